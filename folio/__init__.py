"""Folio: a paged-KV-cache LLM serving engine. One import for users.

Names load lazily, so `python -m folio scheduler` never imports torch.
"""

from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
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


def _source_checkout_root() -> Path | None:
    """The checkout this folder belongs to, when it was imported as a bare source folder.

    Installed, `folio.kernels` and its siblings sit inside this package (setuptools maps
    them there; an editable install maps them too). Run from a checkout's root without an
    install of it on the path (`python -m folio...` in a Docker build step, say), this folder
    shadows the installed package and the top-level folders are its siblings instead."""
    if find_spec("folio.kernels") is not None:
        return None
    root = Path(__file__).resolve().parent.parent
    return root if (root / "kernels" / "__init__.py").is_file() else None


if (_root := _source_checkout_root()) is not None:
    __path__.append(str(_root))   # noqa: F821 (a package's own search path)
