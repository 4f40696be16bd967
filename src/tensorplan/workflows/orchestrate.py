"""`orchestrate`: model -> rewrites -> fission -> candidates -> costs -> BLP -> finalists' race -> `Plan`.

Korch's pipeline as one call, the same one `tensorplan orchestrate` makes. The model is loaded
once and the device resolved once; every later stage receives the `Graph` and the `DeviceSpec`.
The cost model is pluggable: `cost=None`/"measured" compiles and times kernels on this machine
(`tensorplan.cost.measured.MeasuredCost`, cached in the store), "predicted" prices every kernel
without timing it (`tensorplan.cost.lazy.PredictedCost`, what `optimize` starts from), "analytical" is the roofline,
"torch" builds kernels with PyTorch (the default on a GPU device); any object with
`cost(prim, cand) -> seconds` works.

Optional cost-model hook: `kernel_info(prim, cand) -> {"backend": str, "schedule": dict}`
fills the plan's per-kernel backend/schedule (defaults: memory -> "tvm", linear -> "ort",
opaque -> "reference").

After the BLP, its plan races its finalists end to end on this machine (workflows/race.py): the
alternatives are re-solved from the same candidates and costs, so the race adds no profiling.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tensorplan import devices
from tensorplan.errors import PlanError, TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.korch.blp import recomputed_primitives, select
from tensorplan.korch.candidates import Candidate, EnumerationStats, enumerate_candidates
from tensorplan.korch.fission import FissionResult, fission
from tensorplan.korch.regions import KIND as REGION
from tensorplan.runtime.buffers import plan_buffers
from tensorplan.runtime.plan import Plan, PlanKernel, model_origin, topo_order, verify
from tensorplan.zoo.specs import as_graph

# Used only when the cost model does not say (AnalyticalCost): ONNX Runtime's MLAS is the
# fastest linear backend measured on x86 CPUs here (bench/results/korch_kernels.json).
DEFAULT_BACKEND = {"memory": "tvm", "linear": "ort", "opaque": "reference", "region": "ort"}


def make_cost(cost: Any, spec: Any, store: Any = None, threads: int | None = None, jobs: int = 1,
              ray_address: str | None = None):
    """Turn the `cost` option into a KernelCost object (see module docstring); `threads` is what the
    measured model times kernels at, `jobs` how many processes pre-compile torch-built kernels,
    `ray_address` the Ray cluster the measured model's jobs run on (None: here)."""
    from tensorplan.cost import AnalyticalCost
    if ray_address and (cost not in (None, "measured") or getattr(spec, "kind", "cpu") == "gpu"):
        raise TensorplanError(f"--ray-address sends the measured cost model's CPU kernel timings to a cluster; "
                              f"cost {cost or 'measured'} on {getattr(spec, 'name', spec)} times nothing there: "
                              "use --cost measured on a CPU device, or leave --ray-address out")
    if cost == "torch" or (cost in (None, "measured") and getattr(spec, "kind", "cpu") == "gpu"):
        # a GPU: kernels are PyTorch programs (Inductor, cuDNN/cuBLAS) timed there; "torch" on a CPU
        from tensorplan.cost.torch_device import TorchDeviceCost
        return TorchDeviceCost("cuda" if getattr(spec, "kind", "cpu") == "gpu" else "cpu", jobs=jobs)
    if cost is None or cost == "measured":
        from tensorplan.cost.measured import MeasuredCost
        return MeasuredCost(device=spec, store=store, threads=threads, ray_address=ray_address)
    if cost == "analytical":
        return AnalyticalCost(spec)
    if cost == "predicted":
        # what `optimize` starts from: CDMPP over sampled schedules + a work model fitted on measured kernels
        from tensorplan.cost.lazy import PredictedCost
        return PredictedCost(device=spec, store=store, threads=threads)
    if isinstance(cost, str):
        raise TensorplanError(f"unknown cost model '{cost}' (use measured, predicted, analytical or torch)")
    if not callable(getattr(cost, "cost", None)):
        raise TensorplanError(f"cost model {cost!r} has no cost(prim, cand) method")
    return cost


@dataclass
class Problem:
    """Everything before the solve, shared by the BLP's plan and its finalists."""

    model: Graph                 # as loaded
    graph: Graph                 # rewritten
    applied: list
    fr: FissionResult
    prim: Graph
    cands: list[Candidate]
    costs: np.ndarray
    est: EnumerationStats
    n_regions: int
    use_regions: bool
    spec: Any
    cost_model: Any
    timing: dict[str, float]
    options: dict[str, Any]
    origin: dict[str, Any]       # what the plan records about the model file (runtime.plan.model_origin)
    # per-candidate seconds added to the objective only (what a kernel costs inside a plan beyond
    # its solo time: cost/plan_time.py); None = nothing beyond `kernel_overhead_s`
    overhead: np.ndarray | None = None


def orchestrate(model: str | Path | Graph, *, device: Any = "local", cost: Any = None,
                input_shapes: dict[str, tuple[int, ...]] | None = None, opset: int = 17,
                threads: int | None = None, store: Any = None, jobs: int = 1,
                method: str = "blp", max_nodes: int = 8, max_reduces: int | None = 2, linear_epilogue: bool = False,
                recompute: bool = True, cuts: bool = True, time_limit: float = 60.0, require_optimal: bool = False,
                regions: bool | None = None, region_segments: int = 8, kernel_overhead_s: float = 0.0,
                rewrite: bool = True, winograd: bool = False,
                race: bool = True, race_inductor: bool = True, race_rounds: int = 15, race_margin: float = 0.10,
                race_burst_s: float = 0.03, feeds: dict[str, np.ndarray] | None = None,
                progress: bool = False, log: Callable[[str], None] | None = None,
                ray_address: str | None = None) -> Plan:
    """Plan the kernels of `model` (a `Graph`, an ONNX path, a zoo name or a PyTorch factory) on
    `device` (a name, a saved spec path or a `DeviceSpec`); returns the verified plan that is kept.

    Search: `max_nodes`/`max_reduces` cap candidate size; `linear_epilogue` lets a linear
    primitive absorb an elementwise epilogue; `recompute=False` forbids recomputation; `cuts` adds
    the valid BLP cuts; `method` is "blp" (Korch), "greedy" (greedy fusion) or "none" (no fusion);
    `time_limit` bounds the solver (seconds). `regions` adds ONNX Runtime region candidates (runs of
    up to `region_segments` linear-operator segments of the original model, korch/regions.py);
    None = when the cost model can time them and `method` is "blp". `rewrite` applies the exact
    algebraic rewrites first; `winograd=True` also runs every eligible 3x3 convolution as Winograd
    F(4x4, 3x3). `kernel_overhead_s` is added to every candidate's cost in the objective (not to
    the kernels' predicted latencies): what a kernel boundary costs inside a running plan beyond
    its solo time.

    Race (`race=True`, when the device is this machine and the cost model races): the BLP's plan,
    its alternatives and (`race_inductor`, CPU plans) the whole graph as one Inductor program run
    interleaved for `race_rounds` rounds on `feeds` (default: seeded random inputs); the plan with
    the fewest kernels within `race_margin` of the fastest is kept (workflows/race.py).

    `threads` is what kernels are timed and plans raced with (default: the device's own count,
    every usable core for 'local'); `store` is the measurement store of measured costs; `jobs`
    pre-compiles torch-built kernels in that many processes. `progress` shows a progress bar
    while costing; `log(msg)` receives one line per finished stage. `ray_address` sends the
    measured cost model's compile-and-time jobs to that Ray cluster (`measure.cluster`)."""
    say = log or (lambda msg: None)
    t_all = time.perf_counter()
    t0 = time.perf_counter()
    g = as_graph(model, input_shapes, opset)
    load_s = time.perf_counter() - t0
    say(f"loaded {g.source or g.name}: {len(g.nodes)} operators ({load_s:.2f}s)")
    spec = devices.device(device)
    threads = int(threads or devices.default_threads(spec))
    cm = make_cost(cost, spec, store, threads, jobs, ray_address)
    problem = prepare(g, spec, cm, timing={"load_s": load_s}, threads=threads, rewrite=rewrite, winograd=winograd,
                       max_nodes=max_nodes, max_reduces=max_reduces, linear_epilogue=linear_epilogue,
                       regions=regions, region_segments=region_segments, method=method, progress=progress,
                       say=say)
    solve = dict(method=method, recompute=recompute, cuts=cuts, time_limit=time_limit,
                 require_optimal=require_optimal, kernel_overhead_s=kernel_overhead_s)
    plan = solve_problem(problem, say=say, **solve)
    plan.timing["total_s"] = time.perf_counter() - t_all
    if not race or not getattr(cm, "races", True):
        return plan
    if not devices.is_local(spec):
        say(f"race: skipped (device '{getattr(spec, 'name', spec)}' is not this machine)")
        return plan
    return race_finalists(problem, plan, solve, threads=threads, inductor=race_inductor, rounds=race_rounds,
                 margin=race_margin, burst_s=race_burst_s, feeds=feeds, say=say)


def prepare(g: Graph, spec: Any, cm: Any, *, timing: dict[str, float], threads: int, rewrite: bool, winograd: bool,
             max_nodes: int, max_reduces: int | None, linear_epilogue: bool, regions: bool | None,
             region_segments: int, method: str, progress: bool, say: Callable[[str], None]) -> Problem:
    """Rewrites, fission, candidates and their costs: the part of the pipeline every finalist shares."""
    from tensorplan.cost import cost_many
    model = g
    applied: list = []
    if rewrite:
        from tensorplan.rewrite import rewrite as rewrite_graph, winograd_convs
        t0 = time.perf_counter()
        rr = rewrite_graph(g)
        if winograd:
            rr = rewrite_graph(g, winograd=[n.name for n in winograd_convs(rr.graph)])
        g, applied = rr.graph, rr.applied
        timing["rewrite_s"] = time.perf_counter() - t0
        if applied:
            say("rewrites: " + ", ".join(f"{k} x{v}" for k, v in rr.counts.items()) +
                f" ({timing['rewrite_s']:.2f}s)")

    t0 = time.perf_counter()
    fr = fission(g)
    prim = fr.graph
    timing["fission_s"] = time.perf_counter() - t0
    say(f"fission: {len(prim.nodes)} primitives, {len(fr.opaque)} opaque ({timing['fission_s']:.2f}s)")

    t0 = time.perf_counter()
    est = EnumerationStats()
    cands = enumerate_candidates(prim, max_nodes=max_nodes, max_reduces=max_reduces,
                                 linear_epilogue=linear_epilogue,
                                 opaque={n for n, _ in fr.opaque}, stats=est)
    use_regions = (bool(getattr(cm, "supports_regions", False)) and method == "blp") if regions is None \
        else bool(regions)
    n_regions = 0
    if use_regions:
        from tensorplan.korch.regions import enumerate_regions
        rc = enumerate_regions(g, fr, start_id=len(cands), max_segments=region_segments)
        n_regions = len(rc)
        cands = cands + rc
        est.candidates = len(cands)
        est.unique_hashes = len({c.canonical_hash for c in cands})
    timing["enumerate_s"] = time.perf_counter() - t0
    say(f"candidates: {est.candidates} ({est.unique_hashes} unique) in {est.regions} regions "
        f"+ {n_regions} ONNX Runtime regions ({timing['enumerate_s']:.2f}s)")

    t0 = time.perf_counter()
    costs = cost_many(cm, prim, cands, progress=progress,
                      description=f"costing {est.unique_hashes} kernels ({getattr(cm, 'name', 'cost')})")
    timing["profile_s"] = time.perf_counter() - t0
    say(f"costs: {getattr(cm, 'name', 'cost')} ({timing['profile_s']:.2f}s)")
    options = {"rewrite": bool(rewrite), "winograd": bool(winograd and rewrite), "regions": use_regions,
               "region_segments": region_segments, "max_nodes": max_nodes, "max_reduces": max_reduces,
               "linear_epilogue": linear_epilogue, "cost": getattr(cm, "name", type(cm).__name__),
               "threads": threads}
    return Problem(model=model, graph=g, applied=applied, fr=fr, prim=prim, cands=cands, costs=costs, est=est,
                    n_regions=n_regions, use_regions=use_regions, spec=spec, cost_model=cm, timing=timing,
                    options=options, origin=model_origin(model))


def solve_problem(p: Problem, *, method: str, recompute: bool, cuts: bool, time_limit: float, require_optimal: bool,
           kernel_overhead_s: float, say: Callable[[str], None] | None = None) -> Plan:
    """Select kernels from the problem's candidates and costs; a verified plan holding its graphs."""
    say = say or (lambda msg: None)
    prim, cands, cm = p.prim, p.cands, p.cost_model
    timing = dict(p.timing)
    t0 = time.perf_counter()
    kw = dict(recompute=recompute, cuts=cuts, time_limit=time_limit, require_optimal=require_optimal) \
        if method == "blp" else {}
    objective = p.costs + float(kernel_overhead_s) + (p.overhead if p.overhead is not None else 0.0)
    sel = select(prim, cands, objective, method=method, **kw)
    timing["solve_s"] = time.perf_counter() - t0
    say(f"{method}: {len(sel.chosen)} kernels, {sel.objective_s * 1e3:.3f} ms objective, status "
        f"{sel.status} ({timing['solve_s']:.2f}s)")

    by_id = {c.id: c for c in cands}
    cost_of = {c.id: float(p.costs[k]) for k, c in enumerate(cands)}
    info = getattr(cm, "kernel_info", None)
    pos = {n.name: k for k, n in enumerate(prim.nodes)}
    kernels = []
    for j, cid in enumerate(sorted(sel.chosen, key=lambda i: pos[by_id[i].nodes[-1]])):
        c = by_id[cid]
        extra = info(prim, c) if callable(info) else {}
        sched = dict(extra.get("schedule") or {})
        if c.kind == REGION:
            sched["operators"] = [n.name for n in c.source.nodes]
            sched["span"] = list(c.span)
        kernels.append(PlanKernel(id=f"k{j}", nodes=list(c.nodes), inputs=list(c.inputs),
                                  outputs=list(c.outputs), kind=c.kind, predicted_s=cost_of[cid],
                                  backend=str(extra.get("backend") or DEFAULT_BACKEND[c.kind]),
                                  schedule=sched, canonical_hash=c.canonical_hash, candidate=cid))
    kernels = _drop_redundant(kernels)
    order = topo_order(kernels, set(prim.inputs) | set(prim.constants()))
    if p.use_regions:
        kernels, order = _merge_adjacent_regions(kernels, order, prim)
        if len(kernels) == 1 and kernels[0].backend == "ort":
            # one session is the whole plan: let its pool spin between operators as ORT does by
            # default (spinning only hurts when other kernels' threads need the cores)
            kernels[0].schedule["spinning"] = True
    g, spec = p.graph, p.spec
    spec_name = p.model.source or p.model.name
    # the model as data: a factory spec is resolved here, the plan keeps the ONNX file and its hash
    source = {**p.origin, "opset": int(p.model.opset),
              "input_shapes": {k: list(v) for k, v in p.model.input_shapes().items()},
              "fingerprint": g.fingerprint(), "prim_fingerprint": prim.fingerprint(),
              "rewrite": bool(p.options["rewrite"]), "rewrites": [list(x) for x in p.applied],
              "num_operators": len(g.nodes), "num_primitives": len(prim.nodes),
              "opaque": [list(x) for x in p.fr.opaque], "fission_rules": p.fr.rules_applied}
    dev_dict = spec.to_dict() if hasattr(spec, "to_dict") else {"name": str(getattr(spec, "name", spec))}
    plan = Plan(
        source=source, device=dev_dict, kernels=kernels, order=order, solver=sel.to_dict(), timing=timing,
        stats={"enumeration": p.est.to_dict(), "recomputed_primitives": recomputed_primitives(cands, sel.chosen),
               "cost_model": getattr(cm, "describe", lambda: {"name": getattr(cm, "name", type(cm).__name__)})(),
               "unfused_s": float(sum(cost_of[c.id] for c in cands if len(c.nodes) == 1 and c.kind != REGION)),
               "ort_regions": {"candidates": p.n_regions,
                               "selected": sum(1 for i in sel.chosen if by_id[i].kind == REGION),
                               "kernels_after_merge": sum(1 for k in kernels if k.kind == REGION),
                               "primitives": sum(len(k.nodes) for k in kernels if k.kind == REGION)}},
        options={**p.options, "kernel_overhead_s": kernel_overhead_s, "recompute": recompute, "cuts": cuts,
                 "time_limit": time_limit, "method": method},
    )
    try:
        verify(plan, prim, source=g)
    except PlanError as e:
        raise PlanError(f"internal error: the {method} plan for '{spec_name}' failed verification: {e}") from e
    plan_buffers(plan, prim)
    plan.keep_graphs(p.model, g, prim)
    return plan


def _drop_redundant(kernels: list[PlanKernel]) -> list[PlanKernel]:
    """Drop chosen kernels whose every output another chosen kernel also produces (possible when a
    multi-output region covers a single-output kernel's tensor and the solver stops early): it
    would only run twice. `verify` refuses such a plan."""
    kept = list(kernels)
    changed = True
    while changed:
        changed = False
        for k in sorted(kept, key=lambda k: -k.predicted_s):
            others = {o for x in kept if x is not k for o in x.outputs}
            if len(kept) > 1 and all(o in others for o in k.outputs):
                kept.remove(k)
                changed = True
                break
    return kept


def _merge_adjacent_regions(kernels: list[PlanKernel], order: list[str], prim: Graph
                            ) -> tuple[list[PlanKernel], list[str]]:
    """Merge region kernels that run back to back and span adjacent segment intervals into one
    ONNX Runtime session (their union is again an interval, so convex; running it where the
    first one ran keeps the order topological). Why: inside one session ORT keeps its blocked
    layout and its thread pool hot; the BLP priced the pieces separately, so merging can only
    remove boundary costs. Returns (kernels, order) with merged kernels named after the first."""
    by = {k.id: k for k in kernels}
    pos = {n.name: i for i, n in enumerate(prim.nodes)}
    pby = {n.name: n for n in prim.nodes}
    groups: list[list[PlanKernel]] = []
    for kid in order:
        k = by[kid]
        prev = groups[-1][-1] if groups else None
        if (prev is not None and prev.kind == REGION and k.kind == REGION and prev.backend == k.backend
                and prev.schedule.get("span") and k.schedule.get("span")
                and prev.schedule["span"][1] == k.schedule["span"][0]):
            groups[-1].append(k)
        else:
            groups.append([k])
    out_k: list[PlanKernel] = []
    for grp in groups:
        if len(grp) == 1:
            out_k.append(grp[0])
            continue
        nodes = sorted({x for k in grp for x in k.nodes}, key=pos.__getitem__)
        produced = {o for k in grp for o in k.outputs}
        ins = []
        for k in grp:
            for i in k.inputs:
                if i not in produced and i not in ins:
                    ins.append(i)
        members = {k.id for k in grp}
        others = {i for k in kernels if k.id not in members for i in k.inputs} | set(prim.outputs)
        used_inside = {i for x in nodes for i in pby[x].inputs if i}
        outs = [o for k in grp for o in k.outputs if o in others or o not in used_inside]
        sched = {**grp[0].schedule, "operators": [x for k in grp for x in k.schedule["operators"]],
                 "span": [grp[0].schedule["span"][0], grp[-1].schedule["span"][1]],
                 "merged": [k.id for k in grp]}
        out_k.append(PlanKernel(id=grp[0].id, nodes=nodes, inputs=ins, outputs=outs, kind=REGION,
                                predicted_s=sum(k.predicted_s for k in grp), backend=grp[0].backend,
                                schedule=sched, canonical_hash=grp[0].canonical_hash,
                                candidate=grp[0].candidate))
    return out_k, [k.id for k in out_k]


def finalists(p: Problem, plan: Plan, solve: dict[str, Any]) -> dict[str, Plan]:
    """The BLP's `plan` and its alternatives, re-solved from the same candidates and costs: the plan
    with the fewest kernels (1 s per kernel in the objective) and, when the BLP recomputes, the BLP
    without recomputation."""
    out = {"blp": plan}
    fewest = solve_problem(p, **{**solve, "kernel_overhead_s": 1.0})
    if len(fewest.kernels) != len(plan.kernels):
        out["fewest-kernels"] = fewest
    if len(plan.kernels) > 1 and solve["recompute"] and plan.stats.get("recomputed_primitives"):
        norec = solve_problem(p, **{**solve, "recompute": False})
        if len(norec.kernels) > 1 and norec.stats.get("recomputed_primitives") == 0:
            out["blp-no-recompute"] = norec
    return out


def race_finalists(p: Problem, plan: Plan, solve: dict[str, Any], *, threads: int, inductor: bool, rounds: int,
                   margin: float, burst_s: float, feeds: dict[str, np.ndarray] | None,
                   say: Callable[[str], None], on_result: Callable[[dict[str, Plan], Any], None] | None = None) -> Plan:
    """The finalists' race (workflows/race.py); the kept plan records it in `stats["race"]` and its
    time in `timing["race_s"]`. `on_result(finalists, RaceResult)` sees every finalist's measured
    median (optimize records them in the store to fit the plan-time model)."""
    from tensorplan.workflows.race import (run_race, session_backend_variants, session_thread_variants,
                                           whole_graph_inductor)
    t0 = time.perf_counter()
    cands = session_thread_variants(session_backend_variants(finalists(p, plan, solve)), threads)
    if inductor:
        try:
            cands["inductor"] = whole_graph_inductor(plan, threads=threads)
        except Exception as e:  # noqa: BLE001 - a graph Inductor cannot build is simply no finalist
            from tensorplan.errors import UnsupportedOperatorError
            why = (f"{type(e).__name__}: {str(e)[:200]}" if not isinstance(e, UnsupportedOperatorError) else
                   "no PyTorch rule for " + ", ".join(f"{op} (node '{name}')" for name, op in e.ops[:5]))
            say(f"race: no Inductor finalist ({why})")
    if len(cands) == 1:
        return plan
    if feeds is None:
        from tensorplan.ir.reference import random_feeds
        feeds = random_feeds(p.prim, seed=0)
    result = run_race(cands, p.prim, feeds, threads=threads, rounds=rounds, margin=margin, burst_s=burst_s)
    result.seconds = time.perf_counter() - t0
    store = getattr(p.cost_model, "store", None)
    if store is not None:       # every finalist timed end to end: data for the plan-time model (cost/plan_time.py)
        from tensorplan.cost.plan_time import record_plan_run
        for name, fin in cands.items():
            if name in result.median_s:
                record_plan_run(store, p.spec, fin, result.median_s[name], label=name, prim=p.prim, threads=threads)
    if on_result is not None:
        on_result(cands, result)
    med, n_kernels, chosen, fastest = result.median_s, result.kernels, result.chosen, result.fastest
    say(f"race: {', '.join(f'{k} {v * 1e3:.3f} ms ({n_kernels[k]} kernels)' for k, v in med.items())}"
        f" -> {chosen}" + (f" (fewer kernels, within {margin:.0%} of {fastest})" if chosen != fastest else "")
        + f" ({result.seconds:.1f}s)")
    kept = cands[chosen]
    kept.stats["race"] = result.to_dict()
    # the optimisation time is the BLP's pipeline plus the race (finalists' solves included)
    kept.timing = {**{k: v for k, v in plan.timing.items() if k != "total_s"}, "race_s": result.seconds,
                   "total_s": plan.timing.get("total_s", 0.0) + result.seconds}
    return kept


__all__ = ["DEFAULT_BACKEND", "Problem", "finalists", "make_cost", "orchestrate", "prepare", "race_finalists",
           "solve_problem"]
