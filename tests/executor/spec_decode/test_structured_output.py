"""Speculative decoding with structured outputs: the grammar's mask applies at every draft
row (a draft the grammar refuses is rejected), so constrained answers are the ones
speculation off gives, valid, greedy and seeded alike."""

from __future__ import annotations

import json

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                   "prompt_lookup_min": 1, "max_running": 64})
SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
              "minItems": 8, "maxItems": 12},
    "note": {"type": "string", "maxLength": 30}},
    "required": ["items", "note"], "additionalProperties": False}


def test_constrained_answers_with_drafts(llama_dir):
    prompts = ['{"items": [1, 2, 3, 1, 2, 3], "note": "abc abc"} again: ',
               "Record 1:", "aaaa aaaa aaaa", "12 12 12 12"]
    params = [SamplingParams(temperature=0, max_tokens=120, structured_output={"json": SCHEMA}),
              SamplingParams(temperature=0, max_tokens=60, structured_output={"regex": "(ab|a)+c"}),
              SamplingParams(temperature=0.8, seed=3, max_tokens=60,
                             structured_output={"choice": ["aaaa aaaa", "bbbb", "aaaa aaaa aaaa"]}),
              SamplingParams(temperature=0, max_tokens=80, structured_output={"regex": "(12 )+"})]
    off = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=256)
    on = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=256,
             speculative_config=SPEC)
    want = [r.outputs[0] for r in off.generate(prompts, params)]
    got = [r.outputs[0] for r in on.generate(prompts, params)]
    assert [o.token_ids for o in got[:2] + got[3:]] == [o.token_ids for o in want[:2] + want[3:]]
    json.loads(got[0].text)
    assert got[2].text in ("aaaa aaaa", "bbbb", "aaaa aaaa aaaa")
    again = [r.outputs[0].token_ids for r in on.generate(prompts, params)]
    assert again == [o.token_ids for o in got]   # seeded and greedy repeat
    stats = on.stats()
    assert stats["spec_decode_num_accepted_tokens"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
