"""The C++ CPU paged attention against the float64 oracle, its selection, and HF parity."""

from __future__ import annotations

import logging
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folio.executor import ops
from folio import LLM, SamplingParams
from folio.kernels import cpu_attention
from tests.hf_oracle import hf_greedy
from tests.kernels.paged_batch import make_batch, oracle, relative_error

FP32_TOLERANCE = 1e-4
BF16_TOLERANCE = 1.6e-2      # what the Triton tests allow bf16 (about 3x its rounding)
CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("cpu_ops_built")


def random_seqs(rng: random.Random, count: int, block_size: int) -> list[tuple[int, int]]:
    """(cached context, new tokens): decodes, whole prompts and chunks after earlier context,
    with lengths that are not multiples of the block size."""
    seqs = []
    for _ in range(count):
        kind = rng.choice(["decode", "prompt", "chunk"])
        while True:
            context = 0 if kind == "prompt" else rng.randint(1, 3 * block_size)
            new = 1 if kind == "decode" else rng.randint(2, 2 * block_size)
            if (context + new) % block_size:
                break
        seqs.append((context, new))
    return seqs


def run(batch) -> torch.Tensor:
    out = torch.full_like(batch.query, float("nan"))          # unwritten rows fail
    result = cpu_attention.paged_attention_cpu(*batch.args(), out=out)
    assert result is out
    return out


# (seed, block size, head dim, query heads, KV heads, sequences or None for random ones)
CASES = [
    pytest.param(0, 16, 64, 4, 4, [(36, 1), (0, 23), (20, 9), (0, 1), (31, 1)],
                 id="mha-b16-d64-mixed"),
    pytest.param(1, 32, 128, 8, 2, None, id="gqa4-b32-d128-random"),
    pytest.param(2, 16, 32, 4, 1, None, id="mqa-b16-d32-random"),
    pytest.param(3, 32, 64, 6, 2, [(40, 1), (3, 30), (0, 45), (70, 1)], id="gqa3-b32-d64"),
    pytest.param(4, 16, 128, 4, 2, [(15, 1), (47, 1), (2, 1), (93, 1)], id="gqa2-b16-d128-dec"),
    pytest.param(5, 16, 96, 2, 1, [(0, 20), (24, 7)], id="mqa-b16-d96-chunks"),
    pytest.param(6, 4, 32, 4, 2, None, id="gqa2-b4-d32-random"),
    # head_dim 80 and 40 take the generic (not compile-time head_dim) loops.
    pytest.param(7, 16, 80, 8, 8, None, id="mha-b16-d80-random"),
    pytest.param(8, 4, 40, 6, 3, [(0, 37), (9, 1), (13, 18)], id="gqa2-b4-d40"),
    # Long prompt chunks: several query tiles per sequence, context over many key tiles.
    pytest.param(9, 16, 64, 8, 4, [(100, 70), (0, 131), (250, 1)], id="gqa2-b16-d64-long"),
]


@pytest.mark.parametrize("seed, block_size, head_dim, num_heads, num_kv_heads, seqs", CASES)
def test_matches_oracle_fp32(seed, block_size, head_dim, num_heads, num_kv_heads, seqs):
    rng = random.Random(seed)
    if seqs is None:
        seqs = random_seqs(rng, rng.randint(1, 8), block_size)
    batch = make_batch(seqs, block_size=block_size, head_dim=head_dim, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, dtype=torch.float32, device=CPU, seed=seed,
                       table_dtype=rng.choice([torch.int32, torch.int64]),
                       len_dtype=rng.choice([torch.int32, torch.int64]))
    assert relative_error(run(batch), oracle(batch)) < FP32_TOLERANCE, seqs


@pytest.mark.parametrize("head_dim", [64, 48])
def test_bfloat16(head_dim):
    batch = make_batch([(33, 1), (0, 18), (17, 6), (50, 1)], block_size=16, head_dim=head_dim,
                       num_heads=8, num_kv_heads=2, dtype=torch.bfloat16, device=CPU, seed=11)
    out = run(batch)
    assert out.dtype == torch.bfloat16
    assert relative_error(out, oracle(batch)) < BF16_TOLERANCE


@settings(max_examples=12, deadline=None, derandomize=True)
@given(data=st.data())
def test_random_batches(data):
    """Hypothesis-drawn shapes: any mix of decodes, prompts and chunks in one call."""
    block_size = data.draw(st.sampled_from([4, 16, 32]))
    head_dim = data.draw(st.sampled_from([32, 64, 80, 128]))
    num_kv_heads = data.draw(st.sampled_from([1, 2, 4]))
    num_heads = num_kv_heads * data.draw(st.sampled_from([1, 2, 3, 4]))
    seqs = data.draw(st.lists(
        st.tuples(st.integers(0, 80), st.integers(1, 40)), min_size=1, max_size=6))
    batch = make_batch(seqs, block_size=block_size, head_dim=head_dim, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, dtype=torch.float32, device=CPU, seed=0)
    assert relative_error(run(batch), oracle(batch)) < FP32_TOLERANCE


# Sliding window and soft-capping, as in tests/kernels/test_paged_attention.py: windows
# below, equal to and above the contexts, blocks wholly before every window pointing at NaN;
# head_dim 64 takes the compile-time loops, 40 the generic ones; long chunks span several
# query tiles (each with its own first key tile) and many key tiles.
WINDOWED_SEQS = [(40, 1), (0, 23), (20, 9), (0, 1), (31, 1), (3, 30), (70, 1), (100, 70),
                 (0, 131)]


@pytest.mark.parametrize("block_size, head_dim, window, softcap", [
    (16, 64, 8, None), (16, 64, 33, 5.0), (4, 40, 5, None), (4, 40, 1, 2.0),
    (16, 64, 171, None), (32, 64, 1000, 3.0), (16, 40, None, 3.0), (16, 64, 64, None)])
def test_window_and_softcap_match_oracle(block_size, head_dim, window, softcap):
    batch = make_batch(WINDOWED_SEQS, block_size=block_size, head_dim=head_dim, num_heads=6,
                       num_kv_heads=2, dtype=torch.float32, device=CPU, seed=head_dim,
                       window=window)
    out = torch.full_like(batch.query, float("nan"))
    cpu_attention.paged_attention_cpu(*batch.args(), out=out, window=window, softcap=softcap)
    assert relative_error(out, oracle(batch, window, softcap)) < FP32_TOLERANCE


def test_window_bfloat16():
    batch = make_batch(WINDOWED_SEQS[:7], block_size=16, head_dim=64, num_heads=4,
                       num_kv_heads=2, dtype=torch.bfloat16, device=CPU, seed=1, window=12)
    out = cpu_attention.paged_attention_cpu(*batch.args(), window=12, softcap=4.0)
    assert relative_error(out, oracle(batch, 12, 4.0)) < BF16_TOLERANCE


@settings(max_examples=8, deadline=None, derandomize=True)
@given(data=st.data())
def test_random_windowed_batches(data):
    block_size = data.draw(st.sampled_from([4, 16]))
    seqs = data.draw(st.lists(
        st.tuples(st.integers(0, 80), st.integers(1, 40)), min_size=1, max_size=5))
    window = data.draw(st.integers(1, 90))
    softcap = data.draw(st.sampled_from([None, 1.5, 20.0]))
    batch = make_batch(seqs, block_size=block_size, head_dim=32, num_heads=4, num_kv_heads=1,
                       dtype=torch.float32, device=CPU, seed=0, window=window)
    out = cpu_attention.paged_attention_cpu(*batch.args(), window=window, softcap=softcap)
    assert relative_error(out, oracle(batch, window, softcap)) < FP32_TOLERANCE


def test_threads_split_work_without_changing_results():
    """Work items are independent, so one thread and two give the same bits."""
    gen = random.Random(3)
    seqs = [(gen.randint(0, 300), 1) for _ in range(64)] + [(0, 90), (40, 33)]
    batch = make_batch(seqs, block_size=16, head_dim=64, num_heads=8, num_kv_heads=4,
                       dtype=torch.float32, device=CPU, seed=12)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = run(batch)
        torch.set_num_threads(2)
        double = run(batch)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(single, double)
    assert relative_error(double, oracle(batch)) < FP32_TOLERANCE


@pytest.mark.parametrize("head_dim, num_heads, num_kv_heads", [
    (64, 9, 3),     # split inside a KV head's group
    (80, 6, 2),     # the generic head_dim loops
    (32, 16, 1)])   # a group of 16: more rows than a block
@pytest.mark.parametrize("window", [None, 100])
def test_a_lone_decode_split_across_threads_keeps_its_bits(head_dim, num_heads, num_kv_heads,
                                                          window):
    """With more threads than sequences a long decode is split by query heads; a row's
    arithmetic must not depend on which rows share its part."""
    batch = make_batch([(700, 1)], block_size=16, head_dim=head_dim, num_heads=num_heads,
                       num_kv_heads=num_kv_heads, dtype=torch.float32, device=CPU, seed=13,
                       window=window)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = cpu_attention.paged_attention_cpu(*batch.args(), window=window)
        torch.set_num_threads(2)
        double = cpu_attention.paged_attention_cpu(*batch.args(), window=window)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(single, double)
    assert relative_error(double, oracle(batch, window)) < FP32_TOLERANCE


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim, num_heads, num_kv_heads", [(64, 9, 3), (80, 6, 2)])
def test_a_prompt_row_keeps_its_bits_however_the_prompt_is_chunked(dtype, head_dim, num_heads,
                                                                 num_kv_heads):
    """A prompt's last rows computed with the whole prompt, or as a chunk after a prefix in
    the cache (chunked prefill, a prefix-cache hit), or beside other sequences: the same bits,
    so a request's tokens do not depend on how it was scheduled."""
    torch.manual_seed(5)
    blocks, block_size, context = 8, 16, 40
    key_cache = torch.randn(blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    value_cache = torch.randn(blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    query = torch.randn(context, num_heads, head_dim, dtype=dtype)
    table = torch.tensor([[0, 1, 2]], dtype=torch.int32)

    def rows(q, tables, seq_lens, starts):
        return cpu_attention.paged_attention_cpu(
            q.contiguous(), key_cache, value_cache, tables, torch.tensor(seq_lens, dtype=torch.int32),
            torch.tensor(starts, dtype=torch.int32), head_dim ** -0.5)

    whole = rows(query, table, [context], [0, context])
    for tail in (1, 3, 4, 8, 17):
        chunk = rows(query[-tail:], table, [context], [0, tail])
        assert torch.equal(chunk, whole[-tail:]), tail
    beside = rows(torch.cat((query[-4:], query[:1])), torch.tensor([[0, 1, 2], [3, 4, 0]],
                  dtype=torch.int32), [context, 20], [0, 4, 5])
    assert torch.equal(beside[:4], whole[-4:])


def test_rows_of_no_sequence_are_left_alone():
    batch = make_batch([(20, 1), (5, 4)], block_size=16, head_dim=32, num_heads=2,
                       num_kv_heads=1, dtype=torch.float32, device=CPU, seed=3)
    padded = torch.cat([batch.query, torch.randn(3, 2, 32)])
    out = torch.full_like(padded, float("nan"))
    cpu_attention.paged_attention_cpu(padded, *batch.args()[1:], out=out)
    assert relative_error(out[:5], oracle(batch)) < FP32_TOLERANCE
    assert bool(out[5:].isnan().all())


def test_allocates_output_when_none_given():
    batch = make_batch([(9, 1), (0, 5)], block_size=16, head_dim=32, num_heads=2,
                       num_kv_heads=2, dtype=torch.float32, device=CPU, seed=4)
    out = cpu_attention.paged_attention_cpu(*batch.args())
    assert out.shape == batch.query.shape and out.dtype == batch.query.dtype
    assert relative_error(out, oracle(batch)) < FP32_TOLERANCE


def test_accepts_strided_query_views():
    """The executor passes q as a view of a fused qkv projection: strided tokens."""
    batch = make_batch([(12, 1), (3, 6)], block_size=16, head_dim=32, num_heads=4,
                       num_kv_heads=2, dtype=torch.float32, device=CPU, seed=5)
    tokens = batch.query.shape[0]
    fused = torch.randn(tokens, 4 * 32 + 2 * 2 * 32)
    fused[:, :128] = batch.query.reshape(tokens, 128)
    batch.query = fused[:, :128].view(tokens, 4, 32)
    assert not batch.query.is_contiguous()
    assert relative_error(run(batch), oracle(batch)) < FP32_TOLERANCE


def test_bad_arguments_raise():
    batch = make_batch([(9, 1)], block_size=16, head_dim=32, num_heads=4, num_kv_heads=2,
                       dtype=torch.float32, device=CPU, seed=6)
    q, kc, vc, tables, lens, starts, scale = batch.args()
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        cpu_attention.paged_attention_cpu(q.half(), kc.half(), vc.half(), tables, lens, starts,
                                          scale)
    with pytest.raises(RuntimeError, match="multiple of num_kv_heads"):
        cpu_attention.paged_attention_cpu(q[:, :3], kc, vc, tables, lens, starts, scale)
    with pytest.raises(RuntimeError, match="more blocks than block_tables"):
        cpu_attention.paged_attention_cpu(q, kc, vc, tables[:, :0], lens, starts, scale)
    with pytest.raises(RuntimeError, match="inconsistent"):
        cpu_attention.paged_attention_cpu(q, kc, vc, tables, lens, starts + 1, scale)
    with pytest.raises(RuntimeError, match="outside the cache"):
        cpu_attention.paged_attention_cpu(q, kc, vc, tables + kc.shape[0], lens, starts, scale)


def test_load_without_a_build_says_how_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_CPU_OPS_DIR", str(tmp_path))
    status = cpu_attention.load.__wrapped__()          # uncached: the real one stays loaded
    assert not status.ok
    assert str(tmp_path) in status.detail and "--build" in status.detail


def test_load_names_a_stale_build_and_how_to_rebuild(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_CPU_OPS_DIR", str(tmp_path))
    old = tmp_path / "folio_cpu_ops_native_0123456789ab"
    old.mkdir()
    (old / "folio_cpu_ops_native_0123456789ab.so").write_bytes(b"")   # never opened
    status = cpu_attention.load.__wrapped__()
    assert not status.ok
    assert "folio_cpu_ops_native_0123456789ab" in status.detail and "older source" in status.detail
    assert "scripts/setup.sh" in status.detail


def test_portable_build_is_not_loaded_on_a_cpu_without_avx2(tmp_path, monkeypatch):
    monkeypatch.setenv("FOLIO_CPU_OPS_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_attention, "_cpu_runs_x86_64_v3", lambda: False)
    library = cpu_attention.library_path("portable")
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")                           # never opened: the check comes first
    status = cpu_attention.load.__wrapped__()
    assert not status.ok and "AVX2" in status.detail


def test_auto_selects_the_operator_on_cpu(caplog):
    with caplog.at_level(logging.INFO, logger="folio.executor"):
        kernel_ops = ops.select_ops("auto", CPU)
    assert kernel_ops.name == "cpu"
    assert "C++ CPU operator" in caplog.text
    assert ops.select_ops("cpu", CPU).name == "cpu"
    assert ops.select_ops("torch", CPU).name == "torch"


def test_auto_falls_back_to_torch_and_says_why(monkeypatch, caplog):
    missing = cpu_attention.LoadStatus(False, "no build for this source (test)")
    monkeypatch.setattr(cpu_attention, "load", lambda: missing)
    with caplog.at_level(logging.INFO, logger="folio.executor"):
        assert ops.select_ops("auto", CPU) is ops.TORCH_OPS
    assert "torch reference" in caplog.text and "no build for this source (test)" in caplog.text
    with pytest.raises(ValueError, match="no build for this source"):
        ops.select_ops("cpu", CPU)


@pytest.mark.parity
@pytest.mark.parametrize("fixture", ["llama_dir", "qwen2_dir"])
def test_cpu_backend_matches_transformers(fixture, request):
    model_dir = request.getfixturevalue(fixture)
    prompts = [[5, 9, 200, 31, 7, 7, 64], [100] * 21, [3], list(range(40, 77))]
    max_tokens = [4, 3, 5, 6]
    # Small blocks and budget: decodes and prompt chunks with earlier context share calls.
    llm = LLM(str(model_dir), dtype="float32", device="cpu", attention_backend="cpu",
              block_size=4, num_kv_blocks=64, max_num_batched_tokens=9)
    assert llm.engine.executor.ops.name == "cpu"
    results = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=n)
                                     for n in max_tokens])
    assert [r.outputs[0].token_ids for r in results] == hf_greedy(model_dir, prompts,
                                                                  max_tokens, CPU)


@pytest.mark.parametrize("heads,kv_heads,dtype", [(8, 4, torch.float32), (8, 2, torch.float32),
                                                  (6, 6, torch.float32), (8, 2, torch.bfloat16)])
@pytest.mark.parametrize("window", [None, 90])
def test_a_prompt_is_bit_identical_however_it_is_chunked_or_batched(heads, kv_heads, dtype,
                                                                    window):
    """Prompt rows go through in blocks of 4 that depend on where a chunk starts (here an odd
    offset, so a block holds other rows); each row's arithmetic must not. (Items too small to
    transpose, under 16 rows per KV head, take the dot path, which sums in another order:
    both splits here keep every item above that.)"""
    torch.manual_seed(heads * kv_heads)
    head_dim, block_size, length, split = 64, 16, 320, 111
    key_cache = torch.randn(64, block_size, kv_heads, head_dim).to(dtype)
    value_cache = torch.randn(64, block_size, kv_heads, head_dim).to(dtype)
    table = torch.randperm(64)[:20].to(torch.int32)
    query = torch.randn(length, heads, head_dim).to(dtype)
    scale = head_dim ** -0.5

    def run(q, tables, lens, starts):
        return cpu_attention.paged_attention_cpu(
            q, key_cache, value_cache, torch.stack(tables), torch.tensor(lens, dtype=torch.int32),
            torch.tensor(starts, dtype=torch.int32), scale, window=window)

    whole = run(query, [table], [length], [0, length])
    second_chunk = run(query[split:], [table], [length], [0, length - split])
    other = torch.randperm(64)[:20].to(torch.int32)   # a decode batched before the chunk
    batched = run(torch.cat([torch.randn(1, heads, head_dim).to(dtype), query[split:]]),
                  [other, table], [40, length], [0, 1, 1 + length - split])
    assert torch.equal(second_chunk, whole[split:])
    assert torch.equal(batched[1:], whole[split:])
