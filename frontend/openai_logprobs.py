"""Log-probabilities in the legacy completions shape: tokens, token_logprobs, top_logprobs
and text_offset, the prompt's first (echo) and then the generated tokens'."""

from __future__ import annotations

from typing import Any

_FLOOR = -9999.0   # what OpenAI and vLLM send for -inf (JSON has no infinity)


def _value(logprob: float) -> float:
    return max(logprob, _FLOOR)


def _top(entry: dict[str, Any]) -> dict[str, float]:
    """The k most likely tokens, plus the chosen one when it is not among them (so a
    dict has k or k + 1 entries, as OpenAI's and vLLM's do)."""
    top = {text: _value(lp) for token_id, lp, text in entry["top"]}
    if all(token_id != entry["token_id"] for token_id, _, _ in entry["top"]):
        top.setdefault(entry["decoded_token"], _value(entry["logprob"]))
    return top


def completion_logprobs(entries: list[dict[str, Any]], offset: int = 0,
                        first_token: str | None = None) -> dict[str, Any]:
    """`first_token`: the echoed prompt's first token, which has no log-probability (null
    in token_logprobs and top_logprobs); `entries` are the rest, prompt then output.
    text_offset counts characters of the tokens as listed, from `offset`."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top: list[dict[str, float] | None] = []
    if first_token is not None:
        tokens.append(first_token)
        token_logprobs.append(None)
        top.append(None)
    for entry in entries:
        tokens.append(entry["decoded_token"])
        token_logprobs.append(_value(entry["logprob"]))
        top.append(_top(entry))
    offsets = []
    position = offset
    for token in tokens:
        offsets.append(position)
        position += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top,
            "text_offset": offsets}
