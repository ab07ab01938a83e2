"""Speculative decoding, sampled (docs/spec_decode.md): rejection sampling keeps each
position's distribution with drafts that are often wrong (a small vocabulary, many draws, a
chi-square bound); seeded requests repeat run to run; penalties, logit bias and min_tokens
apply at every draft row as at an ordinary decode row."""

from __future__ import annotations

import json

import pytest
import torch
from scipy.stats import chisquare

from folio import LLM, SamplingParams
from folio.executor.input_batch import CachedRequest
from folio.executor.sampler import Sampler
from folio.executor.spec_decode.speculator import verify
from tests.conftest import TEST_DEVICE

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
                   "prompt_lookup_min": 1, "max_running": 64})
VOCAB = 6


def _request(index: int, params: SamplingParams) -> CachedRequest:
    return CachedRequest(index, index, [1, 2, 3], 3, 3, [0], params)


def _chi_square_ok(tokens: list[int], probs: torch.Tensor) -> bool:
    counts = torch.bincount(torch.tensor(tokens), minlength=VOCAB).double()
    expected = probs.double() / probs.double().sum() * len(tokens)
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a token without probability was produced"
    return chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue > 1e-4


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=4),
    SamplingParams(temperature=1.3, top_p=0.8),
], ids=["plain", "top-k", "top-p"])
def test_rejection_sampling_keeps_the_distribution(params):
    # Two drafts per request: the first a likely token, the second a less likely one, so
    # both acceptance and rejection happen often at each position.
    torch.manual_seed(0)
    row_logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -0.5],
                               [0.0, 1.5, -1.0, 0.7, 0.2, 1.0],
                               [1.0, 1.0, 1.0, 0.0, 0.0, -2.0]])
    drafts = [0, 3]
    count = 3000
    requests = [_request(i, params) for i in range(count)]
    logits = row_logits.repeat(count, 1)
    sampler = Sampler(torch.device("cpu"), seed=1, eos_token_ids=())
    outcomes = verify(sampler, logits, requests, [drafts] * count, None)
    want = [sampler.probabilities(row_logits[i:i + 1], [requests[0]])[0] for i in range(3)]
    first = [o.tokens[0] for o in outcomes]
    assert _chi_square_ok(first, want[0])
    # Given the first draft was accepted, the second position is distributed as its row.
    second = [o.tokens[1] for o in outcomes if o.accepted >= 1]
    assert len(second) > count * want[0][0] * 0.9
    assert _chi_square_ok(second, want[1])
    third = [o.tokens[2] for o in outcomes if o.accepted == 2]
    assert len(third) > 100
    assert _chi_square_ok(third, want[2])
    assert all(o.tokens[:o.accepted] == drafts[:o.accepted] for o in outcomes)
    assert 0 < sum(o.accepted for o in outcomes) < 2 * count


def test_a_draft_without_probability_is_never_accepted():
    params = SamplingParams(temperature=1.0, top_k=2)
    sampler = Sampler(torch.device("cpu"), seed=3, eos_token_ids=())
    logits = torch.tensor([[3.0, 2.0, -5.0, 0.0, 0.0, 0.0]] * 2).repeat(500, 1)
    requests = [_request(i, params) for i in range(500)]
    outcomes = verify(sampler, logits, requests, [[4]] * 500, None)
    assert all(o.accepted == 0 and o.tokens[0] in (0, 1) for o in outcomes)


def _sampled(model_dir, params, **engine_args):
    llm = LLM(str(model_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=256,
              **engine_args)
    prompts = [[11, 12, 13, 14, 15] * 8, [7, 8] * 12, [100, 200, 300]]
    results = llm.generate(prompts, params)
    return [r.outputs[0].token_ids for r in results], llm.stats()


def test_seeded_requests_repeat_with_drafts(llama_dir):
    params = [SamplingParams(temperature=0.1, seed=s, max_tokens=40, ignore_eos=True)
              for s in (1, 2, 3)]
    first, stats = _sampled(llama_dir, params, speculative_config=SPEC)
    again, _ = _sampled(llama_dir, params, speculative_config=SPEC)
    assert first == again
    assert stats["spec_decode_num_accepted_tokens"] > 0


@pytest.mark.parametrize("extra", [
    {"repetition_penalty": 1.3},
    {"frequency_penalty": 0.1, "presence_penalty": 0.05},
    {"logit_bias": {17: 3.0, 5: -2.0}},
    {"min_tokens": 20, "stop_token_ids": [17, 903]},
], ids=["repetition", "frequency-presence", "logit-bias", "min-tokens"])
def test_greedy_processing_at_every_draft_row(llama_dir, extra):
    params = SamplingParams(temperature=0.0, max_tokens=40, **extra)
    want, _ = _sampled(llama_dir, params)
    got, stats = _sampled(llama_dir, params, speculative_config=SPEC)
    assert got == want
    assert stats["spec_decode_num_draft_tokens"] > 0


def test_logprobs_of_every_returned_token_with_sampled_drafts(llama_dir):
    llm = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=256,
              speculative_config=SPEC)
    params = SamplingParams(temperature=0.1, seed=5, max_tokens=40, ignore_eos=True,
                            logprobs=2)
    result = llm.generate([[11, 12, 13, 14, 15] * 8], params)[0].outputs[0]
    assert llm.stats()["spec_decode_num_accepted_tokens"] > 0
    assert len(result.logprobs) == len(result.token_ids) == 40
    for token, entry in zip(result.token_ids, result.logprobs):
        assert token in entry and entry[token].logprob <= 0.0


def test_seeded_text_the_same_under_load_and_without_speculation(llama_dir):
    """seed=11, n=3, temperature 0.8 (and a cooler seeded request, whose drafts are often
    accepted): the same tokens alone with drafts, beside 5 other requests (more than
    max_running 4 run: drafts pause), and with speculation off."""
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3,
                       "prompt_lookup_max": 3, "prompt_lookup_min": 1, "max_running": 4})
    seeded = [SamplingParams(temperature=0.8, seed=11, n=3, max_tokens=32, ignore_eos=True),
              SamplingParams(temperature=0.1, seed=5, max_tokens=32, ignore_eos=True)]
    prompts = [[11, 12, 13, 14, 15] * 6, [7, 8] * 12]
    others = [[(5 * i + k) % 300 + 20 for k in range(12)] * 2 for i in range(5)]
    busy = SamplingParams(temperature=0.8, max_tokens=32, ignore_eos=True)

    def run(llm: LLM, load: bool) -> list:
        results = llm.generate(prompts + (others if load else []),
                               seeded + ([busy] * len(others) if load else []))
        return [[list(o.token_ids) for o in r.outputs] for r in results[:2]]

    # No prefix cache: the loaded run computes its prompts as the quiet one did.
    llm = LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=256,
              speculative_config=spec, enable_prefix_caching=False)
    quiet = run(llm, False)
    stats = llm.stats()
    assert stats["spec_decode_num_drafts"] > 0 and stats["spec_decode_num_accepted_tokens"] > 0
    loaded = run(llm, True)
    off = run(LLM(str(llama_dir), dtype="float32", device=TEST_DEVICE, num_kv_blocks=256), False)
    assert quiet == loaded == off
    assert len({tuple(t) for t in quiet[0]}) > 1   # the three samples differ
