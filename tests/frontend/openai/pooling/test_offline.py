"""folio.LLM's embed and score (folio/pooling.py): mean pooling over a prompt cut into
chunks, a reranker declared by the score_tokens setting, the runner's refusals. One LLM
per model, in process."""

from __future__ import annotations

import pytest

from folio import LLM
from folio.shared.pooling.rerank_prompt import rerank_prompt
from tests.pooling_models import (cosine, hf_embeddings, hf_rerank_scores,
                                  make_embedding_model, make_reranker)

TEXTS = ["The for statement", "A while loop repeats while its condition holds. " * 5]


@pytest.fixture(scope="module")
def mean_llm(tmp_path_factory, tokenizer_dir):
    # Mean pooling declared by sentence-transformers' files, no Matryoshka; chunks of 16.
    path = make_embedding_model(tokenizer_dir, tmp_path_factory.mktemp("mean"),
                                pooling="mean_tokens", normalize=False)
    return path, LLM(model=str(path), num_kv_blocks=64, max_num_batched_tokens=16)


def test_mean_pooling_over_chunks_equals_transformers(mean_llm):
    path, llm = mean_llm
    outputs = llm.embed(TEXTS + [[5, 6, 7]])
    prompts = [o.prompt_token_ids for o in outputs]
    assert len(prompts[1]) > 16   # computed in several chunks
    expected = hf_embeddings(path, prompts, "mean", normalize=False)
    for output, reference in zip(outputs, expected):
        assert cosine(output.outputs.embedding, reference) >= 0.99999
        assert output.outputs.embedding == pytest.approx(reference.tolist(), rel=1e-3,
                                                         abs=1e-4)   # not normalised
    again = llm.embed(TEXTS[1])[0]   # a second time: no prefix hit may skip its rows
    assert cosine(again.outputs.embedding, expected[1]) >= 0.99999
    assert llm.stats()["kv_blocks_used"] == 0


def test_refusals_name_the_problem(mean_llm):
    path, llm = mean_llm
    # Settings the runner contradicts: refused before any weight is read.
    with pytest.raises(ValueError, match="pooling_type is the pooling runner's"):
        LLM(model=str(path), runner="generate", pooling_type="mean")
    with pytest.raises(ValueError, match="does not declare Matryoshka"):
        llm.embed("hi", dimensions=8)
    with pytest.raises(ValueError, match="pooling runner"):
        llm.generate("hi")
    with pytest.raises(ValueError, match="at least one token"):
        llm.embed([[]])
    assert llm.stats()["kv_blocks_used"] == 0


def test_score_by_cosine_on_an_embedding_model(mean_llm):
    _, llm = mean_llm
    embedded = [o.outputs.embedding for o in llm.embed(TEXTS)]
    scores = [o.outputs.score for o in llm.score(TEXTS[0], TEXTS)]
    assert scores == pytest.approx([1.0, cosine(*embedded)], abs=1e-5)


def test_reranker_from_the_score_tokens_setting(tmp_path, tokenizer_dir):
    path = make_reranker(tokenizer_dir, tmp_path / "rerank")
    llm = LLM(model=str(path), score_tokens="not,is", num_kv_blocks=64)
    outputs = llm.score("What is a loop?", TEXTS)
    tokenizer = llm.tokenizer
    prompts = [tokenizer.encode(rerank_prompt("What is a loop?", t), add_special_tokens=False)
               for t in TEXTS]
    assert [o.prompt_token_ids for o in outputs] == prompts
    against, for_ = tokenizer.encode("not")[0], tokenizer.encode("is")[0]
    assert [o.outputs.score for o in outputs] == pytest.approx(
        hf_rerank_scores(path, prompts, against, for_), abs=1e-5)
    with pytest.raises(ValueError, match="reranker"):
        llm.embed("hi")
