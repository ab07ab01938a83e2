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


def trailing_space(text: str, end: int) -> int:
    """Where the whitespace that ends text[:end] begins."""
    while end > 0 and text[end - 1].isspace():
        end -= 1
    return end
