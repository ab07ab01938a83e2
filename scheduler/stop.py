"""Stop conditions checked after each sampled token."""

from __future__ import annotations

from folio.scheduler.request import Request
from folio.shared.outputs import FinishReason


def stop_triggers(request: Request, eos_token_ids: tuple[int, ...],
                  max_request_len: int) -> tuple[int, frozenset[int]]:
    """What can end the request, worked out once when it arrives: the output count at
    which a length limit fires (max_tokens, or the context), and the token ids that stop
    it (stop_token_ids, and EOS unless ignore_eos). The scheduler stores them on the
    request (stop_length_at, stop_ids) for finish_reason_after_token."""
    params = request.sampling
    length_at = max_request_len - len(request.prompt_token_ids)
    if params.max_tokens is not None:
        length_at = min(length_at, params.max_tokens)
    stops = set(params.stop_token_ids)
    if not params.ignore_eos:
        stops.update(eos_token_ids)
    return length_at, frozenset(stops)


def finish_reason_after_token(request: Request, token_id: int) -> str | None:
    """Why the token just appended ends the request (a stop id once min_tokens are out,
    else a length limit), or None."""
    num_output = len(request.output_token_ids)
    if token_id in request.stop_ids and num_output > request.sampling.min_tokens:
        return FinishReason.STOP
    if num_output >= request.stop_length_at:
        return FinishReason.LENGTH
    return None
