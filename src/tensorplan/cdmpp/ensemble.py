"""Deep / bagged ensembles: K seeded copies of one latency model, with a spread per prediction.

Why: on unseen networks a single model's error is dominated by a few kernels predicted many-fold
off, and which kernels those are changes with the seed. Averaging the members' log predictions removes the
part of that error that is seed noise, and the members' disagreement is a per-program uncertainty
that users see (`tensorplan predict` reports it) and that the point estimate uses:

If log latency given the program is normal with mean mu and variance s^2, the prediction p that
minimises the expected absolute percentage error E|y - p| / y is exp(mu - s^2) (the median of the
density f(y)/y, a lognormal shifted by -s^2), not the median exp(mu). `shrink` scales s^2, the
members' variance of log predictions; 0 gives the plain geometric mean. Programs the members agree
on are unchanged; the ones they disagree on (unfamiliar kernels) are pulled down, which is where
MAPE's unbounded over-prediction penalty bites.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.arrays import as_arrays
from tensorplan.cdmpp.base import Estimator, estimator_blob, estimator_from_blob


class Ensemble(Estimator):
    """`members` trained alike with different seeds; predicts exp(mean log - shrink * var log)."""

    name = "ensemble"

    def __init__(self, members: list[Estimator] | None = None, shrink: float = 1.0):
        if shrink < 0:
            raise TensorplanError(f"ensemble: shrink must be >= 0, got {shrink}")
        self.members = list(members or [])
        self.shrink = float(shrink)

    @classmethod
    def of(cls, make: Callable[[int], Estimator], k: int, seed: int = 0, shrink: float = 1.0) -> "Ensemble":
        """K members `make(seed + i)`: the same model and budget, seeds seed .. seed + k - 1."""
        if k < 2:
            raise TensorplanError(f"ensemble: need at least 2 members to measure a spread, got {k}")
        return cls([make(seed + i) for i in range(k)], shrink=shrink)

    def get_params(self) -> dict[str, Any]:
        return {"shrink": self.shrink}      # the members are saved in the state

    def _need_members(self, what: str) -> None:
        if not self.members:
            raise TensorplanError(f"ensemble.{what}: the ensemble has no members")

    @property
    def adapts_by_finetune(self) -> bool:
        """True when every member fine-tunes itself (CDMPP) rather than refitting from scratch."""
        return bool(self.members) and all(getattr(m, "adapts_by_finetune", False) for m in self.members)

    def fit(self, train, val=None, target=None, workers: int = 1) -> "Ensemble":
        """Fit every member alike. `workers` > 1 fits that many members at once, each in its own
        process, when every member trains on one thread (CDMPP): each keeps its own time budget, so
        on an idle machine K members take ceil(K / workers) budgets of wall time instead of K. Other
        members (multi-threaded trees) train in turn. The processes are spawned, not forked: a fork
        of a process whose torch has run a multi-threaded op inherits a dead OpenMP pool and hangs."""
        self._need_members("fit")
        w = min(max(1, int(workers)), len(self.members))
        if w > 1 and all(getattr(m, "threads", 0) in (None, 1) for m in self.members):
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(w, mp_context=mp.get_context("spawn")) as pool:
                blobs = list(pool.map(_fit_member, [(m, train, val, target) for m in self.members]))
            self.members = [estimator_from_blob(b, "ensemble") for b in blobs]
            return self
        for m in self.members:
            m.fit(train, val=val, target=target)
        return self

    def finetune(self, data, base=None, **kw) -> "Ensemble":
        """Fine-tune every member alike (`kw`, e.g. CDMPP's `steps`, goes to each)."""
        self._need_members("finetune")
        for m in self.members:
            m.finetune(data, base=base, **kw)
        return self

    def member_log_predictions(self, records) -> np.ndarray:
        """[K, N]: each member's log predicted latency (seconds) per program."""
        self._need_members("predict")
        arr = as_arrays(records)
        return np.stack([np.log(np.maximum(m.predict(arr), 1e-12)) for m in self.members])

    def from_logs(self, logs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(point prediction in seconds, members' std of log latency) from `member_log_predictions`."""
        var = logs.var(0, ddof=1)
        return np.exp(logs.mean(0) - self.shrink * var), np.sqrt(var)

    def log_stats(self, records) -> tuple[np.ndarray, np.ndarray]:
        """Mean and variance (over members, ddof 1) of the log predicted latency, per program."""
        logs = self.member_log_predictions(records)
        return logs.mean(0), logs.var(0, ddof=1)

    def predict(self, records) -> np.ndarray:
        return self.from_logs(self.member_log_predictions(records))[0]

    def predict_with_spread(self, records) -> tuple[np.ndarray, np.ndarray]:
        """(point prediction in seconds, members' standard deviation of log latency) per program."""
        return self.from_logs(self.member_log_predictions(records))

    def save(self, path: str | Path) -> Path:
        """Save all members in one file and, where members have them (CDMPP), their normalisers as
        readable JSON next to it (`<name>.norm.json`, one entry per member)."""
        path = super().save(path)
        norms = [m.normalisers() for m in self.members if hasattr(m, "normalisers")]
        if norms:
            path.with_suffix(".norm.json").write_text(json.dumps({"members": norms}, indent=1))
        return path

    def _state(self):
        self._need_members("save")
        return {"members": [estimator_blob(m) for m in self.members]}

    def _set_state(self, st):
        self.members = [estimator_from_blob(b, "ensemble") for b in st["members"]]


def _fit_member(job: tuple) -> dict:
    """One member fitted in a worker process (`Ensemble.fit`), handed back as its saved state."""
    m, train, val, target = job
    return estimator_blob(m.fit(train, val=val, target=target))
