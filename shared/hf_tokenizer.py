"""Loads a Hugging Face tokenizer from local files only: a checkpoint directory, or a GGUF
file's tokenizer.ggml.* metadata (transformers converts it, chat template included)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    path = Path(path)
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                             local_files_only=True)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer in {path}: expected one of "
                                f"{', '.join(_TOKENIZER_FILES)}")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
