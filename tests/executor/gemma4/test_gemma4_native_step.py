"""Gemma 4's native step (executor/native_step/gemma4.py, kernels/cpu/gemma4_step.cpp)
against the Python layers it replaces: for tiny Gemma 4 checkpoints made by transformers
(every layer its own cache; kv-shared layers with double-wide MLPs and per-layer inputs;
values = keys with one global KV head), float32 and bfloat16, decode steps on 1-3 sequences
and a mixed step (a prompt chunk beside decodes) give the same hidden states and the same
KV cache bytes (torch.equal), with every linear kind (oneDNN / BF16 tiles, torch, int8)
and an int8 KV cache too; the engine runs it
by default with tokens equal to decode_step="python"'s, and the log names what keeps the
layers (the MoE block, hooks, the torch kernels)."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from folio import LLM, SamplingParams
from folio.executor.linear import onednn_unavailable_reason
from folio.executor.model_loader import load_model
from folio.executor.models.hf_config import read_model_config
from folio.executor.native_step import MAX_TOKENS, select_decode_step
from folio.executor.ops import AttentionInputs, select_ops
from folio.kernels.kv_quant import kv_storage_dtype, row_width
from tests.executor.gemma4.checkpoints import make_gemma4_dir
from tests.executor.native_step.harness import (CPU, engine_and_step_lines, executor_model,
                                               native_step, needs_cpu_operators)
from tests.executor.native_step.spy import CountingStep
from tests.hf_oracle import random_prompts

pytestmark = needs_cpu_operators

BLOCK = 4
MAX_POSITIONS = 256
ROWS = 4
# Prompt tokens each sequence has through the layers before the steps (past the sliding
# layers' window of 16 for the first).
PROMPTS = [20, 9, 3]
# Steps: (sequence, new tokens) in the step's order; the last one mixes a prompt chunk of 5
# with decodes.
STEPS = [[(0, 1), (1, 1), (2, 1)], [(2, 1), (0, 1)], [(1, 1)], [(1, 1), (2, 5), (0, 1)]]
DENSE = ["plain", "shared_kv_ple", "k_eq_v_dense"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer_dir):
    made = {}

    def get(variant: str):
        if variant not in made:
            made[variant] = make_gemma4_dir(tmp_path_factory.mktemp(variant), tokenizer_dir,
                                            variant)
        return made[variant]
    return get


def _model(path, dtype: torch.dtype, quantization: str = "none", backend: str = "auto"):
    """The model as the executor builds it, and its native step."""
    model, ops = executor_model(path, dtype, MAX_POSITIONS, quantization, backend)
    return model, native_step(model, ops, dtype)


def _inputs(tables, spans):
    """Attention inputs of the tokens [begin, end) of each sequence (its row of `tables`)."""
    positions, starts, seq_lens, rows = [], [0], [], []
    for row, (begin, end) in spans:
        positions += range(begin, end)
        rows += [row] * (end - begin)
        starts.append(starts[-1] + end - begin)
        seq_lens.append(end)
    positions = torch.tensor(positions, dtype=torch.int64)
    mapping = tables[rows, positions // BLOCK].long() * BLOCK + positions % BLOCK
    return positions, AttentionInputs(mapping, tables[[row for row, _ in spans]],
                                      torch.tensor(seq_lens, dtype=torch.int32),
                                      torch.tensor(starts, dtype=torch.int32))


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@torch.inference_mode()
def _check_steps(model, step, dtype: torch.dtype, kv_cache_dtype: str, seed: int):
    """Prompts through the layers, then each of STEPS through the layers (on copies of the
    caches) and natively: equal hidden states and caches after each."""
    rng = random.Random(seed)
    config = model.config
    per_seq = MAX_POSITIONS // BLOCK // ROWS
    blocks = list(range(1, ROWS * per_seq + 1))
    rng.shuffle(blocks)   # scattered blocks, block 0 never used
    tables = torch.tensor(blocks, dtype=torch.int32).view(ROWS, per_seq)
    kv_dtype = kv_storage_dtype(kv_cache_dtype, dtype)
    caches = []
    for heads, dim in config.kv_cache_shapes:
        shape = (len(blocks) + 1, BLOCK, heads, row_width(kv_dtype, dim))
        caches.append((torch.zeros(shape, dtype=kv_dtype), torch.zeros(shape, dtype=kv_dtype)))
    vocab = config.vocab_size
    model.native_step = None
    positions, inputs = _inputs(tables, [(row, (0, n)) for row, n in enumerate(PROMPTS)])
    model(torch.tensor([rng.randrange(vocab) for _ in positions]), positions, caches, inputs)
    lengths = list(PROMPTS)
    calls = 0
    for order in STEPS:
        positions, inputs = _inputs(tables, [(i, (lengths[i], lengths[i] + n))
                                             for i, n in order])
        ids = torch.tensor([rng.randrange(vocab) for _ in positions])
        python_caches = [(k.clone(), v.clone()) for k, v in caches]
        model.native_step = None
        expected = model(ids, positions, python_caches, inputs)
        model.native_step = spy = CountingStep(step)
        got = model(ids, positions, caches, inputs)
        calls += spy.calls
        assert got.dtype == dtype and got.isfinite().all()
        assert _same_bytes(got, expected), (got.float() - expected.float()).abs().max()
        for (k, v), (k2, v2) in zip(caches, python_caches):
            assert _same_bytes(k, k2) and _same_bytes(v, v2)
        for i, n in order:
            lengths[i] += n
    model.native_step = None
    assert calls == len(STEPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("variant", DENSE)
def test_steps_match_the_python_layers(variant, dtype, checkpoints):
    model, step = _model(checkpoints(variant), dtype)
    spec = model.config.gemma4
    if variant == "shared_kv_ple":
        assert spec.per_layer_input_size and len(spec.cache_layers) < len(model.layers)
    if variant == "k_eq_v_dense":
        assert any(spec.k_eq_v) and spec.moe is None
    _check_steps(model, step, dtype, "auto", seed=1)


@pytest.mark.parametrize("quantization,kv_cache_dtype", [("int8", "auto"), ("none", "int8"),
                                                         ("int8", "int8")])
@pytest.mark.parametrize("variant", ["shared_kv_ple", "k_eq_v_dense"])
def test_int8_weights_and_cache_match(variant, quantization, kv_cache_dtype, checkpoints):
    model, step = _model(checkpoints(variant), torch.float32, quantization)
    if quantization == "int8":
        assert type(model.layers[0].mlp.down_proj).__name__ == "WeightOnlyLinear"
    _check_steps(model, step, torch.float32, kv_cache_dtype, seed=2)


@pytest.mark.parametrize("backend,dtype", [("torch", torch.float32),
                                           ("onednn", torch.bfloat16)])
def test_other_linear_kinds_match(backend, dtype, checkpoints):
    """at::linear, and oneDNN in bfloat16 where Folio's BF16 tiles would serve."""
    if backend == "onednn" and onednn_unavailable_reason(CPU, dtype) is not None:
        pytest.skip(onednn_unavailable_reason(CPU, dtype))
    model, step = _model(checkpoints("shared_kv_ple"), dtype, backend=backend)
    expected = "Linear" if backend == "torch" else "PackedLinear"
    assert type(model.layers[0].mlp.down_proj).__name__ == expected
    _check_steps(model, step, dtype, "auto", seed=3)


@torch.inference_mode()
def test_steps_past_the_bound_keep_the_layers(checkpoints):
    model, step = _model(checkpoints("plain"), torch.float32)
    tables = torch.arange(1, 2 * 5 + 1, dtype=torch.int32).view(2, 5)
    caches = [(torch.zeros(tables.numel() + 1, BLOCK, h, d),
               torch.zeros(tables.numel() + 1, BLOCK, h, d))
              for h, d in model.config.kv_cache_shapes]
    model.native_step = spy = CountingStep(step)
    for spans, calls in (([(0, (0, MAX_TOKENS + 1))], 0), ([(1, (0, MAX_TOKENS))], 1)):
        positions, inputs = _inputs(tables, spans)
        model(torch.zeros(len(positions), dtype=torch.int64), positions, caches, inputs)
        assert spy.calls == calls


def _llm(path, caplog, **engine_args) -> tuple[LLM, list[str]]:
    return engine_and_step_lines(path, caplog, dtype="float32", **engine_args)


def test_the_engine_runs_it_with_the_python_layers_tokens(checkpoints, caplog):
    prompts, _ = random_prompts(4, 2, 30, vocab=1024, seed=5)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (9, 4, 12, 1)]
    path = checkpoints("shared_kv_ple")
    python, lines = _llm(path, caplog, decode_step="python")
    assert lines == ["decode step: Python layers (decode_step='python')"]
    expected = [r.outputs[0].token_ids for r in python.generate(prompts, params)]
    del python
    native, lines = _llm(path, caplog)
    assert lines == ["decode step: native, one C++ call for the layers of steps of up to 16 "
                     "tokens (Gemma 4)"]
    model = native.engine.executor.model
    model.native_step = spy = CountingStep(model.native_step)
    assert [r.outputs[0].token_ids for r in native.generate(prompts, params)] == expected
    assert spy.calls >= 11   # the longest answer's decode steps after its first token


def test_what_keeps_the_python_layers_is_named(checkpoints, caplog):
    model, _ = _model(checkpoints("plain"), torch.float32)
    ops = select_ops("cpu", CPU)
    moe_path = checkpoints("k_eq_v")
    moe = load_model(moe_path, read_model_config(moe_path), ops, torch.float32, CPU,
                     MAX_POSITIONS)

    def select(target=model, setting="auto", kernels=ops):
        return select_decode_step(target, setting, kernels, CPU, torch.float32)

    with caplog.at_level(logging.INFO, logger="folio.executor"):
        caplog.clear()
        assert select(moe) is None
        assert select(kernels=select_ops("torch", CPU)) is None
        handle = model.layers[2].self_attn.register_forward_hook(lambda *_: None)
        assert select() is None
        handle.remove()
        assert select() is not None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decode step")]
    assert lines[:-1] == [f"decode step: Python layers ({why})" for why in (
        "Gemma 4's MoE block (its CPU experts are Python)", "torch attention kernels",
        "forward hooks on a layer")]
    assert lines[-1].startswith("decode step: native")
