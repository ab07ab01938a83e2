"""A GGUF file's metadata checked against its tensors before the model is built (no torch
import): every number the config takes positive and bounded, floats finite, token ids inside
the vocabulary, block_count the layers the tensors hold, every tensor the shape the config
gives it. A file that passes builds the model its metadata describes, or none is started."""

from __future__ import annotations

import re

from folio.executor.quantization.gguf.header import (
    ARRAY, GgufFormatError, GgufHeader, GgufTensorInfo)
from folio.executor.quantization.gguf.metadata_checks import (
    MAX_CONTEXT, check_embedding, check_floats, check_tokenizer, count, entry, span, string)
from folio.executor.quantization.gguf.names import CONFIG_TENSORS, hf_name

_LAYER = re.compile(r"^blk\.(\d+)\.(\w+\.(?:weight|bias))$")
_ATTENTION_MLP = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight")
_LAYER_NEEDS = {"llama": ("attn_norm.weight", "ffn_norm.weight", *_ATTENTION_MLP),
                "olmo2": ("post_attention_norm.weight", "post_ffw_norm.weight",
                          "attn_q_norm.weight", "attn_k_norm.weight", *_ATTENTION_MLP),
                "gemma": ("attn_norm.weight", "post_attention_norm.weight", "ffn_norm.weight",
                          "post_ffw_norm.weight", *_ATTENTION_MLP)}
_BOOL = 7


def check_gguf_header(header: GgufHeader, architectures) -> None:
    """GgufFormatError naming the field; an architecture not in `architectures` is left to
    config.gguf_architecture's refusal."""
    arch = string(header, "general.architecture", required=True)
    if arch not in architectures:
        return
    if architectures[arch].hybrid is not None:   # its own layers (gguf/hybrid/validate.py)
        from folio.executor.quantization.gguf.hybrid.validate import check_hybrid_header

        check_hybrid_header(header, arch, architectures[arch].hybrid)
        return
    if architectures[arch].layout == "gemma4":   # gguf/gemma4/validate.py
        from folio.executor.quantization.gguf.gemma4.validate import check_gemma4_header

        check_gemma4_header(header, arch)
        return
    layout = architectures[arch].layout
    if layout == "gpt_oss":   # its own tensors (gguf/gpt_oss/validate.py)
        from folio.executor.quantization.gguf.gpt_oss.validate import check_gpt_oss_header

        check_gpt_oss_header(header, arch)
        return
    dims = _model_dims(header, arch)
    tensors = {tensor.name: tensor for tensor in header.tensors}
    _check_names(tensors, arch, layout)
    vocab = check_embedding(tensors, dims["embedding_length"])
    check_floats(header, arch)
    check_tokenizer(header, vocab)
    _check_layers(tensors, arch, dims["block_count"], layout)
    _check_windows(header, arch, dims["block_count"])
    _check_shapes(tensors, _expected_shapes(dims, vocab, layout))


def _model_dims(header: GgufHeader, arch: str) -> dict[str, int]:
    """The widths and counts the config takes, each positive, the heads dividing evenly."""
    need = {key: count(header, f"{arch}.{key}", required=True) for key in (
        "block_count", "embedding_length", "feed_forward_length", "attention.head_count")}
    count(header, f"{arch}.context_length", required=True, limit=MAX_CONTEXT)
    heads = need["attention.head_count"]
    kv_heads = count(header, f"{arch}.attention.head_count_kv", False) or heads
    if heads % kv_heads:
        raise GgufFormatError(f"metadata {arch}.attention.head_count ({heads}) is not a "
                              f"multiple of {arch}.attention.head_count_kv ({kv_heads})")
    head_dim = count(header, f"{arch}.attention.key_length", False)
    if head_dim is None:
        if need["embedding_length"] % heads:
            raise GgufFormatError(f"metadata {arch}.embedding_length "
                                  f"({need['embedding_length']}) is not a multiple of "
                                  f"{arch}.attention.head_count ({heads})")
        head_dim = need["embedding_length"] // heads
    if head_dim % 2:   # rotary embeddings pair each head's dimensions
        raise GgufFormatError(f"metadata {arch}.attention.key_length: the head dimension "
                              f"({head_dim}) must be even")
    return {**need, "head_count_kv": kv_heads, "head_dim": head_dim}


def _check_windows(header: GgufHeader, arch: str, block_count: int) -> None:
    """A sliding window within the context; one bool per layer saying which slide."""
    count(header, f"{arch}.attention.sliding_window", False, limit=MAX_CONTEXT)
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = entry(header, key, frozenset({ARRAY}), "an array", False)
    if pattern is not None and (pattern.item_type != _BOOL or pattern.count != block_count):
        raise GgufFormatError(f"metadata {key} must list {block_count} bools (one a layer)")


def _check_names(tensors: dict[str, GgufTensorInfo], arch: str, layout: str) -> None:
    for name in tensors:
        if hf_name(name, layout) is None and name not in CONFIG_TENSORS:
            raise GgufFormatError(f"GGUF tensor {name!r} has no place in Folio's {arch}")


def _check_layers(tensors: dict[str, GgufTensorInfo], arch: str,
                  block_count: int, layout: str) -> None:
    """blk.0 .. blk.{block_count - 1}, each holding the tensors blk.0 holds, the ones every
    layer needs among them."""
    layers: dict[int, set[str]] = {}
    for name in tensors:
        match = _LAYER.match(name)
        if match is not None:
            layers.setdefault(int(match.group(1)), set()).add(match.group(2))
    if sorted(layers) != list(range(block_count)):
        raise GgufFormatError(f"metadata {arch}.block_count is {block_count} but the "
                              f"tensors hold layers {span(sorted(layers))}")
    first = layers[0]
    for need in _LAYER_NEEDS[layout]:
        if need not in first:
            raise GgufFormatError(f"the GGUF file has no blk.0.{need}")
    for layer, names in layers.items():
        if names != first:
            odd = sorted(names ^ first)[0]
            raise GgufFormatError(f"blk.{layer} and blk.0 differ in {odd}")


def _expected_shapes(dims: dict[str, int], vocab: int,
                     layout: str) -> dict[str, tuple[int, ...]]:
    """GGUF shapes (innermost first) by name, blk.N as blk.*; a bias's is its weight's
    output width."""
    hidden, ffn = dims["embedding_length"], dims["feed_forward_length"]
    q_dim = dims["attention.head_count"] * dims["head_dim"]
    kv_dim = dims["head_count_kv"] * dims["head_dim"]
    weights = {"attn_norm": (hidden,), "ffn_norm": (hidden,), "attn_q": (hidden, q_dim),
               "attn_k": (hidden, kv_dim), "attn_v": (hidden, kv_dim),
               "attn_output": (q_dim, hidden), "ffn_gate": (hidden, ffn),
               "ffn_up": (hidden, ffn), "ffn_down": (ffn, hidden),
               "attn_q_norm": (dims["head_dim"],), "attn_k_norm": (dims["head_dim"],),
               "post_attention_norm": (hidden,), "post_ffw_norm": (hidden,)}
    if layout == "olmo2":   # q/k norms over all heads at once
        weights.update({"attn_q_norm": (q_dim,), "attn_k_norm": (kv_dim,)})
    shapes = {"output.weight": (hidden, vocab), "output_norm.weight": (hidden,),
              "rope_freqs.weight": (dims["head_dim"] // 2,)}
    for module, shape in weights.items():
        shapes[f"blk.*.{module}.weight"] = shape
        shapes[f"blk.*.{module}.bias"] = shape[-1:]
    return shapes


def _check_shapes(tensors: dict[str, GgufTensorInfo],
                  shapes: dict[str, tuple[int, ...]]) -> None:
    if "output_norm.weight" not in tensors:
        raise GgufFormatError("the GGUF file has no output_norm.weight")
    for name, tensor in tensors.items():
        expected = shapes.get(_LAYER.sub(r"blk.*.\2", name))
        if expected is not None and tensor.dims != expected:
            raise GgufFormatError(f"tensor {name} has shape {list(tensor.dims)}; the "
                                  f"metadata gives {list(expected)}")
