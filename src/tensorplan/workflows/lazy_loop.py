"""The lazy-measurement loop of `optimize`: solve on predictions, time what the solution uses, solve again.

Why its own module: the loop is the same whatever measures the kernels (TVM / ONNX Runtime on
this CPU, PyTorch on a GPU: `workflows.optimize`, `workflows.optimize_gpu`); only the cost model
(`cost.lazy.LazyCost` with its measuring backend) and the plan-time model differ.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.workflows.orchestrate import Problem, prepare

# the runner-up solution is timed only when its predicted objective is within this share of the
# solution's: further away, no error of the predictor (plan-time median |rel. error| ~0.12, per
# kernel ~0.2-0.3) could make it win, so timing it decides nothing
RUNNER_UP_MARGIN = 0.25
MAX_ITERATIONS = 30
MEASURE_UNTIL = 0.70     # of the budget: lazy measurement stops starting new rounds after this


@dataclass
class Iteration:
    """One solve of the lazy-measurement loop."""

    index: int
    kernels: int               # in the solution
    unmeasured: int            # of them priced by prediction only when solved
    measured_now: int          # kernels compiled and timed after this solve (solution + runner-up)
    objective_ms: float
    solve_s: float
    measure_s: float


def priced_problem(g: Graph, spec: Any, cm: Any, *, phases: dict[str, float], threads: int, max_nodes: int,
                   max_reduces: int | None, regions: bool, progress: bool, say: Callable[[str], None]) -> Problem:
    """Rewrites, fission, candidates, every one priced by `cm` (the lazy cost model: predictions and
    what the store measured before), with optimize's settings; the phases' seconds go into `phases`."""
    problem = prepare(g, spec, cm, timing={"load_s": phases.get("load_s", 0.0)}, threads=threads, rewrite=True,
                      winograd=False, max_nodes=max_nodes, max_reduces=max_reduces, linear_epilogue=False,
                      regions=regions, region_segments=8, method="blp", progress=progress, say=say)
    for k in ("rewrite_s", "fission_s", "enumerate_s"):
        phases[k] = problem.timing.get(k, 0.0)
    phases["predict_s"] = problem.timing.get("profile_s", 0.0)
    return problem


def measure_what_decides(p: Problem, lazy: Any, plan_model: Any, *, deadline: float, time_limit: float,
                         progress: bool, say: Callable[[str], None]) -> tuple[list[Iteration], str]:
    """Solve on the current costs (solo cost + what the plan-time model says the kernel costs inside a
    plan; `plan_model` None: the solo costs alone, as on a GPU whose plan replays as one CUDA graph);
    time the solution's unmeasured kernels (and the runner-up solution's, while at least half the
    time is left); repeat until the solution is all measured, the deadline passes or
    MAX_ITERATIONS solves. Returns (iterations, why it stopped)."""
    from tensorplan.korch.blp import select

    prim, cands = p.prim, p.cands
    by_id = {c.id: c for c in cands}
    iterations: list[Iteration] = []
    previous: set[int] | None = None
    started = time.perf_counter()
    for index in range(MAX_ITERATIONS):
        costs = np.array(lazy.cost_many(prim, cands), dtype=np.float64)
        p.overhead = None if plan_model is None else plan_model.overheads(prim, cands, costs, info=lazy.kernel_info)
        objective = costs if p.overhead is None else costs + p.overhead
        t0 = time.perf_counter()
        sel = select(prim, cands, objective, method="blp", recompute=True, cuts=True, time_limit=time_limit)
        solve_s = time.perf_counter() - t0
        chosen = [by_id[i] for i in sel.chosen]
        todo = [c for c in chosen if not lazy.is_measured(c)]
        stable = previous is not None and set(sel.chosen) == previous
        it = Iteration(index=index, kernels=len(chosen), unmeasured=len(todo), measured_now=0,
                       objective_ms=float(sel.objective_s) * 1e3, solve_s=solve_s, measure_s=0.0)
        iterations.append(it)
        if not todo:
            say(f"solve {index + 1}: {len(chosen)} kernels, all measured ({sel.objective_s * 1e3:.3f} ms)")
            return iterations, "stable"
        now = time.perf_counter()
        if now >= deadline:
            say(f"solve {index + 1}: {len(todo)} of {len(chosen)} kernels still predicted: measurement budget spent")
            return iterations, "budget"
        batch = list(todo)
        if deadline - now > 0.5 * (deadline - started) and not stable:
            batch += runner_up(prim, cands, objective, sel.chosen, lazy, time_limit,
                               within_s=(1 + RUNNER_UP_MARGIN) * float(sel.objective_s))
        t0 = time.perf_counter()
        it.measured_now = lazy.measure(prim, batch, progress=progress, deadline=deadline)
        lazy.repredict(prim, cands)
        it.measure_s = time.perf_counter() - t0
        say(f"solve {index + 1}: {len(chosen)} kernels, {len(todo)} predicted only -> timed {it.measured_now} "
            f"({it.measure_s:.1f}s)")
        previous = set(sel.chosen)
    return iterations, "iterations"


def runner_up(prim: Graph, cands: list, objective: np.ndarray, chosen: list[int], lazy: Any,
              time_limit: float, within_s: float = math.inf) -> list:
    """The unmeasured kernels of the best solution that avoids the chosen fused kernels (singletons
    stay allowed, so it always exists): the alternative a measurement could turn to. None when that
    solution's predicted objective exceeds `within_s` (it cannot decide)."""
    from tensorplan.korch.blp import select

    alt = objective.copy()
    pos = {c.id: k for k, c in enumerate(cands)}
    for i in chosen:
        if len(cands[pos[i]].nodes) > 1:
            alt[pos[i]] = math.inf
    try:
        sel = select(prim, cands, alt, method="blp", recompute=True, cuts=True, time_limit=time_limit / 2)
    except TensorplanError:
        return []
    if float(sel.objective_s) > within_s:
        return []
    return [cands[pos[i]] for i in sel.chosen if not lazy.is_measured(cands[pos[i]])]


__all__ = ["Iteration", "MAX_ITERATIONS", "MEASURE_UNTIL", "RUNNER_UP_MARGIN", "measure_what_decides", "priced_problem", "runner_up"]
