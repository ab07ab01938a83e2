"""Writes a GGUF file from a tiny Hugging Face checkpoint directory the way llama.cpp's
converter lays one out: its metadata keys, its tensor names, q and k rows permuted for its
rope, and the tokenizer (a byte-level BPE) as tokenizer.ggml.* metadata."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

_LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down", "self_attn.q_norm": "attn_q_norm",
                "self_attn.k_norm": "attn_k_norm"}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight",
                 "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}


def gguf_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER_NAMES[module]}.{kind}"


def permute_rows(values: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's two rotary halves interleaved."""
    half = values.shape[0] // heads // 2
    return (values.reshape(heads, 2, half, *values.shape[1:]).swapaxes(1, 2)
            .reshape(values.shape))


def write_llama_gguf(model_dir: Path, out: Path, quant: str = "F32",
                     tokenizer: bool = True, architecture: str = "llama",
                     extra_tensors: dict[str, np.ndarray] | None = None) -> Path:
    """2-D weights in `quant` (F32, F16, BF16, Q8_0, Q4_0, ...; a K-quant: random blocks),
    norms in F32, as llama.cpp does; q and k rows permuted for a llama only."""
    import gguf
    from safetensors.numpy import load_file

    config = json.loads((model_dir / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(out), architecture)
    arch = architecture
    writer.add_uint32(f"{arch}.context_length", config["max_position_embeddings"])
    writer.add_uint32(f"{arch}.embedding_length", config["hidden_size"])
    writer.add_uint32(f"{arch}.block_count", config["num_hidden_layers"])
    writer.add_uint32(f"{arch}.feed_forward_length", config["intermediate_size"])
    writer.add_uint32(f"{arch}.attention.head_count", heads)
    writer.add_uint32(f"{arch}.attention.head_count_kv", kv_heads)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    theta = config.get("rope_theta") or (config.get("rope_parameters") or {}).get(
        "rope_theta", 10000.0)
    writer.add_float32(f"{arch}.rope.freq_base", theta)
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_uint32(f"{arch}.rope.dimension_count", head_dim)
    writer.add_uint32(f"{arch}.attention.key_length", head_dim)
    writer.add_uint32(f"{arch}.attention.value_length", head_dim)
    writer.add_uint32(f"{arch}.vocab_size", config["vocab_size"])
    if tokenizer:
        _add_tokenizer(writer, model_dir)
    qtype = gguf.GGMLQuantizationType[quant]
    for name, values in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        values = values.astype(np.float32)
        if arch == "llama" and name.endswith("q_proj.weight"):
            values = permute_rows(values, heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            values = permute_rows(values, kv_heads)
        _add(writer, gguf_name(name), values, qtype if values.ndim == 2 else
             gguf.GGMLQuantizationType.F32)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type") == "llama3":
        _add(writer, "rope_freqs.weight", llama3_rope_freqs(rope, theta, head_dim),
             gguf.GGMLQuantizationType.F32)
    for name, values in (extra_tensors or {}).items():
        _add(writer, name, values, gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def llama3_rope_freqs(rope: dict, theta: float, head_dim: int) -> np.ndarray:
    """llama.cpp's converter's rope_freqs.weight: what each frequency is divided by."""
    factor, old_len = rope["factor"], rope["original_max_position_embeddings"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    divisors = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim):
        wavelen = 2 * np.pi / freq
        if wavelen < old_len / high:
            divisors.append(1.0)
        elif wavelen > old_len / low:
            divisors.append(factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


# The K-quants: byte offsets of the float16 fields d (and dmin) in each 256-weight block,
# the block's bytes, and for the types with a minimum the middle of their quant range.
# gguf.quants cannot quantize to these types, so blocks are written at random: random
# quants and sub-block scales, small d; where a sub-block's weight is sc * d * q - m * dmin,
# each m is made equal to its sc and dmin = d * middle, so the weights centre on zero
# (off-centre, one token wins every step and the test would tell nothing).
K_QUANT_BLOCKS = {"Q2_K": ((80, 82), 84, 1.5), "Q3_K": ((108,), 110, None),
                  "Q4_K": ((0, 2), 144, 7.5), "Q5_K": ((0, 2), 176, 15.5),
                  "Q6_K": ((208,), 210, None)}


def random_k_quant(rows: int, cols: int, quant: str, seed: int) -> np.ndarray:
    scale_at, block_bytes, middle = K_QUANT_BLOCKS[quant]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (rows * cols // 256, block_bytes), dtype=np.uint8)
    if quant == "Q2_K":        # 16 bytes: sc in the low nibble, m in the high one
        blocks[:, :16] = (blocks[:, :16] & 0x0F) * 0x11
    elif middle is not None:   # 12 bytes at 4: 6-bit sc[0:4], m[0:4], then low nibbles of
        blocks[:, 8:12] = blocks[:, 4:8]         # sc[4:8] | m[4:8] << 4 (high bits ride
        low = blocks[:, 12:16] & 0x0F            # in the first 8 bytes' top two bits)
        blocks[:, 12:16] = low | (low << 4)
    d = rng.uniform(0.0005, 0.002, len(blocks))
    for at, values in zip(scale_at, (d, d * (middle or 0))):
        blocks[:, at:at + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, cols // 256 * block_bytes)


def _add(writer, name: str, values: np.ndarray, qtype) -> None:
    import zlib

    import gguf

    if qtype.name in K_QUANT_BLOCKS:
        if values.shape[1] % 256:   # as llama.cpp: rows a block does not divide fall back
            qtype = gguf.GGMLQuantizationType.Q8_0
        else:
            blocks = random_k_quant(*values.shape, qtype.name, zlib.crc32(name.encode()))
            writer.add_tensor(name, blocks, raw_dtype=qtype)
            return
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, values)
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, values.astype(np.float16))
    else:
        writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)


def _add_tokenizer(writer, model_dir: Path) -> None:
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    specials = {entry["id"]: entry["content"] for entry in spec["added_tokens"]}
    vocab.update({content: index for index, content in specials.items()})
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if index in specials else 1 for index in range(len(tokens))])
    writer.add_token_merges(merges)
    eos = vocab["<|endoftext|>"]
    writer.add_bos_token_id(eos)
    writer.add_eos_token_id(eos)
    template = model_dir / "chat_template.jinja"
    if template.is_file():
        writer.add_chat_template(template.read_text())


# A tiny llama written from scratch (no checkpoint): the valid file the crafted ones in
# test_gguf_crafted.py are mutated from. GGUF shapes are innermost first; numpy's are not.
TINY = {"hidden": 8, "heads": 2, "kv_heads": 1, "head_dim": 4, "ffn": 16, "layers": 2,
        "vocab": 32}


def tiny_metadata() -> dict[str, tuple[str, object]]:
    """key -> (GGUFWriter's add_* kind, value), general.architecture aside."""
    t = TINY
    return {"llama.context_length": ("uint32", 64),
            "llama.embedding_length": ("uint32", t["hidden"]),
            "llama.block_count": ("uint32", t["layers"]),
            "llama.feed_forward_length": ("uint32", t["ffn"]),
            "llama.attention.head_count": ("uint32", t["heads"]),
            "llama.attention.head_count_kv": ("uint32", t["kv_heads"]),
            "llama.attention.layer_norm_rms_epsilon": ("float32", 1e-5),
            "llama.rope.freq_base": ("float32", 10000.0),
            "tokenizer.ggml.tokens": ("array", [f"t{i}" for i in range(t["vocab"])]),
            "tokenizer.ggml.eos_token_id": ("uint32", 1)}


def tiny_tensors() -> dict[str, np.ndarray]:
    t = TINY
    hidden, ffn, q, kv = t["hidden"], t["ffn"], t["heads"] * t["head_dim"], \
        t["kv_heads"] * t["head_dim"]
    shapes = {"token_embd.weight": (t["vocab"], hidden), "output_norm.weight": (hidden,)}
    for layer in range(t["layers"]):
        for name, shape in {"attn_norm": (hidden,), "ffn_norm": (hidden,),
                            "attn_q": (q, hidden), "attn_k": (kv, hidden),
                            "attn_v": (kv, hidden), "attn_output": (hidden, q),
                            "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden),
                            "ffn_down": (hidden, ffn)}.items():
            shapes[f"blk.{layer}.{name}.weight"] = shape
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shape).astype(np.float32)
            for name, shape in shapes.items()}


def write_gguf(out: Path, metadata: dict[str, tuple[str, object]],
               tensors: dict[str, np.ndarray], architecture: str = "llama") -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(out), architecture)
    for key, (kind, value) in metadata.items():
        getattr(writer, f"add_{kind}")(key, value)
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def gguf_string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(8, "little") + data


def raw_gguf(out: Path, entries: list[bytes], tensor_count: int = 0,
             kv_count: int | None = None, tail: bytes = b"", version: int = 3) -> Path:
    """A GGUF header packed by hand (for what GGUFWriter will not write): the given
    key/value entries (each key string, uint32 type, value) and counts, then `tail`."""
    import struct

    head = b"GGUF" + struct.pack("<IQQ", version, tensor_count,
                                 len(entries) if kv_count is None else kv_count)
    out.write_bytes(head + b"".join(entries) + tail)
    return out


def _offset_at(data: bytes, name: str) -> int:
    """Where tensor `name`'s data offset sits in its tensor info (after its name, dimension
    count, dims and type)."""
    at = data.index(gguf_string(name)) + 8 + len(name)
    return at + 4 + 8 * int.from_bytes(data[at:at + 4], "little") + 4


def tensor_offset(path: Path, name: str) -> int:
    data = path.read_bytes()
    at = _offset_at(data, name)
    return int.from_bytes(data[at:at + 8], "little")


def patch_tensor_offset(path: Path, name: str, offset: int) -> None:
    data = path.read_bytes()
    at = _offset_at(data, name)
    path.write_bytes(data[:at] + offset.to_bytes(8, "little") + data[at + 8:])


def serve_refusal(path: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`folio serve --model path` as a user starts it (no FOLIO_ settings from the test
    environment), which should refuse the file before any process starts."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("FOLIO_")}
    return subprocess.run([sys.executable, "-m", "folio", "serve", "--port", "0",
                           "--model", str(path)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=cwd)
