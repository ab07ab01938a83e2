"""`folio simulate`'s command line, its two worked examples, its table and its plots."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from folio.planner.simulator.inputs import MAX_KV_BLOCKS, Machine, TraceRequest, load_trace
from folio.planner.simulator.run import Run, compare, simulate
from folio.shared.config import PREEMPTION_MODES
from folio.shared.kv_cache_dtype import QUANTIZED_KV_CACHE_DTYPES, element_row_bytes
from folio.shared.settings import (Checked, SettingError, above, at_least, in_range, optional,
                                   positive_int, setting)


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


# The stored KV types: the model dtypes and --kv-cache-dtype's (shared/kv_cache_dtype.py).
KV_DTYPES = ("float32", "float16", "bfloat16", *QUANTIZED_KV_CACHE_DTYPES)


def blocks_in_memory(model, gib: float, block_size: int, dtype: str | None = None,
                     state_slots: int = 0) -> int:
    """KV blocks of `model` (an executor ModelConfig) in `gib` GiB: K and V per attention
    layer, as executor/kv_cache.py lays them out (int8 rows with their scales), after a
    hybrid model's `state_slots` recurrent states (one per request that may run, twice that
    with prefix checkpoints, as the executor reserves them first)."""
    stored = dtype or model.torch_dtype
    if stored not in KV_DTYPES:
        stored = "float32"
    row_bytes = lambda dim: element_row_bytes(stored, dim)   # noqa: E731 (per layer's head)
    model_bytes = 2 if model.torch_dtype in ("float16", "bfloat16") else 4
    states = state_slots * model.state_bytes(model_bytes)
    return max(0, int((gib * 2**30 - states) // model.kv_block_bytes(block_size, row_bytes)))


def _model_config(path: str):
    from folio.executor.models.hf_config import read_model_config   # no torch

    try:
        return read_model_config(path)
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"folio simulate: --model {path}: {error}") from None


@dataclass(frozen=True, kw_only=True)
class SimulateSettings(Checked):
    """`folio simulate`'s settings; its flags and FOLIO_* variables are generated from these
    fields like every command's (folio/command_settings.py lists it)."""

    trace: str | None = setting(None, "JSONL trace: arrival, prompt_tokens, output_tokens, "
                                "optional prefix and prefix_tokens", positional=True, nargs="?")
    example: str | None = setting(None, "a worked example instead of a trace",
                                  choices=tuple(sorted(EXAMPLES)))
    num_kv_blocks: int | None = setting(None, "KV blocks of the simulated pool",
                                        check=optional(in_range(1, MAX_KV_BLOCKS)))
    gpu_memory: float | None = setting(None, "or: GiB for the KV cache, cut into blocks of "
                                       "--model's size", metavar="GIB",
                                       check=optional(above(0, " GiB")))
    model: str | None = setting(None, "checkpoint directory (its config.json) for "
                                "--gpu-memory, and the default --max-model-len")
    kv_dtype: str | None = setting(None, "KV element type (default: the model's dtype); "
                                   "int8 and fp8_* as --kv-cache-dtype stores them",
                                   choices=KV_DTYPES)
    block_size: int = setting(16, "tokens per simulated KV block", check=positive_int)
    max_model_len: int | None = setting(None, "context limit (default: the model's, else "
                                        "2048)", check=optional(positive_int))
    max_num_seqs: int = setting(256, "requests running at once", check=positive_int)
    max_num_batched_tokens: int = setting(2048, "tokens computed per step, over all requests",
                                          check=positive_int)
    ms_per_step: float = setting(10.0, "simulated cost of every step",
                                 check=at_least(0, " ms"))
    tokens_per_s: float | None = setting(None, "plus this cost per token",
                                         check=optional(above(0)))
    preemption_mode: str = setting("recompute", "how a request is preempted when blocks run "
                                   "out", choices=PREEMPTION_MODES)
    prefix_caching: bool = setting(True, "reuse KV blocks of identical prompt prefixes")
    plot_dir: str | None = setting(None, "write kv_blocks.png and running.png here")
    json: bool = setting(False, "print the summaries as JSON")


def run_simulate(settings: SimulateSettings) -> int:
    if settings.example:
        runs, story = EXAMPLES[settings.example]()
        block_size = runs[0].machine.block_size
    else:
        model = _model_config(settings.model) if settings.model else None
        num_kv_blocks = settings.num_kv_blocks
        if settings.gpu_memory is not None:
            if model is None:
                raise SystemExit("folio simulate: --gpu-memory needs --model")
            num_kv_blocks = blocks_in_memory(model, settings.gpu_memory, settings.block_size,
                                             settings.kv_dtype, settings.max_num_seqs
                                             * (2 if settings.prefix_caching else 1))
            if num_kv_blocks > MAX_KV_BLOCKS:   # each simulated block is held in memory
                raise SettingError("gpu_memory", f"makes {num_kv_blocks:,} blocks, more than "
                                   f"a simulation holds ({MAX_KV_BLOCKS:,})")
        if not settings.trace or not num_kv_blocks:
            raise SystemExit("folio simulate: give a trace and --num-kv-blocks (or "
                             "--gpu-memory with --model), or --example")
        max_model_len = settings.max_model_len
        if max_model_len is None:
            max_model_len = model.context_limit if model else 2048
        machine = Machine(num_kv_blocks, settings.block_size, max_model_len,
                          settings.max_num_seqs, settings.max_num_batched_tokens,
                          settings.ms_per_step, settings.tokens_per_s, settings.prefix_caching,
                          settings.preemption_mode,
                          settings.max_num_seqs if model and model.hybrid else 0)
        try:
            trace = load_trace(settings.trace)
        except ValueError as error:   # one line naming the file, line and field: exit 2
            raise SettingError("trace", str(error)) from None
        try:
            runs = compare(trace, machine)
        except (OSError, ValueError) as error:
            raise SystemExit(f"folio simulate: {error}") from None
        story, block_size = "", settings.block_size
    if settings.json:
        print(json.dumps([run.summary() for run in runs], indent=2))
    else:
        print(f"{story}\n\n{table(runs)}" if story else table(runs))
    if settings.plot_dir:
        for path in plot(runs, Path(settings.plot_dir), block_size):
            print(f"wrote {path}")
    return 0
