"""Predicted everywhere, measured where it decides: the cost models of `tensorplan optimize`.

Why: a fully measured orchestration compiles and times every unique candidate (minutes to a
quarter of an hour on two cores), although the solver keeps a few percent of them. Here every
candidate is priced by prediction (`PredictedCost`: CDMPP over sampled schedules for kernels that
lower to TIR, a fitted work model for ONNX Runtime / OpenVINO kernels and regions) and only the
kernels a solution uses are compiled and timed (`LazyCost.measure`); a measured value then replaces
the prediction for good, and every measurement lands in the store, so a second run times nothing.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING, Any

from tensorplan.ir.graph import Graph

if TYPE_CHECKING:
    from tensorplan.korch.candidates import Candidate

# seconds to sample and featurise one schedule of a TIR kernel on one core (meta_schedule draw ~8 ms,
# its trace ~2 ms, compact AST ~5 ms; candy's 4,976 draws took 76 s cold on the loaded 2-core dev VM)
SAMPLE_S = 0.015
MEASURE_CHUNK = 16      # kernels timed between two looks at the deadline
# when the measuring backend builds kernels other than the ones priced (PyTorch on a GPU vs TVM's CUDA
# programs), CDMPP's prices are scaled by measured / predicted over the kernels timed so far, its log
# median shrunk toward 1 as if this many points said 1 (research/cdmpp/cdmpp_gpu_prices_inductor.py:
# on an H100, Inductor's kernels ran 4-7x below CDMPP's prices; one scale leaves 1.4-2.4x median error)
SCALE_PRIOR_POINTS = 4

# the backend a kernel runs on when nothing was measured for it (the measured default per kind)
PREDICTED_BACKEND = {"memory": "tvm", "linear": "ort", "opaque": "ort", "region": "ort"}


class PredictedCost:
    """Every candidate priced without timing it: `TunedCost` (CDMPP ranks `samples` sampled
    schedules plus the default one; the predicted-fastest prices the kernel) for memory kernels
    that lower to TIR, `FittedCost` (work features fitted on measured kernels) for the rest.

    `KernelCost` protocol (cost/__init__.py); `kernel_info` names the backend and schedule the
    prediction is for, so a plan priced only by prediction still runs what was priced."""

    name = "predicted"
    supports_regions = True

    def __init__(self, device: Any = "local", store: Any = None, threads: int | None = None, samples: int = 16,
                 model: Any = None, workers: int | None = None):
        from tensorplan import devices
        from tensorplan.cost.fitted import FittedCost
        from tensorplan.cost.tuned import TunedCost
        from tensorplan.measure.store import Store
        self.spec = devices.device(device)
        self.store = store if isinstance(store, Store) else Store(store)
        self.threads = int(threads or devices.default_threads(self.spec))
        self.fitted = FittedCost(device=self.spec, store=self.store, threads=self.threads)
        self.tuned = TunedCost(device=self.spec, store=self.store, threads=self.threads, samples=samples,
                               model=model, fallback=self.fitted, workers=workers)

    def cost(self, prim: Graph, cand: "Candidate") -> float:
        return self.cost_many(prim, [cand])[0]

    def cost_many(self, prim: Graph, cands: list["Candidate"], progress: bool = False) -> list[float]:
        return list(self.tuned.cost_many(prim, cands, progress=progress))

    def by_tuned(self, cand: "Candidate") -> bool:
        """Whether the candidate's price is CDMPP's (else the fitted work model's)."""
        return self.tuned.predicted(cand) is not None

    def kernel_info(self, prim: Graph, cand: "Candidate") -> dict:
        if self.spec.kind == "gpu":     # on a GPU tensorplan runs PyTorch's kernels (`runtime.torch_runner`)
            return {"backend": "torch-inductor", "schedule": {"device": "cuda"}}
        if self.by_tuned(cand):
            return self.tuned.kernel_info(prim, cand)
        return {"backend": PREDICTED_BACKEND.get(cand.kind, "ort"), "schedule": {}}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "tuned": self.tuned.describe(), "fitted": self.fitted.describe()}


class LazyCost:
    """The prediction of every candidate, replaced by its measurement once it was timed.

    `costs(prim, cands)` is what the solver sees now; `measure(prim, cands)` times candidates (the
    TVM ones with their `top_k` predicted-fastest schedules and the default, the fastest kept)
    through `MeasuredCost`, which caches them in the store; measured linear, opaque and region
    kernels also refit the work model, so the unmeasured ones are re-predicted from them.

    `measured`: another measuring cost model with `cached(prim, cand)` (e.g. `TorchDeviceCost` on
    a GPU, whose kernels PyTorch builds): it times the candidates instead, and since it builds every
    kernel the same way whatever the prediction, its `kernel_info` names what runs, timed or not.
    Its kernels are not the programs CDMPP priced, so CDMPP's prices are rescaled by what the timed
    ones measured (`tuned_scale`, refitted after every round)."""

    name = "lazy"
    supports_regions = True

    def __init__(self, predicted: PredictedCost, top_k: int = 3, sample_budget_s: float | None = None,
                 max_samples: int = 32, min_samples: int = 4, measured: Any = None):
        self.predicted = predicted
        self.top_k = int(top_k)
        self.sample_budget_s = sample_budget_s
        self.max_samples, self.min_samples = int(max_samples), int(min_samples)
        self.builds_all = measured is not None     # the measuring backend builds every kernel itself
        if measured is None:
            from tensorplan.cost.measured import MeasuredCost
            measured = MeasuredCost(store=predicted.store, device=predicted.spec, threads=predicted.threads,
                                    tvm_schedules=self._schedules)
        self.measured = measured
        self._pred: dict[str, float] = {}       # canonical hash -> predicted seconds
        self._meas: dict[str, float] = {}       # canonical hash -> measured seconds
        self.tuned_scale = 1.0                   # measured / CDMPP-predicted (only with another `measured`)
        self._tuned_scale_points = 0
        self.stats = {"predicted": 0, "measured": 0, "from_store": 0}

    @property
    def store(self):
        """The measurement store every prediction, timing and plan run of this model lands in."""
        return self.predicted.store

    def _schedules(self, prim: Graph, cand: "Candidate") -> list[dict]:
        if not self.predicted.by_tuned(cand):
            return []
        return self.predicted.tuned.top_schedules(prim, cand, self.top_k)

    # -- what the solver sees -------------------------------------------------------------------
    def predict_all(self, prim: Graph, cands: list["Candidate"], progress: bool = False) -> None:
        """Predict every unique candidate (the expensive, parallel part), and take the ones the store
        already measured as measured."""
        uniq = _unique(cands)
        self._fit_samples(sum(1 for c in uniq if c.kind == "memory"))
        if self.sample_budget_s is not None and self.predicted.tuned.deadline is None:
            self.predicted.tuned.deadline = time.perf_counter() + self.sample_budget_s
        vals = self.predicted.cost_many(prim, uniq, progress=progress)
        for c, v in zip(uniq, vals):
            self._pred[c.canonical_hash] = float(v)
        self.stats["predicted"] = len(self._pred)
        for c in uniq:
            if not math.isfinite(self._pred[c.canonical_hash]) and len(c.nodes) > 1:
                continue        # cannot be one kernel: nothing to look up
            hit = self.measured.cached(prim, c)
            if hit is not None:
                self._meas[c.canonical_hash] = hit
                self.stats["from_store"] += 1
                self._observe(prim, c, hit)
        self.repredict(prim, uniq)

    def _fit_samples(self, n_memory: int) -> None:
        """Schedules sampled per TIR kernel so that sampling and featurising fit `sample_budget_s`."""
        if self.sample_budget_s is None or n_memory == 0:
            return
        tuned = self.predicted.tuned
        from tensorplan.devices import usable_cores
        n = int(self.sample_budget_s * max(1, tuned.workers or usable_cores()) / (n_memory * SAMPLE_S))
        tuned.samples = max(self.min_samples, min(self.max_samples, n))

    def repredict(self, prim: Graph, cands: list["Candidate"]) -> None:
        """Refit the work model on what was measured and re-price the candidates it prices (and, when
        another backend builds the kernels, rescale CDMPP's prices to its measurements)."""
        self._fit_tuned_scale(cands)
        fitted = self.predicted.fitted
        fitted.refit()
        rest = [c for c in _unique(cands) if c.canonical_hash not in self._meas and not self.predicted.by_tuned(c)]
        if rest:
            for c, v in zip(rest, fitted.cost_many(prim, rest)):
                self._pred[c.canonical_hash] = float(v)

    def _fit_tuned_scale(self, cands: list["Candidate"]) -> None:
        if not self.builds_all:
            return
        logs = []
        for c in _unique(cands):
            h = c.canonical_hash
            m, p = self._meas.get(h), self._pred.get(h)
            if m is not None and p is not None and 0 < m < math.inf and 0 < p < math.inf and self.predicted.by_tuned(c):
                logs.append(math.log(m / p))
        if logs:
            n = len(logs)
            self.tuned_scale = math.exp(statistics.median(logs) * n / (n + SCALE_PRIOR_POINTS))
            self._tuned_scale_points = n

    def cost(self, prim: Graph, cand: "Candidate") -> float:
        h = cand.canonical_hash
        if h in self._meas:
            return self._meas[h]
        if h not in self._pred:
            self.predict_all(prim, [cand])
        if self.builds_all and self.predicted.by_tuned(cand):
            return self._pred[h] * self.tuned_scale
        return self._pred[h]

    def cost_many(self, prim: Graph, cands: list["Candidate"], progress: bool = False) -> list[float]:
        missing = [c for c in cands if c.canonical_hash not in self._pred]
        if missing:
            self.predict_all(prim, missing, progress=progress)
        return [self.cost(prim, c) for c in cands]

    def is_measured(self, cand: "Candidate") -> bool:
        return cand.canonical_hash in self._meas

    def predicted_s(self, cand: "Candidate") -> float | None:
        return self._pred.get(cand.canonical_hash)

    def measured_s(self, cand: "Candidate") -> float | None:
        return self._meas.get(cand.canonical_hash)

    # -- timing what decides -----------------------------------------------------------------
    def measure(self, prim: Graph, cands: list["Candidate"], progress: bool = False,
                deadline: float | None = None) -> int:
        """Compile and time the candidates not measured yet (each hash once); returns how many were timed.

        With a `deadline` (a `time.perf_counter()` value) they are timed in chunks, the kernels
        predicted slowest first (they decide most), and no chunk starts after it: the caller's
        budget holds even when a solution has hundreds of unmeasured kernels."""
        todo = [c for c in _unique(cands) if c.canonical_hash not in self._meas]
        if not todo:
            return 0
        if deadline is None:
            chunks = [todo]
        else:
            todo.sort(key=lambda c: -_finite(self._pred.get(c.canonical_hash)))
            chunks = [todo[i:i + MEASURE_CHUNK] for i in range(0, len(todo), MEASURE_CHUNK)]
        from tensorplan.progress import progress_bar
        done = 0
        with progress_bar(f"timing {len(todo)} kernels", len(todo), enabled=progress and len(chunks) > 1) as advance:
            for chunk in chunks:
                if deadline is not None and done and time.perf_counter() >= deadline:
                    break
                vals = self.measured.cost_many(prim, chunk, progress=progress and len(chunks) == 1)
                for c, v in zip(chunk, vals):
                    self._meas[c.canonical_hash] = float(v)
                    self._observe(prim, c, float(v))
                done += len(chunk)
                advance(len(chunk))
        self.stats["measured"] += done
        return done

    def _observe(self, prim: Graph, cand: "Candidate", seconds: float) -> None:
        if math.isfinite(seconds) and not self.predicted.by_tuned(cand):
            self.predicted.fitted.observe(prim, cand, seconds)

    def kernel_info(self, prim: Graph, cand: "Candidate") -> dict:
        if cand.canonical_hash in self._meas or self.builds_all:
            return self.measured.kernel_info(prim, cand)
        return self.predicted.kernel_info(prim, cand)

    def describe(self) -> dict[str, Any]:
        scale = {"tuned_scale": self.tuned_scale, "tuned_scale_points": self._tuned_scale_points} if self.builds_all else {}
        return {"name": self.name, "top_k": self.top_k, **self.stats, **scale, "predicted_by": self.predicted.describe(),
                "measured_by": self.measured.describe()}


def _finite(x: float | None) -> float:
    return float(x) if x is not None and math.isfinite(x) else 0.0


def _unique(cands: list["Candidate"]) -> list["Candidate"]:
    first: dict[str, "Candidate"] = {}
    for c in cands:
        first.setdefault(c.canonical_hash, c)
    return list(first.values())


__all__ = ["LazyCost", "PREDICTED_BACKEND", "PredictedCost"]
