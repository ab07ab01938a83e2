"""Stop conditions checked after each sampled token."""

from __future__ import annotations

from scheduler.request import Request
from shared.outputs import FinishReason


def finish_reason_after_token(request: Request, token_id: int, eos_token_ids: tuple[int, ...],
                              max_request_len: int) -> str | None:
    params = request.sampling
    num_output = len(request.output_token_ids)
    if num_output > params.min_tokens and (
            (token_id in eos_token_ids and not params.ignore_eos)
            or token_id in params.stop_token_ids):
        return FinishReason.STOP
    if params.max_tokens is not None and num_output >= params.max_tokens:
        return FinishReason.LENGTH
    if len(request.prompt_token_ids) + num_output >= max_request_len:
        return FinishReason.LENGTH
    return None
