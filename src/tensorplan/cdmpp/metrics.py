"""Scores of predicted against measured latency, shared by every model and the evaluation."""
from __future__ import annotations

import numpy as np


def regression_metrics(pred_s: np.ndarray, true_s: np.ndarray) -> dict[str, float]:
    """MAPE (%), RMSE (ms) and accuracy within ±10% / ±20% APE, on seconds."""
    pred_s, true_s = np.asarray(pred_s, np.float64), np.asarray(true_s, np.float64)
    ape = np.abs(pred_s - true_s) / true_s
    return {
        "n": int(len(true_s)),
        "mape_pct": float(100 * ape.mean()),
        "rmse_ms": float(1e3 * np.sqrt(np.mean((pred_s - true_s) ** 2))),
        "acc10_pct": float(100 * (ape <= 0.10).mean()),
        "acc20_pct": float(100 * (ape <= 0.20).mean()),
        "median_ape_pct": float(100 * np.median(ape)),
        "mean_abs_log_ratio": float(np.mean(np.abs(np.log(pred_s / true_s)))),
    }


def within_task_spearman(pred_s: np.ndarray, true_s: np.ndarray, task_key: np.ndarray,
                         min_programs: int = 5) -> float:
    """Mean over tasks of Spearman's rho between predicted and measured latency of its schedules.

    Tasks where either side is constant (rho undefined) are left out."""
    from scipy.stats import spearmanr

    rhos = []
    for t in np.unique(task_key):
        m = task_key == t
        if m.sum() < min_programs or np.ptp(true_s[m]) == 0 or np.ptp(pred_s[m]) == 0:
            continue
        r = spearmanr(pred_s[m], true_s[m]).statistic
        if np.isfinite(r):
            rhos.append(r)
    return float(np.mean(rhos)) if rhos else float("nan")
