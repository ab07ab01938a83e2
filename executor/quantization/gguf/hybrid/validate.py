"""A hybrid GGUF file's header checked before GGUFReader reads it (no torch import), as
gguf/validate.py checks the llama family's: the counts positive and bounded, every tensor
with a place (or in a Qwen3.5 file's multi-token-prediction block, which is skipped), the
layers blk.0 to blk.N-1 each holding its norms, its feed-forward and one whole mixer
(attention, or the recurrent layer's tensors), and every tensor the shape the metadata
gives it. Which layer is which comes from array values the bounded reader does not keep;
gguf/hybrid/config.py checks the layer kinds against the tensors once they are read."""

from __future__ import annotations

from folio.executor.quantization.gguf.header import (
    ARRAY, INTEGERS, GgufFormatError, GgufHeader, GgufTensorInfo)
from folio.executor.quantization.gguf.hybrid.names import (
    FFN_NEEDS, MIXER_NEEDS, NORM_NEEDS, hybrid_hf_name, layer_index)
from folio.executor.quantization.gguf.metadata_checks import (
    MAX_CONTEXT, check_embedding, check_floats, check_tokenizer, count, entry, span)

_COUNTS = ("block_count", "embedding_length", "attention.head_count")
_QWEN35_COUNTS = ("attention.key_length", "attention.head_count_kv", "ssm.conv_kernel",
                  "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size")
_MOE_COUNTS = ("expert_count", "expert_used_count", "expert_feed_forward_length",
               "expert_shared_feed_forward_length")


def check_hybrid_header(header: GgufHeader, arch: str, family: str) -> None:
    dims = {key: count(header, f"{arch}.{key}", required=True) for key in _COUNTS}
    # Qwen3.5-MoE has no dense feed-forward to give a width
    dims["feed_forward_length"] = count(header, f"{arch}.feed_forward_length",
                                         required=family != "qwen35moe") or 0
    if family in ("qwen35moe", "lfm2moe", "qwen3next"):
        dims.update({key: count(header, f"{arch}.{key}", required=True)
                     for key in _MOE_COUNTS[:3 if family == "lfm2moe" else 4]})
        if dims["expert_used_count"] > dims["expert_count"]:
            raise GgufFormatError(f"metadata {arch}.expert_used_count "
                                  f"({dims['expert_used_count']}) is more than "
                                  f"{arch}.expert_count ({dims['expert_count']})")
    count(header, f"{arch}.context_length", required=True, limit=MAX_CONTEXT)
    if family in ("lfm2", "lfm2moe"):
        dims["shortconv.l_cache"] = count(header, f"{arch}.shortconv.l_cache", True)
        _lfm2_kv_heads(header, arch, dims["block_count"])
        dims["head_dim"] = _head_dim(dims, arch)
        trunk = dims["block_count"]
    else:
        dims.update({key: count(header, f"{arch}.{key}", required=True)
                     for key in _QWEN35_COUNTS})
        dims["head_dim"] = dims["attention.key_length"]
        trunk = dims["block_count"] - _mtp_layers(header, arch, dims["block_count"])
        _check_divides(dims, arch)
    tensors = {tensor.name: tensor for tensor in header.tensors}
    for name in tensors:
        layer = layer_index(name)
        if hybrid_hf_name(family, name) is None and (layer is None or layer < trunk):
            raise GgufFormatError(f"GGUF tensor {name!r} has no place in Folio's {arch}")
    vocab = check_embedding(tensors, dims["embedding_length"])
    check_floats(header, arch)
    check_tokenizer(header, vocab)
    _check_layers(tensors, arch, family, trunk)
    _check_shapes(tensors, family, dims, vocab, trunk)


def _lfm2_kv_heads(header: GgufHeader, arch: str, layers: int) -> None:
    key = f"{arch}.attention.head_count_kv"
    value = entry(header, key, INTEGERS | frozenset({ARRAY}), "an integer or an array",
                  True)
    if hasattr(value, "count") and (value.count != layers or value.item_type not in INTEGERS):
        raise GgufFormatError(f"metadata {key} must list {layers} integers (one per layer)")


def _head_dim(dims: dict[str, int], arch: str) -> int:
    hidden, heads = dims["embedding_length"], dims["attention.head_count"]
    if hidden % heads or (hidden // heads) % 2:
        raise GgufFormatError(f"metadata {arch}.embedding_length ({hidden}) must be an even "
                              f"head dimension times {arch}.attention.head_count ({heads})")
    return hidden // heads


def _mtp_layers(header: GgufHeader, arch: str, blocks: int) -> int:
    key = f"{arch}.nextn_predict_layers"
    mtp = entry(header, key, INTEGERS, "an integer", False) or 0
    if not 0 <= mtp < blocks:
        raise GgufFormatError(f"metadata {key} is {mtp}: it must leave some of the {blocks} "
                              "layers of block_count")
    return mtp


def _check_divides(dims: dict[str, int], arch: str) -> None:
    pairs = (("attention.head_count", "attention.head_count_kv"),
             ("ssm.time_step_rank", "ssm.group_count"),
             ("ssm.inner_size", "ssm.time_step_rank"))
    for big, small in pairs:
        if dims[big] % dims[small]:
            raise GgufFormatError(f"metadata {arch}.{big} ({dims[big]}) is not a multiple "
                                  f"of {arch}.{small} ({dims[small]})")
    if dims["head_dim"] % 2:
        raise GgufFormatError(f"metadata {arch}.attention.key_length: the head dimension "
                              f"({dims['head_dim']}) must be even")


def _check_layers(tensors: dict[str, GgufTensorInfo], arch: str, family: str,
                  trunk: int) -> None:
    layers: dict[int, set[str]] = {}
    for name in tensors:
        layer = layer_index(name)
        if layer is not None and layer < trunk:
            layers.setdefault(layer, set()).add(name.split(".", 2)[2])
    if sorted(layers) != list(range(trunk)):
        raise GgufFormatError(f"metadata {arch}.block_count gives {trunk} layers but the "
                              f"tensors hold layers {span(sorted(layers))}")
    for layer, names in sorted(layers.items()):
        for need in NORM_NEEDS[family]:
            if need not in names:
                raise GgufFormatError(f"the GGUF file has no blk.{layer}.{need}")
        for part, needs in (("mixer", MIXER_NEEDS[family]), ("feed-forward",
                                                              FFN_NEEDS[family])):
            # the kind it holds most of, and what that kind lacks
            lacking, kind = min((([need for need in wanted if need not in names], kind)
                                 for kind, wanted in needs.items()),
                                key=lambda entry: len(entry[0]))
            if lacking:
                raise GgufFormatError(f"blk.{layer} holds no whole {part}: its {kind} "
                                      f"{part} lacks blk.{layer}.{lacking[0]}")


def _check_shapes(tensors: dict[str, GgufTensorInfo], family: str, dims: dict[str, int],
                  vocab: int, trunk: int) -> None:
    """GGUF shapes, innermost first; attn_k and attn_v of LFM2 (whose KV heads are per
    layer) must only be whole heads and alike."""
    hidden, ffn, head = dims["embedding_length"], dims["feed_forward_length"], dims["head_dim"]
    q_rows = dims["attention.head_count"] * head
    shapes = {"attn_norm.weight": (hidden,), "ffn_norm.weight": (hidden,),
              "post_attention_norm.weight": (hidden,), "ffn_gate.weight": (hidden, ffn),
              "ffn_up.weight": (hidden, ffn), "ffn_down.weight": (ffn, hidden),
              "attn_q_norm.weight": (head,), "attn_k_norm.weight": (head,),
              "attn_output.weight": (q_rows, hidden)}
    if family in ("lfm2", "lfm2moe"):
        shapes.update({"attn_q.weight": (hidden, q_rows),
                       "shortconv.conv.weight": (dims["shortconv.l_cache"], hidden),
                       "shortconv.in_proj.weight": (hidden, 3 * hidden),
                       "shortconv.out_proj.weight": (hidden, hidden)})
        global_shapes = {"token_embd_norm.weight": (hidden,)}
    else:
        kv = dims["attention.head_count_kv"] * head
        keys = dims["ssm.group_count"] * dims["ssm.state_size"]
        inner, v_heads = dims["ssm.inner_size"], dims["ssm.time_step_rank"]
        shapes.update({"attn_q.weight": (hidden, 2 * q_rows), "attn_k.weight": (hidden, kv),
                       "attn_v.weight": (hidden, kv),
                       "attn_qkv.weight": (hidden, 2 * keys + inner),
                       "attn_gate.weight": (hidden, inner),
                       "ssm_beta.weight": (hidden, v_heads),
                       "ssm_alpha.weight": (hidden, v_heads),
                       "ssm_ba.weight": (hidden, 2 * v_heads),
                       "ssm_conv1d.weight": (dims["ssm.conv_kernel"], 2 * keys + inner),
                       "ssm_dt.bias": (v_heads,), "ssm_a": (v_heads,),
                       "ssm_norm.weight": (inner // v_heads,),
                       "ssm_out.weight": (inner, hidden)})
        global_shapes = {"output_norm.weight": (hidden,)}
    if family in ("qwen35moe", "lfm2moe", "qwen3next"):
        experts, inter = dims["expert_count"], dims["expert_feed_forward_length"]
        shapes.update({"ffn_gate_inp.weight": (hidden, experts),
                       "ffn_gate_exps.weight": (hidden, inter, experts),
                       "ffn_up_exps.weight": (hidden, inter, experts),
                       "ffn_down_exps.weight": (inter, hidden, experts),
                       "exp_probs_b.bias": (experts,)})
    if family in ("qwen35moe", "qwen3next"):
        shared = dims["expert_shared_feed_forward_length"]
        shapes.update({"ffn_gate_shexp.weight": (hidden, shared),
                       "ffn_up_shexp.weight": (hidden, shared),
                       "ffn_down_shexp.weight": (shared, hidden)})
    global_shapes["output.weight"] = (hidden, vocab)
    for name, shape in global_shapes.items():
        if name != "output.weight" and name not in tensors:
            raise GgufFormatError(f"the GGUF file has no {name}")
    for name, tensor in tensors.items():
        layer = layer_index(name)
        if layer is not None and layer >= trunk:
            continue
        leaf = name if layer is None else name.split(".", 2)[2]
        expected = (global_shapes if layer is None else shapes).get(leaf)
        if leaf.endswith(".bias") and leaf.startswith("shortconv."):
            expected = (hidden * (3 if "in_proj" in leaf else 1),)
        if leaf == "ffn_gate_inp_shexp.weight" and tensor.dims in ((hidden,), (hidden, 1)):
            continue   # [H] or [H, 1]: one gate logit
        if expected is not None and tensor.dims != expected:
            raise GgufFormatError(f"tensor {name} has shape {list(tensor.dims)}; the "
                                  f"metadata gives {list(expected)}")
        if family in ("lfm2", "lfm2moe") and leaf in ("attn_k.weight", "attn_v.weight"):
            pair = "attn_v" if leaf.startswith("attn_k") else "attn_k"
            other = tensors.get(name.replace(leaf[:6], pair))
            if (len(tensor.dims) != 2 or tensor.dims[0] != hidden or tensor.dims[1] % head
                    or other is None or other.dims != tensor.dims):
                raise GgufFormatError(f"tensor {name} has shape {list(tensor.dims)}: it "
                                      f"must be [{hidden}, whole heads of {head}], as its "
                                      "attn_k / attn_v pair")
