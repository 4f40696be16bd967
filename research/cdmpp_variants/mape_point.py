"""Any model's MAPE-optimal point estimate: exp(log prediction - s^2), s^2 measured on validation.

Why: a model trained on log latency predicts the median exp(mu). If its log error on programs
like the validation ones is roughly normal with variance s^2, the point that minimises the
expected |p - y| / y is exp(mu - s^2) (the same argument as `ensemble.Ensemble`'s shrink, whose
s^2 is the members' disagreement, which understates the error on unseen kernels). Here s^2 is the
variance of log(measured / predicted) on the validation split, which on the held-out-network split
is held-out tasks, so it is as large as the error where the model is used. MAPE punishes a 3x
over-prediction by 200 % and a 3x under-prediction by 67 %, so the shift lowers MAPE and raises
the median APE. Ranks within a task do not change (one factor for every program). A sum over
kernels (a whole network's latency) wants the mean, not this point, so `tensorplan predict` keeps
the plain model; this is the harness's `NAME-mape` (research/notes/cdmpp.md, "A MAPE-optimal point").
"""
from __future__ import annotations

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.arrays import as_arrays
from tensorplan.cdmpp.base import Estimator, estimator_blob, estimator_from_blob

from cdmpp_variants.wrapped import WrappedEstimator


def mape_optimal_factor(pred: np.ndarray, true: np.ndarray) -> float:
    """The g minimising mean |g pred - true| / true: a weighted median of true / pred, weights pred / true."""
    pred, true = np.asarray(pred, np.float64), np.asarray(true, np.float64)
    if not len(pred):
        raise TensorplanError("mape_optimal_factor: no values")
    x, w = true / pred, pred / true
    o = np.argsort(x)
    cw = np.cumsum(w[o])
    return float(x[o][np.searchsorted(cw, 0.5 * cw[-1])])


def factor_floors(pred: np.ndarray, true: np.ndarray, group: np.ndarray) -> dict:
    """MAPE % of `pred` times the MAPE-optimal factor: one for all values, and one per group (task).

    Both factors are fitted on the labels they are scored on, so they are optimistic: what is left
    is error no per-group scale can remove (within-task error, when `pred` is a model's prediction;
    per-program device differences, when `pred` is another device's measured latency)."""
    pred, true, group = np.asarray(pred, np.float64), np.asarray(true, np.float64), np.asarray(group)
    if not len(pred):
        return {"one_factor": None, "one_factor_mape_pct": None, "per_task_factor_mape_pct": None}
    g = mape_optimal_factor(pred, true)
    scaled = np.empty(len(pred))
    inv = np.unique(group, return_inverse=True)[1].ravel()
    order = np.argsort(inv, kind="stable")          # each group's indices together: one pass, not one mask per group
    bounds = np.flatnonzero(np.diff(inv[order])) + 1
    for m in np.split(order, bounds):
        scaled[m] = mape_optimal_factor(pred[m], true[m]) * pred[m]
    return {"one_factor": g, "one_factor_mape_pct": float(100 * np.mean(np.abs(g * pred - true) / true)),
            "per_task_factor_mape_pct": float(100 * np.mean(np.abs(scaled - true) / true))}


class MapePoint(WrappedEstimator):
    """`base` with its predictions scaled by exp(-s^2), s^2 = its validation log-error variance."""

    name = "mape_point"
    chosen_on_validation = ("log_var",)

    def __init__(self, base: Estimator | None = None):
        self.base = base
        self.log_var = None     # s^2, set by fit

    @property
    def adapts_by_finetune(self) -> bool:
        return bool(getattr(self.base, "adapts_by_finetune", False))

    def fit(self, train, val=None, target=None) -> "MapePoint":
        base = self._need_base("fit")
        if val is None or len(as_arrays(val)) == 0:
            raise TensorplanError("mape_point.fit: needs a validation split to measure the model's log error "
                                  "(pass val, e.g. held-out tasks)")
        base.fit(train, val=val, target=target)
        v = as_arrays(val)
        r = np.log(v.latency_s) - np.log(np.maximum(base.predict(v), 1e-12))
        self.log_var = float(r.var())
        return self

    def finetune(self, data, base=None, **kw) -> "MapePoint":
        """Fine-tune the base; s^2 stays the one measured at fit (the few samples are too few)."""
        self._need_base("finetune").finetune(data, base=base, **kw)
        return self

    def predict(self, records) -> np.ndarray:
        if self.log_var is None:
            raise TensorplanError("mape_point.predict: not fitted")
        return self._need_base("predict").predict(records) * np.exp(-self.log_var)

    def _state(self):
        if self.log_var is None:
            raise TensorplanError("mape_point.save: not fitted")
        return {"log_var": self.log_var, "base": estimator_blob(self._need_base("save"))}

    def _set_state(self, st):
        self.base = estimator_from_blob(st["base"], "mape_point")
        self.log_var = float(st["log_var"])
