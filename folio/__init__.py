"""Folio: a paged-KV-cache LLM serving engine. One import for users.

Names load lazily, so `python -m folio scheduler` never imports torch.
"""

from importlib import import_module
from typing import Any

_EXPORTS = {
    "LLM": "folio.llm",
    "Client": "folio.client",
    "AsyncClient": "folio.client",
    "Completion": "folio.client",
    "Delta": "folio.client",
    "SamplingParams": "folio.shared.sampling_params",
    "RequestOutput": "folio.shared.outputs",
    "CompletionOutput": "folio.shared.outputs",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'folio' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
