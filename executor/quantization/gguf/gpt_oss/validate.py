"""A gpt-oss GGUF file's header checked before GGUFReader reads it (no torch import), as
gguf/validate.py checks the llama family's: the counts positive and bounded, the experts'
top-k within their count, every tensor with a place, the layers blk.0 to blk.N-1 each
holding every tensor llama.cpp's gpt-oss loader requires (norms, biased q/k/v/o, sinks,
the biased router and experts), each the shape the metadata gives it, and MXFP4 only on
the experts' weights (where the converter repacks the checkpoint's blocks)."""

from __future__ import annotations

from folio.executor.quantization.gguf.gpt_oss.names import (
    LAYER, LAYER_NEEDS, gpt_oss_hf_name, mxfp4_allowed)
from folio.executor.quantization.gguf.header import (
    ARRAY, INTEGERS, GgufFormatError, GgufHeader, GgufTensorInfo)
from folio.executor.quantization.gguf.metadata_checks import (
    MAX_CONTEXT, check_embedding, check_floats, check_tokenizer, count, entry, positive_float,
    span)

_COUNTS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
           "attention.key_length", "expert_count", "expert_used_count",
           "expert_feed_forward_length")
_BOOL = 7


def check_gpt_oss_header(header: GgufHeader, arch: str) -> None:
    dims = {key: count(header, f"{arch}.{key}", required=True) for key in _COUNTS}
    dims["head_count_kv"] = (count(header, f"{arch}.attention.head_count_kv", False)
                             or dims["attention.head_count"])
    count(header, f"{arch}.context_length", required=True, limit=MAX_CONTEXT)
    count(header, f"{arch}.attention.sliding_window", required=True, limit=MAX_CONTEXT)
    _check_counts(header, arch, dims)
    tensors = {tensor.name: tensor for tensor in header.tensors}
    for name, tensor in tensors.items():
        if gpt_oss_hf_name(name) is None:
            raise GgufFormatError(f"GGUF tensor {name!r} has no place in Folio's {arch}")
        if tensor.type_name == "MXFP4" and not mxfp4_allowed(name):
            raise GgufFormatError(f"tensor {name} is MXFP4: Folio reads MXFP4 only in "
                                  "gpt-oss's expert weights (ffn_{gate,up,down}_exps)")
    vocab = check_embedding(tensors, dims["embedding_length"])
    check_floats(header, arch)
    for key in ("beta_fast", "beta_slow", "attn_factor"):
        positive_float(header, f"{arch}.rope.scaling.yarn_{key}")
    check_tokenizer(header, vocab)
    _check_layers(tensors, arch, dims["block_count"])
    _check_shapes(tensors, dims, vocab)


def _check_counts(header: GgufHeader, arch: str, dims: dict[str, int]) -> None:
    heads, kv_heads = dims["attention.head_count"], dims["head_count_kv"]
    if heads % kv_heads:
        raise GgufFormatError(f"metadata {arch}.attention.head_count ({heads}) is not a "
                              f"multiple of {arch}.attention.head_count_kv ({kv_heads})")
    if dims["attention.key_length"] % 2:   # rotary embeddings pair each head's dimensions
        raise GgufFormatError(f"metadata {arch}.attention.key_length: the head dimension "
                              f"({dims['attention.key_length']}) must be even")
    if dims["expert_used_count"] > dims["expert_count"]:
        raise GgufFormatError(f"metadata {arch}.expert_used_count "
                              f"({dims['expert_used_count']}) is more than "
                              f"{arch}.expert_count ({dims['expert_count']})")
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = entry(header, key, INTEGERS | frozenset({ARRAY}), "an array or an integer",
                    False)
    if isinstance(pattern, int) and not 0 <= pattern <= dims["block_count"]:
        raise GgufFormatError(f"metadata {key} is {pattern}: a period from 0 to "
                              f"{dims['block_count']}")
    if pattern is not None and not isinstance(pattern, int) and (
            pattern.item_type != _BOOL or pattern.count != dims["block_count"]):
        raise GgufFormatError(f"metadata {key} must list {dims['block_count']} bools "
                              "(one a layer)")


def _check_layers(tensors: dict[str, GgufTensorInfo], arch: str, block_count: int) -> None:
    layers: dict[int, set[str]] = {}
    for name in tensors:
        match = LAYER.match(name)
        if match is not None:
            layers.setdefault(int(match.group(1)), set()).add(match.group(2))
    if sorted(layers) != list(range(block_count)):
        raise GgufFormatError(f"metadata {arch}.block_count is {block_count} but the "
                              f"tensors hold layers {span(sorted(layers))}")
    for layer, names in sorted(layers.items()):
        for need in LAYER_NEEDS:
            if need not in names:
                raise GgufFormatError(f"the GGUF file has no blk.{layer}.{need}")
    for name in ("output_norm.weight", "output.weight"):
        if name not in tensors:   # llama.cpp's gpt-oss loader requires both
            raise GgufFormatError(f"the GGUF file has no {name}")


def _check_shapes(tensors: dict[str, GgufTensorInfo], dims: dict[str, int],
                  vocab: int) -> None:
    """GGUF shapes, innermost first."""
    hidden, head = dims["embedding_length"], dims["attention.key_length"]
    q_rows = dims["attention.head_count"] * head
    kv_rows = dims["head_count_kv"] * head
    experts, inter = dims["expert_count"], dims["expert_feed_forward_length"]
    shapes = {"attn_norm.weight": (hidden,), "post_attention_norm.weight": (hidden,),
              "attn_q.weight": (hidden, q_rows), "attn_q.bias": (q_rows,),
              "attn_k.weight": (hidden, kv_rows), "attn_k.bias": (kv_rows,),
              "attn_v.weight": (hidden, kv_rows), "attn_v.bias": (kv_rows,),
              "attn_output.weight": (q_rows, hidden), "attn_output.bias": (hidden,),
              "attn_sinks.weight": (dims["attention.head_count"],),
              "ffn_gate_inp.weight": (hidden, experts), "ffn_gate_inp.bias": (experts,),
              "ffn_gate_exps.weight": (hidden, inter, experts),
              "ffn_up_exps.weight": (hidden, inter, experts),
              "ffn_gate_exps.bias": (inter, experts), "ffn_up_exps.bias": (inter, experts),
              "ffn_down_exps.weight": (inter, hidden, experts),
              "ffn_down_exps.bias": (hidden, experts)}
    global_shapes = {"output_norm.weight": (hidden,), "output.weight": (hidden, vocab)}
    for name, tensor in tensors.items():
        match = LAYER.match(name)
        expected = global_shapes.get(name) if match is None else shapes.get(match.group(2))
        if expected is not None and tensor.dims != expected:
            raise GgufFormatError(f"tensor {name} has shape {list(tensor.dims)}; the "
                                  f"metadata gives {list(expected)}")
