"""Stop conditions checked after each sampled token."""

from __future__ import annotations

from scheduler.request import Request
from shared.outputs import FinishReason


def stop_triggers(request: Request, eos_token_ids: tuple[int, ...],
                  max_request_len: int) -> tuple[int, frozenset[int]]:
    """What can end the request, summarised for a cheap test per token: the output count
    at which a length limit fires, and the token ids that may stop it. Only when one of
    them holds does finish_reason_after_token (the rules themselves) need to run."""
    params = request.sampling
    length_at = max_request_len - len(request.prompt_token_ids)
    if params.max_tokens is not None:
        length_at = min(length_at, params.max_tokens)
    stops = set(params.stop_token_ids)
    if not params.ignore_eos:
        stops.update(eos_token_ids)
    return length_at, frozenset(stops)


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
