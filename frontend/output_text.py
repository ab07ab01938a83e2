"""The text of one sample as tokens arrive: detokenization, stop strings, what to stream.

A stop string is matched on the detokenized text, across token boundaries, by an automaton
fed only the new characters (frontend/stop_strings.py). The text ends right before the match
(or after it, with include_stop_str_in_output). While streaming, only the tail that could
still turn into a stop string is held back; everything else is kept as pieces, so each token
costs work in its own characters, not in the text so far.
"""

from __future__ import annotations

from typing import Any

from folio.frontend.detokenizer import IncrementalDetokenizer
from folio.frontend.stop_strings import StopMatcher, StopStrings
from folio.shared.sampling_params import SamplingParams


class OutputText:
    def __init__(self, tokenizer: Any, params: SamplingParams,
                 stops: StopStrings | None = None) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, params.skip_special_tokens)
        self.matcher = None
        if params.stop:
            self.matcher = StopMatcher(stops if stops is not None else StopStrings(params.stop))
        self.include_stop = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens   # as vLLM: no stop string before min_tokens
        self.num_tokens = 0
        self._sent: list[str] = []   # text already given out
        self._pending = ""           # text held back: at most the longest partial match
        self.stop_string: str | None = None

    @property
    def stopped(self) -> bool:
        return self.stop_string is not None

    @property
    def text(self) -> str:
        if len(self._sent) > 1:
            self._sent = ["".join(self._sent)]
        return (self._sent[0] if self._sent else "") + self._pending

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """Feed tokens; return the text that may be streamed now."""
        if self.stop_string is not None:
            return ""
        self.num_tokens += len(token_ids)
        new = self.detokenizer.add(token_ids)
        if final:
            new += self.detokenizer.flush()
        pending = self._pending + new
        hold = 0
        if self.matcher is not None:
            match = self.matcher.feed(new, report=self.num_tokens > self.min_tokens)
            if match is not None:
                start, stop = match
                end = len(self._pending) + start + (len(stop) if self.include_stop else 0)
                pending = pending[:end]
                self.stop_string = stop
            elif not final:
                hold = self.matcher.held_back()
        delta = pending[:len(pending) - hold]
        self._pending = pending[len(pending) - hold:]
        if delta:
            self._sent.append(delta)
        return delta
