"""Crafted GGUF files are refused before any process starts, in one line naming the file and
the field, without allocating what their header declares (executor/quantization/gguf/
header.py and validate.py, run by folio/preflight.py's check before gguf.GGUFReader)."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest

from folio.preflight import check_model_dir
from folio.shared.config import SettingError
from tests.executor.quantization.gguf_files import (
    TINY, gguf_string, patch_tensor_offset, raw_gguf, tensor_offset, tiny_metadata,
    serve_refusal, tiny_tensors, write_gguf)

U8, U32, STRING, ARRAY, U64 = 0, 4, 8, 9, 10


def _entry(key: str, value_type: int, payload: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", value_type) + payload


def _edited(entries: dict, changes: dict) -> dict:
    """`entries` with keys (`__` for `.`) set to a new value, or dropped where None."""
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            entries.pop(key)
        else:
            entries[key] = value
    return entries


def _with(tmp_path: Path, **changes) -> Path:
    """The tiny llama with metadata keys changed ((kind, value)) or dropped (None)."""
    return write_gguf(tmp_path / "bad.gguf", _edited(tiny_metadata(), changes), tiny_tensors())


def _with_tensors(tmp_path: Path, **changes) -> Path:
    return write_gguf(tmp_path / "bad.gguf", tiny_metadata(), _edited(tiny_tensors(), changes))


def _huge_array(tmp_path: Path) -> Path:
    """10**9 strings declared, ~1 MB of file."""
    entry = _entry("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 10**9))
    return raw_gguf(tmp_path / "bad.gguf", [entry], tail=bytes(2**20))


def _present_array(tmp_path: Path) -> Path:
    """10**7 one-byte items, all present (10 MB): each would be a numpy view in GGUFReader."""
    entry = _entry("general.junk", ARRAY, struct.pack("<IQ", U8, 10**7) + bytes(10**7))
    return raw_gguf(tmp_path / "bad.gguf", [entry])


def _short_string_array(tmp_path: Path) -> Path:
    """3 strings declared: one, then a length far past the end."""
    items = gguf_string("ab") + struct.pack("<Q", 2**40) + bytes(8)
    entry = _entry("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 3) + items)
    return raw_gguf(tmp_path / "bad.gguf", [entry])


def _nested_array(tmp_path: Path) -> Path:
    inner = struct.pack("<IQ", U32, 1) + struct.pack("<I", 7)
    entry = _entry("general.nested", ARRAY, struct.pack("<IQ", ARRAY, 1) + inner)
    return raw_gguf(tmp_path / "bad.gguf", [entry])


def _long_key(tmp_path: Path) -> Path:
    return raw_gguf(tmp_path / "bad.gguf", [struct.pack("<Q", 2**60) + b"x" * 64])


def _kv_count(tmp_path: Path) -> Path:
    return raw_gguf(tmp_path / "bad.gguf", [], kv_count=10**12, tail=bytes(4096))


def _tensor_count(tmp_path: Path) -> Path:
    return raw_gguf(tmp_path / "bad.gguf", [], tensor_count=10**12, tail=bytes(4096))


def _version(tmp_path: Path) -> Path:
    return raw_gguf(tmp_path / "bad.gguf", [], version=1, tail=bytes(64))


def _unknown_type(tmp_path: Path) -> Path:
    return raw_gguf(tmp_path / "bad.gguf", [_entry("general.odd", 13, bytes(8))])


def _twice(tmp_path: Path) -> Path:
    entry = _entry("general.name", STRING, gguf_string("x"))
    return raw_gguf(tmp_path / "bad.gguf", [entry, entry])


def _wrapped_offset(tmp_path: Path) -> Path:
    path = write_gguf(tmp_path / "bad.gguf", tiny_metadata(), tiny_tensors())
    patch_tensor_offset(path, "blk.1.ffn_up.weight", 2**64 - 32)
    return path


def _overlap(tmp_path: Path) -> Path:
    path = write_gguf(tmp_path / "bad.gguf", tiny_metadata(), tiny_tensors())
    patch_tensor_offset(path, "blk.1.attn_k.weight",
                        tensor_offset(path, "blk.1.attn_q.weight"))
    return path


def _unaligned(tmp_path: Path) -> Path:
    path = write_gguf(tmp_path / "bad.gguf", tiny_metadata(), tiny_tensors())
    patch_tensor_offset(path, "output_norm.weight",
                        tensor_offset(path, "output_norm.weight") + 4)
    return path


T = TINY
CASES = {
    # header bounds: refused before anything the header declares is allocated
    "array of 10**9": (_huge_array, "tokenizer.ggml.tokens's item count is 1000000000"),
    "array of 10**7 present": (_present_array, "general.junk's item count is 10000000"),
    "string past the end": (_short_string_array,
                            "tokenizer.ggml.tokens[1] declares a 1099511627776-byte string"),
    "nested array": (_nested_array, "general.nested is an array of arrays"),
    "2**60-byte key": (_long_key, "metadata key #0 declares a 1152921504606846976-byte"),
    "kv_count 10**12": (_kv_count, "kv_count is 1000000000000"),
    "tensor_count 10**12": (_tensor_count, "tensor_count is 1000000000000"),
    "version 1": (_version, "GGUF version 1"),
    "unknown value type": (_unknown_type, "general.odd has unknown value type 13"),
    "key twice": (_twice, "'general.name' appears twice"),
    "alignment 0": (lambda p: _with(p, general__alignment=("uint32", 0)), "general.alignment"),
    # tensor data inside the data section, not overlapping
    "wrapped offset": (_wrapped_offset, "tensor blk.1.ffn_up.weight ends past"),
    "overlapping tensors": (_overlap, "'s data overlaps blk.1.attn_"),
    "unaligned offset": (_unaligned, "output_norm.weight's offset"),
    # metadata against the tensors
    "context_length 2**26": (lambda p: _with(p, llama__context_length=("uint32", 2**26)),
                             "llama.context_length is 67108864"),
    "block_count 10**6": (lambda p: _with(p, llama__block_count=("uint32", 10**6)),
                          "llama.block_count is 1000000"),
    "eos id 2**63": (lambda p: _with(p, tokenizer__ggml__eos_token_id=("uint64", 2**63)),
                     "tokenizer.ggml.eos_token_id is 9223372036854775808"),
    "eos id past the vocabulary": (
        lambda p: _with(p, tokenizer__ggml__eos_token_id=("uint32", T["vocab"])),
        "tokenizer.ggml.eos_token_id is 32, outside the vocabulary"),
    "head_count 0": (lambda p: _with(p, llama__attention__head_count=("uint32", 0)),
                     "llama.attention.head_count is 0"),
    "head_count 3": (lambda p: _with(p, llama__attention__head_count=("uint32", 3)),
                     "llama.embedding_length (8) is not a multiple of "
                     "llama.attention.head_count (3)"),
    "head_count as a string": (lambda p: _with(
        p, llama__attention__head_count=("string", "2")), "head_count must be an integer"),
    "no block_count": (lambda p: _with(p, llama__block_count=None), "lacks llama.block_count"),
    "NaN epsilon": (lambda p: _with(p, llama__attention__layer_norm_rms_epsilon=(
        "float32", math.nan)), "llama.attention.layer_norm_rms_epsilon is nan"),
    "rope base 0": (lambda p: _with(p, llama__rope__freq_base=("float32", 0.0)),
                    "llama.rope.freq_base is 0.0"),
    "infinite rope factor": (lambda p: _with(p, llama__rope__scaling__factor=(
        "float32", math.inf)), "llama.rope.scaling.factor is inf"),
    "more tokens than rows": (lambda p: _with(p, tokenizer__ggml__tokens=(
        "array", ["t"] * (T["vocab"] + 1))), "tokenizer.ggml.tokens must list 1 to 32"),
    "1-D token_embd": (lambda p: _with_tensors(p, token_embd__weight=np.zeros(
        T["vocab"] * T["hidden"], np.float32)), "token_embd.weight has shape [256]"),
    "q rows off": (lambda p: _with_tensors(p, blk__0__attn_q__weight=np.zeros(
        (4, T["hidden"]), np.float32)), "blk.0.attn_q.weight has shape [8, 4]"),
    "missing layer tensor": (lambda p: _with_tensors(p, blk__1__ffn_up__weight=None),
                             "blk.1 and blk.0 differ in ffn_up.weight"),
    "no output_norm": (lambda p: _with_tensors(p, output_norm__weight=None),
                       "no output_norm.weight"),
}


def test_the_tiny_file_is_valid(tmp_path):
    """The file every case is mutated from passes: each refusal is that case's field."""
    config = check_model_dir(str(write_gguf(tmp_path / "tiny.gguf", tiny_metadata(),
                                            tiny_tensors())))
    assert (config.num_layers, config.vocab_size) == (T["layers"], T["vocab"])


@pytest.mark.parametrize("case", CASES)
def test_crafted_gguf_is_refused_naming_the_field(case, tmp_path):
    build, words = CASES[case]
    path = build(tmp_path)
    with pytest.raises(SettingError) as caught:
        check_model_dir(str(path))
    message = str(caught.value)
    assert "model" in message and path.name in message and words in message, message
    assert "\n" not in message


def test_folio_serve_refuses_a_crafted_gguf_in_one_line_exit_2(tmp_path):
    """The context length that made the executor allocate gigabytes and restart: refused by
    `folio serve` before any process starts."""
    path = _with(tmp_path, llama__context_length=("uint32", 2**26))
    result = serve_refusal(path, tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "--model" in lines[0] and "bad.gguf" in lines[0], lines
    assert "llama.context_length" in lines[0] and "Traceback" not in result.stderr


def test_folio_frontend_checks_the_gguf_header_before_its_tokenizer(tmp_path):
    """`folio frontend` reads only the tokenizer, through GGUFReader: the header bounds
    still come first."""
    from folio.checks import check_frontend
    from folio.cli import build_parser

    path = _huge_array(tmp_path)
    args = build_parser().parse_args([
        "frontend", "--model", str(path), "--insecure-transport",
        "--client-address", f"ipc://{tmp_path}/client",
        "--scheduler-address", f"ipc://{tmp_path}/scheduler"])
    with pytest.raises(SettingError) as caught:
        check_frontend(args)
    assert "tokenizer.ggml.tokens's item count" in str(caught.value)
