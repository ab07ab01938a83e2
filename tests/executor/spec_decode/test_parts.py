"""Speculative decoding's parts: the n-gram proposer, the setting, and the wire fields."""

from __future__ import annotations

import numpy as np
import pytest

from folio.executor.spec_decode.speculator import propose_ngram
from folio.shared.config import EngineConfig, SettingError
from folio.shared.protocol.scheduler_executor import decode_plan, decode_result, encode_plan, encode_result
from folio.shared.spec_decode_config import SpeculativeConfig, parse_speculative_config
from folio.shared.protocol.step import StepPlan, StepResult
from folio.shared.protocol.wire import Body, unpack


def _propose(tokens, k=4, low=2, high=4):
    return propose_ngram(np.asarray(tokens, dtype=np.int64), k, low, high)


def test_ngram_proposes_what_followed_the_latest_match():
    assert _propose([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3]) == [7, 8, 1, 2]
    assert _propose([1, 2, 3, 4, 5, 1, 2], k=2) == [3, 4]


def test_ngram_prefers_the_longest_match():
    # The 3-gram (7, 1, 2) recurs once (followed by 5); the 2-gram (1, 2) later (by 6).
    assert _propose([7, 1, 2, 5, 0, 1, 2, 6, 7, 1, 2], low=2, high=3) == [5, 0, 1, 2]


def test_ngram_stops_at_the_end_and_finds_nothing_without_a_match():
    assert _propose([4, 5, 6, 4, 5]) == [6, 4, 5]
    assert _propose([1, 2, 3, 4, 5, 6]) == []
    assert _propose([1]) == []
    assert _propose([3, 3], low=1, high=4) == [3]


def test_speculative_config_parses_and_refuses_by_name():
    assert parse_speculative_config(None) is None
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert config == SpeculativeConfig(num_speculative_tokens=3)
    for text, words in (('{"method": "eagle"}', "method"), ("[1]", "JSON object"),
                        ('{"k": 3}', "unknown key"), ("{", "not JSON"),
                        ('{"num_speculative_tokens": 0}', "num_speculative_tokens"),
                        ('{"prompt_lookup_min": 5}', "prompt_lookup_min"),
                        ('{"min_acceptance": 2}', "min_acceptance")):
        with pytest.raises(ValueError, match=words):
            parse_speculative_config(text)
    with pytest.raises(SettingError, match="speculative_config"):
        EngineConfig(model="x", speculative_config='{"method": "eagle"}')
    assert EngineConfig(model="x").speculative is None   # off by default


def test_draft_fields_cross_the_wire():
    plan = StepPlan(step_id=3, running_handles=[1, 2], running_num_tokens=[1, 1],
                    drafts={1: 4, 2: 0})
    _, body = unpack(encode_plan(plan))
    assert decode_plan(Body("plan", body)).drafts == {1: 4, 2: 0}
    result = StepResult(step_id=3, handles=[1, 1, 1, 2], token_ids=[5, 6, 7, 8],
                        drafts=[(1, 4, 2)])
    _, body = unpack(encode_result(result))
    back = decode_result(Body("result", body))
    assert back.drafts == [(1, 4, 2)] and back.handles == [1, 1, 1, 2]
