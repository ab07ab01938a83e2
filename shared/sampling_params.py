"""Per-request sampling parameters with vLLM's meanings, validated on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

_GREEDY_EPS = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # Accept lists from callers and the wire, keep the frozen value hashable.
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        _check_int("n", self.n, low=1)
        _check_number("temperature", self.temperature, low=0.0, rule=">= 0 (0 means greedy)")
        _check_number("top_p", self.top_p, rule="in (0, 1]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, low=-1, rule=">= 1, or 0 / -1 to disable")
        _check_number("min_p", self.min_p, rule="in [0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None:
            _check_int("seed", self.seed, low=0, high=2**63 - 1)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, low=1)
        _check_int("min_tokens", self.min_tokens, low=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens} "
                f"and max_tokens={self.max_tokens}"
            )
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids", token_id, low=0)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stop_token_ids"] = list(self.stop_token_ids)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingParams":
        if not isinstance(data, dict):
            raise TypeError(f"sampling params must be a mapping, got {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        return cls(**data)


def _check_int(name: str, value: Any, low: int | None = None, high: int | None = None,
               rule: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if (low is not None and value < low) or (high is not None and value > high):
        if rule is None:
            rule = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {rule}, got {value}")


def _check_number(name: str, value: Any, low: float | None = None, rule: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be {rule}, got {value}")
