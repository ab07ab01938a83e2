"""What serving adds to a step, measured against `folio serve` itself (`folio plan
calibrate`'s second part; `--no-served` skips it).

The in-process calibration times the executor, the scheduler and a hop alone. Served, each
step also wakes the frontend and scheduler processes on the executor's cores, and the
frontend streams every token over HTTP; each request is also read, checked and tokenized
before the scheduler sees it. Those costs are measured here, not modelled: the model is
served with the calibrated flags on a loopback port and streams two kinds of load:

- a trickle: requests one at a time at Poisson arrivals, most of them reaching an idle or
  nearly idle server, as at light load (rounds of requests sent back to back stream faster
  than that on shared cores: docs/benchmarks.md, the planner's section);
- rounds of several requests at once, for what each request in a step adds.

Each request (trickle) or round is set beside what the in-process cost model predicts for
the very same requests at the same arrival times, and the difference is fitted as

    served step overhead (ms) = step_ms + per_row_ms * rows     (added to every step)
    request_ms                                                  (arrival to the scheduler)

both clamped at zero (a served step is never predicted faster than the in-process one).
The fixed terms make the trickle's median TPOT and TTFT come out as measured: medians,
not means, so one request held up by a neighbour's wake-up does not move every prediction.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, replace
from http.client import HTTPConnection
from typing import Any

from folio.planner.cost import CostModel, ServedOverhead
from folio.planner.fit import fit_non_negative
from folio.planner.workload import Workload


@dataclass(frozen=True)
class Rounds:
    """The served requests, each `prompt` random token ids and `output` tokens (EOS
    ignored): `trickle` requests at Poisson arrivals of `rate` a second, then rounds of
    `concurrency` requests at once, each round `repeats` times."""

    concurrency: tuple[int, ...]
    prompt: int
    output: int
    repeats: int
    trickle: int = 0
    rate: float = 1.0


FULL_ROUNDS = Rounds((4, 16), 128, 48, 2, trickle=24, rate=1.5)
QUICK_ROUNDS = Rounds((4,), 16, 8, 1, trickle=3, rate=20.0)


@dataclass(frozen=True)
class RoundResult:
    concurrency: int
    ttft_ms: float          # medians over the round's requests
    tpot_ms: float
    predicted_ttft_ms: float
    predicted_tpot_ms: float


@dataclass(frozen=True)
class LoneResult:
    """One request of the trickle, as measured."""

    arrival_s: float        # from the trickle's start
    ttft_ms: float
    tpot_ms: float


def serve_flags(flags: dict[str, Any]) -> list[str]:
    """`folio serve` flags for the calibrated engine flags (names as EngineConfig's)."""
    words: list[str] = []
    for name, value in flags.items():
        if value is not None:
            words += [f"--{name.replace('_', '-')}", str(value)]
    return words


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Server:
    """`folio serve` in its own process group on a free loopback port."""

    def __init__(self, model: str, flags: dict[str, Any]) -> None:
        self.port = _free_port()
        command = [sys.executable, "-m", "folio", "--log-level", "WARNING", "serve",
                   "--model", model, "--port", str(self.port), *serve_flags(flags)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                error = self.proc.stderr.read().decode(errors="replace").strip()
                raise RuntimeError("folio serve exited while starting: "
                                   + (error.splitlines()[-1] if error else "no message"))
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                            timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)   # polling the health endpoint until it answers
        raise RuntimeError(f"folio serve did not answer /health within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc.stderr.close()


def _stream(port: int, prompt: list[int], output: int, times: list[float]) -> None:
    """One streamed completion; appends the arrival time of each token to `times`."""
    body = json.dumps({"prompt": prompt, "max_tokens": output, "ignore_eos": True,
                       "temperature": 0, "stream": True})
    connection = HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.request("POST", "/v1/completions", body,
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"served calibration request failed: HTTP {response.status} "
                               f"{response.read()[:200]!r}")
        for line in response:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                times.append(time.perf_counter())
    finally:
        connection.close()


def _stream_at(port: int, prompts: list[list[int]], output: int, arrivals: list[float]
               ) -> tuple[float, list[float], list[list[float]]]:
    """Stream each prompt from its arrival time (seconds from now) on, a thread each:
    (the start, each request's send time, each request's chunk times)."""
    times: list[list[float]] = [[] for _ in prompts]
    starts = [0.0] * len(prompts)
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            starts[index] = time.perf_counter()
            _stream(port, prompts[index], output, times[index])
        except BaseException as error:   # reported after the join
            errors.append(error)

    begin = time.perf_counter()
    threads = []
    for index, arrival in enumerate(arrivals):
        # The load's own clock: each request is sent at its drawn arrival time.
        time.sleep(max(0.0, begin + arrival - time.perf_counter()))
        thread = threading.Thread(target=run, args=(index,))
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return begin, starts, times


def _round(port: int, prompts: list[list[int]], output: int) -> tuple[float, float]:
    """Stream `prompts` at once; (median TTFT ms, median TPOT ms) over them."""
    start, _, times = _stream_at(port, prompts, output, [0.0] * len(prompts))
    ttft = [t[0] - start for t in times if t]
    # Per request over its streamed chunks: a chunk may carry several tokens (a coalesced
    # frontend), so the time between first and last is divided by the tokens between them.
    tpot = [(t[-1] - t[0]) / (output - 1) for t in times if len(t) > 1]
    if len(ttft) < len(prompts) or not tpot:
        raise RuntimeError("served calibration: a request streamed no tokens")
    return statistics.median(ttft) * 1000, statistics.median(tpot) * 1000


def trickle_arrivals(rounds: Rounds, seed: int) -> list[float]:
    """Poisson arrival times (seconds from the first) of the trickle's requests."""
    workload = Workload("trickle", "poisson", rounds.rate, rounds.trickle,
                        (rounds.prompt,) * 2, (rounds.output,) * 2, seed=seed)
    return [request.arrival for request in workload.trace()]


def _trickle(port: int, prompts: list[list[int]], output: int, arrivals: list[float]
             ) -> list[LoneResult]:
    """Stream each prompt from its arrival time on; each request as measured."""
    begin, starts, times = _stream_at(port, prompts, output, arrivals)
    if any(len(t) < 2 for t in times):
        raise RuntimeError("served calibration: a request streamed fewer than two chunks")
    return [LoneResult(start - begin, (t[0] - start) * 1000,
                       (t[-1] - t[0]) / (output - 1) * 1000)
            for start, t in zip(starts, times)]


def _trickle_prediction(cost: CostModel, lone: list[LoneResult], rounds: Rounds):
    """The cost model's replay of the trickle's requests at their measured arrivals."""
    from folio.planner.replay import predict
    from folio.planner.simulator.inputs import TraceRequest

    trace = [TraceRequest(r.arrival_s, rounds.prompt, rounds.output) for r in lone]
    return predict(trace, cost).requests


def _predicted(cost: CostModel, concurrency: int, rounds: Rounds) -> tuple[float, float]:
    from folio.planner.replay import predict
    from folio.planner.simulator.inputs import TraceRequest

    trace = [TraceRequest(0.0, rounds.prompt, rounds.output) for _ in range(concurrency)]
    summary = predict(trace, cost).summary
    return summary["ttft_p50_ms"], summary["tpot_p50_ms"]


def measure_rounds(model: str, flags: dict[str, Any], vocab_size: int, rounds: Rounds,
                   cost: CostModel, seed: int = 0, start_timeout_s: float = 600
                   ) -> tuple[list[LoneResult], list[RoundResult]]:
    """Serve `model` with `flags` and stream the trickle, then the rounds of `rounds`; each
    round beside the in-process cost model's prediction (`cost` without a served part) of
    the same requests."""
    rng = random.Random(seed)

    def prompts(count: int) -> list[list[int]]:   # random ids: no prefix is shared
        return [[rng.randrange(vocab_size) for _ in range(rounds.prompt)]
                for _ in range(count)]

    server = _Server(model, flags)
    try:
        server.wait_ready(start_timeout_s)
        # A fresh server's first steps of each shape are slow (allocations, caches).
        _round(server.port, prompts(max(rounds.concurrency, default=4)), rounds.output)
        lone = _trickle(server.port, prompts(rounds.trickle), rounds.output,
                        trickle_arrivals(rounds, seed)) if rounds.trickle else []
        results = []
        for concurrency in rounds.concurrency:
            measured = [_round(server.port, prompts(concurrency), rounds.output)
                        for _ in range(rounds.repeats)]
            ttft, tpot = _predicted(cost, concurrency, rounds)
            results.append(RoundResult(concurrency,
                                       statistics.median(m[0] for m in measured),
                                       statistics.median(m[1] for m in measured), ttft, tpot))
        return lone, results
    finally:
        server.stop()


def fit_overhead(results: list[RoundResult], cost: CostModel, rounds: Rounds,
                 lone: list[LoneResult] = ()) -> ServedOverhead:
    """The served part from the measured trickle and rounds. The per-row term is fitted to
    the TPOT gaps (a request's or a round's measured TPOT less the in-process prediction)
    at each one's requests per step. The fixed terms are set so that the trickle's median
    TPOT and TTFT come out as measured (light load, where a plan's p50s sit); without a
    trickle, from the rounds' median gaps."""
    bare = _trickle_prediction(cost, lone, rounds) if lone else []
    samples = [(float(r.concurrency), r.tpot_ms - r.predicted_tpot_ms) for r in results]
    samples += [(p.rows, m.tpot_ms - p.tpot_ms) for m, p in zip(lone, bare)]
    if len({rows for rows, _ in samples}) > 1:
        _, per_row_ms = fit_non_negative([[1.0, rows] for rows, _ in samples],
                                         [gap for _, gap in samples], relative=False)
    else:
        per_row_ms = 0.0
    if lone:
        step_ms = statistics.median(m.tpot_ms for m in lone) - statistics.median(
            p.tpot_ms + per_row_ms * p.rows for p in bare)
    else:
        step_ms = statistics.median(gap - per_row_ms * rows for rows, gap in samples)
    step_ms = max(0.0, step_ms)
    stepped = replace(cost, served=ServedOverhead(step_ms, per_row_ms, 0.0))
    if lone:
        request_ms = statistics.median(m.ttft_ms for m in lone) - statistics.median(
            p.ttft_ms for p in _trickle_prediction(stepped, lone, rounds))
    else:
        request_ms = statistics.median(r.ttft_ms - _predicted(stepped, r.concurrency, rounds)[0]
                                       for r in results)
    fitted = ServedOverhead(step_ms, per_row_ms, max(0.0, request_ms),
                            [vars(r) for r in results])
    return replace(fitted, trickle=_trickle_summary(replace(cost, served=fitted), lone,
                                                    rounds) if lone else {})


def _trickle_summary(cost: CostModel, lone: list[LoneResult], rounds: Rounds
                     ) -> dict[str, Any]:
    """The trickle's medians, measured and as the fitted model replays them."""
    predicted = _trickle_prediction(cost, lone, rounds)
    return {"requests": len(lone), "rate": rounds.rate,
            "ttft_p50_ms": round(statistics.median(r.ttft_ms for r in lone), 3),
            "tpot_p50_ms": round(statistics.median(r.tpot_ms for r in lone), 3),
            "predicted_ttft_p50_ms": round(statistics.median(p.ttft_ms for p in predicted), 3),
            "predicted_tpot_p50_ms": round(statistics.median(p.tpot_ms for p in predicted), 3)}


def calibrate_served(model: str, flags: dict[str, Any], vocab_size: int, cost: CostModel,
                     rounds: Rounds) -> CostModel:
    """`cost` with its served part measured against `folio serve`."""
    bare = replace(cost, served=None)
    lone, results = measure_rounds(model, flags, vocab_size, rounds, bare)
    return replace(cost, served=fit_overhead(results, bare, rounds, lone))
