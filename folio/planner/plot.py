"""`folio plan --plot`: latency against load, one line per option, the SLO drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_plan(plan: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    q = plan["slo_percentile"]
    slo = plan["slo"] or {}
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, label in ((axes[0], "ttft", "TTFT"), (axes[1], "tpot", "TPOT")):
        for number, entry in enumerate(plan["options"]):
            points = entry["curve"]
            ax.plot([p["rate"] for p in points], [p[f"{metric}_p{q}_ms"] for p in points],
                    marker="o", markersize=3, label=entry["option"],
                    linestyle=("-", "--", ":", "-.")[number % 4])
        if metric in slo:
            ax.axhline(slo[metric], color="red", linewidth=1.5, label=f"SLO {slo[metric]:g} ms")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(f"{label} p{q} (ms)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize="x-small")
    figure.suptitle(f"{plan['workload']} on {plan['model'] or 'the calibrated model'}",
                    fontsize="small")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
