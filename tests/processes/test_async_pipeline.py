"""The scheduler process one step ahead (--async-scheduling, the default) against the serial
mode (--no-async-scheduling), as real processes: the same greedy and seeded tokens under
forced recompute and swap preemption, prompt logprobs, stop strings, n > 1 over HTTP, aborts
in flight, and every block free once idle."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request

import pytest

from folio import SamplingParams
from folio.client import AsyncClient, Client
from tests.http_server import free_port
from tests.pipeline import Pipeline

pytestmark = pytest.mark.slow

NUM_KV_BLOCKS = 24   # 384 slots of 16 tokens for about 1000 wanted: preemption is certain
SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                   "prompt_lookup_min": 1, "max_running": 64})


def _workload(seed: int = 3):
    rng = random.Random(seed)
    shared = [rng.randrange(1, 1024) for _ in range(40)]
    prompts = [(shared[:rng.randint(17, 40)] if i % 2 else []) +
               [rng.randrange(1, 1024) for _ in range(rng.randint(1, 40))] for i in range(16)]
    return prompts, [rng.randint(4, 24) for _ in prompts]


PROMPTS, MAX_TOKENS = _workload()


def _http(port: int, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _scores(prompt_logprobs) -> list:
    """Each prompt position's alternatives with their ranks and log-probabilities."""
    return [None if entry is None else
            sorted((token, lp.rank, lp.logprob) for token, lp in entry.items())
            for entry in prompt_logprobs]


def _same_scores(a: list, b: list) -> bool:
    """Same tokens and ranks at every position; log-probabilities within 1e-4 (batches of
    other shapes may move the last bits)."""
    if [len(scores) for scores in a] != [len(scores) for scores in b]:
        return False
    for x, y in zip((e for scores in a for e in scores), (e for scores in b for e in scores)):
        if (x is None) != (y is None):
            return False
        if x is not None and ([t[:2] for t in x] != [t[:2] for t in y]
                              or any(abs(p[2] - q[2]) >= 1e-4 for p, q in zip(x, y))):
            return False
    return True


def _wait_idle(client: Client) -> dict:
    deadline = time.monotonic() + 10
    while True:
        stats = client.health()["stats"]
        idle = stats["num_running"] == stats["num_waiting"] == stats["num_swapped"] == 0
        if (idle and stats["kv_blocks_free"] == stats["kv_blocks_total"]) or \
                time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def _run(pipe: Pipeline, port: int) -> dict:
    address = pipe.client_addresses[0]

    async def burst(params_for):
        async with AsyncClient(address) as client:
            return await asyncio.wait_for(asyncio.gather(*(
                client.generate(p, params_for(i)) for i, p in enumerate(PROMPTS))), 300)

    greedy = asyncio.run(burst(lambda i: SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS[i], prompt_logprobs=2 if i % 4 == 0 else None)))
    seeded = asyncio.run(burst(lambda i: SamplingParams(temperature=1.0, seed=i,
                                                         max_tokens=MAX_TOKENS[i])))
    with Client(address) as client:
        after_bursts = _wait_idle(client)
        plain = client.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24,
                                                           ignore_eos=True))
        stop = plain.text[6:9]
        stopped = client.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24,
                                                             stop=[stop]))
        stream = client.stream(PROMPTS[1], SamplingParams(max_tokens=200, ignore_eos=True))
        for count, _ in enumerate(stream):
            if count == 2:
                break
        stream.close()   # aborts it with steps in flight
        model = _http(port, "/v1/models")["data"][0]["id"]
        forks = _http(port, "/v1/completions", {
            "model": model, "prompt": PROMPTS[3], "n": 3, "temperature": 0, "max_tokens": 12})
        idle = _wait_idle(client)
    return {
        "greedy": [r.token_ids for r in greedy],
        "greedy_reasons": [r.finish_reason for r in greedy],
        "prompt_logprobs": [_scores(r.prompt_logprobs) for r in greedy[::4]],
        "seeded": [r.token_ids for r in seeded],
        "stopped": (stopped.text, stopped.finish_reason, stopped.stop_reason),
        "forks": [c["text"] for c in forks["choices"]],
        "stats": (after_bursts, idle),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory, llama_dir):
    # The four start together (their start-up overlaps), then run one at a time.
    pipes = {}
    try:
        for name, scheduler_args, engine_args in (
                ("serial", ("--no-async-scheduling",), ()),
                ("async", ("--async-scheduling",), ()),
                ("async-swap", ("--preemption-mode", "swap"), ("--preemption-mode", "swap",
                                                              "--num-swap-blocks", "64")),
                # Speculative decoding: both processes read the same setting.
                ("async-spec", ("--async-scheduling", "--speculative-config", SPEC),
                 ("--speculative-config", SPEC))):
            port = free_port()
            pipes[name] = (port, Pipeline(
                tmp_path_factory.mktemp(name), llama_dir, http_port=port,
                engine_args=("--num-kv-blocks", str(NUM_KV_BLOCKS), *engine_args),
                scheduler_args=scheduler_args))
        results = {}
        for name, (port, pipe) in pipes.items():
            pipe.wait_ready()
            results[name] = _run(pipe, port)
            pipe.stop()
        return results
    finally:
        for _, pipe in pipes.values():
            pipe.stop()


@pytest.mark.parametrize("name", ["async", "async-swap"])
def test_one_step_ahead_matches_serial(runs, name):
    serial, other = runs["serial"], runs[name]
    for key in ("greedy", "greedy_reasons", "seeded", "stopped", "forks"):
        assert other[key] == serial[key], key
    assert _same_scores(other["prompt_logprobs"], serial["prompt_logprobs"])
    assert serial["stopped"][1] == "stop" and len(set(serial["forks"])) == 1
    assert all(len(scores) == len(PROMPTS[4 * i]) for i, scores in
               enumerate(serial["prompt_logprobs"]))


def test_preemption_happened_and_every_block_came_back(runs):
    for name, preemption in (("serial", "preemptions_recompute"),
                             ("async", "preemptions_recompute"),
                             ("async-swap", "preemptions_swap")):
        after_bursts, idle = runs[name]["stats"]
        assert after_bursts[preemption] > 0, name
        for stats in (after_bursts, idle):
            assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == NUM_KV_BLOCKS, name
            assert stats["swap_blocks_free"] == stats["swap_blocks_total"], name
            assert stats["num_running"] == stats["num_waiting"] == stats["num_swapped"] == 0


def test_speculative_decoding_one_step_ahead_matches_serial(runs):
    """Greedy answers, finish reasons, stop strings and forks as without speculation
    (seeded samples are drawn differently: rejection sampling, docs/spec_decode.md)."""
    serial, spec = runs["serial"], runs["async-spec"]
    for key in ("greedy", "greedy_reasons", "stopped", "forks"):
        assert spec[key] == serial[key], key
    assert _same_scores(spec["prompt_logprobs"], serial["prompt_logprobs"])
    after_bursts, idle = spec["stats"]
    assert idle["spec_decode_num_accepted_tokens"] > 0
    assert after_bursts["preemptions_recompute"] > 0
    for stats in (after_bursts, idle):
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"] == NUM_KV_BLOCKS
