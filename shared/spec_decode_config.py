"""`--speculative-config`: a JSON object in vLLM's spirit, parsed once into a frozen value
that the scheduler (how many drafts a step may carry, the policy) and the executor (the
proposer's settings) both read. docs/spec_decode.md has the design."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "suffix")
CACHE_SCOPES = ("client", "shared")
MAX_SPECULATIVE_TOKENS = 32
# The global cache holds this many outputs at most (each its first 1024 tokens, one array:
# a query scans it, so it stays small; executor/spec_decode/suffix.py).
MAX_CACHED_REQUESTS = 1024


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 4        # k: drafts per request and step at most
    prompt_lookup_max: int = 4             # n-gram lengths tried, longest first
    prompt_lookup_min: int = 2
    # "suffix" (executor/spec_decode/suffix.py; names after vLLM's): the longest context
    # suffix matched, drafts at most factor x the match length, the least estimated
    # probability of a drafted path, the shortest match that proposes, and the outputs of
    # how many finished requests are searched too (0: only the request's own tokens).
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    suffix_decoding_min_match_len: int = 2
    suffix_decoding_max_cached_requests: int = 0
    # Whose outputs a request's drafts may come from: "client" (each client's own: a client
    # cannot learn from its draft speed what another sent) or "shared" (everyone's: more
    # matches, and that side channel). Folio's own key; vLLM has no tenants.
    suffix_decoding_cache_scope: str = "client"
    # Policy (docs/spec_decode.md): no drafts in a step with more running requests than
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
    problem = _integers_below(config, 1, (
        "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "max_running",
        "acceptance_window", "suffix_decoding_max_tree_depth", "suffix_decoding_min_match_len"))
    problem = problem or _integers_below(config, 0, ("cooldown_steps",
                                                     "suffix_decoding_max_cached_requests"))
    if problem:
        return problem
    if config.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
        return (f"num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS}, got "
                f"{config.num_speculative_tokens}")
    if config.prompt_lookup_min > config.prompt_lookup_max:
        return "prompt_lookup_min must be <= prompt_lookup_max"
    if config.suffix_decoding_cache_scope not in CACHE_SCOPES:
        return (f"suffix_decoding_cache_scope must be one of {', '.join(CACHE_SCOPES)}; got "
                f"{config.suffix_decoding_cache_scope!r}")
    if config.suffix_decoding_max_cached_requests > MAX_CACHED_REQUESTS:
        return (f"suffix_decoding_max_cached_requests must be at most {MAX_CACHED_REQUESTS}"
                f", got {config.suffix_decoding_max_cached_requests}")
    value = config.suffix_decoding_max_spec_factor
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        return f"suffix_decoding_max_spec_factor must be a number > 0, got {value!r}"
    value = config.suffix_decoding_min_token_prob
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        return f"suffix_decoding_min_token_prob must be in [0, 1], got {value!r}"
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


def _integers_below(config, least: int, names: tuple[str, ...]) -> str | None:
    """The first of `names` that is not an integer >= least, said in one line."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            return f"{name} must be an integer >= {least}, got {value!r}"
    return None
