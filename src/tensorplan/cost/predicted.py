"""`CDMPPCost`: a candidate kernel's latency predicted by a trained latency model (CDMPP).

Why: measuring every candidate compiles and times thousands of kernels; predicting costs
milliseconds each. Each candidate is lowered (`kernels.lower`), given the default schedule
(`kernels.schedule`), featurised into its compact AST and predicted; results are cached per
canonical hash. Candidates that cannot be lowered to TIR (opaque operators, unsupported
primitives) go to `fallback` (another `KernelCost`, e.g. `AnalyticalCost`) or get `math.inf`
when none is given (a singleton without a fallback is an error: the planner needs it).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.arrays import ProgramArrays
from tensorplan.cdmpp.base import Estimator, load_estimator
from tensorplan.cdmpp.model import load_shipped
from tensorplan.devices.spec import DeviceSpec


class CDMPPCost:
    """Planner cost model (`tensorplan.cost.KernelCost` protocol): predicted kernel latency.

    `model`: a trained estimator or the path of a saved one (default: the shipped CDMPP);
    `device`: the device domain to predict for ('local': this CPU); `threads`: the thread count the
    default schedules are built for (default: every core this process may use).
    """

    name = "cdmpp"

    def __init__(self, model: "Estimator | str | Path | None" = None, device: "str | DeviceSpec" = "local",
                 fallback=None, threads: int | None = None):
        from tensorplan.cdmpp.predict import resolve_device

        self.model = load_shipped() if model is None else (
            model if isinstance(model, Estimator) else load_estimator(model))
        self.spec, self.device = resolve_device(device)
        self.fallback = fallback
        self.threads = threads
        self._cache: dict[str, float] = {}
        self.stats = {"predicted": 0, "fallback": 0, "featurize_s": 0.0}

    def _ast(self, prim, cand):
        """(compact AST, task_io) of the candidate's default-scheduled kernel, or None."""
        from tensorplan.kernels.lower import lower
        from tensorplan.kernels.schedule import default_schedule
        from tensorplan.cdmpp.features import compact_ast
        from tensorplan.cdmpp.tasks import task_io_of

        if getattr(cand, "kind", "") == "opaque":
            return None
        try:
            lowered = lower(cand.graph(prim), list(cand.outputs))
            sch = default_schedule(lowered, threads=self.threads)
            return compact_ast(sch), task_io_of(sch)
        except Exception:  # noqa: BLE001 - not lowerable: fallback
            return None

    def cost(self, prim, cand) -> float:
        return self.cost_many(prim, [cand])[0]

    def cost_many(self, prim, cands, progress: bool = False) -> list[float]:
        todo = [c for c in cands if c.canonical_hash not in self._cache]
        asts, ios, keep = [], [], []
        t0 = time.perf_counter()
        for c in todo:
            got = self._ast(prim, c)
            a, io = got if got is not None else (None, None)
            if a is None or a.n_leaves == 0:
                if self.fallback is not None:
                    self._cache[c.canonical_hash] = float(self.fallback.cost(prim, c))
                elif len(c.nodes) == 1:
                    raise TensorplanError(f"cdmpp cost: primitive {c.nodes[0]} cannot be lowered to TIR; "
                                          "pass fallback=AnalyticalCost(...)")
                else:
                    self._cache[c.canonical_hash] = math.inf
                self.stats["fallback"] += 1
                continue
            asts.append(a)
            ios.append(io)
            keep.append(c)
        self.stats["featurize_s"] += time.perf_counter() - t0
        if asts:
            arr = ProgramArrays.from_programs([a.leaf_features for a in asts], [a.positions for a in asts],
                                              device=self.device, flops=[a.flops for a in asts], task_io=ios)
            for c, v in zip(keep, self.model.predict(arr)):
                self._cache[c.canonical_hash] = float(v)
            self.stats["predicted"] += len(asts)
        return [self._cache[c.canonical_hash] for c in cands]

    def describe(self) -> dict:
        return {"name": self.name, "device": self.device, "model": type(self.model).__name__, **self.stats}
