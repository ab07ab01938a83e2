"""What a request produces: per-step token deltas from the scheduler, final results for users."""

from __future__ import annotations

from dataclasses import dataclass, field


class FinishReason:
    STOP = "stop"        # EOS, a stop token or a stop string
    LENGTH = "length"    # max_tokens or the context limit
    ABORT = "abort"      # cancelled by the client or the server
    ERROR = "error"      # the engine failed the request


# Per generated token: (logprob, rank, top-k ids, top-k logprobs), from the raw logits.
RawLogprobs = tuple[float, int, list[int], list[float]]


@dataclass(slots=True)
class EngineOutput:
    """One step's news for one request, as the scheduler reports it: token ids only."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[RawLogprobs] | None = None   # one entry per new token, when asked for
    # Entries for the next prompt tokens (prompt_logprobs), in order from prompt token 1.
    prompt_logprobs: list[RawLogprobs] | None = None
    queued_s: float | None = None   # on a request's first token: seconds it waited

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Logprob:
    logprob: float
    rank: int
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    # vLLM's shape: per generated token, token id -> Logprob for the sampled token and top k.
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    # vLLM's shape: None for the first prompt token, then token id -> Logprob per position.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
