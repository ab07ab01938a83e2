"""Adapter files are user input (docs/lora.md): read as regular files only, size-bounded,
checked field by field, and no key of theirs run as a regular expression. Each case is a
real file on disk (a FIFO, a symlink to /dev/zero, a sparse 300 MB config, a header that
says 95 MiB); the test timeout catches a read that blocks or a pattern that spins."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from folio.executor.lora.files import (CONFIG_FILE, MAX_CONFIG_BYTES, MAX_HEADER_BYTES,
                                       WEIGHTS_FILE, LoraError, check_adapter_files,
                                       lora_name_problem, pattern_index, pattern_value,
                                       plan_adapter)
from folio.executor.models.architectures import ARCHITECTURES
from folio.executor.models.hf_config import read_model_config

pytestmark = pytest.mark.timeout(60)   # a hang here is the bug: fail, do not wait

RANK = 4
MODULES = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
           "model.layers.1.mlp.down_proj")


@pytest.fixture(scope="module")
def model(llama_dir):
    config = read_model_config(llama_dir)
    return config, ARCHITECTURES[config.architecture].weights


def _sizes(config, module: str) -> tuple[int, int]:
    """(in, out) of a Llama module, as PEFT's lora_A [r, in] / lora_B [out, r] see them."""
    q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    leaf = module.rsplit(".", 1)[1]
    return {"q_proj": (config.hidden_size, q), "v_proj": (config.hidden_size, kv),
            "down_proj": (config.intermediate_size, config.hidden_size)}[leaf]


def _adapter(directory: Path, config, rank: int = RANK, **settings) -> Path:
    """A PEFT-format adapter on MODULES, written the way PEFT writes one."""
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for module in MODULES:
        in_size, out_size = _sizes(config, module)
        tensors[f"base_model.model.{module}.lora_A.weight"] = np.ones((rank, in_size),
                                                                      np.float32)
        tensors[f"base_model.model.{module}.lora_B.weight"] = np.ones((out_size, rank),
                                                                      np.float32)
    save_file(tensors, str(directory / WEIGHTS_FILE))
    body = {"peft_type": "LORA", "r": rank, "lora_alpha": 8, **settings}
    (directory / CONFIG_FILE).write_text(json.dumps(body))
    return directory


def _plan(path, model, max_rank: int = 64):
    config, names = model
    return plan_adapter("x", path, config, names, max_rank)


def _refused(path, model, *words: str) -> str:
    with pytest.raises(LoraError) as error:
        _plan(path, model)
    message = str(error.value)
    assert all(w in message for w in words), message
    return message


def test_a_good_adapter_plans(model, tmp_path):
    parts = _plan(_adapter(tmp_path / "a", model[0]), model)
    assert len(parts) == len(MODULES) and all(p.scale == 8 / RANK for p in parts)


def test_a_catastrophic_pattern_is_refused_not_run(model, tmp_path):
    # 73 bytes that spin Python's re for ever on a module name: refused as a key.
    path = _adapter(tmp_path / "a", model[0], alpha_pattern={"(.*.*)*x": 8})
    _refused(path, model, CONFIG_FILE, "alpha_pattern key '(.*.*)*x' is not a module name",
             "not as regular expressions")
    path = _adapter(tmp_path / "b", model[0], rank_pattern={"q_proj(": 2})
    _refused(path, model, "rank_pattern key 'q_proj(' is not a module name")


def test_pattern_keys_match_as_peft_matches_module_names(model, tmp_path):
    from peft.utils.other import get_pattern_key

    # The forms PEFT's docs use (^NAME) and PEFT writes (.*\\.NAME, re.escape'd names).
    patterns = {"v_proj": 2, "^model.layers.0.self_attn.q_proj": 3,
                "layers\\.1\\.mlp\\.down_proj$": 5,
                "self_attn.q_proj": 7, ".*\\.up_proj": 17, "proj": 11,
                "model.layers.0.self_attn.k_proj": 13, "^up_proj": 19, "x\\-y": 23}
    index = pattern_index(patterns)
    for module in (*MODULES, "model.layers.0.self_attn.k_proj", "model.layers.10.mlp.up_proj",
                   "model.layers.0.self_attn.qq_proj", "up_proj", "a.x-y", "a.x-y.o_proj"):
        key = get_pattern_key(list(patterns), module)
        assert pattern_value(index, module, None) == patterns.get(key), module
    path = _adapter(tmp_path / "a", model[0], alpha_pattern={"q_proj": 16, "down_proj": 2})
    scales = [(p.module, p.part, p.scale) for p in _plan(path, model)]
    assert scales == [("layers.0.self_attn.qkv_proj", 0, 16 / RANK),
                      ("layers.0.self_attn.qkv_proj", 2, 8 / RANK),
                      ("layers.1.mlp.down_proj", None, 2 / RANK)]


def test_a_fifo_config_is_refused_without_blocking(model, tmp_path):
    path = _adapter(tmp_path / "a", model[0])
    (path / CONFIG_FILE).unlink()
    os.mkfifo(path / CONFIG_FILE)   # no writer: a plain open() would wait for ever
    _refused(path, model, str(path / CONFIG_FILE), "a FIFO, not a regular file")


def test_a_fifo_weights_file_is_refused_without_blocking(model, tmp_path):
    path = _adapter(tmp_path / "a", model[0])
    (path / WEIGHTS_FILE).unlink()
    os.mkfifo(path / WEIGHTS_FILE)
    _refused(path, model, str(path / WEIGHTS_FILE), "a FIFO, not a regular file")


def test_a_symlink_to_a_device_is_refused_and_to_a_file_is_read(model, tmp_path):
    path = _adapter(tmp_path / "a", model[0])
    real = tmp_path / "elsewhere.json"
    (path / CONFIG_FILE).rename(real)
    (path / CONFIG_FILE).symlink_to(real)   # as Hugging Face's cache lays files out
    assert _plan(path, model)
    (path / CONFIG_FILE).unlink()
    (path / CONFIG_FILE).symlink_to("/dev/zero")   # endless bytes
    _refused(path, model, "a character device, not a regular file")


def test_a_huge_config_is_refused_unread(model, tmp_path):
    path = _adapter(tmp_path / "a", model[0])
    with open(path / CONFIG_FILE, "r+b") as file:   # 300 MB on disk, sparse
        file.truncate(300 * 10**6)
    _refused(path, model, CONFIG_FILE, f"over {MAX_CONFIG_BYTES} bytes")


def test_a_huge_header_is_refused_unread(model, tmp_path):
    path = _adapter(tmp_path / "a", model[0])
    length = 95 * 2**20
    with open(path / WEIGHTS_FILE, "wb") as file:   # a header that says 95 MiB, and is
        file.write(struct.pack("<Q", length))
        file.truncate(8 + length)
    _refused(path, model, WEIGHTS_FILE, f"over the {MAX_HEADER_BYTES} this reads")


def test_deep_nesting_is_refused(model, tmp_path):
    path = _adapter(tmp_path / "a", model[0])
    deep = b"[" * 200_000 + b"]" * 200_000
    (path / CONFIG_FILE).write_bytes(b'{"r": 4, "x": ' + deep + b"}")
    _refused(path, model, CONFIG_FILE, "nested too deeply")
    path = _adapter(tmp_path / "b", model[0])
    header = b'{"__metadata__": ' + deep + b"}"
    (path / WEIGHTS_FILE).write_bytes(struct.pack("<Q", len(header)) + header)
    _refused(path, model, WEIGHTS_FILE, "nested too deeply")


@pytest.mark.parametrize("settings, words", [
    ({"r": 0}, "r must be an integer >= 1, got 0"),
    ({"lora_alpha": "8"}, "lora_alpha must be a number"),
    ({"alpha_pattern": ["q_proj", 8]}, "alpha_pattern must be an object"),
    ({"alpha_pattern": {"q_proj": float("inf")}}, "alpha_pattern['q_proj'] must be a finite"),
    ({"rank_pattern": {"q_proj": 0}}, "rank_pattern['q_proj'] must be an integer >= 1"),
    ({"use_rslora": "yes"}, "use_rslora must be true or false"),
])
def test_bad_numbers_and_types_are_refused(model, tmp_path, settings, words):
    _refused(_adapter(tmp_path / "a", model[0], **settings), model, CONFIG_FILE, words)


@pytest.mark.parametrize("literal", [b"1" + b"0" * 400, b"1e400", b"-1e400"])
def test_an_alpha_no_float_holds_is_refused(model, tmp_path, literal):
    path = _adapter(tmp_path / "a", model[0])
    (path / CONFIG_FILE).write_bytes(b'{"r": 4, "lora_alpha": ' + literal + b"}")
    _refused(path, model, "lora_alpha must be a finite number")


def test_a_rank_zero_tensor_is_refused(model, tmp_path):
    _refused(_adapter(tmp_path / "a", model[0], rank=0, r=4), model,
             "not [r, in] and [out, r] with r >= 1")


def test_the_checks_without_a_model_are_the_same_files_checks(model, tmp_path):
    # What the HTTP frontend runs off its event loop before the engine is asked.
    good = check_adapter_files("x", _adapter(tmp_path / "a", model[0]))
    assert len(good.modules) == len(MODULES)
    bad = _adapter(tmp_path / "b", model[0], alpha_pattern={"(.*.*)*x": 8})
    with pytest.raises(LoraError, match="not a module name"):
        check_adapter_files("x", bad)


@pytest.mark.parametrize("name, code", [
    ("folio-default\u200b", "200B"), ("a\nb", "000A"), ("a b", "0020"), ("a\tb", "0009"),
    ("\u202eevil", "202E"), ("x\u2066", "2066"), ("a\x00", "0000"), ("\u00a0a", "00A0"),
    ("a\u2028", "2028"), ("a\u200fb", "200F")])
def test_invisible_and_control_characters_are_refused_in_names(name, code):
    problem = lora_name_problem(name)
    assert problem is not None and f"U+{code}" in problem, problem
    assert "control, zero-width, bidi-control and whitespace" in problem


@pytest.mark.parametrize("name", ["folio-default", "sql_v2.1", "adaptér", "日本語", "a/b:c"])
def test_ordinary_names_are_accepted(name):
    assert lora_name_problem(name) is None


def test_the_registry_refuses_such_a_name(model, tmp_path):
    from folio.executor.lora.registry import LoraRegistry

    registry = LoraRegistry.__new__(LoraRegistry)   # only load()'s first check is reached
    registry.host = {}
    with pytest.raises(LoraError, match="U\\+200B"):
        registry.load("folio-default\u200b", str(tmp_path))


def test_serve_refuses_a_bad_adapter_in_one_line(llama_dir, model, tmp_path, capsys):
    from folio.cli import main

    path = _adapter(tmp_path / "a", model[0], alpha_pattern={"(.*.*)*x": 8})
    for module in (f"bad={path}", f"bad\u200b={_adapter(tmp_path / 'b', model[0])}"):
        assert main(["serve", "--port", "0", "--model", str(llama_dir), "--enable-lora",
                     "--lora-modules", module]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("folio serve: error:"), err
        assert "Traceback" not in err
