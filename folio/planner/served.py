"""What serving adds to a step, measured against `folio serve` itself (`folio plan
calibrate`'s second part; `--no-served` skips it).

The in-process calibration times the executor, the scheduler and a hop alone. Served, each
step also wakes the frontend and scheduler processes on the executor's cores, and the
frontend streams every token over HTTP; each request is also read, checked and tokenized
before the scheduler sees it. Those costs are measured here, not modelled: the model is
served with the calibrated flags on a loopback port, a few rounds of requests are streamed
at several concurrencies, and each round's measured TPOT and TTFT are compared with what the
in-process cost model predicts for the very same requests. The difference is fitted as

    served step overhead (ms) = step_ms + per_row_ms * rows     (added to every step)
    request_ms                                                  (arrival to the scheduler)

both clamped at zero (a served step is never predicted faster than the in-process one).
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


@dataclass(frozen=True)
class Rounds:
    """The served requests: `concurrency` requests at once per round, each `prompt` random
    token ids and `output` tokens (EOS ignored), each round `repeats` times."""

    concurrency: tuple[int, ...]
    prompt: int
    output: int
    repeats: int


FULL_ROUNDS = Rounds((1, 4, 16), 128, 48, 2)
QUICK_ROUNDS = Rounds((1, 4), 16, 8, 1)


@dataclass(frozen=True)
class RoundResult:
    concurrency: int
    ttft_ms: float          # medians over the round's requests
    tpot_ms: float
    predicted_ttft_ms: float
    predicted_tpot_ms: float


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


def _round(port: int, prompts: list[list[int]], output: int) -> tuple[float, float]:
    """Stream `prompts` at once; (median TTFT ms, median TPOT ms) over them."""
    times: list[list[float]] = [[] for _ in prompts]
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            _stream(port, prompts[index], output, times[index])
        except BaseException as error:   # reported after the join
            errors.append(error)

    start = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    ttft = [t[0] - start for t in times if t]
    # Per request over its streamed chunks: a chunk may carry several tokens (a coalesced
    # frontend), so the time between first and last is divided by the tokens between them.
    tpot = [(t[-1] - t[0]) / (output - 1) for t in times if len(t) > 1]
    if len(ttft) < len(prompts) or not tpot:
        raise RuntimeError("served calibration: a request streamed no tokens")
    return statistics.median(ttft) * 1000, statistics.median(tpot) * 1000


def _predicted(cost: CostModel, concurrency: int, rounds: Rounds) -> tuple[float, float]:
    from folio.planner.replay import predict
    from folio.planner.simulator.inputs import TraceRequest

    trace = [TraceRequest(0.0, rounds.prompt, rounds.output) for _ in range(concurrency)]
    summary = predict(trace, cost).summary
    return summary["ttft_p50_ms"], summary["tpot_p50_ms"]


def measure_rounds(model: str, flags: dict[str, Any], vocab_size: int, rounds: Rounds,
                   cost: CostModel, seed: int = 0, start_timeout_s: float = 600
                   ) -> list[RoundResult]:
    """Serve `model` with `flags` and stream `rounds`; each beside the in-process cost
    model's prediction (`cost` without a served part) of the same requests."""
    rng = random.Random(seed)

    def prompts(count: int) -> list[list[int]]:   # random ids: no prefix is shared
        return [[rng.randrange(vocab_size) for _ in range(rounds.prompt)]
                for _ in range(count)]

    server = _Server(model, flags)
    try:
        server.wait_ready(start_timeout_s)
        # A fresh server's first steps of each shape are slow (allocations, caches).
        _round(server.port, prompts(max(rounds.concurrency)), rounds.output)
        results = []
        for concurrency in rounds.concurrency:
            measured = [_round(server.port, prompts(concurrency), rounds.output)
                        for _ in range(rounds.repeats)]
            ttft, tpot = _predicted(cost, concurrency, rounds)
            results.append(RoundResult(concurrency,
                                       statistics.median(m[0] for m in measured),
                                       statistics.median(m[1] for m in measured), ttft, tpot))
        return results
    finally:
        server.stop()


def fit_overhead(results: list[RoundResult], cost: CostModel, rounds: Rounds
                 ) -> ServedOverhead:
    """The served part from measured rounds: the per-step terms from the TPOT gaps, then the
    per-request term from the TTFT gaps left once the steps carry theirs."""
    rows = [[1.0, float(r.concurrency)] for r in results]
    gaps = [r.tpot_ms - r.predicted_tpot_ms for r in results]
    if len(results) > 1:
        step_ms, per_row_ms = fit_non_negative(rows, gaps, relative=False)
    else:
        step_ms, per_row_ms = max(0.0, gaps[0]), 0.0
    stepped = replace(cost, served=ServedOverhead(step_ms, per_row_ms, 0.0))
    ttft_gaps = [r.ttft_ms - _predicted(stepped, r.concurrency, rounds)[0] for r in results]
    request_ms = max(0.0, statistics.median(ttft_gaps))
    return ServedOverhead(step_ms, per_row_ms, request_ms,
                          [vars(r) for r in results])


def calibrate_served(model: str, flags: dict[str, Any], vocab_size: int, cost: CostModel,
                     rounds: Rounds) -> CostModel:
    """`cost` with its served part measured against `folio serve`."""
    bare = replace(cost, served=None)
    results = measure_rounds(model, flags, vocab_size, rounds, bare)
    return replace(cost, served=fit_overhead(results, bare, rounds))
