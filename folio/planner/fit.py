"""Least squares for the planner's cost model: non-negative coefficients (a step never gets
cheaper with more work), and the fit's error as a person reads it."""

from __future__ import annotations

import numpy as np


def fit_non_negative(features: list[list[float]], targets: list[float],
                     relative: bool = True) -> list[float]:
    """Coefficients c >= 0 minimising |F c - t|, each row weighted by 1 / t when `relative`
    (a 20 ms decode step counts as much as a 2 s prompt step): least squares, then the most
    negative coefficient pinned to 0 and the rest refitted, until none is negative (a small
    active-set method; the problems here have five unknowns)."""
    matrix = np.asarray(features, dtype=float)
    target = np.asarray(targets, dtype=float)
    if relative:
        weight = 1 / np.maximum(np.abs(target), 1e-9)
        matrix, target = matrix * weight[:, None], target * weight
    free = list(range(matrix.shape[1]))
    coefficients = np.zeros(matrix.shape[1])
    while free:
        solution, *_ = np.linalg.lstsq(matrix[:, free], target, rcond=None)
        if solution.min() >= 0:
            coefficients[free] = solution
            break
        free.pop(int(np.argmin(solution)))
    return [float(c) for c in coefficients]


def fit_error(features: list[list[float]], targets: list[float],
              coefficients: list[float]) -> dict[str, float]:
    """Relative error of the fitted step times: median and 90th percentile, in percent,
    and the R^2 of the fit."""
    matrix = np.asarray(features, dtype=float)
    target = np.asarray(targets, dtype=float)
    predicted = matrix @ np.asarray(coefficients)
    relative = np.abs(predicted - target) / np.maximum(target, 1e-9) * 100
    spread = float(((target - target.mean()) ** 2).sum())
    r2 = 1 - float(((target - predicted) ** 2).sum()) / spread if spread else 1.0
    return {"median_pct": round(float(np.median(relative)), 2),
            "p90_pct": round(float(np.percentile(relative, 90)), 2),
            "r2": round(r2, 4), "steps": int(len(target))}
