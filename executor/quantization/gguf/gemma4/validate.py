"""A Gemma 4 GGUF file's header checked before GGUFReader reads it (no torch import): the
counts its config takes bounded, its per-layer arrays one item a layer, every tensor one
Folio has a place for, in layers blk.0 to blk.{block_count - 1}. What needs the arrays'
values (each layer's kind, heads and shapes) is checked by gemma4/config.py once the file
is read."""

from __future__ import annotations

from folio.executor.quantization.gguf.header import (
    ARRAY, INTEGERS, GgufFormatError, GgufHeader)
from folio.executor.quantization.gguf.metadata_checks import (
    MAX_CONTEXT, check_embedding, check_floats, check_tokenizer, count, entry, span)
from folio.executor.quantization.gguf.gemma4.names import (CONFIG_TENSORS, gemma4_hf_name,
                                                            layer_part)

_BOOL = 7


def check_gemma4_header(header: GgufHeader, arch: str) -> None:
    need = {key: count(header, f"{arch}.{key}", required=True) for key in (
        "block_count", "embedding_length", "attention.head_count", "attention.key_length",
        "attention.key_length_swa")}
    count(header, f"{arch}.context_length", required=True, limit=MAX_CONTEXT)
    count(header, f"{arch}.attention.sliding_window", required=True, limit=MAX_CONTEXT)
    layers = need["block_count"]
    for key in ("attention.key_length", "attention.key_length_swa"):
        if need[key] % 2:   # rotary embeddings pair each head's dimensions
            raise GgufFormatError(f"metadata {arch}.{key}: the head dimension "
                                  f"({need[key]}) must be even")
    for key in ("attention.head_count_kv", "feed_forward_length"):
        _count_or_array(header, f"{arch}.{key}", layers)
    pattern = entry(header, f"{arch}.attention.sliding_window_pattern", frozenset({ARRAY}),
                    "an array", True)
    if pattern.item_type != _BOOL or pattern.count != layers:
        raise GgufFormatError(f"metadata {arch}.attention.sliding_window_pattern must list "
                              f"{layers} bools (one a layer)")
    shared = entry(header, f"{arch}.attention.shared_kv_layers", INTEGERS, "an integer",
                   False) or 0
    if not 0 <= shared < layers:
        raise GgufFormatError(f"metadata {arch}.attention.shared_kv_layers is {shared}: it "
                              f"must leave some of the {layers} layers keeping a KV cache")
    per_layer = entry(header, f"{arch}.embedding_length_per_layer_input", INTEGERS,
                      "an integer", False) or 0
    if per_layer:
        count(header, f"{arch}.embedding_length_per_layer_input", True)
    tensors = {tensor.name: tensor for tensor in header.tensors}
    if "blk.0.ffn_gate_inp.weight" in tensors:   # the MoE block
        for key in ("expert_count", "expert_used_count"):
            count(header, f"{arch}.{key}", required=True)
        _count_or_array(header, f"{arch}.expert_feed_forward_length", layers)
    vocab = check_embedding(tensors, need["embedding_length"])
    check_floats(header, arch)
    check_tokenizer(header, vocab)
    found = set()
    for name in tensors:
        if name.endswith(".attn_qkv.weight"):
            raise GgufFormatError(f"GGUF tensor {name!r}: fused q/k/v (the converter's "
                                  "--fuse-qkv) is not read for gemma4")
        if gemma4_hf_name(name) is None and name not in CONFIG_TENSORS:
            raise GgufFormatError(f"GGUF tensor {name!r} has no place in Folio's {arch}")
        part = layer_part(name)
        if part is not None:
            found.add(part[0])
    if sorted(found) != list(range(layers)):
        raise GgufFormatError(f"metadata {arch}.block_count is {layers} but the tensors "
                              f"hold layers {span(sorted(found))}")


def _count_or_array(header: GgufHeader, key: str, layers: int) -> None:
    value = entry(header, key, INTEGERS | frozenset({ARRAY}), "an integer or an array", True)
    if hasattr(value, "count"):
        if value.count != layers or value.item_type not in INTEGERS:
            raise GgufFormatError(f"metadata {key} must list {layers} integers (one a layer)")
    else:
        count(header, key, True)
