"""Attention kernel timings on one CUDA GPU: decode against copy bandwidth, prefill against SDPA.

    python bench/gpu_attention.py [--quick] [--no-sweep] [--budget-s 150] [--json out.json]

Decode: batch 64 x 2048-token contexts and batch 1 x 32k, Llama shapes (32 query heads,
8 KV heads, head_dim 128, 16-token blocks, shuffled block tables), fp16 and bf16. Achieved
bandwidth = bytes of K/V + q read / kernel time, as a fraction of the device-to-device copy
bandwidth measured here (bytes read + written / time of a big torch copy).
Prefill: whole prompts through paged_attention against torch's scaled_dot_product_attention
(is_causal) on the same data laid out contiguously.
Then, while --budget-s lasts, a sweep of launch configs, to pick better defaults.
Each timing is the median over reps of CUDA-event time, with L2 flushed before each rep.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="fewer reps, no sweep, no bf16 (a smoke run)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the launch-config sweep")
    parser.add_argument("--budget-s", type=float, default=150.0,
                        help="stop sweeping once this many seconds have passed (default 150)")
    parser.add_argument("--reps", type=int, default=30, help="timed reps per measurement")
    parser.add_argument("--json", metavar="PATH", help="also write every row as JSON here")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: tiny shapes on CPU through triton's interpreter, wall-clock "
                             "times (checks that this script runs, measures nothing)")
    return parser.parse_args(argv)


@dataclass
class Row:
    kind: str                  # copy | decode | prefill | sweep-decode | sweep-prefill
    case: str
    dtype: str
    config: str
    time_us: float
    gbps: float | None = None
    fraction_of_copy: float | None = None
    tflops: float | None = None
    baseline_us: float | None = None       # decode: torch reference; prefill: SDPA
    max_rel_err: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def copy_bandwidth(torch, timer, size: int) -> float:
    """Bytes read + written per second by a device-to-device copy of `size` bytes."""
    src = torch.empty(size, dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    src.fill_(1)
    micros = timer(lambda: dst.copy_(src))
    del src, dst
    return 2 * size / (micros * 1e-6)


def paged_inputs(torch, batch: int, context: int, new_tokens: int, args, dtype):
    """Caches holding exactly the needed blocks, in shuffled order, and the step's metadata."""
    blocks_per_seq = -(-context // args.block_size)
    num_blocks = batch * blocks_per_seq
    shape = (num_blocks, args.block_size, args.kv_heads, args.head_dim)
    device = args.device
    key_cache = torch.randn(shape, dtype=dtype, device=device)
    value_cache = torch.randn(shape, dtype=dtype, device=device)
    tables = torch.randperm(num_blocks, device=device).view(batch, blocks_per_seq)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    starts = torch.arange(batch + 1, dtype=torch.int32, device=device) * new_tokens
    query = torch.randn(batch * new_tokens, args.heads, args.head_dim, dtype=dtype,
                        device=device)
    scale = args.head_dim ** -0.5
    return query, key_cache, value_cache, tables.to(torch.int32), seq_lens, starts, scale


def relative_error(torch, actual, expected) -> float:
    expected = expected.float()
    return float((actual.float() - expected).abs().max() / expected.abs().max())


def config_name(config) -> str:
    fields = {k: v for k, v in asdict(config).items() if v is not None}
    return ",".join(f"{k}={v}" for k, v in fields.items()) or "default"


def run_decode(torch, kernels, timer, copy_bps, args, dtype, batch, context, config=None,
               kind="decode", reference=True) -> Row:
    inputs = paged_inputs(torch, batch, context, 1, args, dtype)
    query, key_cache = inputs[0], inputs[1]
    out = torch.empty_like(query)
    config = config or kernels.AttentionConfig()

    def triton_fn():
        return kernels.paged_attention(*inputs, out=out, config=config)

    micros = timer(triton_fn)
    element = key_cache.element_size()
    kv_bytes = 2 * batch * context * args.kv_heads * args.head_dim * element
    q_bytes = query.numel() * element
    bps = (kv_bytes + q_bytes) / (micros * 1e-6)
    row = Row(kind, f"decode {batch}x{context}", str(dtype).removeprefix("torch."),
              config_name(config), micros, gbps=bps / 1e9, fraction_of_copy=bps / copy_bps)
    if reference:
        triton_fn()
        expected = kernels.paged_attention_ref(*inputs)
        row.max_rel_err = relative_error(torch, out, expected)
        del expected
        row.baseline_us = timer(lambda: kernels.paged_attention_ref(*inputs), reps=5)
    return row


def run_prefill(torch, kernels, timer, args, dtype, batch, length, config=None,
                kind="prefill", baseline=True) -> Row:
    import torch.nn.functional as F

    inputs = paged_inputs(torch, batch, length, length, args, dtype)
    query, key_cache, value_cache, tables = inputs[:4]
    out = torch.empty_like(query)
    config = config or kernels.AttentionConfig()
    micros = timer(lambda: kernels.paged_attention(*inputs, out=out, config=config))
    flops = 2 * batch * length * length * args.heads * args.head_dim   # causal: half of 4*L*L*H*D
    row = Row(kind, f"prefill {batch}x{length}", str(dtype).removeprefix("torch."),
              config_name(config), micros, tflops=flops / (micros * 1e-6) / 1e12)
    if not baseline:
        return row
    # The same data, contiguous: q [b, H, L, D], k/v [b, Hkv, L, D].
    q = query.view(batch, length, args.heads, args.head_dim).transpose(1, 2).contiguous()
    k = key_cache[tables.long()].flatten(1, 2)[:, :length].transpose(1, 2).contiguous()
    v = value_cache[tables.long()].flatten(1, 2)[:, :length].transpose(1, 2).contiguous()
    scale = inputs[-1]
    try:
        F.scaled_dot_product_attention(q[:, :, :16], k[:, :, :16], v[:, :, :16], is_causal=True,
                                       scale=scale, enable_gqa=True)
        sdpa_kwargs: dict[str, Any] = {"enable_gqa": True}
    except TypeError:                                   # torch < 2.5: expand the KV heads
        groups = args.heads // args.kv_heads
        k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        sdpa_kwargs = {}

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale,
                                              **sdpa_kwargs)

    row.baseline_us = timer(sdpa)
    expected = sdpa().transpose(1, 2).reshape(out.shape)
    kernels.paged_attention(*inputs, out=out, config=config)
    row.max_rel_err = relative_error(torch, out, expected)
    row.extra["sdpa_tflops"] = flops / (row.baseline_us * 1e-6) / 1e12
    return row


HEADER = (f"{'kind':<14}{'case':<18}{'dtype':<10}{'time us':>10}{'GB/s':>9}{'of copy':>9}"
          f"{'TFLOP/s':>9}{'base us':>10}{'rel err':>10}  config")


def format_row(r: Row) -> str:
    def fmt(value, spec):
        return format(value, spec) if value is not None else format("-", ">" + spec.split(".")[0])

    return (f"{r.kind:<14}{r.case:<18}{r.dtype:<10}{r.time_us:>10.1f}{fmt(r.gbps, '9.0f')}"
            f"{fmt(r.fraction_of_copy, '9.2f')}{fmt(r.tflops, '9.1f')}"
            f"{fmt(r.baseline_us, '10.1f')}{fmt(r.max_rel_err, '10.1e')}  {r.config}")


def print_table(rows: list[Row]) -> None:
    print(HEADER)
    print("-" * len(HEADER))
    for r in rows:
        print(format_row(r))
    sys.stdout.flush()


def sweep_configs(kernels, kind: str):
    config = kernels.AttentionConfig
    if kind == "decode":
        for tile in (64, 128, 32):
            for warps in (4, 8):
                for stages in (2, 3):
                    yield config(tile_size=tile, num_warps=warps, num_stages=stages)
    else:
        for block_m in (64, 128):
            for tile in (64, 32, 128):
                for warps in (4, 8):
                    yield config(block_m=block_m, tile_size=tile, num_warps=warps)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"      # before triton and the kernels are imported
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("bench/gpu_attention.py needs a CUDA GPU; none is visible (--dry-run runs tiny "
              "shapes on CPU)", file=sys.stderr)
        return 2
    import triton

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the repo root
    from bench.gpu_timer import Timer
    from folio import kernels

    began = time.monotonic()
    args.device = "cpu" if args.dry_run else "cuda"
    reps = 2 if args.dry_run else 5 if args.quick else args.reps
    timer = Timer(torch, reps, args.device)
    if args.dry_run:
        args.heads, args.kv_heads, args.head_dim = 4, 2, 32
        decode_cases, prefill_cases, copy_size = [(3, 100), (1, 300)], [(1, 64), (2, 32)], 1 << 24
        print("# dry run on CPU (triton interpreter): the numbers mean nothing")
    else:
        decode_cases = [(64, 2048), (1, 32768)]
        prefill_cases = [(1, 4096), (8, 1024)]
        copy_size = 1 << 30
        props = torch.cuda.get_device_properties(0)
        print(f"# {props.name}, {props.multi_processor_count} SMs, "
              f"{props.total_memory / 2**30:.0f} GiB")
    print(f"# torch {torch.__version__}, triton {triton.__version__}; H={args.heads} "
          f"Hkv={args.kv_heads} D={args.head_dim} block={args.block_size}")
    torch.manual_seed(0)
    copy_bps = copy_bandwidth(torch, timer, copy_size)
    rows = [Row("copy", f"d2d {copy_size >> 20} MiB", "uint8", "torch copy_",
                2 * copy_size / copy_bps * 1e6, gbps=copy_bps / 1e9, fraction_of_copy=1.0)]
    dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
    print("# progress (base us: torch reference for decode, SDPA for prefill)")
    print(HEADER)
    print(format_row(rows[0]), flush=True)
    for dtype in dtypes:
        for batch, context in decode_cases:
            rows.append(run_decode(torch, kernels, timer, copy_bps, args, dtype, batch, context))
            print(format_row(rows[-1]), flush=True)
        for batch, length in prefill_cases:
            rows.append(run_prefill(torch, kernels, timer, args, dtype, batch, length))
            print(format_row(rows[-1]), flush=True)

    if not (args.quick or args.no_sweep):
        sweep_rows: list[Row] = []
        plans = [("decode", case) for case in decode_cases] + [("prefill", prefill_cases[0])]
        for kind, (batch, size) in plans:
            configs = list(sweep_configs(kernels, kind))
            if kind == "decode":
                splits = (1, 2, 4, 8) if batch > 1 else (8, 16, 32, 64)
                configs += [kernels.AttentionConfig(num_splits=s) for s in splits]
            for config in configs:
                if time.monotonic() - began > args.budget_s:
                    print(f"# sweep stopped: --budget-s {args.budget_s:.0f} spent")
                    break
                try:
                    if kind == "decode":
                        row = run_decode(torch, kernels, timer, copy_bps, args, torch.float16,
                                         batch, size, config, "sweep-decode", reference=False)
                    else:
                        row = run_prefill(torch, kernels, timer, args, torch.float16, batch,
                                          size, config, "sweep-prefill", baseline=False)
                except Exception as error:      # a config that does not compile or fit
                    print(f"# {kind} {config_name(config)}: {type(error).__name__}: "
                          f"{str(error)[:200]}")
                    continue
                sweep_rows.append(row)
        if sweep_rows:
            print("\n# sweep (fp16), fastest first per case")
            sweep_rows.sort(key=lambda r: (r.case, r.time_us))
            print_table(sweep_rows)
        rows += sweep_rows

    print("\n# summary")
    print_table([r for r in rows if not r.kind.startswith("sweep")])

    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)
    print(f"# done in {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
