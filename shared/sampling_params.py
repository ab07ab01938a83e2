"""Per-request sampling parameters with vLLM's meanings, validated on construction."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from folio.shared.structured_output import check_spec
from folio.shared.protocol.wire import Body, ProtocolError

_GREEDY_EPS = 1e-5
_INT32_MAX = 2**31 - 1        # token ids, counts and lengths all fit; msgpack and torch too
_MAX_TEMPERATURE = 1e4
# Every range below keeps float32 logits finite: |logit| x 100 (repetition) / 1e-5 (the
# smallest temperature that samples) + 100 (bias) + 2 + 2 (penalties) stays far below 3e38.
MIN_REPETITION_PENALTY = 0.01
# Bounds that keep every message carrying a request bounded (docs/protocol.md, section 3).
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 65_536          # per stop string
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024
MAX_LORA_NAME_CHARS = 64   # a map key on the wire (the stats' per-adapter counts)
# Fields only the frontend reads (stop strings, detokenization): never sent to the engine.
POOLING_KINDS = (None, "last", "mean")
FRONTEND_ONLY = ("stop", "include_stop_str_in_output", "skip_special_tokens")


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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None            # top-k log-probabilities per generated token
    prompt_logprobs: int | None = None     # the same for every prompt token
    logit_bias: dict[int, float] = field(default_factory=dict)
    # One vLLM structured_outputs key, e.g. {"json": schema} (shared/structured_output.py):
    # the executor masks every sampled token to the spec's grammar.
    structured_output: dict[str, Any] | None = None
    # Not sampling, but per request like the rest: vLLM's priority (lower runs first), read
    # by the scheduler under --scheduling-policy priority only.
    priority: int = 0
    # False: this request never carries speculative drafts (docs/spec_decode.md).
    speculative: bool = True
    # Not sampling either: the LoRA adapter this request runs with, by name (docs/lora.md);
    # None: the base model. The executor applies it and the prefix cache keys blocks by it.
    lora: str | None = None
    # A pooling request (shared/pooling/): the executor returns the prompt's pooled hidden
    # state ("last" token or "mean"), or with score_token_ids the softmax over those
    # tokens' logits at the last position, instead of sampling; it then ends. Sent with
    # max_tokens 1: the scheduler runs it as a prefill whose one "sample" is the vector.
    pooling: str | None = None
    score_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        # Lists from callers and the wire become tuples, so nobody changes a frozen value
        # through a list they still hold. (Not hashable: logit_bias and structured_output
        # are dicts, so hash() raises TypeError.)
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        object.__setattr__(self, "score_token_ids", tuple(self.score_token_ids or ()))
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        object.__setattr__(self, "stop", tuple(stop or ()))
        object.__setattr__(self, "logit_bias", _bias_map(self.logit_bias))
        object.__setattr__(self, "structured_output", check_spec(self.structured_output))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_number(name, value, rule="in [-2, 2]")
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        _check_number("repetition_penalty", self.repetition_penalty,
                      rule=f"in [{MIN_REPETITION_PENALTY:g}, 100]")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= 100.0:
            # Past it a seen token's logit is multiplied or divided by almost 0: infinite
            # in float32, and the row's probabilities NaN.
            raise ValueError(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, "
                             f"100], got {self.repetition_penalty}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop takes at most {MAX_STOP_STRINGS} strings, got "
                             f"{len(self.stop)}")
        for text in self.stop:
            if not isinstance(text, str) or not text:
                raise ValueError(f"stop must be non-empty strings, got {text!r:.80}")
            if len(text) > MAX_STOP_CHARS:
                raise ValueError(f"stop strings must be at most {MAX_STOP_CHARS} characters, "
                                 f"got one of {len(text)}")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids takes at most {MAX_STOP_TOKEN_IDS} ids, got "
                             f"{len(self.stop_token_ids)}")
        for name in ("include_stop_str_in_output", "skip_special_tokens", "speculative"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), low=0, high=_INT32_MAX,
                           rule=">= 0")
        _check_int("n", self.n, low=1, high=_INT32_MAX, rule=f">= 1 and <= {_INT32_MAX}")
        _check_number("temperature", self.temperature, low=0.0, rule=">= 0 (0 means greedy)")
        if self.temperature > _MAX_TEMPERATURE:
            raise ValueError(f"temperature must be <= {_MAX_TEMPERATURE:g}, got "
                             f"{self.temperature}")
        _check_number("top_p", self.top_p, rule="in (0, 1]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, low=-1, high=_INT32_MAX,
                   rule=f">= 1, or 0 / -1 to disable (at most {_INT32_MAX})")
        _check_number("min_p", self.min_p, rule="in [0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.seed is not None:
            _check_int("seed", self.seed, low=0, high=2**63 - 1)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, low=1, high=_INT32_MAX,
                       rule=f">= 1 and <= {_INT32_MAX}")
        _check_int("min_tokens", self.min_tokens, low=0, high=_INT32_MAX, rule=">= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens} "
                f"and max_tokens={self.max_tokens}"
            )
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids", token_id, low=0, high=_INT32_MAX)
        _check_int("priority", self.priority, low=-_INT32_MAX - 1, high=_INT32_MAX)
        if self.lora is not None and (not isinstance(self.lora, str) or not self.lora
                                      or len(self.lora) > MAX_LORA_NAME_CHARS):
            raise ValueError(f"lora must be an adapter name of 1 to {MAX_LORA_NAME_CHARS} "
                             f"characters, got {self.lora!r:.80}")
        if self.pooling not in POOLING_KINDS:
            raise ValueError(f"pooling must be one of {', '.join(map(str, POOLING_KINDS))}, "
                             f"got {self.pooling!r:.40}")
        if self.score_token_ids and (self.pooling != "last" or len(self.score_token_ids) != 2):
            raise ValueError("score_token_ids takes two token ids, with pooling 'last'")
        for token_id in self.score_token_ids:
            _check_int("score_token_ids", token_id, low=0, high=_INT32_MAX)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS or self.top_k == 1

    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stop_token_ids"] = list(self.stop_token_ids)
        data["score_token_ids"] = list(self.score_token_ids)
        data["stop"] = list(self.stop)
        # msgpack maps need string keys: token biases travel as [token, bias] pairs.
        data["logit_bias"] = [[token, bias] for token, bias in self.logit_bias.items()]
        return data

    def engine_dict(self) -> dict[str, Any]:
        """What the scheduler and the executor read (lengths, stop tokens, sampler,
        logprobs): to_dict without the frontend-only fields, so the size of an `add` or a
        plan never depends on stop strings."""
        data = self.to_dict()
        for name in FRONTEND_ONLY:
            del data[name]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingParams":
        if not isinstance(data, dict):
            raise TypeError(f"sampling params must be a mapping, got {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        return cls(**data)


def check_against_model(params: SamplingParams, vocab_size: int, max_logprobs: int,
                        max_n: int) -> None:
    """Checks that need the model: token ids must exist, k and n within the engine's limits."""
    if params.n > max_n:
        raise ValueError(f"n must be <= {max_n} (the engine's max_n), got {params.n}")
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and value > max_logprobs:
            raise ValueError(f"{name} must be in [0, {max_logprobs}] (the engine's "
                             f"max_logprobs), got {value}")
    for name, ids in (("stop_token_ids", params.stop_token_ids),
                      ("score_token_ids", params.score_token_ids),
                      ("logit_bias", params.logit_bias)):
        for token_id in ids:
            if not 0 <= token_id < vocab_size:
                raise ValueError(f"{name} has token id {token_id}, outside the vocabulary "
                                 f"[0, {vocab_size})")


def sampling_from_wire(body: Body, name: str = "params") -> SamplingParams:
    """The sampling parameters in a message body's map `name`; a bad one is a ProtocolError."""
    raw = body.map(name)
    try:
        return SamplingParams.from_dict(raw)
    except (TypeError, ValueError) as error:
        raise ProtocolError(f"{body.msg_type}: {error}") from None


def _bias_map(value: Any) -> dict[int, float]:
    """logit_bias from a dict (JSON gives string keys) or a list of [token, bias] pairs."""
    if value is None:
        return {}
    items = value.items() if isinstance(value, dict) else value
    result: dict[int, float] = {}
    try:
        pairs = [tuple(item) for item in items]
    except TypeError:
        raise TypeError("logit_bias must map token ids to biases") from None
    for pair in pairs:
        if len(pair) != 2:
            raise TypeError("logit_bias must map token ids to biases")
        token, bias = pair
        if isinstance(token, str) and token.strip().lstrip("-").isdigit():
            token = int(token)
        _check_int("logit_bias token id", token, low=0, high=_INT32_MAX)
        _check_number("logit_bias value", bias, rule="in [-100, 100]")
        if not -100.0 <= bias <= 100.0:
            raise ValueError(f"logit_bias values must be in [-100, 100], got {bias}")
        result[token] = float(bias)
    if len(result) > MAX_LOGIT_BIAS:
        raise ValueError(f"logit_bias takes at most {MAX_LOGIT_BIAS} entries")
    return result


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
