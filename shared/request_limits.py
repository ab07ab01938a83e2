"""Whether a prompt and its max_tokens fit a context limit: the one wording of that refusal.

The frontend checks against max_model_len before a request leaves it; the scheduler checks
again against what it can actually hold (max_model_len, or less when the KV pool is smaller),
because it does not trust its peers. Both call these.
"""

from __future__ import annotations

from collections.abc import Sequence


def length_problem(prompt_len: int, max_tokens: int | None, limit: int | None,
                   what: str = "max_model_len", score_only: bool = False) -> str | None:
    """Why `prompt_len` tokens plus `max_tokens` cannot run under `limit` (None: they can).
    `what` names the limit in the message; `score_only` words a max_tokens=0 scoring request."""
    if limit is None:
        return None
    if prompt_len > limit:
        named = f"this model's maximum context length {what}" if what == "max_model_len" \
            else what
        return f"prompt has {prompt_len} tokens, more than {named} = {limit}"
    if max_tokens is None:
        if prompt_len >= limit:
            return (f"prompt has {prompt_len} tokens, leaving no room for a generated token "
                    f"under {what} = {limit}")
        return None
    if prompt_len + max_tokens > limit:
        if score_only:
            return (f"prompt has {prompt_len} tokens: scoring it (max_tokens 0) needs one "
                    f"position beyond the prompt, and {what} = {limit}")
        return (f"prompt ({prompt_len} tokens) plus max_tokens ({max_tokens}) is "
                f"{prompt_len + max_tokens} tokens, more than {what} = {limit}")
    return None


def ids_problem(ids: Sequence[object], vocab_size: int) -> str | None:
    """Why these prompt ids are not a prompt of this vocabulary (None: they are)."""
    if not ids:
        return "prompt must contain at least one token"
    for token_id in ids:
        if isinstance(token_id, bool) or not isinstance(token_id, int) \
                or not 0 <= token_id < vocab_size:
            return f"prompt token id {token_id!r} is outside the vocabulary [0, {vocab_size})"
    return None
