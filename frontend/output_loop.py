"""The one loop around the output processor, for the frontend's engine client and the
offline `folio.LLM`.

The engine reports outputs per sample (a sample id is the request id, or `id#i` of n).
`OutputLoop` finds each output's request and sample, skips samples already ended, applies
the output to the request's `RequestState` (frontend/output_processor.py: text, stop
strings, logprobs, finish), aborts at the engine a sample a stop string ended while the
engine still ran it (its blocks are freed now), and tells its `OutputEvents` what happened:
`tokens` before a step is applied (timing, metrics), `step` after it (streams), `finished`
once every sample of a request has ended, `error` for an output that carries one.

`on_token` is the columnar fast path (one plain token, no finish, no logprobs): the served
hot loop, one call per running sample per step; it allocates nothing but the id list the
consumer keeps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable, Generic, TypeVar

from folio.frontend.output_processor import RequestState, SampleState
from folio.shared.outputs import EngineOutput, StepOutputs

R = TypeVar("R")   # the consumer's own record of a request


class OutputEvents(Generic[R]):
    """What an output loop tells its consumer; each does nothing unless overridden."""

    def error(self, request_id: str, request: R, message: str,
              code: str | None = None) -> bool:
        """An output carries an error (`code`: its RefusalCode, None: the engine failed it);
        True: the consumer took it (nothing is applied)."""
        return False

    def tokens(self, request: R, count: int, queued_s: float | None) -> None:
        """A step of `count` tokens is about to be applied (`queued_s`: on a request's
        first output, the seconds it waited)."""

    def step(self, request: R, sample: SampleState, delta: str, new_ids: list[int]) -> None:
        """A step was applied: `delta` is the text that may be streamed now."""

    def finished(self, request_id: str, request: R) -> None:
        """Every sample of the request has ended; its state holds the whole result."""


class OutputLoop(Generic[R]):
    __slots__ = ("events", "abort_sample", "samples")

    def __init__(self, events: OutputEvents[R], abort_sample: Callable[[str], Any]) -> None:
        self.events = events
        self.abort_sample = abort_sample   # at the engine, by sample id
        # sample id -> (request id, request, state, sample): one lookup per token.
        self.samples: dict[str, tuple[str, R, RequestState, SampleState]] = {}

    def track(self, request_id: str, request: R, state: RequestState,
              sample_ids: list[str]) -> None:
        for sample_id, sample in zip(sample_ids, state.samples):
            self.samples[sample_id] = (request_id, request, state, sample)

    def untrack(self, sample_ids: Iterable[str]) -> None:
        for sample_id in sample_ids:
            self.samples.pop(sample_id, None)

    def feed(self, outputs: StepOutputs | Iterable[EngineOutput]) -> None:
        """A whole step's outputs (columnar or not)."""
        if isinstance(outputs, StepOutputs):
            for output in outputs.entries:
                self.on_output(output)
            for sample_id, token_id in zip(outputs.ids, outputs.tokens):
                self.on_token(sample_id, token_id)
        else:
            for output in outputs:
                self.on_output(output)

    def on_output(self, output: EngineOutput) -> None:
        found = self.samples.get(output.request_id)
        if found is None:
            return   # not this consumer's, or ended (an abort's answer, say)
        request_id, request, state, sample = found
        if output.error is not None and self.events.error(request_id, request, output.error,
                                                          output.error_code):
            return
        if sample.finish_reason is not None:
            return   # already ended by a stop string
        self.events.tokens(request, len(output.new_token_ids), output.queued_s)
        delta = state.add(sample, output)
        self._stepped(output.request_id, request_id, request, state, sample, delta,
                      output.new_token_ids)

    def on_token(self, sample_id: str, token_id: int) -> None:
        found = self.samples.get(sample_id)
        if found is not None:
            request_id, request, state, sample = found
            if sample.finish_reason is None:
                new_ids = [token_id]   # the consumer keeps it
                self.events.tokens(request, 1, None)
                self._stepped(sample_id, request_id, request, state, sample,
                              sample.add(new_ids), new_ids)

    def _stepped(self, sample_id: str, request_id: str, request: R, state: RequestState,
                 sample: SampleState, delta: str, new_ids: list[int]) -> None:
        self.events.step(request, sample, delta, new_ids)
        if sample.finish_reason is None:
            return
        if sample.abort_engine:
            self.abort_sample(sample_id)   # a stop string ended it: free its blocks now
        if state.finished:
            self.events.finished(request_id, request)
