"""The scheduler process's flow control, seen from the executor socket: with async scheduling
plan N+1 arrives before result N is sent, and never a third; serially it waits. An error
for the plan that was ahead of a failed one fails nothing new. The test plays the executor
(the bench's null batch) and a frontend over ipc:// sockets against a real scheduler."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from bench.step_overhead import NullBatch, peek_type
from folio.shared.protocol import messages as m
from folio.shared.config import ExecutorCapacity
from folio.shared.sampling_params import SamplingParams
from folio.shared.transport import configure

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CAPACITY = ExecutorCapacity(num_kv_blocks=64, block_size=16, max_model_len=1024,
                            vocab_size=1000, eos_token_ids=())
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


class Peers:
    """A scheduler process, and sockets playing its executor and one frontend."""

    def __init__(self, run_dir: Path, *flags: str) -> None:
        fe, ex = f"ipc://{run_dir}/fe.sock", f"ipc://{run_dir}/ex.sock"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "folio", "scheduler", "--frontend-address", fe,
             "--executor-address", ex, "--executor-timeout", "60", *flags],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.ctx = zmq.Context()
        self.executor = configure(self.ctx.socket(zmq.DEALER))
        self.executor.connect(ex)
        self.frontend = configure(self.ctx.socket(zmq.DEALER))
        self.frontend.connect(fe)
        self.batch = NullBatch(block_size=16, vocab_size=1000)
        self.executor.send(m.encode_hello_executor(CAPACITY, os.getpid()))
        self.frontend.send(m.pack("frontend_hello", {"id": "flow-test"}))

    def close(self) -> None:
        self.executor.close(0)
        self.frontend.close(0)
        self.ctx.term()
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def plan(self, timeout: float = 10.0):
        """The next plan the executor socket receives, or None within `timeout`."""
        deadline = time.monotonic() + timeout
        while self.executor.poll(max(1, int((deadline - time.monotonic()) * 1000))):
            data = self.executor.recv()
            if peek_type(data) == "plan":
                return m.decode_plan(m.decode(data, frozenset({"plan"}))[1])
            if time.monotonic() > deadline:
                break
        return None

    def answer(self, plan) -> None:
        self.executor.send(m.encode_result(self.batch.execute(plan)))

    def outputs(self, until, timeout: float = 10.0) -> list:
        """Outputs the frontend receives until `until(outputs)` holds."""
        got: list = []
        deadline = time.monotonic() + timeout
        while not until(got):
            assert self.frontend.poll(max(1, int((deadline - time.monotonic()) * 1000))), got
            data = self.frontend.recv()
            if peek_type(data) == "outputs":
                got += m.decode_outputs(m.decode(data, frozenset({"outputs"}))[1])
        return got


@pytest.fixture
def peers(tmp_path, request):
    started = Peers(tmp_path, *request.param)
    try:
        yield started
    finally:
        started.close()


def _add(peers: Peers, request_id: str) -> None:
    deadline = time.monotonic() + 30
    while True:   # until the scheduler has the executor attached (else: engine_dead)
        peers.frontend.send(m.encode_add(request_id, [5, 6, 7], PARAMS))
        plan = peers.plan(timeout=0.5)
        if plan is not None:
            return plan
        assert time.monotonic() < deadline, "the scheduler never took the request"


@pytest.mark.parametrize("peers", [()], indirect=True)
def test_plan_n_plus_1_arrives_before_result_n_and_never_a_third(peers):
    plans = [_add(peers, "a")]
    tokens = 0
    while plans:
        ahead = peers.plan(timeout=2.0 if tokens < PARAMS.max_tokens - 1 else 0.3)
        if tokens < PARAMS.max_tokens - 1:
            assert ahead is not None, f"no plan ahead of step {plans[0].step_id}"
            assert ahead.running_handles == [0] and ahead.running_num_tokens == [1]
            plans.append(ahead)
        else:
            assert ahead is None   # the step in flight samples the last token
        assert peers.plan(timeout=0.05) is None, "a third plan while two are unanswered"
        peers.answer(plans.pop(0))
        tokens += 1
        if tokens == PARAMS.max_tokens:
            break
    outputs = peers.outputs(lambda got: any(o.finished for o in got))
    assert [t for o in outputs for t in o.new_token_ids] == \
        peers.batch.held[0].tokens[3:3 + PARAMS.max_tokens]
    assert outputs[-1].finish_reason == "length"


@pytest.mark.parametrize("peers", [("--no-async-scheduling",)], indirect=True)
def test_serial_mode_waits_for_each_result(peers):
    plan = _add(peers, "a")
    for _ in range(3):
        assert peers.plan(timeout=0.3) is None, "a plan before the result"
        peers.answer(plan)
        plan = peers.plan()
        assert plan.running_handles == [0]


@pytest.mark.parametrize("peers", [()], indirect=True)
def test_an_error_for_the_plan_ahead_of_a_failed_one_fails_nothing_new(peers):
    first = _add(peers, "a")
    ahead = peers.plan()
    assert ahead is not None
    peers.executor.send(m.encode_executor_error(first.step_id, "RuntimeError: boom"))
    failed = peers.outputs(lambda got: any(o.finished for o in got))
    assert failed[-1].finish_reason == "error" and "boom" in failed[-1].error
    plan = _add(peers, "b")        # a request that arrives after the failure ...
    peers.executor.send(m.encode_executor_error(ahead.step_id, "RuntimeError: boom"))
    peers.batch = NullBatch(block_size=16, vocab_size=1000)   # the failed state is gone
    while plan is not None:        # ... runs to its end: the late error was dropped
        if plan.new_requests or plan.running_handles:
            peers.answer(plan)
        plan = peers.plan(timeout=1.0)
    outputs = peers.outputs(lambda got: any(o.finished for o in got))
    assert [o.request_id for o in outputs] == ["b"] * PARAMS.max_tokens
    assert outputs[-1].finish_reason == "length"
