"""Multi-step decoding (docs/multi_step.md): with --num-scheduler-steps K a small batch's
decode rows run up to K passes per plan. Outputs are token-identical to K = 1 through
folio.LLM on the tiny model: greedy and seeded, under max_tokens, stop ids mid-burst,
min_tokens, n > 1, logprobs, stop strings, structured outputs, prefix-cache hits, forced
recompute and swap preemption, and one step in flight; fewer plans than tokens; no burst
in a crowd; every block free when idle."""

from __future__ import annotations

import json

import pytest

from folio import LLM, SamplingParams
from folio.scheduler.multi_step import MAX_RUNNING
from tests.conftest import TEST_DEVICE
from tests.executor.spec_decode.test_greedy import (PROMPTS, UNDER_PRESSURE, _assert_idle,
                                                    _run_one_ahead)

MAX_TOKENS = [48, 30, 41, 17, 64, 25]   # some not a multiple of K: bursts cut short
K = 4


def _llm(model_dir, steps: int = K, **engine_args) -> LLM:
    return LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_scheduler_steps=steps,
               **engine_args)


def _outputs(llm: LLM, prompts, params):
    return [[o.token_ids for o in r.outputs] for r in llm.generate(prompts, params)]


def _greedy(**extra):
    return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **extra)
            for n in MAX_TOKENS]


@pytest.fixture(scope="module")
def plain(llama_dir):
    return _outputs(_llm(llama_dir, 1, num_kv_blocks=512), PROMPTS, _greedy())


def test_greedy_identical_in_fewer_steps(llama_dir, plain):
    llm = _llm(llama_dir, num_kv_blocks=512)
    assert _outputs(llm, PROMPTS, _greedy()) == plain
    stats = llm.stats()
    # Each plan gave every decode row up to K tokens: about a K-th of the plans.
    assert stats["steps"] < max(MAX_TOKENS) / 2
    assert stats["multi_step_extra_tokens"] > sum(MAX_TOKENS) / 2
    assert "spec_decode_num_drafts" not in stats
    _assert_idle(stats)


@UNDER_PRESSURE
def test_greedy_identical_under_pressure(llama_dir, plain, engine_args):
    llm = _llm(llama_dir, **engine_args)
    assert _outputs(llm, PROMPTS, _greedy()) == plain
    stats = llm.stats()
    assert stats["multi_step_extra_tokens"] > 0
    if "preemption_mode" in engine_args:
        assert stats["preemptions_swap"] > 0
    elif engine_args["num_kv_blocks"] == 12:
        assert stats["preemptions_recompute"] > 0
    _assert_idle(stats)


@pytest.mark.parametrize("engine_args", [
    {"num_kv_blocks": 512},
    {"num_kv_blocks": 12, "max_num_batched_tokens": 64, "preemption_mode": "swap",
     "num_swap_blocks": 64},
], ids=["roomy", "swap"])
def test_greedy_identical_one_step_in_flight(llama_dir, plain, engine_args):
    llm = _llm(llama_dir, **engine_args)
    tokens = _run_one_ahead(llm, PROMPTS, _greedy())
    assert [tokens[f"r{i}"] for i in range(len(PROMPTS))] == [p[0] for p in plain]
    stats = llm.stats()
    assert stats["multi_step_extra_tokens"] > 0
    _assert_idle(stats)


def test_prefix_cache_hits_after_bursts(llama_dir):
    llm = _llm(llama_dir, num_kv_blocks=512)
    first = [o[0] for o in _outputs(llm, PROMPTS, _greedy())]
    longer = [p + out for p, out in zip(PROMPTS, first)]
    again = _outputs(llm, longer, _greedy())
    assert again == _outputs(_llm(llama_dir, 1, num_kv_blocks=512), longer, _greedy())
    stats = llm.stats()
    assert stats["prefix_cache_hits"] > 0
    _assert_idle(stats)


def test_stop_ids_min_tokens_n_and_seeds(llama_dir):
    """Stop ids end a row inside a burst (its tokens past the stop are never reported),
    min_tokens holds them off, forks burst too, and a seeded sample draws the same tokens
    whichever pass it falls in."""
    prompts = PROMPTS[:3]
    first = _outputs(_llm(llama_dir, 1, num_kv_blocks=512), prompts,
                     [SamplingParams(temperature=0.0, max_tokens=40)] * 3)
    stop = first[0][0][9]
    # A stop id min_tokens holds off: one seen before the 9th output token if any repeats.
    answer = first[1][0]
    late = next((t for i, t in enumerate(answer[:8]) if t in answer[8:]), answer[12])
    params = [SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop],
                             min_tokens=0, n=2),
              SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[late],
                             min_tokens=8),
              SamplingParams(temperature=0.9, seed=11, max_tokens=37, n=2)]
    want = _outputs(_llm(llama_dir, 1, num_kv_blocks=512), prompts, params)
    llm = _llm(llama_dir, num_kv_blocks=512)
    got = _outputs(llm, prompts, params)
    assert got == want
    assert len(got[0][0]) == first[0][0].index(stop) + 1   # the stop did fire
    assert len(got[1][0]) == answer.index(late, 8) + 1
    stats = llm.stats()
    assert stats["forks"] > 0 and stats["multi_step_extra_tokens"] > 0
    _assert_idle(stats)


def test_stop_strings_and_logprobs(llama_dir):
    text = "def repeat(text):\n    return text + text\n" * 4
    params = [SamplingParams(temperature=0.0, max_tokens=40, stop=["text +"], logprobs=2),
              SamplingParams(temperature=0.0, max_tokens=30, logprobs=1)]
    prompts = [text, "Copy this: " + text]
    want = _llm(llama_dir, 1, num_kv_blocks=512).generate(prompts, params)
    llm = _llm(llama_dir, num_kv_blocks=512)
    got = llm.generate(prompts, params)
    for a, b in zip(want, got):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
        assert a.outputs[0].finish_reason == b.outputs[0].finish_reason
        assert len(a.outputs[0].logprobs) == len(b.outputs[0].logprobs)
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert x.keys() == y.keys()
            for token in x:
                assert x[token].rank == y[token].rank
                assert x[token].logprob == pytest.approx(y[token].logprob, abs=1e-5)
    assert llm.stats()["multi_step_extra_tokens"] > 0
    _assert_idle(llm.stats())


def test_structured_outputs_in_bursts(llama_dir):
    schema = {"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                  "minItems": 4, "maxItems": 8}}, "required": ["items"],
        "additionalProperties": False}
    prompts = ["Record 1:", "aaaa aaaa aaaa", "12 12 12 12"]
    params = [SamplingParams(temperature=0, max_tokens=80, structured_output={"json": schema}),
              SamplingParams(temperature=0.8, seed=3, max_tokens=40,
                             structured_output={"choice": ["aaaa aaaa", "bbbb"]}),
              SamplingParams(temperature=0, max_tokens=40, structured_output={"regex": "(12 )+"})]
    want = [r.outputs[0] for r in _llm(llama_dir, 1, num_kv_blocks=256).generate(prompts, params)]
    llm = _llm(llama_dir, num_kv_blocks=256)
    got = [r.outputs[0] for r in llm.generate(prompts, params)]
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    json.loads(got[0].text)
    assert llm.stats()["multi_step_extra_tokens"] > 0
    _assert_idle(llm.stats())


def test_no_bursts_in_a_crowd(llama_dir):
    """More than MAX_RUNNING requests at once: one pass per plan, so requests that arrive
    join at the next pass (the bursts resume once the crowd thins out)."""
    prompts = [[7 + i, 20 + i, 300 + i] for i in range(MAX_RUNNING + 4)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = _outputs(_llm(llama_dir, 1, num_kv_blocks=512), prompts, params)
    llm = _llm(llama_dir, num_kv_blocks=512)
    assert _outputs(llm, prompts, params) == want
    stats = llm.stats()
    assert stats["multi_step_bursts"] == 0
    assert stats["steps"] >= 12   # a pass per plan: at least one plan a token
    _assert_idle(stats)


def test_a_bad_setting_is_refused_by_name(llama_dir):
    for bad in (0, 33, 2.5):
        with pytest.raises(ValueError, match="num_scheduler_steps"):
            _llm(llama_dir, bad)
