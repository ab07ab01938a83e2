"""Checks of a GGUF file's metadata that every family's header check shares (no torch
import): typed entries, bounded counts, finite positive floats, the embedding's vocabulary
and the tokenizer's ids inside it. gguf/validate.py and gguf/hybrid/validate.py use them."""

from __future__ import annotations

import math

from folio.executor.quantization.gguf.header import (
    ARRAY, FLOATS, INTEGERS, STRING, GgufFormatError, GgufHeader, GgufTensorInfo)

# The rotary cache is [context, head_dim] floats, built at start: 2**20 positions is past
# every served llama/qwen file (Qwen2.5-1M: 1,010,000) and a few hundred MB at most.
MAX_CONTEXT = 2**20
MAX_DIM = 2**20               # any width or count the config takes
_TOKENIZER_ARRAYS = ("tokenizer.ggml.token_type", "tokenizer.ggml.scores")


def entry(header: GgufHeader, key: str, kinds: frozenset[int], what: str,
           required: bool):
    found = header.metadata.get(key)
    if found is None:
        if required:
            raise GgufFormatError(f"the GGUF metadata lacks {key}")
        return None
    if found.type not in kinds:
        raise GgufFormatError(f"metadata {key} must be {what} (it is of GGUF type "
                              f"{found.type})")
    return found.value


def string(header: GgufHeader, key: str, required: bool = False) -> str | None:
    return entry(header, key, frozenset({STRING}), "a string", required)


def count(header: GgufHeader, key: str, required: bool, limit: int = MAX_DIM) -> int | None:
    value = entry(header, key, INTEGERS, "an integer", required)
    if value is not None and not 1 <= value <= limit:
        raise GgufFormatError(f"metadata {key} is {value}: it must be from 1 to {limit}")
    return value


def positive_float(header: GgufHeader, key: str, required: bool = False) -> None:
    value = entry(header, key, FLOATS | INTEGERS, "a number", required)
    if value is not None and not (math.isfinite(value) and value > 0):
        raise GgufFormatError(f"metadata {key} is {value}: it must be a finite positive "
                              "number")


def check_floats(header: GgufHeader, arch: str) -> None:
    positive_float(header, f"{arch}.attention.layer_norm_rms_epsilon", required=True)
    positive_float(header, f"{arch}.rope.freq_base")
    positive_float(header, f"{arch}.rope.scaling.factor")
    positive_float(header, f"{arch}.rope.freq_base_swa")
    positive_float(header, f"{arch}.attn_logit_softcapping")
    positive_float(header, f"{arch}.final_logit_softcapping")
    string(header, f"{arch}.rope.scaling.type")


def check_embedding(tensors: dict[str, GgufTensorInfo], hidden: int) -> int:
    """The vocabulary size token_embd.weight gives ([hidden, vocab], innermost first)."""
    embed = tensors.get("token_embd.weight")
    if embed is None:
        raise GgufFormatError("the GGUF file has no token_embd.weight")
    if len(embed.dims) != 2 or embed.dims[0] != hidden:
        raise GgufFormatError(f"tensor token_embd.weight has shape {list(embed.dims)}; the "
                              f"metadata's embedding_length gives [{hidden}, vocab]")
    return embed.dims[1]


def check_tokenizer(header: GgufHeader, vocab: int) -> None:
    """Token ids inside the embedding (and the token list); the per-token arrays as long as
    the token list."""
    tokens = entry(header, "tokenizer.ggml.tokens", frozenset({ARRAY}), "an array", False)
    limit = vocab
    if tokens is not None:
        if tokens.item_type != STRING or not 1 <= tokens.count <= vocab:
            raise GgufFormatError(f"metadata tokenizer.ggml.tokens must list 1 to {vocab} "
                                  f"strings (token_embd.weight's rows)")
        limit = tokens.count
        for key in _TOKENIZER_ARRAYS:
            other = entry(header, key, frozenset({ARRAY}), "an array", False)
            if other is not None and other.count != tokens.count:
                raise GgufFormatError(f"metadata {key} has {other.count} items for "
                                      f"{tokens.count} tokens")
    for key in header.metadata:
        if key.startswith("tokenizer.ggml.") and key.endswith("_token_id"):
            token = entry(header, key, INTEGERS, "an integer", True)
            if not 0 <= token < limit:
                raise GgufFormatError(f"metadata {key} is {token}, outside the vocabulary "
                                      f"(0 to {limit - 1})")


def span(layers: list[int]) -> str:
    if not layers:
        return "none"
    return f"blk.{layers[0]} to blk.{layers[-1]} ({len(layers)} of them)"
