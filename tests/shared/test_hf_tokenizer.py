"""The tokenizer loader's short way (shared/hf_tokenizer.py): a checkpoint that declares the
generic tokenizer class gets what AutoTokenizer would give, without importing torch, and
anything else still goes through AutoTokenizer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from folio.shared.hf_tokenizer import (GENERIC_TOKENIZER_MODEL_TYPES, generic_tokenizer,
                                       load_tokenizer)
from tests.http_server import ROOT

TEXTS = ["Hello, world!", "  two  spaces\nand a newline", "<|im_start|>user\nhi<|im_end|>",
         "ünïcödé 字 🙂", ""]


def test_transformers_keeps_the_generic_class_for_each_listed_model_type():
    from transformers.models.auto.tokenization_auto import (
        MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, TOKENIZER_MAPPING_NAMES)

    for model_type in GENERIC_TOKENIZER_MODEL_TYPES:
        assert model_type not in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, model_type
        assert TOKENIZER_MAPPING_NAMES.get(model_type) in (
            None, "TokenizersBackend", "PreTrainedTokenizerFast"), model_type


def _same_as_auto(path) -> None:
    from transformers import AutoTokenizer

    ours, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path),
                                                                    local_files_only=True)
    assert type(ours) is type(auto)
    for text in TEXTS:
        assert ours(text)["input_ids"] == auto(text)["input_ids"], text
        assert ours.decode(auto(text)["input_ids"]) == auto.decode(auto(text)["input_ids"])
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == \
        (auto.bos_token_id, auto.eos_token_id, auto.pad_token_id)
    messages = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_a_generic_llama_tokenizer_loads_as_autotokenizer_would(llama_dir):
    assert generic_tokenizer(llama_dir)
    _same_as_auto(llama_dir)


def test_other_checkpoints_go_through_autotokenizer(qwen2_dir, llama_dir, tmp_path):
    assert not generic_tokenizer(qwen2_dir)   # transformers gives qwen2 its own class
    _same_as_auto(qwen2_dir)
    remote = tmp_path / "remote"
    shutil.copytree(llama_dir, remote)
    config = json.loads((remote / "tokenizer_config.json").read_text())
    (remote / "tokenizer_config.json").write_text(json.dumps({**config, "auto_map": {}}))
    assert not generic_tokenizer(remote)


def test_loading_a_generic_tokenizer_does_not_import_torch(llama_dir):
    code = ("import sys\nfrom folio.shared.hf_tokenizer import load_tokenizer\n"
            f"load_tokenizer({str(llama_dir)!r})\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "False"
