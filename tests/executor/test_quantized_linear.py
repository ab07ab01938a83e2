"""Quantized weights on the CPU executor: the W8A8 layer's arithmetic (executor/
quantized_linear.py, kept for comparison), and `quantization="int8"|"int4"` (weight-only,
executor/weight_only_linear.py): the model kept quantized in memory, greedy tokens against
float32, and refusals by name."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from torch import nn

from folio import LLM, SamplingParams
from folio.executor.linear import PackedLinear, pack_linears
from folio.executor.quantized_linear import Int8Linear, prepacked_available, quantize_rows
from folio.executor.weight_only_linear import WeightOnlyLinear
from tests.hf_oracle import random_prompts

KERNELS = ["int_mm"] + (["prepacked"] if prepacked_available() else [])


def test_quantize_rows_is_per_channel_symmetric():
    weight = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [-100.0, 10.0, 1.0]])
    q, scale = quantize_rows(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert q.abs().amax(dim=1).tolist() == [127, 0, 127]   # each row's largest maps to 127
    torch.testing.assert_close(scale[[0, 2]], torch.tensor([2.0, 100.0]) / 127)
    # Rounding to the nearest step: no entry is further than half a step away.
    error = (q.float() * scale[:, None] - weight).abs()
    assert (error <= scale[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_int8_linear_within_the_quantization_error(rows, bias, kernel):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias)
    x = torch.randn(rows, 96)
    x[0] *= 1000   # one token's outliers must not coarsen the other tokens' steps
    layer = Int8Linear(linear, kernel)
    assert layer.kernel == kernel
    out = layer(x)
    assert out.shape == (rows, 200) and out.dtype == torch.float32
    q = layer.int8_weight()
    assert q.dtype == torch.int8 and q.shape == (200, 96)
    torch.testing.assert_close(q, quantize_rows(linear.weight)[0], rtol=0, atol=0)
    expected = x.double() @ linear.weight.double().T
    if bias:
        expected += linear.bias.double()
    # |x w - x^ w^| <= |x| |w - w^| + |x - x^| |w| + |x - x^| |w - w^|, each error within
    # half its step: the bound from the two scales, per output. The activation step is
    # max|x| / 127 per token (FBGEMM's uint8 range / 255 is no coarser).
    w_step = layer.scale.double()                                        # [N]
    x_step = x.double().abs().amax(dim=1, keepdim=True) / 127            # [M, 1]
    bound = (w_step / 2 * x.double().abs().sum(1, keepdim=True)
             + x_step / 2 * linear.weight.double().abs().sum(1)
             + 96 * x_step * w_step / 4)
    error = (out.double() - expected).abs()
    assert (error <= bound + 1e-5).all()
    # and far closer than the bound on average (errors of independent roundings cancel)
    assert error.mean() < bound.mean() / 4
    if kernel == "int_mm":   # exactly the integer product rescaled, nothing dequantized
        xq = torch.round(x / x_step.float()).to(torch.int8)
        exact = (xq.long() @ q.long().T).double() * x_step * layer.scale.double()
        if bias:
            exact += linear.bias.double()
        torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not prepacked_available(), reason="this torch has no FBGEMM")
def test_prepacked_int8_linear_holds_far_less_than_float32s_bytes():
    """The int8 weights (a quarter of float32's bytes) and FBGEMM's packed copy, never a
    float one: a float copy kept would grow the process by at least float32's bytes. The
    bound leaves room for what the allocator keeps of the quantizing temporaries."""
    linear = nn.Linear(4096, 4096, bias=False)
    float_bytes = linear.weight.nbytes
    before = _rss()
    layer = Int8Linear(linear, "prepacked")
    grown = _rss() - before
    assert 0.2 * float_bytes < grown < 0.8 * float_bytes, grown / float_bytes
    assert all(t.dim() < 2 for t in list(layer.buffers()) + list(layer.parameters()))


def _rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("kernel", KERNELS)
def test_int8_linear_takes_bfloat16_activations_and_leading_dims(kernel):
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    layer = Int8Linear(linear, kernel)
    x = torch.randn(2, 3, 64)
    out = layer(x.bfloat16())
    assert out.shape == (2, 3, 32) and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), linear(x).detach(), rtol=0.05, atol=0.05)


@pytest.fixture(scope="module", autouse=True)
def cpu_ops_built():
    """The weight-only layers run on the built operators (without, on a float fallback)."""
    from folio.kernels import cpu_attention

    if not cpu_attention.load().ok:
        cpu_attention.build()


@pytest.mark.parametrize("bits", [8, 4])
def test_pack_linears_quantizes_every_linear_and_holds_no_float_weight(bits):
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Sequential(nn.Linear(128, 32)))
    x = torch.randn(3, 64)
    reference = model(x).detach()
    name = f"int{bits}"
    assert pack_linears(model, torch.device("cpu"), torch.float32, "auto", name) == name
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear,
                                                           WeightOnlyLinear))]
    assert [type(m) for m in layers] == [WeightOnlyLinear, WeightOnlyLinear]
    assert {m.data.dtype for m in layers} == {torch.int8 if bits == 8 else torch.uint8}
    # no float copy of a weight (the scales are one per channel or per 32 values)
    assert not any(t.is_floating_point() and t.numel() >= 64 * 32 / 16 * 2 + 1
                   for t in list(model.parameters()) + list(model.buffers()) if t.dim() == 2)
    torch.testing.assert_close(model(x), reference, rtol=0.1, atol=0.1 if bits == 4 else 0.02)


def test_quantization_refused_by_name_where_it_cannot_run():
    model = nn.Sequential(nn.Linear(8, 8))
    with pytest.raises(ValueError, match="quantization='int8'.*CPU executor only.*cuda"):
        pack_linears(model, torch.device("cuda"), torch.float32, "auto", "int8")
    assert isinstance(model[0], nn.Linear)   # nothing was half-converted


def test_unknown_quantization_is_a_setting_error(llama_dir):
    with pytest.raises(ValueError, match="quantization"):
        LLM(str(llama_dir), device="cpu", quantization="int3")


def _greedy(llm: LLM, prompts, max_tokens) -> list[list[int]]:
    params = [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens]
    return [r.outputs[0].token_ids for r in llm.generate(prompts, params)]


@pytest.mark.parametrize("quantization", ["int8", "int4"])
@pytest.mark.parametrize("fixture", ["llama_dir", "qwen2_dir"])   # qwen2's are tied
def test_quantized_model_is_quantized_in_memory_and_predicts_float32_tokens(
        fixture, quantization, request):
    model_dir = str(request.getfixturevalue(fixture))
    # One greedy token after each of 64 prompts: 64 independent next-token predictions (a
    # longer generation diverges for good at its first near-tie, and a tiny random model's
    # logits are full of near-ties).
    prompts, _ = random_prompts(64, 3, 60, vocab=1024, seed=5)
    max_tokens = [1] * len(prompts)
    reference_llm = LLM(model_dir, dtype="float32", device="cpu", num_kv_blocks=256)
    reference = _greedy(reference_llm, prompts, max_tokens)
    reference_long = _greedy(reference_llm, prompts[:4], [8] * 4)
    del reference_llm
    llm = LLM(model_dir, dtype="float32", device="cpu", num_kv_blocks=256,
              quantization=quantization)
    executor = llm.engine.executor
    assert executor.linear_backend == quantization
    layers = [m for m in executor.model.modules() if isinstance(m, WeightOnlyLinear)]
    float_linears = [m for m in executor.model.modules()
                     if isinstance(m, (nn.Linear, PackedLinear))]
    assert layers and not float_linears   # lm_head included, tied or not
    assert {m.bits for m in layers if m is not executor.model.lm_head} == \
        {int(quantization[3:])}
    assert executor.model.lm_head.bits == 8   # int8 under int4 too
    assert not any(t.is_floating_point() and t.shape == (layer.out_features, layer.in_features)
                   for layer in layers for t in layer.buffers())
    # The embedding stays float (a lookup reads a few rows a step); tied, it keeps
    # working as the input side while lm_head holds its own quantized copy.
    assert executor.model.embed_tokens.weight.dtype == torch.float32
    quantized = _greedy(llm, prompts, max_tokens)
    agreed = sum(q == r for q, r in zip(quantized, reference))
    # Measured: int8 weight-only agrees on 63 and 62 of 64 next tokens (llama, qwen2); int4
    # on 39 and 45 (a random tiny model's logits are full of near-ties; chance is 1/1024).
    assert agreed >= (0.9 * len(prompts) if quantization == "int8" else 0.5 * len(prompts)), \
        (agreed, quantized, reference)
    longer = _greedy(llm, prompts[:4], [8] * 4)
    assert all(len(tokens) == 8 for tokens in longer)   # it produces text
    if quantization == "int8":   # 3 and 2 of 4 eight-token runs were float32's exactly
        assert sum(a == b for a, b in zip(longer, reference_long)) >= 2


def test_cli_refuses_int4_for_a_model_its_groups_cannot_take(tmp_path_factory, tokenizer_dir):
    """hidden_size 80 is not a multiple of int4's 32-value groups: one line naming
    --quantization, exit 2, before any process starts."""
    import subprocess
    import sys

    from tests.conftest import _model_dir

    model = _model_dir(tmp_path_factory, tokenizer_dir, "llama80", arch="llama",
                       hidden_size=80, num_heads=4, num_kv_heads=2)
    result = subprocess.run([sys.executable, "-m", "folio", "serve", "--model", str(model),
                             "--device", "cpu", "--quantization", "int4"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "quantization" in line and "multiple of 32" in line and "80" in line
    with pytest.raises(ValueError, match="multiple of 32"):
        LLM(str(model), device="cpu", quantization="int4")


def test_cli_refuses_int8_for_a_gpu_executor_before_anything_starts(llama_dir):
    """--device cuda with --quantization int8: one line naming the setting, exit 2, before
    any process starts (whether or not this machine has a GPU)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "folio", "serve", "--model", str(llama_dir),
                             "--device", "cuda", "--quantization", "int8"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "quantization" in line and "CPU executor only" in line
