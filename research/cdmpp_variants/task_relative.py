"""Trees that space an unseen kernel's schedules relative to each other (`NAME-rel`).

Why: on unseen networks `xgboost-deep` is about 30 % off even after a perfect factor per kernel
(research/notes/cdmpp.md, "Scale or shape"): the error is in how a kernel's schedules are spaced, not its
scale. Absolute per-store features mix the two. A second booster learns only the spacing: its
target is log latency minus the mean over the task's programs on that device, its inputs are the
base's features plus their deviation from the same mean. Predictions keep the base's scale and
mix the two spacings, with the mix weight chosen on the validation split (held-out tasks on the
network split).

The deviation is taken over the programs passed to one `predict` call, per task and device, so a
task given with its candidate schedules (a tuner's batch, a dataset split) gets the relative
model's spacing; a program given alone gets exactly the base's prediction. So does a program the
trees were trained on (on any device): they nearly memorise it, and the spacing booster only
helps where they have not seen the program (`research/cdmpp/cdmpp_val_overlap.py`). The base's scale (the
task's log mean) is kept exactly where a task's programs are all unseen, as on unseen networks.
"""
from __future__ import annotations

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.arrays import ProgramArrays, as_arrays
from tensorplan.cdmpp.base import estimator_blob, estimator_from_blob
from tensorplan.cdmpp.baselines import TenSetXGB

from cdmpp_variants.wrapped import WrappedEstimator

MIX_GRID = (0.0, 0.25, 0.5, 0.75, 1.0)
DEFAULT_MIX = 0.5       # without a validation split: the best on both held-out-network draws tried


def group_index(arr: ProgramArrays) -> np.ndarray:
    """Each program's task-and-device group, numbered 0..G-1."""
    return np.unique(arr.task_domains(), return_inverse=True)[1].ravel()


def group_means(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """The mean of x's rows over each group (result row k: group k; g: `group_index`)."""
    n = np.bincount(g).astype(np.float64)
    out = np.zeros((len(n),) + x.shape[1:])
    np.add.at(out, g, x)
    return out / n.reshape((-1,) + (1,) * (x.ndim - 1))


def _group_mean(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Each row's mean over its group (rows of x: programs)."""
    return group_means(x, g)[g]


class TaskRelative(WrappedEstimator):
    """A `TenSetXGB` base plus a booster of the same settings fitted on within-task deviations."""

    name = "task_relative"
    chosen_on_validation = ("mix", "val_mape_by_mix")

    def __init__(self, base: TenSetXGB | None = None):
        if base is not None and not isinstance(base, TenSetXGB):
            raise TensorplanError(f"task_relative: the base must be an XGBoost model (TenSetXGB), "
                                  f"got {type(base).__name__}")
        self.base = base
        self.booster = None
        self.mix: float | None = None           # weight of the relative model's spacing, set by fit
        self.val_mape_by_mix: dict[float, float] = {}
        self.seen = np.zeros(0, np.uint64)      # sorted `program_ids` of the training programs

    def _design(self, arr: ProgramArrays, g: np.ndarray) -> np.ndarray:
        f = self.base._features(arr).astype(np.float64)
        return np.hstack([f, f - _group_mean(f, g)]).astype(np.float32)

    def _centred_target(self, arr: ProgramArrays, g: np.ndarray) -> np.ndarray:
        y = np.log(arr.latency_s) - self.base._offset(arr)
        return y - _group_mean(y, g)

    def fit(self, train, val=None, target=None) -> "TaskRelative":
        import xgboost as xgb

        base = self._need_base("fit")
        tr = as_arrays(train)
        if tr.latency_s is None:
            raise TensorplanError("task_relative.fit: the training programs carry no latency labels")
        va = as_arrays(val) if val is not None else None
        if va is not None and (len(va) == 0 or va.latency_s is None):
            va = None                           # nothing to stop early on or to choose the mix with
        base.fit(tr, val=va, target=target)
        self.seen = np.unique(tr.program_ids())
        gtr = group_index(tr)
        dtr = xgb.DMatrix(self._design(tr, gtr), label=self._centred_target(tr, gtr))
        evals, kw = [], {}
        gva = group_index(va) if va is not None else None
        if va is not None:
            evals = [(xgb.DMatrix(self._design(va, gva), label=self._centred_target(va, gva)), "val")]
            kw["early_stopping_rounds"] = base.early_stop
        self.booster = xgb.train(base._params(), dtr, num_boost_round=base.n_rounds, evals=evals,
                                 verbose_eval=False, **kw)
        self.mix, self.val_mape_by_mix = DEFAULT_MIX, {}
        if va is not None:
            p_base, dev, new = base.predict(va), self._relative_spacing(va, gva), self._unseen(va)
            for w in MIX_GRID:
                p = self._combine(p_base, dev, gva, w * new)
                self.val_mape_by_mix[w] = float(100 * np.mean(np.abs(p - va.latency_s) / va.latency_s))
            self.mix = min(self.val_mape_by_mix, key=self.val_mape_by_mix.get)
        return self

    def _relative_spacing(self, arr: ProgramArrays, g: np.ndarray) -> np.ndarray:
        """The relative booster's log prediction plus the base's offset, centred per task and device
        (the booster learnt deviations of log latency minus the offset, which varies within a task)."""
        import xgboost as xgb

        kw = {}
        if self.booster.attr("best_iteration") is not None:
            kw["iteration_range"] = (0, int(self.booster.best_iteration) + 1)
        z = self.booster.predict(xgb.DMatrix(self._design(arr, g)), **kw).astype(np.float64)
        z += self.base._offset(arr)
        return z - _group_mean(z, g)

    def _unseen(self, arr: ProgramArrays) -> np.ndarray:
        """[N] 1.0 for a program the trees were not trained on (on any device), else 0.0."""
        return (~np.isin(arr.program_ids(), self.seen)).astype(np.float64)

    @staticmethod
    def _combine(p_base: np.ndarray, rel_dev: np.ndarray, g: np.ndarray, w) -> np.ndarray:
        """The base's prediction with a share w (one number or one per program) of its within-task
        spacing replaced by the relative one."""
        lb = np.log(np.maximum(p_base, 1e-12))
        return np.exp(lb + w * (rel_dev - (lb - _group_mean(lb, g))))

    def predict(self, records) -> np.ndarray:
        if self.booster is None or self.mix is None:
            raise TensorplanError("task_relative.predict: not fitted")
        arr = as_arrays(records)
        p, g = self._need_base("predict").predict(arr), group_index(arr)
        return self._combine(p, self._relative_spacing(arr, g), g, self.mix * self._unseen(arr))

    def _state(self):
        if self.booster is None:
            raise TensorplanError("task_relative.save: not fitted")
        return {"booster": bytes(self.booster.save_raw("ubj")), "mix": self.mix,
                "val_mape_by_mix": {str(w): v for w, v in self.val_mape_by_mix.items()},  # str keys: plain data
                "seen": self.seen.tobytes(),
                "base": estimator_blob(self._need_base("save"))}

    def _set_state(self, st):
        import xgboost as xgb

        self.base = estimator_from_blob(st["base"], "task_relative")
        self.booster = xgb.Booster(params=self.base._params())
        self.booster.load_model(bytearray(st["booster"]))
        self.mix = float(st["mix"])
        self.val_mape_by_mix = {float(w): v for w, v in (st.get("val_mape_by_mix") or {}).items()}
        self.seen = np.frombuffer(st.get("seen", b""), dtype=np.uint64).copy()
