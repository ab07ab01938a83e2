"""Shared fixtures: tiny checkpoints made locally (nothing is downloaded)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import settings

# triton decides when it is first imported whether its own @jit functions (tl.zeros, ...)
# compile or run in its CPU interpreter: without CUDA, the interpreter, set before any test
# module imports triton (AutoAWQ and PEFT do at import). tests/kernels/conftest.py says more.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Property tests: the suite runs the `ci` profile (its examples fit the ten-minute budget);
# FOLIO_HYPOTHESIS_PROFILE=thorough searches ten times as long, before a release or after
# a change to the scheduler.
settings.register_profile("ci", max_examples=100, deadline=None)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("FOLIO_HYPOTHESIS_PROFILE", "ci"))

# The device the model tests run on: "cpu" everywhere, "cuda" in bench/gpu_check.sh.
TEST_DEVICE = os.environ.get("FOLIO_TEST_DEVICE", "cpu")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from folio.tiny_models import train_tokenizer

    path = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(path, vocab_size=1024)
    return path


def _model_dir(tmp_path_factory, tokenizer_dir: Path, name: str, **checkpoint) -> Path:
    from folio.tiny_models import make_random_checkpoint

    path = tmp_path_factory.mktemp(name)
    for file in TOKENIZER_FILES:
        if (tokenizer_dir / file).exists():
            shutil.copy(tokenizer_dir / file, path / file)
    make_random_checkpoint(path, vocab_size=1024, **checkpoint)
    return path


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory, tokenizer_dir) -> Path:
    return _model_dir(tmp_path_factory, tokenizer_dir, "llama", arch="llama")


@pytest.fixture(scope="session")
def long_llama_dir(tmp_path_factory, tokenizer_dir) -> Path:
    """llama_dir's weights with a 32768-token context: room for answers that outlast any
    step of a test on a far faster engine (ended by an abort, a kill or a deadline)."""
    return _model_dir(tmp_path_factory, tokenizer_dir, "llama_long", arch="llama",
                      max_position_embeddings=32768)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory, tokenizer_dir) -> Path:
    # Tied embeddings and MQA exercise other loader and attention paths.
    return _model_dir(tmp_path_factory, tokenizer_dir, "qwen2", arch="qwen2",
                      num_kv_heads=1, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def mistral_dir(tmp_path_factory, tokenizer_dir) -> Path:
    return _model_dir(tmp_path_factory, tokenizer_dir, "mistral", arch="mistral",
                      num_heads=4, num_kv_heads=4, head_dim=32, hidden_size=96,
                      num_layers=3)


@pytest.fixture(scope="session")
def llama3_rope_dir(tmp_path_factory, tokenizer_dir) -> Path:
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}
    return _model_dir(tmp_path_factory, tokenizer_dir, "llama3", arch="llama",
                      rope_parameters=rope)


@pytest.fixture(scope="session")
def lora_adapters(long_llama_dir, tmp_path_factory) -> dict[str, Path]:
    """PEFT adapters on long_llama_dir (tests/lora_adapters.py ADAPTERS), by name."""
    from tests.lora_adapters import ADAPTERS, make_adapter

    root = tmp_path_factory.mktemp("loras")
    return {name: make_adapter(long_llama_dir, root / name, seed, rank, alpha, targets, rs)
            for name, (seed, rank, alpha, targets, rs) in ADAPTERS.items()}


@pytest.fixture(scope="session")
def lora_expected(long_llama_dir, lora_adapters) -> dict:
    """transformers + PEFT greedy answers to tests/lora_adapters.py PROMPTS, by adapter
    name (None: the base model)."""
    from tests.lora_adapters import MAX_TOKENS, PROMPTS, hf_lora_greedy

    refs = {name: hf_lora_greedy(long_llama_dir, path, PROMPTS, MAX_TOKENS)
            for name, path in lora_adapters.items()}
    refs[None] = hf_lora_greedy(long_llama_dir, None, PROMPTS, MAX_TOKENS)
    return refs
