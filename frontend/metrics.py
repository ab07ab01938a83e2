"""Prometheus metrics, named like vLLM's with a `folio:` prefix.

Request-level counters and histograms are observed here from engine-client events; engine
gauges and counters (running, waiting, KV usage, prefix cache, preemptions, speculative
decoding) are read from
the scheduler's stats at scrape time. One registry per frontend: no global state.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class _EngineStatsCollector:
    def __init__(self) -> None:
        self.stats: dict[str, Any] = {}

    def collect(self):
        stats = self.stats
        gauges = (("num_requests_running", "Requests in the running batch", "num_running"),
                  ("num_requests_waiting", "Requests waiting to be scheduled", "num_waiting"),
                  ("num_requests_swapped", "Requests swapped out to CPU memory",
                   "num_swapped"))
        for name, doc, key in gauges:
            yield GaugeMetricFamily(f"folio:{name}", doc, value=float(stats.get(key, 0)))
        total = stats.get("kv_blocks_total") or 0
        used = stats.get("kv_blocks_used", 0)
        yield GaugeMetricFamily("folio:kv_cache_usage_perc",
                                "Fraction of KV-cache blocks in use (0-1)",
                                value=used / total if total else 0.0)
        for name, doc, key in (
                ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                 "prefix_cache_queries"),
                ("prefix_cache_hits", "Prompt tokens found in the prefix cache",
                 "prefix_cache_hits")):
            yield CounterMetricFamily(f"folio:{name}", doc, value=float(stats.get(key, 0)))
        preemptions = CounterMetricFamily("folio:num_preemptions", "Preempted requests",
                                          labels=["mode"])
        preemptions.add_metric(["recompute"], float(stats.get("preemptions_recompute", 0)))
        preemptions.add_metric(["swap"], float(stats.get("preemptions_swap", 0)))
        yield preemptions
        yield from _decode_rate(stats)
        yield from _speculative(stats)
        yield from _multi_step(stats)
        yield from _lora(stats)
        yield from _state_slots(stats)
        yield from _per_replica(stats.get("replicas") or [])
        yield from _per_rank(stats)


def _decode_rate(stats: dict[str, Any]):
    """The decode steps' forward time and the weights they read (scheduler/decode_rate.py):
    rate(bytes x steps) / rate(seconds) is the effective bandwidth; the gauge gives the last
    64 decode steps' figure directly."""
    yield CounterMetricFamily("folio:decode_steps", "Executor steps that only decoded",
                              value=float(stats.get("decode_steps", 0)))
    yield CounterMetricFamily("folio:decode_forward_seconds",
                              "Executor forward time of the steps that only decoded",
                              value=float(stats.get("decode_forward_seconds", 0.0)))
    yield GaugeMetricFamily("folio:weight_bytes_per_step",
                            "Bytes of weights one decode step reads",
                            value=float(stats.get("weight_bytes_per_step", 0)))
    yield GaugeMetricFamily("folio:decode_weight_read_gbps",
                            "Weights read per second of decode forward time, GB/s (last 64 "
                            "decode steps)", value=float(stats.get("decode_weight_read_gbps", 0.0)))


def _speculative(stats: dict[str, Any]):
    """Speculative decoding's counters, as vLLM names them (present when it is on)."""
    if "spec_decode_num_drafts" not in stats:
        return
    for name, doc in (("num_drafts", "Steps in which a request carried draft tokens"),
                      ("num_draft_tokens", "Draft tokens proposed and verified"),
                      ("num_accepted_tokens", "Draft tokens accepted")):
        yield CounterMetricFamily(f"folio:spec_decode_{name}", doc,
                                  value=float(stats.get(f"spec_decode_{name}", 0)))
    per_position = CounterMetricFamily("folio:spec_decode_num_accepted_tokens_per_pos",
                                       "Draft tokens accepted, by position in the step",
                                       labels=["position"])
    for position, count in enumerate(stats.get("spec_decode_num_accepted_tokens_per_pos")
                                     or ()):
        per_position.add_metric([str(position)], float(count))
    yield per_position


def _multi_step(stats: dict[str, Any]):
    """Multi-step decoding's counters (present when it is on; docs/multi_step.md)."""
    if "multi_step_bursts" not in stats:
        return
    yield CounterMetricFamily("folio:multi_step_bursts",
                              "Request steps that ran more than one decode pass",
                              value=float(stats.get("multi_step_bursts", 0)))
    yield CounterMetricFamily("folio:multi_step_extra_tokens",
                              "Tokens decoded by the extra passes of those steps",
                              value=float(stats.get("multi_step_extra_tokens", 0)))


def _state_slots(stats: dict[str, Any]):
    """A hybrid model's recurrent state slots (scheduler/kv/state_slots.py), when it has them."""
    if "state_slots_total" not in stats:
        return
    yield GaugeMetricFamily("folio:state_slots_total", "Recurrent state slots (hybrid model)",
                            value=float(stats["state_slots_total"]))
    yield GaugeMetricFamily("folio:state_slots_used",
                            "Recurrent state slots held by requests (hybrid model)",
                            value=float(stats.get("state_slots_used", 0)))
    total = stats.get("swap_state_slots_total", 0)
    yield GaugeMetricFamily("folio:swap_state_slots_used",
                            "Host state slots holding swapped-out requests' states (hybrid "
                            "model)", value=float(total - stats.get("swap_state_slots_free",
                                                                    total)))


def _lora(stats: dict[str, Any]):
    """Unfinished requests per LoRA adapter (docs/lora.md), while adapters are loaded."""
    if "lora_running" not in stats:
        return
    for key, name, doc in (("lora_running", "lora_num_requests_running",
                            "Requests running (or swapped out) with each LoRA adapter"),
                           ("lora_waiting", "lora_num_requests_waiting",
                            "Requests waiting to be scheduled with each LoRA adapter")):
        family = GaugeMetricFamily(f"folio:{name}", doc, labels=["lora"])
        for adapter, count in sorted((stats.get(key) or {}).items()):
            family.add_metric([adapter], float(count))
        yield family


def _per_rank(stats: dict[str, Any]):
    """Tensor-parallel ranks: 1 while the rank's group serves, labelled by replica and rank
    (a single engine is replica 0)."""
    engines = stats.get("replicas") or [{"replica": 0, **stats}]
    if not any(len(e.get("executor_ranks") or ()) > 1 for e in engines):
        return
    up = GaugeMetricFamily("folio:executor_rank_up",
                           "1 while the tensor-parallel rank's executor group serves",
                           labels=["replica", "rank", "pid"])
    for engine in engines:
        alive = 1.0 if engine.get("executor_alive") else 0.0
        for rank, pid in enumerate(engine.get("executor_ranks") or ()):
            up.add_metric([str(engine.get("replica", 0)), str(rank), str(pid)], alive)
    yield up


def _per_replica(replicas: list[dict[str, Any]]):
    """Data-parallel replicas: each one's gauges and prefix counters, labelled by index
    (the unlabelled families above are their sums)."""
    if not replicas:
        return
    up = GaugeMetricFamily("folio:replica_up", "1 while the replica's executor serves",
                           labels=["replica"])
    families = {key: GaugeMetricFamily(f"folio:replica_{name}", doc, labels=["replica"])
                for key, name, doc in (
                    ("num_running", "num_requests_running", "Requests running on the replica"),
                    ("num_waiting", "num_requests_waiting", "Requests waiting on the replica"),
                    ("kv_blocks_free", "kv_blocks_free", "Free KV blocks of the replica"),
                    ("prefix_cache_hits", "prefix_cache_hits",
                     "Prompt tokens found in the replica's prefix cache"))}
    for entry in replicas:
        label = [str(entry.get("replica", 0))]
        up.add_metric(label, 1.0 if entry.get("executor_alive") else 0.0)
        for key, family in families.items():
            family.add_metric(label, float(entry.get(key, 0)))
    yield up
    yield from families.values()


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.engine = _EngineStatsCollector()
        self.registry.register(self.engine)
        labels = ["model_name"]
        self.model = model_name
        self.prompt_tokens = Counter("folio:prompt_tokens", "Prompt tokens processed",
                                     labels, registry=self.registry)
        self.generation_tokens = Counter("folio:generation_tokens", "Tokens generated",
                                         labels, registry=self.registry)
        self.request_success = Counter("folio:request_success", "Finished requests",
                                       labels + ["finished_reason"], registry=self.registry)
        self.ttft = Histogram("folio:time_to_first_token_seconds", "Time to first token",
                              labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.itl = Histogram("folio:inter_token_latency_seconds", "Time between tokens",
                             labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("folio:e2e_request_latency_seconds", "Request latency",
                             labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_time = Histogram("folio:request_queue_time_seconds",
                                    "Time from arrival to the first scheduled step",
                                    labels, buckets=_LATENCY_BUCKETS, registry=self.registry)
        # The per-token children, looked up once (labels() costs more than the update).
        self._tokens = self.generation_tokens.labels(model_name)
        self._itl = self.itl.labels(model_name)

    def observe(self, event: str, request: Any, **details: Any) -> None:
        """Engine-client events: submitted, first_token, tokens, finished, failed."""
        model = self.model
        if event == "first_token":
            self.ttft.labels(model).observe(request.first_token - request.created)
            self._tokens.inc()
        elif event == "tokens":
            count = details["count"]
            self._tokens.inc(count)
            self._itl.observe(details["gap"] / count)
        elif event == "queued":
            self.queue_time.labels(model).observe(details["seconds"])
        elif event == "finished":
            result = details["result"]
            self.prompt_tokens.labels(model).inc(result.prompt_tokens)
            end = request.last_token or request.created
            self.e2e.labels(model).observe(end - request.created)
            for sample in result.samples:
                self.request_success.labels(model, sample.finish_reason).inc()
        elif event == "failed":
            self.request_success.labels(model, "error").inc()

    def render(self, stats: dict[str, Any]) -> bytes:
        self.engine.stats = stats
        return generate_latest(self.registry)
