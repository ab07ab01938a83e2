"""Bar chart of a bench/peer.py report: output tok/s per round and engine, load beside each."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")   # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"folio": "Folio", "vllm": "vLLM (CPU build)", "hf": "transformers generate"}
COLORS = {"folio": "#2b6cb0", "vllm": "#c05621", "hf": "#718096"}


def plot(report: dict, path: Path) -> None:
    rounds = report["rounds"]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(rounds)), 4.6))
    names = [f"{LABELS[r['engine']].split(' ')[0]}\nround {r['round']}" for r in rounds]
    bars = ax.bar(range(len(rounds)), [r["tok_per_s"] for r in rounds],
                  color=[COLORS[r["engine"]] for r in rounds])
    for bar, r in zip(bars, rounds):
        ax.annotate(f"{r['tok_per_s']:.0f}\nload {r['loadavg_1m_before']:.1f}",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rounds)), names, fontsize=8)
    ax.set_ylabel("output tokens / s")
    ax.margins(y=0.2)
    fractions = report.get("fraction_of_floor", {})
    handles = []
    for engine, median in report["median_tok_per_s"].items():
        share = f", {100 * fractions[engine]:.0f}% of floor" if engine in fractions else ""
        handles.append(plt.Rectangle((0, 0), 1, 1, color=COLORS[engine],
                                     label=f"{LABELS[engine]}: median {median:.0f}{share}"))
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2),
              ncol=1, frameon=False)   # below the axes: never over a bar
    title = (f"{report['requests']} requests, {report['output_tokens']} output tokens, "
             f"greedy, float32")
    if "floor" in report:
        title += f"; matmul floor {report['floor']['tok_per_s']:.0f} tok/s"
    if "tokens_folio_vs_vllm" in report:
        match = report["tokens_folio_vs_vllm"]
        title += f"\nidentical tokens: {match['exact']}/{match['requests']} requests"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
