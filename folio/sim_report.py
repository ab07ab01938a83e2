"""`folio simulate`'s command line, its two worked examples, its table and its plots."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from folio.sim_inputs import Machine, TraceRequest, load_trace
from folio.simulate import Run, compare, simulate
from folio.shared.config import PREEMPTION_MODES


def lockers() -> tuple[list[Run], str]:
    """60 slots; eight users each hold at most 8 tokens (5 of prompt, 4 answered) while a
    contiguous system reserves max_model_len = 12 for each: who gets in, who waits."""
    machine = Machine(num_kv_blocks=15, block_size=4, max_model_len=12)
    trace = [TraceRequest(0.0, 5, 4, name=f"u{i}") for i in range(1, 9)]
    runs = compare(trace, machine)
    lines = ["60 KV slots; 8 users, each holding at most 8 tokens, max_model_len 12."]
    for run in runs:
        first = [n for n, step in run.admitted_step.items() if step == 1]
        later = [f"{n} (round {step})" for n, step in run.admitted_step.items() if step > 1]
        lines.append(f"  {run.name}: in at once {', '.join(first)}; waiting "
                     f"{', '.join(later) or 'nobody'}")
    return runs, "\n".join(lines)


def rounds() -> tuple[list[Run], str]:
    """Six requests, three slots; A needs 6 rounds (tokens), B to F 2 each. Static batching
    waits for a whole batch to end; iteration-level scheduling refills a slot at once."""
    machine = Machine(num_kv_blocks=64, block_size=4, max_model_len=64, max_num_seqs=3)
    trace = [TraceRequest(0.0, 4, 6 if name == "A" else 2, name=name) for name in "ABCDEF"]
    runs = [simulate(trace, machine, "iteration-level"),
            simulate(trace, machine, "static batches", static_batches=True)]
    lines = ["6 requests, 3 slots; A needs 6 rounds, B-F 2 each."]
    for run in runs:
        spans = ", ".join(f"{n} {run.admitted_step[n]}-{run.finished_step[n]}" for n in "ABCDEF")
        lines.append(f"  {run.name}: {run.steps} rounds ({spans})")
    return runs, "\n".join(lines)


EXAMPLES = {"lockers": lockers, "rounds": rounds}


def table(runs: list[Run]) -> str:
    head = ("policy", "peak running", "peak blocks", "slot util", "queue p50/p90/p99 ms",
            "preemptions", "rounds", "drain s")
    rows = [head]
    for run in runs:
        s = run.summary()
        rows.append((s["policy"], str(s["peak_running"]), f"{s['peak_blocks']}/{s['blocks']}",
                     f"{s['slot_utilization']:.1%}",
                     "/".join(f"{s[f'queue_p{q}_s'] * 1000:.0f}" for q in (50, 90, 99)),
                     str(s["preemptions"]), str(s["rounds"]), f"{s['drain_s']:.3f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                     for row in rows)


def plot(runs: list[Run], directory: Path, block_size: int) -> list[Path]:
    """Blocks in use (reservations counted in blocks of the paged size) and requests
    running, over simulated time: one PNG each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for column, label, file in ((1, f"KV blocks in use ({block_size} slots each)",
                                 "kv_blocks.png"), (2, "requests running", "running.png")):
        figure, axes = plt.subplots(figsize=(8, 4))
        for number, run in enumerate(runs):
            scale = run.machine.block_size / block_size if column == 1 else 1
            times = [0.0] + [point[0] for point in run.timeline]
            values = [0] + [point[column] * scale for point in run.timeline]
            axes.step(times, values, where="pre", label=run.name,   # equal runs stay seen
                      linestyle=("-", "--", ":")[number % 3], linewidth=3 - number % 3)
        axes.set_xlabel("simulated time (s)")
        axes.set_ylabel(label)
        axes.legend(fontsize="small")
        figure.tight_layout()
        figure.savefig(directory / file, dpi=100)
        plt.close(figure)
        written.append(directory / file)
    return written


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def blocks_in_memory(model, gib: float, block_size: int, dtype: str | None = None) -> int:
    """KV blocks of `model` (an executor ModelConfig) in `gib` GiB: K and V per layer, as
    executor/kv_cache.py lays them out."""
    element = DTYPE_BYTES.get(dtype or model.torch_dtype, 4)
    return int(gib * 2**30 // model.kv_block_bytes(block_size, element))


def _model_config(path: str):
    from folio.executor.models.hf_config import read_model_config   # no torch

    try:
        return read_model_config(path)
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"folio simulate: --model {path}: {error}") from None


def add_simulate_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", nargs="?", help="JSONL trace: arrival, prompt_tokens, "
                        "output_tokens, optional prefix and prefix_tokens")
    parser.add_argument("--example", choices=sorted(EXAMPLES), help="a worked example "
                        "instead of a trace")
    parser.add_argument("--num-kv-blocks", type=int, help="KV blocks of the simulated pool")
    parser.add_argument("--gpu-memory", type=float, metavar="GIB", help="or: GiB for the KV "
                        "cache, cut into blocks of --model's size")
    parser.add_argument("--model", help="checkpoint directory (its config.json) for "
                        "--gpu-memory, and the default --max-model-len")
    parser.add_argument("--kv-dtype", choices=sorted(DTYPE_BYTES), help="KV element type "
                        "(default: the model's dtype)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, help="default: the model's context "
                        "limit, else 2048")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--ms-per-step", type=float, default=10.0,
                        help="simulated cost of every step")
    parser.add_argument("--tokens-per-s", type=float, help="plus this cost per token")
    parser.add_argument("--preemption-mode", choices=PREEMPTION_MODES, default="recompute")
    parser.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction,
                        default=True)
    parser.add_argument("--plot-dir", help="write kv_blocks.png and running.png here")
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")


def run_simulate(args: argparse.Namespace) -> int:
    if args.example:
        runs, story = EXAMPLES[args.example]()
        block_size = runs[0].machine.block_size
    else:
        model = _model_config(args.model) if args.model else None
        if args.gpu_memory is not None:
            if model is None:
                raise SystemExit("folio simulate: --gpu-memory needs --model")
            args.num_kv_blocks = blocks_in_memory(model, args.gpu_memory, args.block_size,
                                                  args.kv_dtype)
        if not args.trace or not args.num_kv_blocks:
            raise SystemExit("folio simulate: give a trace and --num-kv-blocks (or "
                             "--gpu-memory with --model), or --example")
        if args.max_model_len is None:
            args.max_model_len = model.context_limit if model else 2048
        machine = Machine(args.num_kv_blocks, args.block_size, args.max_model_len,
                          args.max_num_seqs, args.max_num_batched_tokens, args.ms_per_step,
                          args.tokens_per_s, args.prefix_caching, args.preemption_mode)
        try:
            runs = compare(load_trace(args.trace), machine)
        except (OSError, ValueError) as error:
            raise SystemExit(f"folio simulate: {error}") from None
        story, block_size = "", args.block_size
    if args.json:
        print(json.dumps([run.summary() for run in runs], indent=2))
    else:
        print(f"{story}\n\n{table(runs)}" if story else table(runs))
    if args.plot_dir:
        for path in plot(runs, Path(args.plot_dir), block_size):
            print(f"wrote {path}")
    return 0
