"""Failing requests at once (the executor failed or was lost, the shutdown timeout passed):
each sample still running ends with an error that says why, instead of an abort."""

from __future__ import annotations

from collections.abc import Iterable

from folio.scheduler.scheduler import Scheduler
from folio.shared.outputs import EngineOutput, FinishReason


def fail_requests(scheduler: Scheduler, request_ids: Iterable[str],
                  reason: str) -> list[EngineOutput]:
    """Abort these requests (ids as added: every sample of each) and return one ERROR
    output per sample that was still in the scheduler, after the outputs already pending
    (abort notices not yet routed): a sample aborted just before the failure still ends
    for its frontend, so its id is released, not held as in use forever."""
    pending = scheduler.take_pending_outputs()
    for request_id in request_ids:
        scheduler.abort_request(request_id)
    return pending + [EngineOutput(aborted.request_id, [], FinishReason.ERROR, reason)
                      for aborted in scheduler.take_pending_outputs()]
