"""The hybrids' native decode step (executor/native_step/hybrid.py,
kernels/cpu/hybrid_step.cpp) against the Python layers it replaces: for tiny Qwen3.5 and LFM2
checkpoints made by transformers, float32 and bfloat16, several decode steps on 1-3 sequences
with fresh and continuing state slots give the same hidden states, the same state pool and
the same KV cache bytes (torch.equal), with every linear kind the engine makes (oneDNN / BF16
tiles, torch, int8, int4) and KV cache types; steps it does not take keep the layers; the
engine runs it by default with tokens equal to decode_step="python"'s, and the log names
what keeps the layers (a MoE hybrid, LoRA, tensor parallel, the torch kernels, hooks)."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from folio import LLM, SamplingParams
from folio.executor.linear import onednn_unavailable_reason
from folio.executor.lora.layers import LoraStep
from folio.executor.models.hybrid.state_pool import StatePool
from folio.executor.native_step import MAX_TOKENS, select_decode_step
from folio.executor.ops import AttentionInputs, select_ops
from folio.kernels.kv_quant import kv_storage_dtype, row_width
from tests.executor.hybrid.checkpoints import make_hybrid_dir
from tests.executor.hybrid.moe_checkpoints import make_moe_dir
from tests.executor.native_step.harness import (CPU, engine_and_step_lines, executor_model,
                                               native_step, needs_cpu_operators)
from tests.executor.native_step.spy import CountingStep
from tests.hf_oracle import random_prompts

pytestmark = needs_cpu_operators

BLOCK = 4
MAX_POSITIONS = 256
SLOTS = 5
# (state slot, prompt tokens computed by the layers before the decode steps; 0: the
# sequence's first token is its first decode step, a fresh slot).
SEQUENCES = [(3, 6), (0, 9), (4, 0)]
# Decode steps: which sequences (by index) take one token each, in the step's order.
STEPS = [[0, 1, 2], [2, 0], [1], [1, 2, 0]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tokenizer_dir):
    made = {}

    def get(name: str):
        """A family's checkpoint; "lfm2_bias": LFM2 with biases on its convolutions and
        their projections."""
        if name not in made:
            family, overrides = ("lfm2", {"conv_bias": True}) if name == "lfm2_bias" \
                else (name, {})
            made[name] = make_hybrid_dir(tmp_path_factory.mktemp(name), tokenizer_dir,
                                         family, **overrides)
        return made[name]
    return get


def _model(path, dtype: torch.dtype, linear: str):
    """The model as the executor builds it, with `linear` linears, and its native step."""
    quantization = linear if linear in ("int8", "int4") else "none"
    backend = linear if linear in ("torch", "onednn") else "auto"
    model, ops = executor_model(path, dtype, MAX_POSITIONS, quantization, backend)
    return model, native_step(model, ops, dtype)


def _inputs(tables, spans, slots):
    """Attention inputs of the tokens [begin, end) of each sequence (its row of `tables`)."""
    positions, starts, seq_lens, rows = [], [0], [], []
    for row, (begin, end) in zip(slots, spans):
        positions += range(begin, end)
        rows += [row] * (end - begin)
        starts.append(starts[-1] + end - begin)
        seq_lens.append(end)
    positions = torch.tensor(positions, dtype=torch.int64)
    mapping = tables[rows, positions // BLOCK].long() * BLOCK + positions % BLOCK
    return positions, starts, AttentionInputs(mapping, tables[list(slots)],
                                              torch.tensor(seq_lens, dtype=torch.int32),
                                              torch.tensor(starts, dtype=torch.int32))


def _copy(pool: StatePool) -> StatePool:
    other = StatePool.__new__(StatePool)
    other.num_slots, other.device = pool.num_slots, pool.device
    other.conv = {layer: t.clone() for layer, t in pool.conv.items()}
    other.delta = {layer: t.clone() for layer, t in pool.delta.items()}
    return other


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@torch.inference_mode()
def _check_decode_steps(model, step, dtype: torch.dtype, kv_cache_dtype: str, seed: int):
    """Prompts through the layers, then each of STEPS through the layers (on copies of the
    pool and caches) and natively: equal hidden states, pools and caches after each."""
    rng = random.Random(seed)
    config = model.config
    per_seq = MAX_POSITIONS // BLOCK // 4
    blocks = list(range(1, SLOTS * per_seq + 1))
    rng.shuffle(blocks)   # scattered blocks, block 0 never used
    tables = torch.tensor(blocks, dtype=torch.int32).view(SLOTS, per_seq)
    kv_dtype = kv_storage_dtype(kv_cache_dtype, dtype)
    shape = (len(blocks) + 1, BLOCK, config.num_kv_heads, row_width(kv_dtype, config.head_dim))
    caches = [(torch.zeros(shape, dtype=kv_dtype), torch.zeros(shape, dtype=kv_dtype))
              for _ in config.hybrid.attention_layers]
    pool = StatePool(config.hybrid, SLOTS, dtype, CPU)
    for tensors in (pool.conv, pool.delta):   # stale contents: a fresh slot must ignore them
        for tensor in tensors.values():
            tensor.normal_(0, 1)
    vocab = config.vocab_size
    model.attach_states(pool)
    model.native_step = None
    prompted = [(slot, n) for slot, n in SEQUENCES if n]
    positions, starts, inputs = _inputs(tables, [(0, n) for _, n in prompted],
                                        [slot for slot, _ in prompted])
    states = pool.step([slot for slot, _ in prompted], [0] * len(prompted), starts)
    model(torch.tensor([rng.randrange(vocab) for _ in positions]), positions, caches, inputs,
          states)
    lengths = [n for _, n in SEQUENCES]
    calls = 0
    for order in STEPS:
        slots = [SEQUENCES[i][0] for i in order]
        positions, starts, inputs = _inputs(tables, [(lengths[i], lengths[i] + 1)
                                                     for i in order], slots)
        ids = torch.tensor([rng.randrange(vocab) for _ in order])
        begins = [lengths[i] for i in order]
        python_pool, python_caches = _copy(pool), [(k.clone(), v.clone()) for k, v in caches]
        model.native_step = None
        model.attach_states(python_pool)
        expected = model(ids, positions, python_caches, inputs,
                         python_pool.step(slots, begins, starts))
        model.native_step = spy = CountingStep(step)
        model.attach_states(pool)
        got = model(ids, positions, caches, inputs, pool.step(slots, begins, starts))
        calls += spy.calls
        assert got.dtype == dtype and got.isfinite().all()
        assert _same_bytes(got, expected), (got.float() - expected.float()).abs().max()
        for ours, theirs in ((pool.conv, python_pool.conv), (pool.delta, python_pool.delta)):
            assert ours.keys() == theirs.keys()
            for layer in ours:
                assert _same_bytes(ours[layer], theirs[layer]), f"layer {layer}'s states"
        for (k, v), (k2, v2) in zip(caches, python_caches):
            assert _same_bytes(k, k2) and _same_bytes(v, v2)
        for i in order:
            lengths[i] += 1
    model.native_step = None
    assert calls == len(STEPS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("family", ["qwen3_5", "lfm2", "lfm2_bias"])
def test_decode_steps_match_the_python_layers(family, dtype, checkpoints):
    model, step = _model(checkpoints(family), dtype, "auto")
    if family == "lfm2_bias":
        assert model.layers[0].mixer.conv.bias is not None
    _check_decode_steps(model, step, dtype, "auto", seed=1)


def test_norms_holding_their_scale_match_the_python_layers(checkpoints):
    """A Qwen3.5 GGUF file stores each zero-centred norm's scale 1 + w, and the model keeps
    it with Norm.offset 0 (executor/quantization/gguf/hybrid/): the native step adds the
    same offset. The norms are made so here, then the step is built."""
    from folio.executor.models.hybrid.layers import Norm

    model, ops = executor_model(checkpoints("qwen3_5"), torch.float32, MAX_POSITIONS)
    scaled = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module) is Norm and module.zero_centred:
                module.weight.add_(1.0)
                module.offset = 0.0
                scaled += 1
    assert scaled > 2 * len(model.layers)
    _check_decode_steps(model, native_step(model, ops, torch.float32), torch.float32, "auto",
                        seed=3)


# Linear kinds beside the default packed ones (oneDNN in bfloat16 where Folio's BF16 tiles
# would serve), and KV cache types.
LINEARS_AND_CACHES = [("torch", "auto", torch.float32), ("int8", "auto", torch.float32),
                      ("int8", "int8", torch.float32), ("int4", "bfloat16", torch.float32),
                      ("auto", "fp8_e4m3", torch.float32), ("onednn", "auto", torch.bfloat16)]


@pytest.mark.parametrize("linear,kv_cache_dtype,dtype", LINEARS_AND_CACHES)
@pytest.mark.parametrize("family", ["qwen3_5", "lfm2"])
def test_every_linear_kind_and_cache_type_matches(family, linear, kv_cache_dtype, dtype,
                                                  checkpoints):
    if linear == "onednn" and onednn_unavailable_reason(CPU, dtype) is not None:
        pytest.skip(onednn_unavailable_reason(CPU, dtype))
    model, step = _model(checkpoints(family), dtype, linear)
    if linear in ("int8", "int4"):   # the recurrent layers' linears quantized too
        assert type(model.layers[0].mixer.out_proj).__name__ == "WeightOnlyLinear"
    if linear == "onednn":
        assert type(model.layers[0].mixer.out_proj).__name__ == "PackedLinear"
    _check_decode_steps(model, step, dtype, kv_cache_dtype, seed=2)


@torch.inference_mode()
def test_steps_it_does_not_take_keep_the_layers(checkpoints):
    """Prompts (several tokens a sequence) and a decode step past the bound run the layers."""
    model, step = _model(checkpoints("qwen3_5"), torch.float32, "auto")
    config = model.config
    pool = StatePool(config.hybrid, MAX_TOKENS + 1, torch.float32, CPU)
    model.attach_states(pool)
    tables = torch.arange(1, 2 * (MAX_TOKENS + 1) + 1, dtype=torch.int32).view(-1, 2)
    shape = (tables.numel() + 1, BLOCK, config.num_kv_heads, config.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in config.hybrid.attention_layers]
    model.native_step = spy = CountingStep(step)
    for count, tokens, calls in ((2, 3, 0), (MAX_TOKENS + 1, 1, 0), (MAX_TOKENS, 1, 1)):
        slots = list(range(count))
        positions, starts, inputs = _inputs(tables, [(0, tokens)] * count, slots)
        model(torch.zeros(len(positions), dtype=torch.int64), positions, caches, inputs,
              pool.step(slots, [0] * count, starts))
        assert spy.calls == calls


def _llm(path, caplog, **engine_args) -> tuple[LLM, list[str]]:
    return engine_and_step_lines(path, caplog, dtype="float32", **engine_args)


@pytest.mark.parametrize("family", ["qwen3_5", "lfm2"])
def test_the_engine_runs_it_with_the_python_layers_tokens(family, checkpoints, caplog):
    prompts, _ = random_prompts(4, 2, 30, vocab=1024, seed=5)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (9, 4, 12, 1)]
    python, lines = _llm(checkpoints(family), caplog, decode_step="python")
    assert lines == ["decode step: Python layers (decode_step='python')"]
    assert python.engine.executor.model.native_step is None
    expected = [r.outputs[0].token_ids for r in python.generate(prompts, params)]
    del python
    native, lines = _llm(checkpoints(family), caplog)
    assert lines == [f"decode step: native, one C++ call for the layers of decode-only steps "
                     f"of up to 16 sequences (hybrid: {family})"]
    model = native.engine.executor.model
    model.native_step = spy = CountingStep(model.native_step)
    assert [r.outputs[0].token_ids for r in native.generate(prompts, params)] == expected
    assert spy.calls >= 11   # the longest answer's decode steps after its first token


def test_a_moe_hybrid_keeps_the_python_layers_and_says_why(tmp_path, tokenizer_dir, caplog):
    path = make_moe_dir(tmp_path, tokenizer_dir, "qwen3_5_moe")
    llm, lines = _llm(path, caplog)
    assert lines == ["decode step: Python layers (MoE layers)"]
    assert llm.engine.executor.model.native_step is None


def test_what_keeps_the_python_layers_is_named(checkpoints, caplog):
    model, _ = _model(checkpoints("lfm2"), torch.float32, "auto")
    cpu, torch_ops = select_ops("cpu", CPU), select_ops("torch", CPU)

    def select(ops=cpu, setting="auto", **options):
        return select_decode_step(model, setting, ops, CPU, torch.float32, **options)

    with caplog.at_level(logging.INFO, logger="folio.executor"):
        caplog.clear()
        assert select(setting="python") is None
        assert select(torch_ops) is None
        model.lora_step = LoraStep()   # what the LoRA registry sets
        assert select() is None
        model.lora_step = None
        assert select(tensor_parallel=True) is None
        model.layers[0].mixer.native = False   # the torch recurrent steps compute otherwise
        assert select() is None
        model.layers[0].mixer.native = True
        handle = model.layers[1].ffn.register_forward_hook(lambda *_: None)
        assert select() is None
        handle.remove()
        assert select() is not None
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("decode step")]
    assert lines[:-1] == [f"decode step: Python layers ({why})" for why in (
        "decode_step='python'", "torch attention kernels", "LoRA adapters", "tensor parallel",
        "the recurrent layers' torch decode steps", "forward hooks on a layer")]
    assert lines[-1].startswith("decode step: native")
