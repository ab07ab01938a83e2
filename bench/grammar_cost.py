"""Grammar libraries on CPU: compile time, per-token mask cost, and the two correctness points
of issue 15 (no raw control characters inside JSON strings; bounded whitespace).

    .venv/bin/python bench/grammar_cost.py --tokenizer folio/default_model/weights \
        --tokenizer /tmp/tok32k --walks 20

For each library and tokenizer: the time to compile a nested JSON schema (cold, then the
library's cache if it has one), the mean time to compute one token mask while a compact
instance is fed token by token (mask, then consume), and `--walks` random walks that pick
a uniformly random allowed token at every step (what a random-weight model does, at worst):
how many tokens they need to finish, whether every result parses with `json.loads`
(strict: raw control characters refused) and validates against the schema, and whether a
raw control character (any token decoding to one below U+0020) is allowed right after
an opening quote.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

import torch

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {"type": "object", "properties": {
            "street": {"type": "string", "maxLength": 24},
            "city": {"type": "string", "maxLength": 24},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                 "maxItems": 4},
        "scores": {"type": "array", "items": {"type": "object", "properties": {
            "subject": {"type": "string", "maxLength": 12},
            "value": {"type": "number"}}, "required": ["subject", "value"],
            "additionalProperties": False}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "address", "tags", "scores", "active"],
    "additionalProperties": False,
}
INSTANCE = {"name": "Ada Lovelace", "age": 36, "role": "admin",
            "address": {"street": "12 St James Square", "city": "London", "zip": "10001"},
            "tags": ["math", "poetry"], "scores": [{"subject": "analysis", "value": 9.5}],
            "active": True}


class Llguidance:
    name = "llguidance"
    prefix = '{"name":"'     # compact separators, as configured below

    def __init__(self, hf_tokenizer, vocab: int, flexible: bool = False) -> None:
        import llguidance
        import llguidance.hf

        self.flexible = flexible
        self.ll = llguidance
        self.vocab = vocab
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab)
        self.cache: dict[str, Any] = {}

    def compile(self, schema: dict[str, Any], cached: bool):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": self.flexible})
        if cached and grammar in self.cache:
            return self.cache[grammar].deep_copy()
        matcher = self.ll.LLMatcher(self.tokenizer, grammar)
        assert not matcher.is_error(), matcher.get_error()
        self.cache[grammar] = matcher
        return matcher.deep_copy()

    def new_mask(self) -> torch.Tensor:
        return torch.full((1, (self.vocab + 31) // 32), -1, dtype=torch.int32)

    def fill(self, matcher, mask: torch.Tensor) -> None:
        matcher.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_stopped()


class Xgrammar:
    name = "xgrammar"
    prefix = '{"name": "'    # its any_whitespace=False separators

    def __init__(self, hf_tokenizer, vocab: int, flexible: bool = False) -> None:
        import xgrammar

        self.flexible = flexible
        self.xgr = xgrammar
        self.vocab = vocab
        info = xgrammar.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1,
                                                 cache_enabled=True)

    def compile(self, schema: dict[str, Any], cached: bool):
        if not cached:
            self.compiler.clear_cache()
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=self.flexible,
                                                     strict_mode=True)
        return self.xgr.GrammarMatcher(compiled)

    def new_mask(self) -> torch.Tensor:
        return self.xgr.allocate_token_bitmask(1, self.vocab)

    def fill(self, matcher, mask: torch.Tensor) -> None:
        matcher.fill_next_token_bitmask(mask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_terminated()


def allowed(mask: torch.Tensor, vocab: int) -> list[int]:
    bits = (mask[0].to(torch.int64)[:, None] >> torch.arange(32)) & 1
    return [t for t in torch.nonzero(bits.flatten()[:vocab]).flatten().tolist()]


def measure(lib, hf_tokenizer, walks: int, seed: int) -> dict[str, Any]:
    import jsonschema

    start = time.perf_counter()
    lib.compile(SCHEMA, cached=False)
    cold_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    lib.compile(SCHEMA, cached=True)
    cached_ms = (time.perf_counter() - start) * 1e3

    # Per-token mask cost along a compact instance.
    separators = (",", ":") if lib.prefix == '{"name":"' else (", ", ": ")
    if lib.flexible:
        separators = (", ", ": ")
    ids = hf_tokenizer.encode(json.dumps(INSTANCE, separators=separators),
                              add_special_tokens=False)
    matcher, mask = lib.compile(SCHEMA, cached=True), lib.new_mask()
    times = []
    for token in ids:
        start = time.perf_counter()
        lib.fill(matcher, mask)
        times.append((time.perf_counter() - start) * 1e6)
        if not lib.accept(matcher, token):
            break   # a library wanting other separators stops the walk here
    mask_us = statistics.mean(times)

    # Is a raw control character allowed right after the opening quote of "name"?
    matcher = lib.compile(SCHEMA, cached=True)
    control_ids = {i for i in range(lib.vocab)
                   if any(ord(c) < 0x20 for c in hf_tokenizer.decode([i]))}
    prefix = hf_tokenizer.encode(lib.prefix, add_special_tokens=False)
    for token in prefix:
        lib.fill(matcher, mask)
        lib.accept(matcher, token)
    lib.fill(matcher, mask)
    control_allowed = bool(control_ids & set(allowed(mask, lib.vocab)))

    rng = random.Random(seed)
    lengths, parsed, valid, walk_us = [], 0, 0, []
    eos = hf_tokenizer.eos_token_id
    for _ in range(walks):
        matcher, out = lib.compile(SCHEMA, cached=True), []
        while not lib.done(matcher) and len(out) < 2000:
            start = time.perf_counter()
            lib.fill(matcher, mask)
            walk_us.append((time.perf_counter() - start) * 1e6)
            token = rng.choice(allowed(mask, lib.vocab))
            lib.accept(matcher, token)
            if token == eos:
                break
            out.append(token)
        lengths.append(len(out))
        text = hf_tokenizer.decode(out)
        try:
            value = json.loads(text)
            parsed += 1
            jsonschema.validate(value, SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    return {"library": lib.name, "vocab": lib.vocab, "compile_ms": round(cold_ms, 1),
            "compile_cached_ms": round(cached_ms, 2), "mask_us_instance": round(mask_us, 1),
            "mask_us_random_walk": round(statistics.mean(walk_us), 1),
            "control_char_allowed_in_string": control_allowed,
            "walks": walks, "walk_tokens_median": statistics.median(lengths),
            "walk_tokens_max": max(lengths), "walks_json_loads_ok": parsed,
            "walks_schema_valid": valid}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", action="append", required=True,
                        help="a Hugging Face tokenizer directory (repeatable)")
    parser.add_argument("--walks", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--library", action="append", choices=("llguidance", "xgrammar"))
    parser.add_argument("--whitespace", choices=("compact", "flexible"), default="compact",
                        help="flexible: each library's free-whitespace JSON (the default of "
                        "both), to see what it costs a random walk")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    for path in args.tokenizer:
        hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
        vocab = len(hf)
        for cls in (Llguidance, Xgrammar):
            if args.library and cls.name not in args.library:
                continue
            lib = cls(hf, vocab, flexible=args.whitespace == "flexible")
            print(json.dumps({"tokenizer": path, "whitespace": args.whitespace,
                              **measure(lib, hf, args.walks, args.seed)}), flush=True)


if __name__ == "__main__":
    main()
