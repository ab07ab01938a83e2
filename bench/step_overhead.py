"""Step overhead: the scheduler <-> executor hop, measured with a no-model executor.

    python bench/step_overhead.py                       # N = 1, 64, 256 running requests
    python bench/step_overhead.py --sizes 256 --seconds 5 --json
    python bench/step_overhead.py --breakdown           # where one step's time goes, in-process
    python bench/step_overhead.py --breakdown --sizes 256 --repeats 5   # median, min of 5 runs
    python bench/step_overhead.py --null-executor ipc:///run/folio-x/scheduler-executor.sock
    python bench/step_overhead.py --step-ms 0 2 20 --scheduling serial async   # step period

For each N it starts a real scheduler process (`python -m folio scheduler`) on ipc:// sockets
in a private temporary directory, and a null executor (a spawned process running
`null_executor` below) that speaks the real executor protocol with no model: it says
`executor_hello`, heartbeats from a thread with its own socket, keeps a persistent batch and
answers each `plan` with a `result` holding one deterministic token per request that reached
the end of its tokens. A driver on the scheduler's frontend socket plays the frontend: it adds
N requests (16-token prompts, EOS ignored, no length limit in sight), waits until every one has
produced a token, then lets them decode for a few seconds.

The null executor timestamps every plan as it arrives and records its size and the size of
the result it sent back. ms/step is the time between consecutive plan arrivals during the
measured window, i.e. one full round trip: executor decode + apply + encode, the result's hop,
the scheduler's update, routing of outputs to the frontend, schedule(), the plan's hop.
Plan bytes per running request are the real received sizes of decode plans divided by N.

`--step-ms X` makes each null-executor step last X ms from the plan's arrival to its result
(mostly asleep, standing in for a forward pass on an accelerator: the CPU is free).
`--scheduling serial` runs the scheduler with `--no-async-scheduling` (plan N+1 only after
result N: period = X + hop), `async` with one step in flight (plan N+1 waits at the executor
while step N runs: period about max(X, hop)). `vs target` is the period over max(X, hop),
hop being the serial period at X = 0 for the same N (measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import zmq  # noqa: E402

from folio.shared.protocol import messages as m  # noqa: E402
from folio.shared.config import ExecutorCapacity  # noqa: E402
from folio.shared.sampling_params import SamplingParams  # noqa: E402
from folio.shared.protocol.step import StepPlan, StepResult  # noqa: E402
from folio.shared.transport import (UP_EVENTS, configure, ipc_address, make_run_dir,  # noqa: E402
                              monitor_socket, read_monitor_event, send_heartbeats)
from folio.shared.protocol.wire import ProtocolError  # noqa: E402

PROMPT_LEN = 16
BLOCK_SIZE = 16
VOCAB_SIZE = 32000
NUM_KV_BLOCKS = 1 << 18          # 4M token slots: nobody is preempted in a few seconds
MAX_MODEL_LEN = 1 << 20
HEARTBEAT_S = 0.25               # as executor/service.py
FRONTEND_HEARTBEAT_S = 0.5       # as frontend/service.py


# ---- the null executor --------------------------------------------------------------------

class _Held:
    __slots__ = ("tokens", "computed", "blocks", "prompt_len")

    def __init__(self, tokens: list[int], computed: int, blocks: list[int], prompt_len: int):
        self.tokens = tokens
        self.computed = computed
        self.blocks = blocks
        self.prompt_len = prompt_len


class NullBatch:
    """The executor's persistent batch without tensors: tokens, progress and block tables."""

    def __init__(self, block_size: int = BLOCK_SIZE, vocab_size: int = VOCAB_SIZE) -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.held: dict[int, _Held] = {}

    def execute(self, plan: StepPlan) -> StepResult:
        held = self.held
        for handle in plan.dropped_handles:
            held.pop(handle, None)
        scheduled: list[tuple[int, _Held, int]] = []
        for new in plan.new_requests:
            if new.handle in held:
                raise ValueError(f"new request {new.handle} is already held")
            state = _Held(list(new.token_ids), new.num_computed_tokens, list(new.block_ids),
                          new.prompt_len)
            held[new.handle] = state
            scheduled.append((new.handle, state, new.num_new_tokens))
        appended = plan.new_block_ids
        for handle, count in zip(plan.running_handles, plan.running_num_tokens):
            state = held.get(handle)
            if state is None:
                raise ValueError(f"plan runs handle {handle}, which was never sent")
            if appended:
                blocks = appended.get(handle)
                if blocks:
                    state.blocks.extend(blocks)
            scheduled.append((handle, state, count))
        result = StepResult(plan.step_id)
        for handle, state, count in scheduled:
            state.computed += count
            known = len(state.tokens)
            if state.computed > known or len(state.blocks) * self.block_size < state.computed:
                raise ValueError(f"handle {handle}: computing past its tokens or its blocks")
            if state.computed == known:
                token = (handle * 7919 + known * 104729) % self.vocab_size
                state.tokens.append(token)
                result.handles.append(handle)
                result.token_ids.append(token)
        return result

    def tokens_per_handle(self) -> dict[int, int]:
        return {h: len(s.tokens) - s.prompt_len for h, s in self.held.items()}


def _wait_until(deadline_ns: int) -> None:
    """Sleep (the CPU is free, as during a forward pass on an accelerator), then spin the
    last 0.3 ms so the step lasts what was asked however late the sleep wakes."""
    remaining = (deadline_ns - time.monotonic_ns()) / 1e9 - 3e-4
    if remaining > 0:
        time.sleep(remaining)
    while time.monotonic_ns() < deadline_ns:
        pass


def _heartbeat_loop(ctx: zmq.Context, address: str, stop: threading.Event) -> None:
    sock = configure(ctx.socket(zmq.DEALER))
    sock.setsockopt(zmq.IDENTITY, f"executor-heartbeat-{os.getpid()}".encode())
    sock.connect(address)
    send_heartbeats(sock, stop, m.encode_heartbeat(os.getpid()), HEARTBEAT_S)


def null_executor(address: str, control=None, num_kv_blocks: int = NUM_KV_BLOCKS,
                  step_ms: float = 0.0) -> None:
    """Serve plans until told to stop; then report what was received.

    `control` is a multiprocessing Connection: b"stop" (or its closing) ends the loop and the
    report goes back on it as JSON bytes. Without one (the --null-executor command), SIGTERM
    or SIGINT ends the loop and the report is printed as one JSON line.
    """
    capacity = ExecutorCapacity(num_kv_blocks=num_kv_blocks, block_size=BLOCK_SIZE,
                                max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB_SIZE,
                                eos_token_ids=())
    pid = os.getpid()
    stopped = threading.Event()
    if control is None:
        signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        signal.signal(signal.SIGINT, lambda *_: stopped.set())
    ctx = zmq.Context()
    sock = configure(ctx.socket(zmq.DEALER))
    sock.setsockopt(zmq.IDENTITY, f"executor-{pid}".encode())
    monitor = monitor_socket(sock)   # before connect, so the first handshake is seen
    sock.connect(address)
    beats = threading.Thread(target=_heartbeat_loop, args=(ctx, address, stopped), daemon=True)
    beats.start()
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    if control is not None:
        poller.register(control.fileno(), zmq.POLLIN)
    batch = NullBatch(BLOCK_SIZE, VOCAB_SIZE)
    # One row per plan: arrival (monotonic ns), busy ns (recv to result sent), plan bytes,
    # running, new, finished, result bytes.
    rows: list[tuple[int, int, int, int, int, int, int]] = []
    errors = 0
    clock = time.monotonic_ns
    try:
        while not stopped.is_set():
            events = dict(poller.poll(100))
            if control is not None and control.fileno() in events:
                try:
                    command = control.recv_bytes()
                except EOFError:
                    command = b"stop"
                if command == b"stop":
                    break
            if monitor in events and read_monitor_event(monitor) & UP_EVENTS:
                batch = NullBatch(BLOCK_SIZE, VOCAB_SIZE)   # a new scheduler knows nothing
                sock.send(m.encode_hello_executor(capacity, pid))
            if sock not in events:
                continue
            while True:   # drain: plans never queue up behind a poll
                try:
                    data = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                arrived = clock()
                try:
                    _, body = m.decode(data, frozenset({"plan"}))
                    plan = m.decode_plan(body)
                except ProtocolError:
                    errors += 1
                    continue
                try:
                    reply = m.encode_result(batch.execute(plan))
                    if step_ms > 0 and not plan.is_empty:
                        _wait_until(arrived + int(step_ms * 1e6))   # the rest of the step
                except ValueError as error:
                    errors += 1
                    sock.send(m.encode_executor_error(plan.step_id, str(error)))
                    continue
                if plan.is_empty:
                    reply = b""   # forget notices only: no result, as executor/service.py
                else:
                    sock.send(reply)
                rows.append((arrived, clock() - arrived, len(data), len(plan.running_handles),
                             len(plan.new_requests), len(plan.dropped_handles), len(reply)))
    finally:
        stopped.set()
        beats.join(timeout=1)
        report = json.dumps({"rows": rows, "errors": errors,
                             "tokens": list(batch.tokens_per_handle().values())}).encode()
        if control is not None:
            try:
                control.send_bytes(report)
            except (BrokenPipeError, OSError):
                pass
        else:
            summary = json.loads(report)
            summary["rows"] = len(rows)
            print(json.dumps(summary), flush=True)
        monitor.close(0)
        sock.close(0)
        ctx.term()


# ---- the driver: a frontend without text ------------------------------------------------

def peek_type(data: bytes) -> str:
    """A message's type without decoding its body ([version, type, body], type a fixstr)."""
    if len(data) > 3 and data[0] == 0x93 and data[2] & 0xE0 == 0xA0:
        return data[3:3 + (data[2] & 0x1F)].decode("ascii", "replace")
    obj = msgpack.unpackb(data, raw=False)
    return obj[1] if isinstance(obj, list) and len(obj) == 3 else ""


class Driver:
    """Speaks to the scheduler's frontend socket the way frontend/service.py does."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = configure(self.ctx.socket(zmq.DEALER))
        self.sock.setsockopt(zmq.IDENTITY, f"bench-driver-{os.getpid()}".encode())
        self.sock.connect(address)
        self.beat = m.encode_heartbeat(os.getpid())
        self.last_beat = 0.0
        self.output_messages = 0
        self.output_bytes = 0

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if now - self.last_beat >= FRONTEND_HEARTBEAT_S:
            self.last_beat = now
            self.sock.send(self.beat)

    def _recv(self, deadline: float) -> bytes | None:
        self._heartbeat()
        wait_ms = max(0, min(100, int((deadline - time.monotonic()) * 1000)))
        if not self.sock.poll(wait_ms):
            return None
        return self.sock.recv()

    def wait_for_executor(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self.sock.send(m.pack("frontend_hello", {"id": "bench-driver"}))
        while time.monotonic() < deadline:
            data = self._recv(deadline)
            if data is not None and peek_type(data) == "engine_info":
                _, body = m.decode(data, frozenset({"engine_info"}))
                if m.EngineInfo.decode(body).executor_alive:
                    return
        raise TimeoutError(f"no executor attached to the scheduler within {timeout:g} s")

    def add(self, num_requests: int) -> list[str]:
        params = SamplingParams(max_tokens=MAX_MODEL_LEN - 64, ignore_eos=True)
        ids = [f"r{i}" for i in range(num_requests)]
        for i, request_id in enumerate(ids):
            prompt = [(i * 131 + j * 17 + 1) % VOCAB_SIZE for j in range(PROMPT_LEN)]
            self.sock.send(m.encode_add(request_id, prompt, params))
        return ids

    def wait_all_running(self, ids: list[str], timeout: float) -> dict[str, int]:
        """Read outputs until every request has produced a token; fail on any refusal."""
        tokens = dict.fromkeys(ids, 0)
        missing = set(ids)
        deadline = time.monotonic() + timeout
        while missing:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(missing)} of {len(ids)} requests produced no token "
                                   f"within {timeout:g} s")
            data = self._recv(deadline)
            if data is None:
                continue
            kind = peek_type(data)
            if kind in ("rejected", "error"):
                raise RuntimeError(f"scheduler answered {kind}: {msgpack.unpackb(data)[2]}")
            if kind != "outputs":
                continue
            _, body = m.decode(data, frozenset({"outputs"}))
            for output in m.decode_outputs(body):
                if output.finished:
                    raise RuntimeError(f"request {output.request_id} finished early: "
                                       f"{output.finish_reason} {output.error or ''}")
                tokens[output.request_id] += len(output.new_token_ids)
                if output.new_token_ids:
                    missing.discard(output.request_id)
        return tokens

    def pump(self, seconds: float) -> None:
        """Read (and count, undecoded) whatever the scheduler sends for `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            data = self._recv(deadline)
            if data is not None:
                self._count(data)

    def _count(self, data: bytes) -> str:
        kind = peek_type(data)
        if kind == "outputs":
            self.output_messages += 1
            self.output_bytes += len(data)
        elif kind in ("rejected", "error"):
            raise RuntimeError(f"scheduler answered {kind}: {msgpack.unpackb(data)[2]}")
        return kind

    def stats(self, timeout: float = 10.0) -> dict:
        self.sock.send(m.pack("stats_request", {}))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = self._recv(deadline)
            if data is not None and self._count(data) == "stats":
                _, body = m.decode(data, frozenset({"stats"}))
                return body.map("stats")
        raise TimeoutError(f"no stats from the scheduler within {timeout:g} s")


# ---- one measurement ----------------------------------------------------------------------

def _die_with_parent() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop(proc: subprocess.Popen | multiprocessing.Process | None) -> None:
    if proc is None:
        return
    if isinstance(proc, subprocess.Popen):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        return
    proc.join(timeout=5)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def measure(num_requests: int, seconds: float = 3.0, warmup: float = 0.5,
            startup_timeout: float = 60.0, step_ms: float = 0.0,
            async_scheduling: bool = True) -> dict:
    """Run scheduler + null executor + driver for one N; return the figures as a dict."""
    run_dir = make_run_dir()
    frontend_address = ipc_address(run_dir, "scheduler-frontends")
    executor_address = ipc_address(run_dir, "scheduler-executor")
    log_path = run_dir / "scheduler.log"
    scheduler = executor = driver = control = None
    try:
        with open(log_path, "wb") as log:
            scheduler = subprocess.Popen(
                [sys.executable, "-m", "folio", "--log-level", "WARNING", "scheduler",
                 "--frontend-address", frontend_address,
                 "--executor-address", executor_address,
                 "--max-num-seqs", str(max(256, num_requests)),
                 "--async-scheduling" if async_scheduling else "--no-async-scheduling"],
                cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=log,
                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        spawn = multiprocessing.get_context("spawn")
        control, child_end = spawn.Pipe()
        executor = spawn.Process(target=null_executor,
                                 args=(executor_address, child_end, NUM_KV_BLOCKS, step_ms),
                                 daemon=True, name="null-executor")
        executor.start()
        child_end.close()
        driver = Driver(frontend_address)
        try:
            driver.wait_for_executor(startup_timeout)
            ids = driver.add(num_requests)
            warm_tokens = driver.wait_all_running(ids, startup_timeout)
            driver.pump(warmup)
            before = driver.stats()
            start_ns = time.monotonic_ns()
            messages0, bytes0 = driver.output_messages, driver.output_bytes
            driver.pump(seconds)
            end_ns = time.monotonic_ns()
            after = driver.stats()
            out_messages = driver.output_messages - messages0
            out_bytes = driver.output_bytes - bytes0
        except Exception as error:
            tail = log_path.read_text(errors="replace")[-2000:]
            state = "running" if scheduler.poll() is None else f"exited {scheduler.returncode}"
            raise RuntimeError(f"{error}\n--- scheduler ({state}) log:\n{tail}") from error
        control.send_bytes(b"stop")
        if not control.poll(30):
            raise TimeoutError("the null executor did not report within 30 s")
        report = json.loads(control.recv_bytes())
    finally:
        if driver is not None:
            driver.close()
        if control is not None:
            try:
                control.send_bytes(b"stop")
            except (BrokenPipeError, OSError):
                pass
        _stop(executor)
        if control is not None:
            control.close()
        _stop(scheduler)
        shutil.rmtree(run_dir, ignore_errors=True)
    summary = summarize(num_requests, report, start_ns, end_ns, before, after, warm_tokens,
                        out_messages, out_bytes)
    summary["scheduling"] = "async" if async_scheduling else "serial"
    summary["step_ms"] = step_ms
    return summary


def summarize(num_requests: int, report: dict, start_ns: int, end_ns: int, before: dict,
              after: dict, warm_tokens: dict[str, int], out_messages: int,
              out_bytes: int) -> dict:
    rows = [r for r in report["rows"] if start_ns <= r[0] <= end_ns]
    decode = [r for r in rows if r[3] == num_requests and r[4] == 0 and r[5] == 0]
    if len(rows) < 2 or not decode:
        raise RuntimeError(f"only {len(rows)} plans ({len(decode)} decode) arrived in the "
                           "measured window")
    gaps_ms = [(b[0] - a[0]) / 1e6 for a, b in zip(rows, rows[1:])]
    span_ms = (rows[-1][0] - rows[0][0]) / 1e6
    window_s = (end_ns - start_ns) / 1e9
    plan_bytes = statistics.fmean(r[2] for r in decode)
    result_bytes = statistics.fmean(r[6] for r in decode)
    busy_ms = statistics.fmean(r[1] for r in rows) / 1e6
    ms_per_step = span_ms / (len(rows) - 1)
    tokens = report["tokens"]
    return {
        "running": num_requests,
        "window_s": round(window_s, 3),
        "steps": len(rows),
        "decode_steps": len(decode),
        "scheduler_steps": after.get("steps", 0) - before.get("steps", 0),
        "ms_per_step": ms_per_step,
        "ms_per_step_p50": _percentile(gaps_ms, 0.50),
        "ms_per_step_p99": _percentile(gaps_ms, 0.99),
        "executor_ms_per_step": busy_ms,
        "scheduler_and_wire_ms_per_step": ms_per_step - busy_ms,
        "plan_bytes": plan_bytes,
        "plan_bytes_per_request": plan_bytes / num_requests,
        "plan_bytes_max": max(r[2] for r in decode),
        "result_bytes": result_bytes,
        "result_bytes_per_request": result_bytes / num_requests,
        "outputs_bytes_per_step": out_bytes / max(1, out_messages),
        "outputs_messages": out_messages,
        "requests_with_tokens": sum(1 for n in warm_tokens.values() if n > 0),
        "min_tokens_per_request": min(tokens) if tokens else 0,
        "num_running_stat": after.get("num_running"),
        "executor_errors": report["errors"],
    }


# ---- in-process breakdown -----------------------------------------------------------------

def breakdown(num_requests: int, steps: int = 300) -> dict[str, float]:
    """Microseconds per step spent in each piece of the round trip, without sockets.

    The same work the three parties do per decode step, run one after another in this
    process: scheduler.schedule + encode_plan (scheduler), decode_plan + apply +
    encode_result (executor), decode_result + scheduler.update + encode_outputs (scheduler).
    """
    from folio.scheduler.scheduler import Scheduler
    from folio.shared.config import SchedulerConfig
    from folio.shared.protocol.wire import Body, unpack

    scheduler = Scheduler(SchedulerConfig(
        num_kv_blocks=NUM_KV_BLOCKS, block_size=BLOCK_SIZE, max_num_seqs=max(256, num_requests),
        max_num_batched_tokens=2048, max_model_len=MAX_MODEL_LEN, vocab_size=VOCAB_SIZE))
    params = SamplingParams(max_tokens=MAX_MODEL_LEN - 64, ignore_eos=True)
    for i in range(num_requests):
        scheduler.add_request(f"r{i}", [(i * 131 + j * 17 + 1) % VOCAB_SIZE
                                        for j in range(PROMPT_LEN)], params)
    batch = NullBatch()
    stages = ("schedule", "encode_plan", "decode_plan", "null_apply", "encode_result",
              "decode_result", "update", "encode_outputs")
    spent = dict.fromkeys(stages, 0.0)
    clock = time.perf_counter
    for step in range(steps + 20):
        t0 = clock()
        plan = scheduler.schedule()
        t1 = clock()
        wire_plan = m.encode_plan(plan)
        t2 = clock()
        kind, body = unpack(wire_plan)
        received = m.decode_plan(Body(kind, body))
        t3 = clock()
        result = batch.execute(received)
        t4 = clock()
        wire_result = m.encode_result(result)
        t5 = clock()
        kind, body = unpack(wire_result)
        decoded = m.decode_result(Body(kind, body))
        t6 = clock()
        outputs = scheduler.update(plan, decoded)
        t7 = clock()
        m.encode_outputs(outputs)
        t8 = clock()
        if step >= 20 and not plan.new_requests:   # decode steps only
            for name, a, b in zip(stages, (t0, t1, t2, t3, t4, t5, t6, t7),
                                  (t1, t2, t3, t4, t5, t6, t7, t8)):
                spent[name] += b - a
    measured = max(1, steps)
    return {name: spent[name] / measured * 1e6 for name in stages}


# The scheduler process's own share of a step: the rest is the executor's, or the sockets'.
SCHEDULER_STAGES = ("schedule", "encode_plan", "decode_result", "update", "encode_outputs")


def breakdown_repeated(num_requests: int, repeats: int = 5, steps: int = 300
                       ) -> dict[str, dict[str, float]]:
    """breakdown() `repeats` times (a fresh scheduler each time): per stage, and for the
    total and the scheduler's own work (SCHEDULER_STAGES), the median and the minimum over
    the runs. A busy machine slows some runs down; the median and the minimum move less."""
    runs = []
    for _ in range(max(1, repeats)):
        run = breakdown(num_requests, steps)
        run["total"] = sum(run.values())
        run["scheduler own"] = sum(run[name] for name in SCHEDULER_STAGES)
        runs.append(run)
    return {"median": {name: statistics.median(r[name] for r in runs) for name in runs[0]},
            "min": {name: min(r[name] for r in runs) for name in runs[0]},
            "repeats": len(runs)}


# ---- command line -------------------------------------------------------------------------

COLUMNS = (("running", "N", "{:d}"), ("steps", "steps", "{:d}"),
           ("ms_per_step", "ms/step", "{:.3f}"), ("ms_per_step_p50", "p50", "{:.3f}"),
           ("ms_per_step_p99", "p99", "{:.3f}"), ("executor_ms_per_step", "exec ms", "{:.3f}"),
           ("scheduler_and_wire_ms_per_step", "sched + wire ms", "{:.3f}"),
           ("plan_bytes", "plan B", "{:.1f}"), ("plan_bytes_per_request", "plan B/req", "{:.2f}"),
           ("result_bytes", "result B", "{:.1f}"),
           ("result_bytes_per_request", "result B/req", "{:.2f}"),
           ("outputs_bytes_per_step", "outputs B", "{:.0f}"))


PERIOD_COLUMNS = (("scheduling", "scheduling", "{}"), ("step_ms", "X ms", "{:g}"),
                  ("running", "N", "{:d}"), ("steps", "steps", "{:d}"),
                  ("ms_per_step", "period ms", "{:.3f}"), ("ms_per_step_p50", "p50", "{:.3f}"),
                  ("ms_per_step_p99", "p99", "{:.3f}"), ("target_ms", "max(X, hop) ms", "{:.3f}"),
                  ("vs_target", "vs target", "{:.2f}"))


def add_targets(results: list[dict]) -> None:
    """hop = the serial period at X = 0 for the same N; target = max(X, hop)."""
    hops = {r["running"]: r["ms_per_step"] for r in results
            if r["scheduling"] == "serial" and r["step_ms"] == 0}
    for row in results:
        hop = hops.get(row["running"])
        row["target_ms"] = float("nan") if hop is None else max(row["step_ms"], hop)
        row["vs_target"] = row["ms_per_step"] / row["target_ms"]


def table(results: list[dict], columns=COLUMNS) -> str:
    head = "| " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|" + "|".join("---:" for _ in columns) + "|"
    lines = [head, rule]
    for row in results:
        lines.append("| " + " | ".join(fmt.format(row[key]) for key, _, fmt in columns) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 64, 256],
                        help="numbers of running requests to measure")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window per size")
    parser.add_argument("--warmup", type=float, default=0.5,
                        help="decode time before the window opens")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--breakdown", action="store_true",
                        help="time each piece of a decode step in-process (no sockets)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="--breakdown: runs per size; prints the median and the minimum")
    parser.add_argument("--step-ms", type=float, nargs="+", default=None, metavar="X",
                        help="null-executor step times to measure (ms slept per plan); "
                        "prints the step-period table")
    parser.add_argument("--scheduling", nargs="+", choices=("serial", "async"),
                        default=["async"], help="scheduler modes to measure")
    parser.add_argument("--null-executor", metavar="ADDRESS",
                        help="only run the null executor against a scheduler at ADDRESS")
    args = parser.parse_args(argv)
    if args.null_executor:
        null_executor(args.null_executor)
        return 0
    if args.breakdown:
        rows = {n: breakdown_repeated(n, args.repeats) for n in args.sizes}
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        stages = list(next(iter(rows.values()))["median"])
        repeats = next(iter(rows.values()))["repeats"]
        print(f"| stage (µs/step, median / min of {repeats}) | "
              + " | ".join(f"N={n}" for n in rows) + " |")
        print("|---|" + "|".join("---:" for _ in rows) + "|")
        for stage in stages:
            print(f"| {stage} | " + " | ".join(
                f"{r['median'][stage]:.1f} / {r['min'][stage]:.1f}" for r in rows.values())
                + " |")
        return 0
    if args.step_ms is None:
        results = [measure(n, args.seconds, args.warmup,
                           async_scheduling=args.scheduling[0] == "async") for n in args.sizes]
        print(json.dumps(results, indent=2) if args.json else table(results))
        return 0
    results = [measure(n, args.seconds, args.warmup, step_ms=x,
                       async_scheduling=mode == "async")
               for mode in args.scheduling for x in args.step_ms for n in args.sizes]
    add_targets(results)
    print(json.dumps(results, indent=2) if args.json else table(results, PERIOD_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
