"""Which runner a model gets, and how it pools, from its own files and two settings.

A checkpoint is an embedding model when
- its config.json's architecture is a base model class (`Qwen3Model`, `LlamaModel`, ...:
  the transformer without its LM head, as sentence-transformers saves decoders), or
- it ships sentence-transformers' modules.json with a Pooling module (Qwen3-Embedding
  does): 1_Pooling/config.json says last-token or mean, a Normalize module says normalise;
and a scorer (decoder reranker) when config.json has `classifier_from_token`, two tokens
[against, for] (vLLM's key; Qwen3-Reranker converted for vLLM has ["no", "yes"]), or the
setting --score-tokens names them. Anything else generates. `--runner` overrides the guess.

Matryoshka truncation (`dimensions`) is allowed only where config.json declares it:
`matryoshka_dimensions` (exactly those sizes) or `is_matryoshka: true` (any size up to the
hidden size); vLLM reads the same keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUNNERS = ("auto", "generate", "pooling")
POOLING_TYPES = ("auto", "last", "mean")
SCORE_TOKENS_HELP = "two tokens, against and for, e.g. no,yes"


@dataclass(frozen=True)
class PoolingTask:
    """A pooling runner's model: how requests are pooled and what answers may ask."""

    pooling_type: str                       # "last" or "mean"
    normalize: bool                         # embeddings scaled to unit length
    hidden_size: int
    score_tokens: tuple[str, ...] = ()      # (against, for): a scorer, not an embedder
    matryoshka: bool = False                # any dimensions up to hidden_size
    matryoshka_dimensions: tuple[int, ...] = ()   # else exactly these (empty: none)

    @property
    def scores(self) -> bool:
        return bool(self.score_tokens)

    def dimensions_problem(self, dimensions: int) -> str | None:
        """Why `dimensions` cannot be served by this model (None: it can)."""
        if dimensions == self.hidden_size:
            return None
        if self.matryoshka and 1 <= dimensions <= self.hidden_size:
            return None
        if dimensions in self.matryoshka_dimensions:
            return None
        if self.matryoshka or self.matryoshka_dimensions:
            allowed = (f"1 to {self.hidden_size}" if self.matryoshka
                       else ", ".join(map(str, sorted(self.matryoshka_dimensions))))
            return f"dimensions must be one of this model's Matryoshka sizes ({allowed}), " \
                   f"got {dimensions}"
        return (f"this model does not declare Matryoshka dimensions (config.json's "
                f"is_matryoshka or matryoshka_dimensions), so dimensions can only be its "
                f"hidden size {self.hidden_size}, got {dimensions}")

    def to_wire(self) -> dict[str, Any]:
        return {"type": self.pooling_type, "normalize": self.normalize,
                "hidden_size": self.hidden_size, "score_tokens": list(self.score_tokens),
                "matryoshka": self.matryoshka,
                "matryoshka_dimensions": list(self.matryoshka_dimensions)}

    @classmethod
    def from_wire(cls, values: dict[str, Any]) -> "PoolingTask":
        return cls(values["type"], values["normalize"], values["hidden_size"],
                   tuple(values["score_tokens"]), values["matryoshka"],
                   tuple(values["matryoshka_dimensions"]))


def base_model_architecture(name: str, supported: tuple[str, ...] | dict) -> str:
    """`Qwen3Model` -> `Qwen3ForCausalLM` where Folio serves that: a base model class is the
    same decoder without its LM head."""
    if name.endswith("Model") and name[:-5] + "ForCausalLM" in supported:
        return name[:-5] + "ForCausalLM"
    return name


def parse_score_tokens(value: str | None) -> tuple[str, ...]:
    """--score-tokens "no,yes" -> ("no", "yes"); ValueError for anything but two tokens."""
    if not value:
        return ()
    tokens = tuple(value.split(","))
    if len(tokens) != 2 or not all(tokens):
        raise ValueError(f"takes {SCORE_TOKENS_HELP}, got {value!r}")
    return tokens


def resolve_pooling_task(model_dir: str | Path, runner: str = "auto",
                         pooling_type: str = "auto", score_tokens: str | None = None
                         ) -> PoolingTask | None:
    """The model's pooling task, or None for the generate runner. ValueError names what
    cannot be served (an unknown sentence-transformers pooling mode, a classification head)."""
    if runner not in RUNNERS:
        raise ValueError(f"runner must be one of {', '.join(RUNNERS)}, got {runner!r}")
    if pooling_type not in POOLING_TYPES:
        raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got "
                         f"{pooling_type!r}")
    path = Path(model_dir)
    config = (_json(path / "config.json") if path.is_dir() else None) or {}
    modules = _json(path / "modules.json") if path.is_dir() else None
    declared = _declared_pooling(path, modules)
    architecture = (config.get("architectures") or ["<none>"])[0]
    tokens = parse_score_tokens(score_tokens) or tuple(config.get("classifier_from_token") or ())
    if tokens and len(tokens) != 2:
        raise ValueError(f"classifier_from_token must name two tokens, got {list(tokens)}")
    if runner == "auto":
        embeds = declared is not None or (architecture.endswith("Model")
                                          and not architecture.endswith("ForCausalLM"))
        runner = "pooling" if embeds or tokens else "generate"
    if runner == "generate":
        return None
    if architecture.endswith("ForSequenceClassification") and not tokens:
        raise ValueError(f"{architecture}: classification heads are not served; a decoder "
                         "reranker is served from two token logits (config.json's "
                         "classifier_from_token or --score-tokens)")
    kind, normalize = declared if declared is not None else ("last", True)
    if pooling_type != "auto":
        kind = pooling_type
    if tokens:
        kind = "last"   # a scorer reads the next-token logits at the last position
    dims = config.get("matryoshka_dimensions") or ()
    return PoolingTask(kind, normalize, int(config.get("hidden_size") or 0), tokens,
                       bool(config.get("is_matryoshka", False)), tuple(int(d) for d in dims))


def _declared_pooling(path: Path, modules: list | None) -> tuple[str, bool] | None:
    """sentence-transformers' modules.json: (pooling kind, normalise) or None."""
    if not isinstance(modules, list):
        return None
    pooling = next((m for m in modules if isinstance(m, dict)
                    and str(m.get("type", "")).endswith("Pooling")), None)
    if pooling is None:
        return None
    normalize = any(isinstance(m, dict) and str(m.get("type", "")).endswith("Normalize")
                    for m in modules)
    settings = _json(path / str(pooling.get("path", "")) / "config.json") or {}
    if settings.get("pooling_mode_lasttoken"):
        return "last", normalize
    if settings.get("pooling_mode_mean_tokens"):
        return "mean", normalize
    modes = sorted(k for k, v in settings.items() if k.startswith("pooling_mode") and v)
    raise ValueError(f"sentence-transformers pooling {', '.join(modes) or '(none)'} is not "
                     "served; Folio pools by last token or mean")


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
