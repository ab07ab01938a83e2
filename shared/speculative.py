"""`--speculative-config`: a JSON object in vLLM's spirit, parsed once into a frozen value
that the scheduler (how many drafts a step may carry, the policy) and the executor (the
proposer's settings) both read. docs/speculative.md has the design."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram",)
MAX_SPECULATIVE_TOKENS = 32


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4        # k: drafts per request and step at most
    prompt_lookup_max: int = 4             # n-gram lengths tried, longest first
    prompt_lookup_min: int = 2
    # Policy (docs/speculative.md): no drafts in a step with more running requests than
    # this (a large batch is compute-bound, verifying drafts would cost the crowd) ...
    max_running: int = 4
    # ... and a request whose acceptance over its last `acceptance_window` drafts falls
    # below this stops proposing for `cooldown_steps` steps, then tries again.
    min_acceptance: float = 0.1
    acceptance_window: int = 32
    cooldown_steps: int = 64

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            raise ValueError(f"speculative_config {problem}")


def _problem(config: SpeculativeConfig) -> str | None:
    if config.method not in METHODS:
        return f"method must be one of {', '.join(METHODS)}; got {config.method!r}"
    for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                 "max_running", "acceptance_window"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"{name} must be an integer >= 1, got {value!r}"
    if config.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
        return (f"num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS}, got "
                f"{config.num_speculative_tokens}")
    if config.prompt_lookup_min > config.prompt_lookup_max:
        return "prompt_lookup_min must be <= prompt_lookup_max"
    if isinstance(config.cooldown_steps, bool) or not isinstance(config.cooldown_steps, int) \
            or config.cooldown_steps < 0:
        return f"cooldown_steps must be an integer >= 0, got {config.cooldown_steps!r}"
    value = config.min_acceptance
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        return f"min_acceptance must be in [0, 1], got {value!r}"
    return None


def parse_speculative_config(text: str | None) -> SpeculativeConfig | None:
    """The setting's JSON text as a config; None when unset (speculation off). A bad one
    raises ValueError naming the key."""
    if text is None or not text.strip():
        return None
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"speculative_config is not JSON: {error.msg}") from None
    if not isinstance(data, dict):
        raise ValueError("speculative_config must be a JSON object")
    known = {f.name for f in fields(SpeculativeConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"speculative_config has unknown key(s): {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(known))})")
    return SpeculativeConfig(**data)


def check_speculative_config(text: Any) -> str | None:
    """The setting's check (shared/settings.py's convention: the problem, or None)."""
    if text is None:
        return None
    if not isinstance(text, str):
        return f"must be a JSON object as text, got {type(text).__name__}"
    try:
        parse_speculative_config(text)
    except (TypeError, ValueError) as error:
        return str(error).removeprefix("speculative_config ")
    return None
