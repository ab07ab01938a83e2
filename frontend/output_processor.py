"""Output processing, written once for the offline `LLM` and the frontend's engine client.

The engine reports per step, per sample, token ids, maybe logprobs and maybe a finish
reason. A `RequestState` (one per request) and its `SampleState`s (one per sample of n)
turn that into what users see: the text (incremental detokenizing and stop strings, via
frontend/output_text.py), the token ids, logprob entries, the finish reason, and whether a
stop string ended a sample the engine still runs (so the caller aborts it there).

`SampleState.add` is the served path's hot loop (one call per running sample per step):
it allocates nothing of its own for a plain token, the state it returns is its attributes.
"""

from __future__ import annotations

from typing import Any, Callable

from folio.frontend.output_text import OutputText
from folio.frontend.stop_strings import StopStrings
from folio.shared.outputs import EngineOutput, Logprob, RawLogprobs
from folio.shared.sampling_params import SamplingParams

# Turns one raw entry into the caller's shape: (tokenizer, token_id, entry) -> entry.
LogprobFormat = Callable[[Any, int, RawLogprobs], Any]


class TokenTexts:
    """tokenizer.decode([id]), remembered per id, for one request's log-prob entries: its
    tables name the same tokens again and again (every position's top k), and a decode
    costs microseconds on the event loop (a 2,000-token prompt with logprobs 20 is 42,000)."""

    __slots__ = ("tokenizer", "texts")

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.texts = tokenizer, {}

    def decode(self, ids: list[int]) -> str:
        return self.text(ids[0]) if len(ids) == 1 else self.tokenizer.decode(ids)

    def text(self, token_id: int) -> str:
        text = self.texts.get(token_id)
        if text is None:
            text = self.texts[token_id] = self.tokenizer.decode([token_id])
        return text


def wire_logprob(tokenizer: Any, token_id: int, entry: RawLogprobs) -> dict[str, Any]:
    """The frontend's shape (what the gateways encode): token_id, logprob, rank, its text,
    and the top k as [id, logprob, text]."""
    logprob, rank, top_ids, top_logprobs = entry
    decode = tokenizer.decode   # a TokenTexts remembers each id's text
    return {"token_id": token_id, "logprob": logprob, "rank": rank,
            "decoded_token": decode([token_id]),
            "top": [[tid, lp, decode([tid])] for tid, lp in zip(top_ids, top_logprobs)]}


def vllm_logprob(tokenizer: Any, token_id: int, entry: RawLogprobs) -> dict[int, Logprob]:
    """vLLM's shape: the sampled token and the top k, each with logprob, rank and text
    (None without a tokenizer)."""
    logprob, rank, top_ids, top_logprobs = entry

    def text(tid: int) -> str | None:
        return None if tokenizer is None else tokenizer.decode([tid])

    result = {tid: Logprob(lp, i + 1, text(tid))
              for i, (tid, lp) in enumerate(zip(top_ids, top_logprobs))}
    if token_id not in result:
        result[token_id] = Logprob(logprob, rank, text(token_id))
    return result


class SampleState:
    """One sample's output as it grows. After each `add`: `new_logprobs` holds that step's
    entries (None without), `finish_reason` is set once the sample has ended ("stop" for a
    stop string, which `stop_reason` names), and `abort_engine` says a stop string ended it
    while the engine still runs it."""

    __slots__ = ("index", "token_ids", "logprobs", "cumulative_logprob", "new_logprobs",
                 "finish_reason", "stop_reason", "abort_engine", "_text", "_tokenizer",
                 "_format", "pooled")

    def __init__(self, index: int, tokenizer: Any, params: SamplingParams,
                 stops: StopStrings | None, logprob_format: LogprobFormat,
                 texts: TokenTexts | None = None) -> None:
        self.index = index
        self.token_ids: list[int] = []
        wants_logprobs = params.logprobs is not None
        self.logprobs: list[Any] | None = [] if wants_logprobs else None
        self.cumulative_logprob: float | None = 0.0 if wants_logprobs else None
        self.new_logprobs: list[Any] | None = None
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.abort_engine = False
        self.pooled: bytes | None = None   # a pooling request's vector, when it ends
        # No tokenizer (LLM with skip_tokenizer_init): token ids only, the text stays "".
        self._text = None if tokenizer is None else OutputText(tokenizer, params, stops)
        self._tokenizer = tokenizer if texts is None else texts   # for log-prob entries
        self._format = logprob_format

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        return "" if self._text is None else self._text.text

    def add(self, token_ids: list[int], logprobs: list[RawLogprobs] | None = None,
            finish_reason: str | None = None) -> str:
        """Apply one step; return the text that may be streamed now. A finished sample
        takes nothing more (callers skip it; this is the guard)."""
        if self.finish_reason is not None:
            self.new_logprobs = None
            return ""
        self.token_ids.extend(token_ids)
        entries = None
        if logprobs is not None and self.logprobs is not None:
            entries = []
            fmt, tokenizer = self._format, self._tokenizer
            for tid, entry in zip(token_ids, logprobs):
                entries.append(fmt(tokenizer, tid, entry))
                self.cumulative_logprob += entry[0]
            self.logprobs.extend(entries)
        self.new_logprobs = entries
        text = self._text
        if text is None:
            delta = ""
        else:
            delta = text.add(token_ids, final=finish_reason is not None)
            if text.stop_string is not None:
                self.finish_reason = "stop"
                self.stop_reason = text.stop_string
                self.abort_engine = finish_reason is None   # free its blocks now
                return delta
        self.finish_reason = finish_reason
        return delta


class RequestState:
    """A request's samples and its prompt logprobs (from the second prompt token on: the
    first has none)."""

    __slots__ = ("prompt_ids", "samples", "prompt_logprobs", "_tokenizer", "_format")

    def __init__(self, tokenizer: Any, params: SamplingParams, prompt_ids: list[int],
                 logprob_format: LogprobFormat, stops: StopStrings | None = None) -> None:
        if params.stop and stops is None and tokenizer is not None:
            stops = StopStrings(params.stop)   # built once, shared by the n samples
        self.prompt_ids = prompt_ids
        texts = None
        if tokenizer is not None and (params.logprobs is not None
                                      or params.prompt_logprobs is not None):
            texts = TokenTexts(tokenizer)   # one per request: its samples share it
        self.samples = [SampleState(i, tokenizer, params, stops, logprob_format, texts)
                        for i in range(params.n)]
        self.prompt_logprobs: list[Any] | None = \
            None if params.prompt_logprobs is None else []
        self._tokenizer = tokenizer if texts is None else texts
        self._format = logprob_format

    @property
    def finished(self) -> bool:
        return all(sample.finish_reason is not None for sample in self.samples)

    def add(self, sample: SampleState, output: EngineOutput) -> str:
        """Apply one step's output for one of this request's samples (prompt logprobs
        included); return the sample's text delta. Nothing for a finished sample."""
        if sample.finish_reason is not None:
            sample.new_logprobs = None
            return ""
        if output.prompt_logprobs is not None and self.prompt_logprobs is not None:
            start = len(self.prompt_logprobs) + 1
            prompt, tokenizer, fmt = self.prompt_ids, self._tokenizer, self._format
            self.prompt_logprobs.extend(fmt(tokenizer, prompt[start + i], entry)
                                        for i, entry in enumerate(output.prompt_logprobs))
        if output.pooled is not None:
            sample.pooled = output.pooled
        return sample.add(output.new_token_ids, output.logprobs, output.finish_reason)
