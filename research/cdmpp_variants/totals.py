"""Whole-network totals: would each kernel's mean latency sum better than its median-like prediction?

Why ask: the latency models fit log latency (CDMPP adds a MAPE term, and an ensemble shrinks by its
members' spread, `ensemble.py`), so a kernel's prediction is a median-like point that minimises the
per-kernel percentage error. Half the programs run slower than predicted, and those run further
over than the others run under, so a sum of medians should fall short of the measured sum by the
mean of measured / predicted. Duan's smearing estimator (1983) turns a log-space prediction into a
mean by that factor, measured on held-out records.

`mean_factor` is that mean, winsorised at the 1st / 99th percentile so a handful of many-fold misses
do not set it. The variant harness measures it on its validation tasks and scores each network's
total both ways (`add_expected_totals`, `harness.VariantHarness`). Measured (research/notes/cdmpp.md,
*Network totals*): the factor is 0.99-1.32 per fold, but leaving each network out it does not bring
totals closer (CDMPP's mean total error 22.2 -> 26.5 %, the trees' 20.4 -> 26.5 %): a network's
total is off by a bias of its own (0.7-1.6x over networks above 1 ms), not by the median-to-mean gap. So `tensorplan predict` sums the kernels'
predictions as they are.
"""
from __future__ import annotations

import numpy as np

from tensorplan.errors import TensorplanError


def mean_factor(pred_s, measured_s, trim: float = 0.01) -> float:
    """Mean of measured / predicted over held-out records (ratios winsorised at the `trim` and
    1 - `trim` quantiles): the factor that turns a sum of median-like predictions into an expected sum."""
    p = np.asarray(pred_s, np.float64)
    y = np.asarray(measured_s, np.float64)
    ok = (np.isfinite(p) & np.isfinite(y) & (p > 0) & (y > 0)) if p.shape == y.shape else np.zeros(0, bool)
    if not ok.any():
        raise TensorplanError(f"mean_factor: need positive predictions and measurements of one shape "
                              f"(got {p.shape} and {y.shape}, {int(ok.sum())} usable)")
    r = y[ok] / p[ok]
    lo, hi = np.quantile(r, [trim, 1 - trim])
    return float(np.clip(r, lo, hi).mean())


def add_expected_totals(network_latency: dict, factor: float) -> dict:
    """Add to each entry of `evaluate._network_errors`' result the expected total, predicted_ms *
    `factor`, and its error (expected_ms, expected_ape_pct; per pick "_mean_expected_ape_pct")."""
    for entries in network_latency.values():
        nets = [e for k, e in entries.items() if not k.startswith("_")]
        for e in nets:
            exp = e["predicted_ms"] * factor
            e["expected_ms"], e["expected_ape_pct"] = exp, 100 * abs(exp - e["measured_ms"]) / e["measured_ms"]
        if nets:
            entries["_mean_expected_ape_pct"] = float(np.mean([e["expected_ape_pct"] for e in nets]))
    return network_latency
