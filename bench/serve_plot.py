"""Latency vs load from bench/serve.py reports: one line per server (the reports' label)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")   # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import ScalarFormatter  # noqa: E402

PANELS = (("output_throughput", None, "output tok/s"), ("ttft_ms", "p50", "TTFT p50 (ms)"),
          ("ttft_ms", "p99", "TTFT p99 (ms)"), ("tpot_ms", "p50", "TPOT p50 (ms)"),
          ("itl_ms", "p50", "ITL p50 (ms)"), ("itl_ms", "p99", "ITL p99 (ms)"))


def load_results(paths: list[Path]) -> list[dict]:
    """A report file holds one result, or {"results": [...]} (what `race` writes)."""
    results = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        results += data["results"] if "results" in data else [data]
    return results


def load_of(result: dict) -> tuple[str, float]:
    if result.get("request_rate") is not None:
        return "request rate (req/s)", result["request_rate"]
    return "max concurrency", result.get("max_concurrency") or result["num_prompts"]


def median_line(ax, points: list[tuple[float, float]], label: str) -> list[float]:
    """A line joining each load's median over rounds, every round a dot (where several);
    the loads, in order."""
    by_load: dict[float, list[float]] = {}
    for x, y in points:
        by_load.setdefault(x, []).append(y)
    xs = sorted(by_load)
    line, = ax.plot(xs, [statistics.median(by_load[x]) for x in xs], marker="o", label=label)
    if any(len(v) > 1 for v in by_load.values()):
        ax.scatter([x for x, _ in points], [y for _, y in points], s=10,
                   color=line.get_color(), alpha=0.5)
    return xs


def plot_files(paths: list[Path], out: Path) -> None:
    results = load_results(paths)
    by_label: dict[str, list[dict]] = {}
    for result in results:
        by_label.setdefault(result.get("label") or result["base_url"], []).append(result)
    axis = load_of(results[0])[0]
    loads = [load_of(r)[1] for r in results]
    spread = min(loads) > 0 and max(loads) / min(loads) >= 4   # e.g. concurrency 1, 16, 64
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, (key, stat, title) in zip(axes.flat, PANELS):
        for label, runs in sorted(by_label.items()):
            points = [(load_of(r)[1], r[key] if stat is None else r[key][stat]) for r in runs]
            median_line(ax, [(x, y) for x, y in points if y is not None], label)
        ax.set_title(title, fontsize=10)
        ax.set_ylim(bottom=0)
        if spread:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.set_xlabel(axis, fontsize=8)
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    first = results[0]
    fig.suptitle(f"{first.get('input_len')} in / {first.get('output_len')} out tokens, "
                 f"{first['num_prompts']} prompts, greedy, ignore_eos", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
