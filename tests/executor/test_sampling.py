"""Sampling semantics against transformers and against the model's own distribution."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from folio import LLM, SamplingParams
from folio.frontend.output_text import OutputText

PROMPTS = [[5, 9, 200, 31, 7, 7, 64, 12], [100] * 21, [3, 1000, 17]]


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(str(llama_dir), dtype="float32", num_kv_blocks=1024)


@pytest.fixture(scope="module")
def hf(llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32).eval()


def _tokens(results):
    return [r.outputs[0].token_ids for r in results]


def test_top_k_1_at_temperature_1_is_greedy(llm):
    greedy = _tokens(llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=12)))
    top1 = _tokens(llm.generate(PROMPTS, SamplingParams(temperature=1.0, top_k=1,
                                                        max_tokens=12)))
    assert top1 == greedy


def test_repetition_penalty_matches_transformers(llm, hf):
    ours = _tokens(llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=15,
                                                        repetition_penalty=1.7)))
    with torch.inference_mode():
        for prompt, tokens in zip(PROMPTS, ours):
            ids = torch.tensor([prompt])
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=15,
                              do_sample=False, repetition_penalty=1.7)
            assert out[0, len(prompt):].tolist() == tokens
    plain = _tokens(llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=15)))
    assert plain != ours   # the penalty changed something, so the test means something


def test_logprobs_equal_transformers_log_softmax(llm, hf):
    result = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=6,
                                                       logprobs=3))[0].outputs[0]
    sequence = PROMPTS[0] + result.token_ids
    with torch.inference_mode():
        logits = hf(torch.tensor([sequence])).logits[0].float()
    reference = torch.log_softmax(logits, dim=-1)
    assert len(result.logprobs) == len(result.token_ids)
    for step, (token, entry) in enumerate(zip(result.token_ids, result.logprobs)):
        row = reference[len(PROMPTS[0]) - 1 + step]
        top = row.topk(3)
        assert token in entry and entry[token].rank == 1            # greedy: the best
        assert set(top.indices.tolist()) <= set(entry)
        for token_id, logprob in entry.items():
            assert abs(logprob.logprob - float(row[token_id])) < 1e-4
            assert logprob.decoded_token is not None
    assert abs(result.cumulative_logprob - sum(e[t].logprob for t, e in
                                               zip(result.token_ids, result.logprobs))) < 1e-6


def test_sampled_token_rank_counts_better_tokens(llm):
    result = llm.generate([PROMPTS[1]], SamplingParams(temperature=1.5, seed=3, max_tokens=8,
                                                       logprobs=0))[0].outputs[0]
    for token, entry in zip(result.token_ids, result.logprobs):
        assert list(entry) == [token] and entry[token].rank >= 1


def test_seeded_request_is_the_same_alone_in_a_batch_and_under_preemption(llama_dir, llm):
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=42, max_tokens=20)
    alone = llm.generate([PROMPTS[2]], params)[0].outputs[0].token_ids
    mixed = llm.generate(PROMPTS + [PROMPTS[2]],
                         [SamplingParams(temperature=1.0, max_tokens=20)] * 3 + [params])
    assert mixed[3].outputs[0].token_ids == alone
    tight = LLM(str(llama_dir), dtype="float32", num_kv_blocks=12, block_size=4,
                max_num_batched_tokens=8)
    squeezed = tight.generate(PROMPTS + [PROMPTS[2]],
                              [SamplingParams(temperature=1.0, max_tokens=20)] * 3 + [params])
    assert squeezed[3].outputs[0].token_ids == alone
    assert tight.stats()["preemptions_recompute"] > 0


def test_one_token_samples_follow_the_model_distribution(llm, hf):
    prompt = [11, 12, 13]
    count = 3000
    params = [SamplingParams(temperature=1.0, max_tokens=1, seed=i) for i in range(count)]
    samples = Counter(r.outputs[0].token_ids[0] for r in llm.generate([prompt] * count, params))
    with torch.inference_mode():
        probs = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1].float(), dim=-1)
    expected = probs * count
    # Tokens expected at least 5 times each get a cell; the rest share one.
    big = [t for t in range(len(probs)) if expected[t] >= 5]
    observed = [samples.get(t, 0) for t in big]
    wanted = [float(expected[t]) for t in big]
    rest_observed = count - sum(observed)
    rest_wanted = count - sum(wanted)
    if rest_wanted >= 5:
        observed.append(rest_observed)
        wanted.append(rest_wanted)
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, wanted))
    df = len(wanted) - 1
    z = 3.09   # p = 0.001, Wilson-Hilferty approximation of the chi-square quantile
    limit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert df >= 10, "the distribution should be spread enough to test"
    assert chi2 < limit, f"chi2={chi2:.1f} over {df} degrees of freedom (limit {limit:.1f})"
    # And it is not greedy: many distinct tokens come out.
    assert len(samples) > 20


def test_presence_frequency_and_logit_bias_change_the_choice(llm):
    base = SamplingParams(temperature=0, max_tokens=10)
    plain = _tokens(llm.generate([PROMPTS[1]], base))[0]
    biased = _tokens(llm.generate([PROMPTS[1]], SamplingParams(
        temperature=0, max_tokens=10, logit_bias={777: 100.0})))[0]
    assert biased == [777] * 10
    penalized = _tokens(llm.generate([PROMPTS[1]], SamplingParams(
        temperature=0, max_tokens=10, frequency_penalty=2.0, presence_penalty=2.0)))[0]
    assert penalized != plain
    assert max(Counter(penalized).values()) <= max(Counter(plain).values())


def test_min_tokens_bans_stop_tokens(llm):
    first = _tokens(llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=1)))[0]
    stop = first[0]
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=6, min_tokens=4,
                                                    stop_token_ids=[stop]))[0].outputs[0]
    assert stop not in out.token_ids[:4] and len(out.token_ids) >= 4


def test_stop_string_across_token_boundary(llm, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    plain = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=20))[0]
    ids = plain.outputs[0].token_ids
    pieces = [tokenizer.decode([t]) for t in ids]
    # A stop string made of the end of one token's text and the start of the next one's.
    k = next(i for i in range(1, len(ids)) if pieces[i - 1] and pieces[i]
             and tokenizer.decode(ids[:i + 1]).endswith(pieces[i - 1] + pieces[i]))
    stop = pieces[k - 1][-1:] + pieces[k][:1]
    full = tokenizer.decode(ids)
    cut = full.index(stop)
    out = llm.generate([PROMPTS[0]], SamplingParams(temperature=0, max_tokens=20,
                                                    stop=[stop]))[0].outputs[0]
    assert out.text == full[:cut] and out.finish_reason == "stop"
    kept = llm.generate([PROMPTS[0]], SamplingParams(
        temperature=0, max_tokens=20, stop=[stop], include_stop_str_in_output=True))[0]
    assert kept.outputs[0].text == full[:cut + len(stop)]
    assert llm.stats()["kv_blocks_free"] == llm.stats()["kv_blocks_total"]


def test_streaming_holds_back_only_a_possible_stop_string(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = tokenizer.encode("The while statement repeats a block")
    text = OutputText(tokenizer, SamplingParams(stop=["block!"]))
    streamed = "".join(text.add([t]) for t in ids)
    assert streamed == "The while statement repeats a "   # "block" may still become "block!"
    dot = tokenizer.encode(".")
    assert text.add(dot) == "block."                       # it did not: all of it goes out
    assert not text.stopped


@pytest.mark.parametrize("kwargs, message", [
    ({"logprobs": 21}, r"logprobs must be in \[0, 20\]"),
    ({"n": 65}, "n must be <= 64"),
    ({"logit_bias": {1024: 1.0}}, r"logit_bias has token id 1024, outside the vocabulary"),
    ({"stop_token_ids": [5000]}, r"stop_token_ids has token id 5000"),
])
def test_model_aware_validation_allocates_nothing(llm, kwargs, message):
    with pytest.raises(ValueError, match=message):
        llm.generate([PROMPTS[0]], SamplingParams(**kwargs))
    stats = llm.stats()
    assert stats["num_waiting"] == stats["num_running"] == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"presence_penalty": 2.5}, r"presence_penalty must be in \[-2, 2\]"),
    ({"frequency_penalty": -3}, r"frequency_penalty must be in \[-2, 2\]"),
    ({"repetition_penalty": 0}, r"repetition_penalty must be in \[0.01, 100\]"),
    ({"logprobs": -1}, "logprobs must be >= 0"),
    ({"stop": [""]}, "stop must be non-empty strings"),
    ({"logit_bias": {5: 200}}, r"logit_bias values must be in \[-100, 100\]"),
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
    ({"top_p": 1.01}, r"top_p must be in \(0, 1\]"),
])
def test_impossible_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_prompt_logprobs_match_transformers_with_chunks_and_preemption(llama_dir, hf):
    prompt = PROMPTS[1] + PROMPTS[0]
    with torch.inference_mode():
        reference = torch.log_softmax(hf(torch.tensor([prompt])).logits[0].float(), dim=-1)
    # A 7-token budget splits the prompt into chunks; a 10-block pool forces recompute.
    tight = LLM(str(llama_dir), dtype="float32", num_kv_blocks=10, block_size=4,
                max_num_batched_tokens=7)
    params = [SamplingParams(temperature=0, max_tokens=8, prompt_logprobs=2)] + \
        [SamplingParams(temperature=0, max_tokens=8)] * 2
    result = tight.generate([prompt, PROMPTS[0], PROMPTS[2]], params)[0]
    assert result.prompt_logprobs[0] is None
    assert len(result.prompt_logprobs) == len(prompt)
    for position in range(1, len(prompt)):
        entry = result.prompt_logprobs[position]
        token = prompt[position]
        assert abs(entry[token].logprob - float(reference[position - 1, token])) < 1e-4
        assert len(entry) in (2, 3)   # the top 2, plus the prompt token when outside them
    assert tight.stats()["preemptions_recompute"] > 0


def test_the_inverse_cdf_draw_never_picks_a_token_without_mass():
    from folio.executor.sampler import inverse_cdf

    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0, 0.0]]).expand(5, 6)
    edges = torch.tensor([[0.0], [0.2499], [0.2501], [0.5], [1.0 - 2 ** -24]])
    assert inverse_cdf(probs, edges).tolist() == [1, 1, 3, 3, 3]
    uniforms = torch.rand(100_000, 1, generator=torch.Generator().manual_seed(3))
    counts = torch.bincount(inverse_cdf(probs[:1].expand(100_000, 6), uniforms), minlength=6)
    assert counts[[0, 2, 4, 5]].sum() == 0
    assert abs(counts[3].item() / 100_000 - 0.75) < 0.01
