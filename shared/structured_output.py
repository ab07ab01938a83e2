"""Structured-output specs (vLLM's `structured_outputs` keys) and the llguidance grammar each
one compiles to.

A spec is a one-key mapping that travels inside SamplingParams:
    {"json": <JSON schema, an object or its text>}   output validates against the schema
    {"json_object": true}                              any JSON object
    {"regex": <pattern>}                               output matches the pattern (fully)
    {"choice": [<string>, ...]}                        output is exactly one of the strings
    {"grammar": <Lark or GBNF text>}                   output is in the grammar's language

The frontend compiles a spec once to refuse a bad one (400 naming the field); the executor
compiles it again, once per distinct spec, to build its token matchers. Both use
`to_grammar`, so they agree on what a spec means.

JSON is always compact: no whitespace between tokens (llguidance's `whitespace_flexible`
off, forced over any `x-guidance` in the schema); an object schema that lists `properties`
and says nothing of `additionalProperties` admits no other keys (as xgrammar's strict mode,
vLLM's default, does). Free whitespace lets a random-weight
model spend hundreds of tokens on newlines before the first key; llguidance's JSON strings
never admit raw control characters, so every result parses with a strict `json.loads`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "json_object", "regex", "choice", "grammar")
MAX_SPEC_CHARS = 65_536    # the spec as JSON text: bounds what a plan carries per request
MAX_CHOICES = 1024


@dataclass(frozen=True)
class GrammarBudget:
    """What one constrained request may cost, the same in the frontend (admission) and the
    executor (every step). llguidance's own limits bound the work deterministically: a
    grammar past them errs (at admission: refused; later: that request fails alone). The
    CPU-time budgets catch what is costly yet within them (`a{10000}`: 2.5 ms per token on
    the 4k-token vocabulary, against 0.02-0.8 ms for real JSON schemas; docs/benchmarks.md)."""

    initial_lexer_fuel: int = 400_000    # regex building; llguidance's default 1,000,000
    step_lexer_fuel: int = 50_000        # per token mask; default 200,000 (~14 ms)
    step_max_items: int = 20_000         # Earley items per mask; default 50,000
    max_lexer_states: int = 50_000       # default 250,000 (1-2 kB each)
    max_grammar_size: int = 200_000      # symbols; default 500,000
    max_compile_ms: float = 1000.0       # CPU: building the matcher at admission
    max_first_mask_ms: float = 50.0      # CPU: the first mask builds the lexer lazily
    max_mask_ms: float = 1.0             # CPU: mean per later token (admission walk, executor)
    walk_tokens: int = 8                 # masks the admission walk measures after the first


def parser_limits(budget: GrammarBudget) -> Any:
    from llguidance import LLParserLimits

    return LLParserLimits(
        initial_lexer_fuel=budget.initial_lexer_fuel, step_lexer_fuel=budget.step_lexer_fuel,
        step_max_items=budget.step_max_items, max_lexer_states=budget.max_lexer_states,
        max_grammar_size=budget.max_grammar_size, verbose_errors=False)


def matcher_error(text: str) -> str:
    """llguidance's error, first line only (the rest is parser state): for a client."""
    line = (text or "").strip().split("\n", 1)[0]
    if line == "NoExtensionBias" or not line:
        # What llguidance says when no text at all can follow: an empty language (a
        # regex like [^\s\S]) or a schema that only refers to itself ($ref cycle).
        return "the grammar matches no output at all (an empty language, or a $ref cycle)"
    return "the grammar cannot be served: " + line[:300]
# Forced over the schema's own "x-guidance" options: compact, bounded output.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


def check_spec(spec: Any) -> dict[str, Any] | None:
    """The spec's shape (one known key, values of the right types, bounded size); the
    grammar itself is checked by `grammar_error`. Raises ValueError / TypeError."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or len(spec) != 1:
        raise TypeError("structured_output must be a mapping with exactly one of "
                        f"{', '.join(KINDS)}")
    (kind, value), = spec.items()
    if kind not in KINDS:
        raise ValueError(f"structured_output has unknown kind {kind!r}; expected one of "
                         f"{', '.join(KINDS)}")
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as error:
                raise ValueError(f"structured_output json schema is not valid JSON: "
                                 f"{error}") from None
        if not isinstance(value, (dict, bool)):
            raise TypeError("structured_output json must be a JSON schema (an object)")
    elif kind == "json_object":
        if value is not True:
            raise ValueError("structured_output json_object must be true")
    elif kind == "choice":
        if (not isinstance(value, (list, tuple)) or not value or len(value) > MAX_CHOICES
                or not all(isinstance(c, str) and c for c in value)):
            raise ValueError(f"structured_output choice must be a list of 1 to {MAX_CHOICES} "
                             "non-empty strings")
        value = list(value)
    elif not isinstance(value, str) or not value:
        raise TypeError(f"structured_output {kind} must be a non-empty string")
    if len(json.dumps(value)) > MAX_SPEC_CHARS:
        raise ValueError(f"structured_output {kind} is longer than {MAX_SPEC_CHARS} "
                         "characters")
    return {kind: value}


def compact_schema(schema: dict[str, Any] | bool) -> dict[str, Any] | bool:
    """The schema with Folio's compact-JSON options forced over its own, and objects that
    list their properties closed to others unless they say otherwise."""
    if not isinstance(schema, dict):
        return schema
    schema = _closed(schema)
    return {**schema, "x-guidance": {**schema.get("x-guidance", {}), **_JSON_OPTIONS}}


_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")   # not allOf: its parts combine
_SUBSCHEMAS = ("items", "additionalProperties", "not", "contains", "if", "then", "else")


def _closed(schema: Any) -> Any:
    """`additionalProperties: false` on every object schema with `properties` and no
    `additionalProperties` of its own: what xgrammar's strict mode (vLLM's default backend)
    and OpenAI's strict schemas do. Without it a model may add keys of its own, and a
    random one fills them until max_tokens."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(sub) for sub in out[key]]
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key])
    if "properties" in out and "additionalProperties" not in out \
            and "patternProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out


def to_grammar(spec: dict[str, Any]) -> str:
    """The llguidance grammar (its JSON text) of a spec checked by `check_spec`."""
    from llguidance import LLMatcher

    (kind, value), = spec.items()
    if kind == "json":
        return LLMatcher.grammar_from_json_schema(compact_schema(value),
                                                  overrides=_JSON_OPTIONS)
    if kind == "json_object":
        return LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=_JSON_OPTIONS)
    if kind == "regex":
        return LLMatcher.grammar_from_regex(value)
    if kind == "choice":
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c)
                                                                  for c in value))
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(value)   # GBNF (llama.cpp's) becomes Lark; Lark stays as it is
    except Exception as error:   # its converter raises several types for bad text
        raise ValueError(f"grammar is neither Lark nor GBNF: {error}") from None
    return LLMatcher.grammar_from_lark(lark)


def grammar_error(spec: dict[str, Any], budget: GrammarBudget = GrammarBudget()
                  ) -> str | None:
    """Why the spec's grammar cannot be compiled, or None when it can (without a tokenizer:
    its cost is measured by frontend/structured_output_admission.py and by the executor)."""
    return checked_grammar(spec, budget)[1]


def checked_grammar(spec: dict[str, Any], budget: GrammarBudget
                    ) -> tuple[str, None] | tuple[None, str]:
    """(the spec's llguidance grammar, None), or (None, why it cannot be compiled)."""
    from llguidance import LLMatcher

    try:
        grammar = to_grammar(spec)
    except ValueError as error:
        return None, str(error)
    is_error, messages = LLMatcher.validate_grammar_with_warnings(
        grammar, limits=parser_limits(budget))
    return (None, messages[0]) if is_error else (grammar, None)
