"""Leaf-count experts: one model for every program, plus a copy fine-tuned on each common leaf count.

CDMPP's released scripts train one model per leaf count (5 by default, the others fine-tuned from
it). Measured here (research/notes/cdmpp.md), a model trained on 5-leaf programs alone predicts them far
better than one trained on every program, so this keeps the one padded model for all counts (it
covers rare counts and unseen ones) and fine-tunes a copy of it, every weight, on each count with
at least `min_records` training programs. A program is predicted by the expert of its leaf count.
An expert is kept only where it is no worse than the base model on that count's validation
programs, when there are enough of them to tell.
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.arrays import as_arrays
from tensorplan.cdmpp.base import Estimator, estimator_blob, estimator_from_blob
from tensorplan.cdmpp.model import CDMPP


def _log_err(pred: np.ndarray, true: np.ndarray) -> float:
    """Mean |log(pred / true)|: the symmetric error CDMPP selects models on."""
    return float(np.mean(np.abs(np.log(np.maximum(pred, 1e-12) / true))))


class LeafExperts(Estimator):
    """`base` (a CDMPP) for every program, experts (fine-tuned copies) for common leaf counts."""

    name = "leaf-experts"
    adapts_by_finetune = True

    def __init__(self, base: Estimator | None = None, min_records: int = 1000, steps: int = 1000,
                 lr: float = 3e-4, min_val: int = 30):
        if base is not None and not isinstance(base, CDMPP):
            raise TensorplanError(f"leaf experts: the base model must be a CDMPP (its copies are fine-tuned), "
                                  f"got {type(base).__name__}; for several seeds, put leaf experts in an ensemble")
        self.base = base
        self.min_records, self.steps, self.lr, self.min_val = int(min_records), int(steps), float(lr), int(min_val)
        self.experts: dict[int, CDMPP] = {}
        self.report: dict[str, dict] = {}     # per leaf count: records, validation errors, kept or not

    def get_params(self) -> dict[str, Any]:
        return {"min_records": self.min_records, "steps": self.steps, "lr": self.lr, "min_val": self.min_val}

    def _need_base(self, what: str) -> Estimator:
        if self.base is None:
            raise TensorplanError(f"leaf experts.{what}: no base model (construct with base=CDMPP(...))")
        return self.base

    def fit(self, train, val=None, target=None) -> "LeafExperts":
        base = self._need_base("fit")
        tr = as_arrays(train)
        va = as_arrays(val) if val is not None else None
        base.fit(tr, val=va, target=target)
        self.experts, self.report = {}, {}
        for k in np.unique(tr.n_leaves):
            sel = np.flatnonzero(tr.n_leaves == k)
            if len(sel) < self.min_records:
                continue
            e = copy.deepcopy(base)
            scope, lr = e.finetune_scope, e.finetune_lr
            e.finetune_scope, e.finetune_lr = "all", self.lr
            e.finetune(tr.subset(sel), steps=self.steps)
            e.finetune_scope, e.finetune_lr = scope, lr   # a later device fine-tune adapts the head only
            rep: dict[str, Any] = {"train_records": int(len(sel)), "kept": True}
            if va is not None:
                vs = np.flatnonzero(va.n_leaves == k)
                rep["val_records"] = int(len(vs))
                if len(vs) >= self.min_val:
                    v = va.subset(vs)
                    rep["val_log_err_base"] = _log_err(base.predict(v), v.latency_s)
                    rep["val_log_err_expert"] = _log_err(e.predict(v), v.latency_s)
                    rep["kept"] = rep["val_log_err_expert"] <= rep["val_log_err_base"]
            self.report[str(int(k))] = rep
            if rep["kept"]:
                self.experts[int(k)] = e
        return self

    def predict(self, records) -> np.ndarray:
        base = self._need_base("predict")
        arr = as_arrays(records)
        pred = np.asarray(base.predict(arr), np.float64).copy()
        for k, e in self.experts.items():
            sel = np.flatnonzero(arr.n_leaves == k)
            if len(sel):
                pred[sel] = e.predict(arr.subset(sel))
        return pred

    def finetune(self, data, base=None, **kw) -> "LeafExperts":
        """Device adaptation: the base model and every expert fine-tune alike on `data`."""
        for m in [self._need_base("finetune"), *self.experts.values()]:
            m.finetune(data, base=base, **kw)
        return self

    def _state(self):
        return {"base": estimator_blob(self._need_base("save")),
                "experts": {str(k): estimator_blob(e) for k, e in self.experts.items()}, "report": self.report}

    def _set_state(self, st):
        self.base = estimator_from_blob(st["base"], "leaf experts")
        self.experts = {int(k): estimator_from_blob(b, "leaf experts") for k, b in st["experts"].items()}
        self.report = dict(st.get("report") or {})
