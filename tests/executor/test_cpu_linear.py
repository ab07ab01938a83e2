"""The CPU matmul path: oneDNN prepacked linears, their fallback, and the thread policy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from folio.executor.cpu_threads import apply_cpu_threads
from folio.shared.cpus import usable_cores
from folio.executor.linear import PackedLinear, onednn_unavailable_reason, pack_linears
from folio import LLM, SamplingParams
from tests.hf_oracle import hf_greedy, random_prompts

ONEDNN = onednn_unavailable_reason(torch.device("cpu"), torch.float32) is None


@pytest.mark.skipif(not ONEDNN, reason="this torch build has no oneDNN linear")
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 300])
def test_packed_linear_matches_f_linear(rows, bias):
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias)
    x = torch.randn(rows, 96)
    packed = PackedLinear(linear)
    expected = x.double() @ linear.weight.double().T
    if bias:
        expected += linear.bias.double()
    torch.testing.assert_close(packed(x).double(), expected, rtol=1e-5, atol=1e-5)
    assert packed(x).shape == (rows, 200)


def test_pack_linears_replaces_every_linear_or_none():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    used = pack_linears(model, torch.device("cpu"), torch.float32)
    kinds = [type(m) for m in model.modules() if isinstance(m, (nn.Linear, PackedLinear))]
    if ONEDNN:
        assert used == "onednn" and kinds == [PackedLinear, PackedLinear]
    else:
        assert used == "torch" and kinds == [nn.Linear, nn.Linear]
    plain = nn.Sequential(nn.Linear(8, 8))
    assert pack_linears(plain, torch.device("cpu"), torch.float32, "torch") == "torch"
    assert isinstance(plain[0], nn.Linear)


def test_onednn_refuses_by_name_where_it_cannot_run():
    model = nn.Sequential(nn.Linear(8, 8).half())
    with pytest.raises(ValueError, match="linear_backend='onednn'.*float16"):
        pack_linears(model, torch.device("cpu"), torch.float16, "onednn")
    assert pack_linears(model, torch.device("cpu"), torch.float16) == "torch"


def test_greedy_identical_on_both_linear_paths(llama_dir):
    prompts, max_tokens = random_prompts(6, 3, 120, vocab=1024, seed=77)
    expected = hf_greedy(llama_dir, prompts, max_tokens, "cpu")
    for backend in ("auto", "torch"):
        llm = LLM(str(llama_dir), dtype="float32", device="cpu", num_kv_blocks=256,
                  linear_backend=backend)
        assert llm.engine.executor.linear_backend == ("torch" if backend == "torch" or
                                                      not ONEDNN else "onednn")
        params = [SamplingParams(temperature=0, max_tokens=n) for n in max_tokens]
        outputs = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
        assert outputs == expected, backend


def test_thread_policy_follows_the_request_or_the_affinity():
    before = torch.get_num_threads()
    try:
        assert apply_cpu_threads(1) == 1 and torch.get_num_threads() == 1
        assert apply_cpu_threads(None) == len(usable_cores()) == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_cpu_threads_must_be_positive(llama_dir):
    with pytest.raises(ValueError, match="cpu_threads must be a positive integer"):
        LLM(str(llama_dir), cpu_threads=0)


def test_bfloat16_is_prepacked_only_where_onednn_can():
    """On a CPU without AVX-512 or AVX-NE-CONVERT oneDNN refuses to prepack bfloat16: the
    layers stay plain there (torch's matmul) instead of failing at load. Where Folio's own
    BF16 kernel is built it takes them; linear_backend="onednn" still asks for oneDNN."""
    from folio.executor.linear import tiled_bf16_unavailable_reason
    from folio.kernels.onednn_packing import onednn_packs

    model = nn.Sequential(nn.Linear(32, 16)).bfloat16()
    x = torch.randn(3, 32).bfloat16()
    reference = model(x)
    used = pack_linears(model, torch.device("cpu"), torch.bfloat16)
    onednn = "onednn" if onednn_packs(torch.bfloat16) else "torch"
    tiles = tiled_bf16_unavailable_reason(torch.device("cpu"), torch.bfloat16) is None
    assert used == ("bf16-tiles" if tiles and onednn == "onednn" else onednn)
    torch.testing.assert_close(model(x), reference, rtol=2e-2, atol=2e-2)
