"""Few-shot device adaptation by calibration: source-domain prediction × a learned correction.

Why: a new device mostly rescales a program's latency by a factor that depends on a few program
properties (is there a parallel loop and how long is it, vector width, unrolling) and on its size
(fixed per-call costs such as thread-pool wake-up dominate kernels of a few µs): a program with a
parallel loop gains from a second thread, one without does not. Fine-tuning network weights on a
few hundred samples learns that factor poorly (reference/cdmpp.md §3; compare both in
`tensorplan predictor evaluate --splits device`). Here the trained model keeps predicting *as on
the source device* and a small gradient-boosted tree model, fitted on the few target samples,
predicts log(target latency / source prediction) from those properties and the source prediction
itself.

The wrapper is an `Estimator`, so it is saved, loaded and scored like every other model.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.arrays import ProgramArrays, as_arrays, device_features, labelled_latency
from tensorplan.cdmpp.base import Estimator, estimator_blob, estimator_from_blob

#: Leaf features whose max / min over a program's stores feed the correction model.
CORRECTION_FEATURES = ("parallel_num", "parallel_prod", "parallel_len", "vec_prod", "unroll_prod")


def correction_inputs(arr: ProgramArrays, source_pred_s: np.ndarray) -> np.ndarray:
    """[N, 12]: max and min over stores of `CORRECTION_FEATURES`, log source prediction, log2 stores."""
    from tensorplan.cdmpp.features import FEATURE_NAMES

    cols = [FEATURE_NAMES.index(n) for n in CORRECTION_FEATURES]
    leaf = arr.leaf_data[:, cols].astype(np.float64)
    starts = arr.offsets[:-1]
    mx = np.maximum.reduceat(leaf, starts, axis=0)
    mn = np.minimum.reduceat(leaf, starts, axis=0)
    return np.hstack([mx, mn, np.log(np.maximum(source_pred_s, 1e-12))[:, None],
                      np.log2(arr.n_leaves)[:, None]]).astype(np.float32)


class Calibrated(Estimator):
    """`base` predicts as on `source`; a depth-2 boosted-tree model corrects to the target device."""

    name = "calibrated"

    def __init__(self, base: Estimator | None = None, source: str = "local-2t", max_depth: int = 2,
                 n_rounds: int = 100, eta: float = 0.1, min_child_weight: float = 3.0, seed: int = 0,
                 source_features: list[float] | None = None):
        """`source_features`: the source domain's device vector as recorded with its data
        (`arrays.device_features(source, dataset.devices)`); default: resolve `source` here."""
        self.base, self.source = base, source
        self.source_features = None if source_features is None else [float(x) for x in source_features]
        self.max_depth, self.n_rounds, self.eta, self.min_child_weight, self.seed = (
            max_depth, n_rounds, eta, min_child_weight, seed)
        self.booster = None
        self.n_samples = 0

    def get_params(self) -> dict[str, Any]:
        p = super().get_params()
        p.pop("base")                       # saved in the state, as a nested model blob
        return p

    def source_predict(self, arr: ProgramArrays) -> np.ndarray:
        if self.base is None:
            raise TensorplanError("calibrated: no base model")
        vec = self.source_features if self.source_features is not None else device_features(self.source)
        return self.base.predict(arr.on_device(vec))

    def fit(self, train, val=None, target=None) -> "Calibrated":
        """Fit the correction on labelled target-device samples `train` (the base stays as it is)."""
        import xgboost as xgb

        arr = as_arrays(train)
        y = labelled_latency(arr, "calibrated.fit")
        if len(arr) < 8:
            raise TensorplanError(f"calibrated: need at least 8 target samples to fit a correction, got {len(arr)}")
        sp = self.source_predict(arr)
        params = {"max_depth": self.max_depth, "eta": self.eta, "min_child_weight": self.min_child_weight,
                  "objective": "reg:squarederror", "verbosity": 0, "seed": self.seed, "nthread": 1}
        self.booster = xgb.train(params, xgb.DMatrix(correction_inputs(arr, sp), label=np.log(y / sp)),
                                 num_boost_round=self.n_rounds)
        self.n_samples = len(arr)
        return self

    def finetune(self, data, base=None) -> "Calibrated":
        return self.fit(data)

    def predict(self, records) -> np.ndarray:
        import xgboost as xgb

        if self.booster is None:
            raise TensorplanError("calibrated: the correction is not fitted (fit it on target samples first)")
        arr = as_arrays(records)
        sp = self.source_predict(arr)
        return sp * np.exp(self.booster.predict(xgb.DMatrix(correction_inputs(arr, sp))).astype(np.float64))

    def _state(self):
        if self.booster is None:
            raise TensorplanError("calibrated.save: the correction is not fitted")
        return {"booster": bytes(self.booster.save_raw("ubj")), "n_samples": self.n_samples,
                "base": estimator_blob(self.base)}

    def _set_state(self, st):
        import xgboost as xgb

        self.base = estimator_from_blob(st["base"], "calibrated")
        self.booster = xgb.Booster()
        self.booster.load_model(bytearray(st["booster"]))
        self.n_samples = int(st.get("n_samples", 0))
