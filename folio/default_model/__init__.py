"""Folio's built-in default model: a small Llama that ships inside the package.

``folio serve`` with no ``--model`` serves this model, so a new user sees text come back
without downloading anything.

What it is
    A ``LlamaForCausalLM`` of about 4 M parameters (hidden 256, 4 layers, 8 query heads and
    4 key/value heads, intermediate 688, tied embeddings, max_position_embeddings 2048) in
    float32 safetensors, with a 4096-token byte-level BPE tokenizer and a ChatML chat
    template. ``generation_config.json`` stops on ``<|endoftext|>`` (id 0) and ``<|im_end|>``.

How it was built
    Trained from scratch on text that ships with Python: CPython's bundled documentation
    (``pydoc_data.topics``, about 450 kB) plus ChatML question/answer pairs made from it
    (the user asks about a documentation section, the assistant answers with its opening
    sentences). The tokenizer is trained on the same text. Training is a plain torch loop
    (AdamW, warmup then cosine learning rate, batches of 16 windows of 256 tokens) on one
    CPU thread with a fixed seed; ``weights/build_info.json`` records the steps, losses and
    versions of the committed build. It writes like the Python reference manual and knows
    nothing else: it is a demonstration model, not an assistant.

How to rebuild
    ``python -m folio.default_model.build`` (11-12 minutes on one CPU core) rewrites
    ``folio/default_model/weights/``. ``--out DIR`` writes elsewhere, ``--steps N`` trains
    shorter or longer. The corpus is the running Python's ``pydoc_data``, so a different
    Python version gives slightly different weights.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["default_model_path", "resolve_model", "WEIGHTS_DIR"]

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"

_REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def default_model_path() -> Path:
    """The directory of the built-in model, loadable by ``from_pretrained`` and Folio."""
    missing = [name for name in _REQUIRED if not (WEIGHTS_DIR / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"Folio's default model is missing from {WEIGHTS_DIR} (no {', '.join(missing)}). "
            "Reinstall folio, or rebuild it with `python -m folio.default_model.build`, "
            "or pass --model explicitly.")
    return WEIGHTS_DIR


def resolve_model(model: str | None) -> str:
    """The checkpoint directory a command serves: the one given, else the built-in model."""
    return model or str(default_model_path())
