"""Speculative decoding, greedy (docs/spec_decode.md): outputs token-identical to
speculation off through folio.LLM on the tiny model, by each proposer (n-gram lookup and
suffix decoding with its global cache), with drafts accepted (a prompt that repeats
itself) and rejected, under max_tokens, stop ids, stop strings, n > 1, prefix-cache
hits, forced recompute and swap preemption, and one step in flight; every block free when
idle."""

from __future__ import annotations

import json
import random
from collections import deque

import pytest

from folio import LLM, SamplingParams
from tests.conftest import TEST_DEVICE

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                   "prompt_lookup_min": 1, "max_running": 64})
SUFFIX = json.dumps({"method": "suffix", "num_speculative_tokens": 4, "max_running": 64,
                     "suffix_decoding_min_match_len": 1, "suffix_decoding_max_spec_factor": 2,
                     "suffix_decoding_max_cached_requests": 8})


@pytest.fixture(params=[SPEC, SUFFIX], ids=["ngram", "suffix"])
def spec(request):
    """The tests that hold for every proposer run once per method."""
    return request.param


def _prompts() -> list[list[int]]:
    rng = random.Random(7)
    phrase = [rng.randrange(1, 1024) for _ in range(9)]
    shared = [rng.randrange(1, 1024) for _ in range(40)]
    return [
        phrase * 6,                                            # copies: drafts accepted
        [rng.randrange(1, 1024) for _ in range(37)],           # nothing to copy
        shared + phrase * 3,                                   # shares a prefix ...
        shared + [rng.randrange(1, 1024) for _ in range(20)],  # ... with this one
        [5, 6] * 20,
        [rng.randrange(1, 1024) for _ in range(3)],
    ]


PROMPTS = _prompts()
MAX_TOKENS = [48, 30, 40, 17, 64, 25]


def _generate(model_dir, prompts, params, **engine_args):
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, **engine_args)
    results = llm.generate(prompts, params)
    return [[o.token_ids for o in r.outputs] for r in results], llm.stats()


def _greedy(**extra):
    return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **extra)
            for n in MAX_TOKENS]


def _assert_idle(stats):
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert stats["num_running"] == stats["num_waiting"] == stats["num_swapped"] == 0


@pytest.fixture(scope="module")
def plain(llama_dir):
    outputs, _ = _generate(llama_dir, PROMPTS, _greedy(), num_kv_blocks=512)
    return outputs


def test_greedy_identical_with_drafts_accepted(llama_dir, plain, spec):
    outputs, stats = _generate(llama_dir, PROMPTS, _greedy(), num_kv_blocks=512,
                               speculative_config=spec)
    assert outputs == plain
    assert stats["spec_decode_num_accepted_tokens"] > 0
    assert stats["spec_decode_num_draft_tokens"] > stats["spec_decode_num_accepted_tokens"]
    assert stats["spec_decode_num_accepted_tokens_per_pos"][0] > 0
    assert stats["steps"] < sum(MAX_TOKENS)   # fewer steps than tokens: drafts paid off
    _assert_idle(stats)


def test_per_request_opt_out_carries_no_drafts(llama_dir, plain):
    outputs, stats = _generate(llama_dir, PROMPTS, _greedy(speculative=False),
                               num_kv_blocks=512, speculative_config=SPEC)
    assert outputs == plain
    assert stats["spec_decode_num_draft_tokens"] == 0


# Engines under memory and budget pressure (the multi-step tests run them too).
UNDER_PRESSURE = pytest.mark.parametrize("engine_args", [
    # 12 blocks of 16 tokens for about 480 wanted: requests are preempted and recomputed.
    {"num_kv_blocks": 12, "max_num_batched_tokens": 64},
    {"num_kv_blocks": 12, "max_num_batched_tokens": 64, "preemption_mode": "swap",
     "num_swap_blocks": 64},
    {"num_kv_blocks": 96, "block_size": 4, "max_num_batched_tokens": 23, "max_num_seqs": 3},
    {"num_kv_blocks": 512, "enable_prefix_caching": False},
], ids=["recompute", "swap", "small-blocks-chunks", "no-prefix-cache"])


@UNDER_PRESSURE
def test_greedy_identical_under_pressure(llama_dir, plain, engine_args, spec):
    outputs, stats = _generate(llama_dir, PROMPTS, _greedy(), speculative_config=spec,
                               **engine_args)
    assert outputs == plain
    assert stats["spec_decode_num_accepted_tokens"] > 0
    if "preemption_mode" in engine_args:
        assert stats["preemptions_swap"] > 0
    elif engine_args["num_kv_blocks"] == 12:
        assert stats["preemptions_recompute"] > 0
    _assert_idle(stats)


@pytest.fixture(scope="module")
def without_speculation(llama_dir):
    """The answers without speculation to (prompts, params), by their values: each computed
    once for the module (both proposers' tests compare against the same ones)."""
    made = {}

    def answers(prompts, params):
        key = (repr(prompts), repr([p.to_dict() for p in params]))
        if key not in made:
            made[key] = _generate(llama_dir, prompts, params, num_kv_blocks=512)[0]
        return made[key]

    return answers


def test_prefix_cache_hits_with_drafts(llama_dir, spec, without_speculation):
    params = _greedy()
    # The second round finds the first round's blocks, drafts' blocks never among them.
    llm = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=512,
              speculative_config=spec)
    first = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, params)]
    again = [r.outputs[0].token_ids for r in llm.generate(
        [p + out for p, out in zip(PROMPTS, first)], _greedy())]
    stats = llm.stats()
    reference = without_speculation([p + out for p, out in zip(PROMPTS, first)], _greedy())
    assert again == [r[0] for r in reference]
    assert stats["prefix_cache_hits"] > 0
    _assert_idle(stats)


def test_stop_ids_min_tokens_and_n(llama_dir, spec, without_speculation):
    stop = PROMPTS[0][3]   # a token the copy-heavy answer is likely to reach
    params = [SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop],
                             min_tokens=m, n=2) for m in (0, 5, 0, 3, 0, 1)]
    want = without_speculation(PROMPTS, params)
    got, stats = _generate(llama_dir, PROMPTS, params, num_kv_blocks=512,
                           speculative_config=spec)
    assert got == want
    assert stats["forks"] > 0
    _assert_idle(stats)


def test_stop_strings_and_logprobs(llama_dir):
    text = "def repeat(text):\n    return text + text\n" * 4
    params = [SamplingParams(temperature=0.0, max_tokens=40, stop=["text +"], logprobs=2),
              SamplingParams(temperature=0.0, max_tokens=30, logprobs=1)]
    prompts = [text, "Copy this: " + text]
    llm_off = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=512)
    llm_on = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=512,
                 speculative_config=SPEC)
    want, got = llm_off.generate(prompts, params), llm_on.generate(prompts, params)
    for a, b in zip(want, got):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
        assert a.outputs[0].finish_reason == b.outputs[0].finish_reason
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert x.keys() == y.keys()
            for token in x:
                assert x[token].rank == y[token].rank
                assert abs(x[token].logprob - y[token].logprob) < 1e-4
    _assert_idle(llm_on.stats())


def _run_one_ahead(llm: LLM, prompts, params) -> dict[str, list[int]]:
    """Scheduler and executor in one process, one plan always made before the previous
    step's result is applied (what --async-scheduling does across processes)."""
    scheduler, executor = llm.engine.scheduler, llm.engine.executor
    ids = []
    for i, (prompt, sampling) in enumerate(zip(prompts, params)):
        ids += scheduler.add_request(f"r{i}", prompt, sampling)
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    in_flight: deque = deque()

    def collect(outputs) -> None:
        for output in outputs:
            tokens[output.request_id].extend(output.new_token_ids)

    while scheduler.has_unfinished_requests() or in_flight:
        while len(in_flight) < 2:
            plan = scheduler.plan_for_executor()
            if plan is None:
                break
            in_flight.append((plan, executor.execute(plan)))   # runs in order, as served
        collect(scheduler.take_pending_outputs())
        if in_flight:
            collect(scheduler.update(*in_flight.popleft()))
    return tokens


@pytest.mark.parametrize("engine_args", [
    {"num_kv_blocks": 512},
    {"num_kv_blocks": 12, "max_num_batched_tokens": 64},
    {"num_kv_blocks": 12, "max_num_batched_tokens": 64, "preemption_mode": "swap",
     "num_swap_blocks": 64},
], ids=["roomy", "recompute", "swap"])
def test_greedy_identical_one_step_in_flight(llama_dir, plain, engine_args, spec):
    llm = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, speculative_config=spec,
              **engine_args)
    tokens = _run_one_ahead(llm, PROMPTS, _greedy())
    assert [tokens[f"r{i}"] for i in range(len(PROMPTS))] == [p[0] for p in plain]
    stats = llm.stats()
    assert stats["spec_decode_num_accepted_tokens"] > 0
    _assert_idle(stats)


def test_suffix_global_cache_drafts_what_an_earlier_request_answered(llama_dir, plain):
    """The same question asked again: with the global cache on, its answer is drafted from
    the first request's output (more drafts accepted than from its own tokens alone), and
    the output is still the one without speculation."""
    prompt = [PROMPTS[1]]   # nothing in the prompt to copy
    params = _greedy()[1]
    accepted = {}
    for cached in (0, 4):
        spec = json.dumps({"method": "suffix", "num_speculative_tokens": 4, "max_running": 64,
                           "suffix_decoding_min_match_len": 1,
                           "suffix_decoding_max_spec_factor": 4,
                           "suffix_decoding_max_cached_requests": cached})
        llm = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=512,
                  speculative_config=spec)
        first = llm.generate(prompt, params)[0].outputs[0].token_ids
        before = llm.stats()["spec_decode_num_accepted_tokens"]
        again = llm.generate(prompt, params)[0].outputs[0].token_ids
        assert again == first
        accepted[cached] = llm.stats()["spec_decode_num_accepted_tokens"] - before
        _assert_idle(llm.stats())
        assert first == plain[1][0]
    assert accepted[4] > accepted[0], accepted
