"""Suffix decoding (after Oliaro et al., arXiv 2411.04975): drafts from the continuations
of the longest earlier match of a request's recent tokens, ranked by how often each
continuation followed, in the request's own tokens and (opt-in) in recent requests'
outputs.

The paper keeps suffix trees. A query of one only needs, for the context's longest suffix
that occurred before, the occurrences of it (a node of the tree) and counts of what came
next (its children). Both come straight out of the token array with a few vectorised
passes, so nothing is built or kept per request: the occurrences of the last token are
found in one comparison over the array (a few microseconds for thousands of tokens), then
narrowed one token further back at a time while any survive (depth <= max_tree_depth),
then walked forward, taking at each step the most frequent next token (ties: the latest),
while the estimated probability of the path (the product of each step's count over its
parent's) stays at or above min_token_prob. At most max_spec_factor x the match length
tokens are proposed: a long match earns a long draft, a one-token match at most one.

The global cache keeps the outputs of the last N finished requests, each under its scope
(the client that sent it, or one shared scope), and a request searches only its own
scope's, laid out in one array (each followed by a -1 that no match or walk crosses),
rebuilt when that scope's outputs change; memory and the cost of a query are bounded by
N x MAX_CACHED_OUTPUT_TOKENS whatever the number of scopes. Scoped per client, a client
cannot tell from how fast its text decodes whether another client sent it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

MAX_CACHED_OUTPUT_TOKENS = 1024   # per cached request: its first ones
_SEPARATOR = -1


@dataclass(frozen=True)
class SuffixSettings:
    max_tree_depth: int       # longest context suffix matched
    max_spec_factor: float    # drafts <= factor x match length
    min_token_prob: float     # stop when the path's estimated probability falls below
    min_match_len: int        # shorter matches propose nothing


def longest_match(stream: np.ndarray, ends: np.ndarray, context: np.ndarray,
                  max_depth: int) -> tuple[np.ndarray, int]:
    """The positions in `stream` where the longest suffix of `context` (at most max_depth
    tokens) ends, given `ends`: where its last token occurs; and that length."""
    depth = 1
    limit = min(max_depth, len(context))
    while depth < limit and len(ends):
        if len(ends) == 1:   # one occurrence left: its length in one comparison
            end = int(ends[0])
            span = min(limit, end + 1)
            differ = np.flatnonzero(stream[end + 1 - span:end + 1][::-1]
                                    != context[len(context) - span:][::-1])
            return ends, int(differ[0]) if len(differ) else span
        before = ends - depth
        before = before[before >= 0]
        keep = before[stream[before] == context[-1 - depth]] + depth
        if not len(keep):
            break
        ends, depth = keep, depth + 1
    return ends, depth


def walk(stream: np.ndarray, ends: np.ndarray, limit: int, min_prob: float
         ) -> tuple[list[int], float]:
    """The most frequent continuation of the occurrences ending at `ends` (ascending), token
    by token while its estimated probability stays >= min_prob; with its score (the sum of
    the probabilities: the expected accepted drafts)."""
    drafts: list[int] = []
    prob, score = 1.0, 0.0
    size = len(stream)
    while len(drafts) < limit:
        nexts = ends + 1
        nexts = nexts[nexts < size]
        if len(nexts) == 1:   # one occurrence left: the rest of it, at this probability
            start = int(nexts[0])
            tail = stream[start:start + limit - len(drafts)].tolist()
            if _SEPARATOR in tail:
                tail = tail[:tail.index(_SEPARATOR)]
            drafts += tail
            return drafts, score + prob * len(tail)
        tokens = stream[nexts]
        known = tokens != _SEPARATOR
        nexts, tokens = nexts[known], tokens[known]
        if not len(tokens):
            break
        values, counts = np.unique(tokens, return_counts=True)
        best = counts.max()
        top = values[counts == best]
        token = int(top[0]) if len(top) == 1 else int(tokens[np.isin(tokens, top)][-1])
        prob *= best / len(tokens)
        if prob < min_prob:
            break
        drafts.append(token)
        score += prob
        ends = nexts[tokens == token]
    return drafts, score


def _propose_in(stream: np.ndarray, ends: np.ndarray, context: np.ndarray, cap: int,
                settings: SuffixSettings) -> tuple[list[int], float]:
    if not len(ends):
        return [], 0.0
    ends, depth = longest_match(stream, ends, context, settings.max_tree_depth)
    if depth < settings.min_match_len:
        return [], 0.0
    limit = min(cap, int(settings.max_spec_factor * depth))
    if limit < 1:
        return [], 0.0
    return walk(stream, ends, limit, settings.min_token_prob)


def propose_suffix(tokens: np.ndarray, cap: int, settings: SuffixSettings,
                   cache: SuffixCache | None = None, scope: str | None = None) -> list[int]:
    """Up to `cap` drafts for a request whose tokens (prompt and output) are `tokens`: from
    its own earlier tokens, or from its scope's cached outputs when that path scores
    higher."""
    if len(tokens) < 2 or cap < 1:
        return []
    last = tokens[-1]
    own = np.flatnonzero(tokens[:-1] == last)   # never the context's own end
    drafts, score = _propose_in(tokens, own, tokens, cap, settings)
    stream = cache.stream(scope) if cache is not None else None
    if stream is not None:
        found, other = _propose_in(stream, np.flatnonzero(stream == last), tokens, cap,
                                   settings)
        if other > score:
            drafts = found
    return drafts


class SuffixCache:
    """The outputs of the last `max_requests` finished requests, each under its scope, for
    the proposals of the requests of that scope (the paper's global tree, per tenant)."""

    def __init__(self, max_requests: int) -> None:
        self.outputs: deque[tuple[str | None, np.ndarray]] = deque(maxlen=max_requests)
        self._streams: dict[str | None, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.outputs)

    def add(self, output: list[int], scope: str | None = None) -> None:
        if not output:
            return
        if len(self.outputs) == self.outputs.maxlen:   # the oldest leaves its scope
            self._streams.pop(self.outputs[0][0], None)
        self.outputs.append((scope, np.asarray(output[:MAX_CACHED_OUTPUT_TOKENS],
                                               dtype=np.int64)))
        self._streams.pop(scope, None)

    def stream(self, scope: str | None = None) -> np.ndarray | None:
        """Every cached output of `scope`, each followed by a separator, in one array;
        None when it has none."""
        stream = self._streams.get(scope)
        if stream is None:
            separator = np.full(1, _SEPARATOR, dtype=np.int64)
            parts = [part for owner, output in self.outputs if owner == scope
                     for part in (output, separator)]
            if not parts:
                return None
            stream = self._streams[scope] = np.concatenate(parts)
        return stream
