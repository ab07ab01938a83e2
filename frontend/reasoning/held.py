"""The tail of streamed text that must wait: it may be the start of a marker the next piece
completes (a marker's tokens arrive in separate deltas)."""

from __future__ import annotations


def partial_marker(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` are a proper prefix of one of `markers`."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


class HeldText:
    """A reader of streamed text that holds back what it cannot place yet: `feed` each
    piece, `finish` at the end; both give (reasoning, answer) to send now. Its subclass's
    `_run` places what `buffer` holds."""

    buffer: str

    def feed(self, text: str) -> tuple[str, str]:
        self.buffer += text
        return self._run(final=False)

    def finish(self) -> tuple[str, str]:
        return self._run(final=True)

    def _run(self, final: bool) -> tuple[str, str]:
        raise NotImplementedError


def trailing_space(text: str, end: int) -> int:
    """Where the whitespace that ends text[:end] begins."""
    while end > 0 and text[end - 1].isspace():
        end -= 1
    return end
