"""What the GGUF tests check of a file (test_gguf_quantized.py, the GGUF families' and the
hybrids' tests): its greedy output against transformers on the checkpoint it was written
from; served with its quantized layers kept against the same file dequantized (the prompt's
top logprobs of each, and that they agree); its refusal at start."""

from __future__ import annotations

from pathlib import Path

from folio import LLM, SamplingParams
from folio.executor.quantization import weight_formats
from folio.executor.quantization.weight_only_linear import WeightOnlyLinear
from tests.hf_oracle import hf_greedy


def greedy_matches_checkpoint(path: Path, model_dir: Path, prompts: list[list[int]],
                              max_tokens: int) -> LLM:
    """`path` (an F32 file) served gives transformers' greedy tokens on `model_dir`, the
    longer prompts chunked; the engine, for what the caller checks after."""
    expected = hf_greedy(model_dir, prompts, [max_tokens] * len(prompts), "cpu")
    assert len({t for answer in expected for t in answer}) > 10   # not one repeated token
    llm = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=64,
              max_num_batched_tokens=32)   # the longer prompts chunked
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens)] * len(prompts)
    assert [r.outputs[0].token_ids for r in llm.generate(prompts, params)] == expected
    return llm


def prompt_logprobs(path: Path, prompts: list[list[int]], monkeypatch, keep: bool
                    ) -> tuple[list[dict[int, float]], list[str]]:
    """Every prompt position's top-5 logprobs (token -> logprob, prompts after one another)
    and the names of the modules kept quantized; `keep` False dequantizes every layer.
    Float activations: the file's blocks against their dequantized floats, exactly (the
    default int8 activations of small batches round x too: tests/kernels/test_quant_dot.py)."""
    if not keep:
        monkeypatch.setattr(weight_formats, "keep_gguf_quantized", lambda *args: 0)
    llm = LLM(str(path), dtype="float32", device="cpu", num_kv_blocks=64,
              quantized_activations="float")
    outs = llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0,
                                                prompt_logprobs=5))
    kept = [name for name, module in llm.engine.executor.model.named_modules()
            if isinstance(module, WeightOnlyLinear)]
    monkeypatch.undo()
    positions = [{token: entry.logprob for token, entry in position.items()}
                 for out in outs for position in out.prompt_logprobs[1:]]
    return positions, kept


def assert_same_top_logprobs(kept: list[dict[int, float]], dequantized: list[dict[int, float]],
                             within: float = 1e-3) -> None:
    assert len(kept) == len(dequantized)
    for kept_position, float_position in zip(kept, dequantized):
        assert kept_position.keys() == float_position.keys()   # the same top tokens
        for token, logprob in float_position.items():
            assert abs(kept_position[token] - logprob) < within


def kept_and_dequantized_agree(path: Path, prompts: list[list[int]], monkeypatch) -> list[str]:
    """`path` served with its layers kept quantized and dequantized: nothing kept in the
    second, the same top logprobs in both; the names of the modules kept in the first."""
    kept_values, kept = prompt_logprobs(path, prompts, monkeypatch, keep=True)
    float_values, none = prompt_logprobs(path, prompts, monkeypatch, keep=False)
    assert none == []
    assert_same_top_logprobs(kept_values, float_values)
    return kept


def linear_kinds(names: list[str]) -> set[str]:
    """The kinds of module among `names` (their last part: out_proj, qkv_proj, ...)."""
    return {name.rsplit(".", 1)[-1] for name in names}


def model_refusal(path: Path) -> str:
    """The start-up check's one-line refusal of `path` (a SettingError naming the model)."""
    import pytest

    from folio.preflight import check_model_dir
    from folio.shared.config import SettingError

    with pytest.raises(SettingError) as info:
        check_model_dir(str(path))
    assert str(info.value).startswith("model ")
    return str(info.value)
