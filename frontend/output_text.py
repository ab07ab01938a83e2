"""The text of one sample as tokens arrive: detokenization, stop strings, what to stream.

A stop string is matched on the detokenized text, across token boundaries. The text ends
right before the match (or after it, with include_stop_str_in_output). While streaming, only
the tail that could still turn into a stop string is held back.
"""

from __future__ import annotations

from typing import Any

from frontend.detokenizer import IncrementalDetokenizer
from shared.sampling_params import SamplingParams


class OutputText:
    def __init__(self, tokenizer: Any, params: SamplingParams) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, params.skip_special_tokens)
        self.stops = params.stop
        self.include_stop = params.include_stop_str_in_output
        self.longest_stop = max((len(s) for s in self.stops), default=0)
        self.min_tokens = params.min_tokens   # as vLLM: no stop string before min_tokens
        self.num_tokens = 0
        self.text = ""
        self.sent = 0
        self.stop_string: str | None = None

    @property
    def stopped(self) -> bool:
        return self.stop_string is not None

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """Feed tokens; return the text that may be streamed now."""
        if self.stopped:
            return ""
        before = len(self.text)
        self.num_tokens += len(token_ids)
        self.detokenizer.add(token_ids)
        if final:
            self.detokenizer.flush()
        self.text = self.detokenizer.text
        if self.stops and self.num_tokens > self.min_tokens:
            self._match(max(0, before - self.longest_stop + 1))
        end = len(self.text) if final or self.stopped else len(self.text) - self._held_back()
        delta = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return delta

    def _match(self, start: int) -> None:
        best = None
        for stop in self.stops:
            index = self.text.find(stop, start)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        if best is not None:
            index, stop = best
            self.stop_string = stop
            self.text = self.text[:index + len(stop) if self.include_stop else index]

    def _held_back(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        for size in range(min(self.longest_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-size:]
            if any(stop.startswith(tail) for stop in self.stops):
                return size
        return 0
