"""Stop strings matched as text arrives, in time linear in the text (Knuth-Morris-Pratt).

`StopStrings` holds each stop string's prefix function, built once per request and shared by
its samples. A `StopMatcher` keeps, per stop string, how long a prefix of it the text ends
with: a character costs amortized O(1) per stop string however long the strings are, and
the tail a stream must hold back is the longest such partial match.
"""

from __future__ import annotations

from array import array


class StopStrings:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.tables = [_prefix_function(stop) for stop in stops]
        self.total_chars = sum(len(stop) for stop in stops)


def _prefix_function(pattern: str) -> array:
    """table[i]: length of the longest proper prefix of pattern[:i + 1] that is also its
    suffix."""
    table = array("i", bytes(4 * len(pattern)))
    k = 0
    for i in range(1, len(pattern)):
        char = pattern[i]
        while k and pattern[k] != char:
            k = table[k - 1]
        if pattern[k] == char:
            k += 1
        table[i] = k
    return table


class StopMatcher:
    def __init__(self, strings: StopStrings) -> None:
        self.strings = strings
        self.partial = [0] * len(strings.stops)   # per stop string: matched prefix length

    def feed(self, text: str, report: bool = True) -> tuple[int, str] | None:
        """Consume `text`. With `report`, return the match completed in it that starts
        first: (its start relative to the start of `text`, negative when it began in
        earlier text; the stop string). Without, matches are passed over."""
        best: tuple[int, str] | None = None
        for j, (stop, table) in enumerate(zip(self.strings.stops, self.strings.tables)):
            k, size = self.partial[j], len(stop)
            for i, char in enumerate(text):
                while k and stop[k] != char:
                    k = table[k - 1]
                if stop[k] == char:
                    k += 1
                if k == size:
                    if report:
                        start = i - size + 1
                        if best is None or start < best[0]:
                            best = (start, stop)
                        break   # later matches of this string start later
                    k = table[k - 1]
            self.partial[j] = k
        return best

    def held_back(self) -> int:
        """How many characters at the end of the text may still begin a stop string."""
        return max(self.partial, default=0)
