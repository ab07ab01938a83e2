"""Suffix decoding's proposer (executor/spec_decode/suffix.py): what follows the longest earlier
match, ranked by frequency, bounded by k, the match length and the probability threshold;
the global cache of finished outputs, opt-in and bounded."""

from __future__ import annotations

import numpy as np
import pytest

from folio.executor.spec_decode.speculator import Speculator
from folio.executor.spec_decode.suffix import (MAX_CACHED_OUTPUT_TOKENS, SuffixCache,
                                            SuffixSettings, propose_suffix)
from folio.shared.spec_decode_config import SpeculativeConfig, parse_speculative_config

SETTINGS = SuffixSettings(max_tree_depth=24, max_spec_factor=4.0, min_token_prob=0.1,
                          min_match_len=2)


def _propose(tokens, cap=8, cache=None, **changes):
    settings = SuffixSettings(**{**SETTINGS.__dict__, **changes})
    return propose_suffix(np.asarray(tokens, dtype=np.int64), cap, settings, cache)


def test_proposes_what_follows_a_repeated_span():
    span = [11, 12, 13, 14, 15, 16, 17]
    assert _propose([1, 2] + span + [3, 4] + span[:3]) == [14, 15, 16, 17, 3, 4, 11, 12]
    assert _propose([1, 2] + span + [3, 4] + span[:3], cap=3) == [14, 15, 16]   # k


def test_the_longest_match_wins_over_a_later_shorter_one():
    # (7, 1, 2) once, followed by 5; (1, 2) later, followed by 6.
    assert _propose([7, 1, 2, 5, 9, 1, 2, 6, 8, 7, 1, 2], cap=1) == [5]


def test_the_most_frequent_continuation_wins_and_the_threshold_stops_the_draft():
    # The longest match, (3, 0, 1, 2), is followed by 3 twice and by 4 once (the latest):
    # 3, at p = 2/3.
    tokens = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 2]
    assert _propose(tokens, cap=1) == [3]
    # After those 3s comes 0 every time: the path keeps p = 2/3.
    assert _propose(tokens, cap=2) == [3, 0]
    assert _propose(tokens, cap=2, min_token_prob=0.8) == []
    # Two continuations equally often: the latest is drafted, at p = 0.5.
    tied = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2]
    assert _propose(tied, cap=1) == [4]
    assert _propose(tied, cap=1, min_token_prob=0.6) == []


def test_match_length_bounds_the_draft():
    tokens = [5, 6, 7, 8, 9, 10, 0, 5, 6]   # (5, 6) matches: two tokens
    assert _propose(tokens, max_spec_factor=1.0) == [7, 8]
    assert _propose(tokens, max_spec_factor=0.5) == [7]
    assert _propose(tokens, min_match_len=3) == []
    assert _propose([1, 2, 3, 4, 5]) == []            # nothing recurs
    assert _propose([3]) == [] and _propose([3, 3], min_match_len=1) == [3]


def test_global_cache_is_opt_in_and_bounded():
    earlier = [40, 41, 42, 43, 44, 45]
    tokens = [9, 8, 7, 40, 41]   # this request never saw what follows (40, 41)
    assert _propose(tokens) == []
    cache = SuffixCache(max_requests=2)
    cache.add(earlier)
    assert _propose(tokens, cache=cache) == [42, 43, 44, 45]   # stops at the output's end
    cache.add([1, 2, 3])
    cache.add([4, 5, 6])   # the third pushes the first out
    assert len(cache) == 2 and _propose(tokens, cache=cache) == []
    assert len(cache.stream()) == 8   # two outputs and their separators
    cache.add(list(range(3 * MAX_CACHED_OUTPUT_TOKENS)))
    assert len(cache.stream()) == 4 + MAX_CACHED_OUTPUT_TOKENS + 1


def test_a_match_never_crosses_from_one_cached_output_into_the_next():
    cache = SuffixCache(max_requests=4)
    cache.add([7, 1])
    cache.add([2, 3, 4])   # "1, 2" exists only across the boundary
    assert _propose([5, 1, 2], cache=cache) == []


def test_the_request_own_tokens_win_when_they_score_higher():
    cache = SuffixCache(max_requests=4)
    cache.add([30, 31, 99])
    assert _propose([30, 31, 50, 51, 30, 31], cap=2, cache=cache) == [50, 51]


def test_the_speculator_keeps_finished_outputs_only_when_asked():
    class _Request:
        def __init__(self, tokens, prompt_len, cache_scope=None):
            self.token_ids, self.prompt_len = tokens, prompt_len
            self.cache_scope = cache_scope

    config = parse_speculative_config('{"method": "suffix", '
                                      '"suffix_decoding_max_cached_requests": 3}')
    speculator = Speculator(config, 1024)
    for i in range(5):
        speculator.retire(_Request([1, 2, 3, 10 + i, 11 + i], 3))
    assert [o.tolist() for _, o in speculator.cache.outputs] == \
        [[12, 13], [13, 14], [14, 15]]
    assert Speculator(SpeculativeConfig(method="suffix"), 1024).cache is None
    assert Speculator(SpeculativeConfig(), 1024).cache is None


def test_the_cache_is_scoped_per_client_unless_shared():
    """A client's drafts never come from another client's outputs (so it cannot tell, from
    how fast a text decodes, that someone else sent it), unless the config shares them."""
    cache = SuffixCache(max_requests=4)
    cache.add([40, 41, 42, 43, 44, 45], scope="alice")
    tokens = np.asarray([9, 8, 7, 40, 41], dtype=np.int64)
    settings = SETTINGS
    assert propose_suffix(tokens, 4, settings, cache, "alice") == [42, 43, 44, 45]
    assert propose_suffix(tokens, 4, settings, cache, "bob") == []
    assert propose_suffix(tokens, 4, settings, cache, None) == []
    cache.add([1, 2, 3], scope="bob")
    cache.add([4, 5, 6], scope="bob")
    cache.add([7, 8, 9], scope="bob")
    cache.add([10, 11], scope="bob")   # pushes alice's out: the bound is over all scopes
    assert len(cache) == 4 and cache.stream("alice") is None

    class _Request:
        def __init__(self, tokens, scope):
            self.token_ids, self.prompt_len, self.cache_scope = tokens, 2, scope

    for scope, other in (("client", []), ("shared", [42, 43])):
        config = parse_speculative_config(
            '{"method": "suffix", "suffix_decoding_max_cached_requests": 3, '
            f'"suffix_decoding_cache_scope": "{scope}"}}')
        speculator = Speculator(config, 1024)
        speculator.retire(_Request([1, 2, 40, 41, 42, 43, 44, 45], "alice"))
        assert speculator._propose(tokens, 4, _Request([], "alice")) == [42, 43]
        assert speculator._propose(tokens, 4, _Request([], "bob")) == other


@pytest.mark.parametrize("text, words", [
    ('{"method": "suffix", "suffix_decoding_cache_scope": "everyone"}', "cache_scope"),
    ('{"method": "suffix", "suffix_decoding_min_token_prob": 2}', "min_token_prob"),
    ('{"method": "suffix", "suffix_decoding_max_spec_factor": 0}', "max_spec_factor"),
    ('{"method": "suffix", "suffix_decoding_max_cached_requests": -1}', "max_cached_requests"),
    ('{"method": "suffix", "suffix_decoding_max_cached_requests": 100000}',
     "max_cached_requests"),
    ('{"method": "suffix", "suffix_decoding_max_tree_depth": 0}', "max_tree_depth"),
])
def test_suffix_settings_are_refused_by_name(text, words):
    with pytest.raises(ValueError, match=words):
        parse_speculative_config(text)
