"""The native decode step (executor/native_step, kernels/cpu/decode_step.cpp) against the
Python layer loop it replaces: the same hidden state and residual, bit for bit, and the same
KV cache bytes, for each architecture feature it covers (qkv bias, q/k norm, partial rotary,
sliding window), float32 and bfloat16, every linear kind (torch, oneDNN, int8, int4) and KV
cache type, over batches of 1 to 16 rows with mixed context lengths; steps past its bound
keep the loop."""

from __future__ import annotations

import random

import pytest
import torch

from folio.executor.linear import onednn_unavailable_reason
from folio.executor.native_step import MAX_TOKENS
from folio.executor.ops import AttentionInputs
from folio.kernels.kv_quant import kv_storage_dtype, row_width
from folio.tiny_models import make_random_checkpoint
from tests.executor.native_step.harness import (CPU, executor_model, native_step,
                                               needs_cpu_operators)
from tests.executor.native_step.spy import CountingStep

pytestmark = needs_cpu_operators

BLOCK = 4
MAX_POSITIONS = 256
ARCHS = {
    "llama": dict(arch="llama"),
    "qwen2": dict(arch="qwen2", num_kv_heads=1),                          # qkv bias, MQA
    "qwen3": dict(arch="qwen3"),                                          # q/k norm
    "phi3": dict(arch="phi3", rope_parameters={                           # partial rotary
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    "mistral": dict(arch="mistral", sliding_window=8),                    # windowed layers
}
# (context length, new tokens) per sequence: one decode row; a batch of 8 decodes with
# mixed contexts (block boundaries, a first token); rows of several tokens per sequence
# (speculative drafts, a short prompt chunk); the bound.
BATCHES = [[(37, 1)],
           [(1, 1), (4, 1), (5, 1), (23, 1), (40, 1), (9, 1), (16, 1), (31, 1)],
           [(12, 3), (7, 1), (30, 4)],
           [(20, 2)] * 8]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = tmp_path_factory.mktemp(name)
            make_random_checkpoint(made[name], max_position_embeddings=MAX_POSITIONS,
                                   **ARCHS[name])
        return made[name]
    return get


def _model(path, dtype: torch.dtype, linear: str):
    """The model as the executor builds it, with `linear` linears, and its native step."""
    quantization = linear if linear in ("int8", "int4") else "none"
    backend = "torch" if linear == "torch" else "auto"
    model, ops = executor_model(path, dtype, MAX_POSITIONS, quantization, backend)
    return model, native_step(model, ops, dtype)


def _inputs(tables, spans):
    """Attention inputs of the tokens [begin, end) of each sequence."""
    positions, starts, seq_lens, rows = [], [0], [], []
    for seq, (begin, end) in enumerate(spans):
        positions += range(begin, end)
        rows += [seq] * (end - begin)
        starts.append(starts[-1] + end - begin)
        seq_lens.append(end)
    positions = torch.tensor(positions, dtype=torch.int64)
    slots = tables[rows, positions // BLOCK].long() * BLOCK + positions % BLOCK
    return positions, AttentionInputs(slots, tables, torch.tensor(seq_lens, dtype=torch.int32),
                                      torch.tensor(starts, dtype=torch.int32))


def _caches(model, kv_dtype: torch.dtype, blocks: int):
    config = model.config
    shape = (blocks, BLOCK, config.num_kv_heads, row_width(kv_dtype, config.head_dim))
    return [(torch.zeros(shape, dtype=kv_dtype), torch.zeros(shape, dtype=kv_dtype))
            for _ in range(config.num_layers)]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@torch.inference_mode()
def _check_step(model, step, dtype: torch.dtype, kv_cache_dtype: str, batch, seed: int):
    """Prefill each sequence's context through the loop, then run the step's new tokens
    natively and through the loop from copies of the same cache: equal bytes everywhere."""
    rng = random.Random(seed)
    per_seq = max(-(-ctx // BLOCK) for ctx, _ in batch)
    blocks = list(range(1, len(batch) * per_seq + 1))
    rng.shuffle(blocks)   # scattered blocks, block 0 never used
    tables = torch.tensor(blocks, dtype=torch.int32).view(len(batch), per_seq)
    caches = _caches(model, kv_storage_dtype(kv_cache_dtype, dtype), len(blocks) + 1)
    vocab = model.config.vocab_size
    prefill = [(0, ctx - new) for ctx, new in batch]
    model.native_step = None
    if any(end for _, end in prefill):
        kept = [i for i, (_, end) in enumerate(prefill) if end]
        positions, inputs = _inputs(tables[kept], [prefill[i] for i in kept])
        model(torch.tensor([rng.randrange(vocab) for _ in positions]), positions, caches, inputs)
    positions, inputs = _inputs(tables, [(ctx - new, ctx) for ctx, new in batch])
    ids = torch.tensor([rng.randrange(vocab) for _ in positions])
    copies = [(k.clone(), v.clone()) for k, v in caches]
    expected = model(ids, positions, copies, inputs)
    model.native_step = spy = CountingStep(step)
    got = model(ids, positions, caches, inputs)
    model.native_step = None
    assert spy.calls == 1
    assert got.dtype == dtype and got.isfinite().all()
    assert _same_bytes(got, expected), (got - expected).abs().max()
    for (k, v), (k2, v2) in zip(caches, copies):
        assert _same_bytes(k, k2) and _same_bytes(v, v2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_each_architecture_feature_matches_the_layer_loop(arch, dtype, checkpoints):
    model, step = _model(checkpoints(arch), dtype, "auto")
    if arch == "phi3":
        assert model.layers[0].self_attn.rotary_dim == 8 < model.config.head_dim
    if arch == "mistral":
        assert model.layers[0].self_attn.window == 8
    for i, batch in enumerate(BATCHES):
        _check_step(model, step, dtype, "auto", batch, seed=i)


# Every linear kind against KV cache types; qwen2 for the biases (q, k, v).
LINEARS_AND_CACHES = [("torch", "auto"), ("torch", "int8"), ("onednn", "int8"),
                      ("onednn", "fp8_e4m3"), ("int8", "auto"), ("int8", "int8"),
                      ("int4", "auto"), ("int4", "bfloat16")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("linear,kv_cache_dtype", LINEARS_AND_CACHES)
def test_every_linear_kind_and_cache_type_matches_the_layer_loop(linear, kv_cache_dtype,
                                                                 dtype, checkpoints):
    if linear == "onednn" and onednn_unavailable_reason(CPU, dtype) is not None:
        pytest.skip(onednn_unavailable_reason(CPU, dtype))
    model, step = _model(checkpoints("qwen2"), dtype, linear)
    for i, batch in enumerate(BATCHES[1:3]):
        _check_step(model, step, dtype, kv_cache_dtype, batch, seed=10 + i)


@torch.inference_mode()
def test_a_step_past_the_bound_keeps_the_layer_loop(checkpoints):
    model, step = _model(checkpoints("llama"), torch.float32, "auto")
    assert MAX_TOKENS == 16
    tables = torch.arange(1, 9, dtype=torch.int32).view(2, 4)
    model.native_step = spy = CountingStep(step)
    for tokens, calls in ((MAX_TOKENS, 1), (MAX_TOKENS + 1, 1)):
        positions, inputs = _inputs(tables, [(0, tokens - 5), (0, 5)])
        model(torch.arange(tokens), positions, _caches(model, torch.float32, 9), inputs)
        assert spy.calls == calls
