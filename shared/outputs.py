"""What a request produces: per-step token deltas from the scheduler, final results for users."""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.shared.protocol.codes import FinishReason  # noqa: F401  (its home before shared/protocol/codes.py)


# Per generated token: (logprob, rank, top-k ids, top-k logprobs), from the raw logits.
RawLogprobs = tuple[float, int, list[int], list[float]]


def child_request_id(request_id: str, index: int, n: int) -> str:
    """The id each of n samples reports under (the request's own id when n == 1): the
    scheduler names them so, the frontend finds its samples by them."""
    return request_id if n == 1 else f"{request_id}#{index}"


@dataclass(slots=True)
class EngineOutput:
    """One step's news for one request, as the scheduler reports it: token ids only."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    error: str | None = None
    logprobs: list[RawLogprobs] | None = None   # one entry per new token, when asked for
    # Entries for the next prompt tokens (prompt_logprobs), in order from prompt token 1.
    prompt_logprobs: list[RawLogprobs] | None = None
    queued_s: float | None = None   # on a request's first token: seconds it waited
    pooled: bytes | None = None     # a pooling request's vector (float32 bytes): it ended
    # With an error: its RefusalCode ("request_failed": this request alone); None: the
    # engine failed it (engine_dead).
    error_code: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class StepOutputs:
    """One step's news, columnar: the common case -- one plain token for a request that goes
    on -- as two parallel lists (no object per token), and everything else (a finish, an
    error, logprobs, prompt logprobs, the first token's queue time) as entries apart.
    Iterating yields EngineOutput objects, entries first: a request's prompt logprobs always
    precede its token. A request with several tokens in one step (accepted speculative
    drafts) has them all as entries, in order."""

    ids: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    entries: list[EngineOutput] = field(default_factory=list)
    seq: int | None = None   # the message's number in its frontend's stream (resumes)

    def __iter__(self):
        yield from self.entries
        for request_id, token_id in zip(self.ids, self.tokens):
            yield EngineOutput(request_id, [token_id])

    def __len__(self) -> int:
        return len(self.entries) + len(self.ids)


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
