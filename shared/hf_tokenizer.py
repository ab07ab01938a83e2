"""Loads a Hugging Face tokenizer from local files only: a checkpoint directory, or a GGUF
file's tokenizer.ggml.* metadata (transformers converts it, chat template included).

AutoTokenizer reads the model's config to pick a class, and that import brings in torch:
2 of the frontend's 3.6 s of start-up CPU on a 2-core machine. A checkpoint whose
tokenizer_config.json names the generic class (`TokenizersBackend`, what transformers 5
saves) and whose model type transformers gives no tokenizer of its own gets that class
directly, as AutoTokenizer would (tests/shared/test_hf_tokenizer.py checks both the choice
and the result); anything else goes through AutoTokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# Model types for which AutoTokenizer keeps a generic class the checkpoint declares: none
# registered, or a generic one, and not on its list of checkpoints with a wrong class.
GENERIC_TOKENIZER_MODEL_TYPES = frozenset({
    "llama", "smollm3", "gpt_oss", "lfm2", "olmo2", "olmo3", "granite", "glm4",
    "deepseek_v3"})


def load_tokenizer(path: str | Path) -> Any:
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        from transformers import AutoTokenizer

        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        from huggingface_hub.errors import StrictDataclassError

        try:
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 local_files_only=True)
        except StrictDataclassError:
            pass   # a config it cannot type (Gemma 4's per-layer KV heads or MLP widths)
        except ValueError as error:
            if "is not supported yet" not in str(error):
                raise
        except TypeError:   # transformers 5.24 misreads gpt-oss files' rope.scaling.* keys
            pass
        # transformers reads no config from this architecture's files (LFM2-MoE's; gpt-oss's
        # it misreads), or cannot hold the one it reads (Gemma 4's): its generic class
        # converts the tokenizer.ggml.* metadata all the same
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 local_files_only=True)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        raise FileNotFoundError(f"no tokenizer in {path}: expected one of "
                                f"{', '.join(_TOKENIZER_FILES)}")
    if generic_tokenizer(path):
        from transformers import TokenizersBackend

        return TokenizersBackend.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def generic_tokenizer(path: Path) -> bool:
    """Whether AutoTokenizer would load this directory's tokenizer.json as the generic
    class (see the module's note): decided from the two JSON files alone."""
    try:
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return False
    return ((path / "tokenizer.json").is_file()
            and tokenizer_config.get("tokenizer_class") in _GENERIC_CLASSES
            and "auto_map" not in tokenizer_config
            and model_type in GENERIC_TOKENIZER_MODEL_TYPES)
