"""A GGUF file served with its quantized layers kept against the same file dequantized: the
prompt's top logprobs of each, and the check that they agree (test_gguf_quantized.py, the
GGUF families' and hybrids' tests)."""

from __future__ import annotations

from pathlib import Path

from folio import LLM, SamplingParams
from folio.executor.quantization import weight_formats
from folio.executor.quantization.weight_only_linear import WeightOnlyLinear


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
