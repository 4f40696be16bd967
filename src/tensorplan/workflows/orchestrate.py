"""`orchestrate`: model -> fission -> candidates -> costs -> BLP -> verified `Plan`.

Korch's pipeline as one function over plain data. The cost model is pluggable:
`cost=None` uses `tensorplan.cost.measured.MeasuredCost(device=spec[, store=...])`
when that module exists (compiles and times kernels on this machine), otherwise the
roofline `AnalyticalCost`; `cost="analytical"` / `"measured"` force one; any object
with `cost(prim, cand) -> seconds` works.

Optional cost-model hook: `kernel_info(prim, cand) -> {"backend": str, "schedule": dict}`
fills the plan's per-kernel backend/schedule (defaults: memory -> "tvm",
linear -> "torch", opaque -> "reference").
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from tensorplan.errors import PlanError, TensorplanError
from tensorplan.korch.fission import fission
from tensorplan.ir.graph import Graph
from tensorplan.korch.blp import recomputed_primitives, select
from tensorplan.korch.candidates import EnumerationStats, enumerate_candidates
from tensorplan.runtime.plan import Plan, PlanKernel, plan_buffers, verify

# Used only when the cost model does not say (AnalyticalCost): ONNX Runtime's MLAS is the
# fastest linear backend measured on x86 CPUs here (bench/results/korch_kernels.json).
DEFAULT_BACKEND = {"memory": "tvm", "linear": "ort", "opaque": "reference", "region": "ort"}


def resolve_device(device: Any):
    """A DeviceSpec from a name ('local', catalog name) or a DeviceSpec (returned as is)."""
    if not isinstance(device, str):
        return device
    from tensorplan.devices import resolve
    return resolve(device)


def make_cost(cost: Any, spec: Any, store: Any = None):
    """Turn the `cost` option into a KernelCost object (see module docstring)."""
    from tensorplan.cost import AnalyticalCost
    if cost == "torch" or (cost in (None, "measured") and getattr(spec, "kind", "cpu") == "gpu"):
        # a GPU: kernels are PyTorch programs (Inductor, cuDNN/cuBLAS) timed there; "torch" on a CPU
        from tensorplan.cost.torch_device import TorchDeviceCost
        return TorchDeviceCost("cuda" if getattr(spec, "kind", "cpu") == "gpu" else "cpu")
    if cost is None or cost == "measured":
        try:
            from tensorplan.cost.measured import MeasuredCost  # written by the kernels helper
        except ImportError:
            if cost == "measured":
                raise TensorplanError("measured costs need tensorplan.cost.measured, which is not installed")
            return AnalyticalCost(spec)
        return MeasuredCost(device=spec, store=store) if store is not None else MeasuredCost(device=spec)
    if cost == "analytical":
        return AnalyticalCost(spec)
    if isinstance(cost, str):
        raise TensorplanError(f"unknown cost model '{cost}' (use measured, analytical or torch)")
    if not callable(getattr(cost, "cost", None)):
        raise TensorplanError(f"cost model {cost!r} has no cost(prim, cand) method")
    return cost


def _load(model: str | Path | Graph, input_shapes, opset: int) -> tuple[Graph, str]:
    if isinstance(model, Graph):
        return model, model.name
    from tensorplan.zoo.specs import load_model  # type: ignore[attr-defined]
    return load_model(str(model), input_shapes=input_shapes, opset=opset), str(model)


def orchestrate(model: str | Path | Graph, *, input_shapes: dict[str, tuple[int, ...]] | None = None,
                opset: int = 17, device: Any = "local", cost: Any = None, max_nodes: int = 8,
                max_reduces: int | None = 2, linear_epilogue: bool = False, recompute: bool = True,
                cuts: bool = True, time_limit: float = 60.0, method: str = "blp",
                require_optimal: bool = False, store: Any = None, progress: bool = False,
                regions: bool | None = None, region_segments: int = 8, kernel_overhead_s: float = 0.0,
                rewrite: bool = True, winograd: bool = False,
                log: Callable[[str], None] | None = None) -> Plan:
    """Plan the kernels of `model` (ONNX path, zoo name or Graph) on `device`; returns a verified Plan.

    Options: `max_nodes`/`max_reduces` cap candidate size; `linear_epilogue` lets a linear
    primitive absorb an elementwise epilogue; `recompute=False` forbids recomputation;
    `cuts` adds the valid BLP cuts; `method` is "blp" (Korch), "greedy" (greedy fusion) or
    "none" (no fusion); `time_limit` bounds the solver (seconds). `regions` adds ONNX Runtime
    region candidates (runs of up to `region_segments` linear-operator segments of the original
    model, korch/regions.py); None = when the cost model can time them and `method` is "blp".
    `winograd=True` also runs every eligible 3x3 convolution as Winograd F(4x4, 3x3)
    (rewrite/rules.py; off by default: built from ONNX operators it did not pay on the benchmark
    models, bench/winograd_probe.py).
    `kernel_overhead_s` is added to every candidate's cost in the objective (not to the kernels'
    predicted latencies): what a kernel boundary costs inside a running plan beyond the kernel's
    solo time (thread pools waking, caches), which solo timings cannot see.
    `progress` shows a progress bar while costing; `log(msg)` receives one line per finished stage. A plan made from a
    `Graph` records `graph.name` as its model, so `Plan.primitive_graph()` can only re-derive it
    when that name is a zoo name or ONNX path; pass the spec string when the plan will be run."""
    from tensorplan.cost import cost_many
    say = log or (lambda msg: None)
    t_all = time.perf_counter()
    timing: dict[str, float] = {}

    t0 = time.perf_counter()
    g, spec_name = _load(model, input_shapes, opset)
    timing["load_s"] = time.perf_counter() - t0
    say(f"loaded {spec_name}: {len(g.nodes)} operators ({timing['load_s']:.2f}s)")
    applied: list = []
    if rewrite:
        from tensorplan.rewrite.rules import rewrite as rewrite_graph, winograd_convs
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

    spec = resolve_device(device)
    cm = make_cost(cost, spec, store)
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

    t0 = time.perf_counter()
    kw = dict(recompute=recompute, cuts=cuts, time_limit=time_limit, require_optimal=require_optimal) \
        if method == "blp" else {}
    sel = select(prim, cands, costs + float(kernel_overhead_s), method=method, **kw)
    timing["solve_s"] = time.perf_counter() - t0
    say(f"{method}: {len(sel.chosen)} kernels, {sel.objective_s * 1e3:.3f} ms objective, status "
        f"{sel.status} ({timing['solve_s']:.2f}s)")

    by_id = {c.id: c for c in cands}
    cost_of = {c.id: float(costs[k]) for k, c in enumerate(cands)}
    info = getattr(cm, "kernel_info", None)
    kernels = []
    for j, cid in enumerate(sorted(sel.chosen, key=lambda i: _first_pos(prim, by_id[i]))):
        c = by_id[cid]
        extra = info(prim, c) if callable(info) else {}
        sched = dict(extra.get("schedule") or {})
        if c.kind == "region":
            sched["operators"] = [n.name for n in c.source.nodes]
            sched["span"] = list(c.span)
        kernels.append(PlanKernel(id=f"k{j}", nodes=list(c.nodes), inputs=list(c.inputs),
                                  outputs=list(c.outputs), kind=c.kind, predicted_s=cost_of[cid],
                                  backend=str(extra.get("backend") or DEFAULT_BACKEND[c.kind]),
                                  schedule=sched,
                                  canonical_hash=c.canonical_hash, candidate=cid))
    from tensorplan.runtime.plan import topo_order
    order = topo_order(kernels, set(prim.inputs) | set(prim.constants()))
    if use_regions:
        from tensorplan.korch.regions import merge_adjacent_regions
        kernels, order = merge_adjacent_regions(kernels, order, prim)
        if len(kernels) == 1 and kernels[0].backend == "ort":
            # one session is the whole plan: let its pool spin between operators as ORT does by
            # default (spinning only hurts when other kernels' threads need the cores)
            kernels[0].schedule["spinning"] = True
    dev_dict = spec.to_dict() if hasattr(spec, "to_dict") else {"name": str(getattr(spec, "name", spec))}
    plan = Plan(
        source={"model": spec_name, "opset": int(getattr(g, "opset", opset)),
                "input_shapes": {k: list(v) for k, v in g.input_shapes().items()},
                "fingerprint": g.fingerprint(), "prim_fingerprint": prim.fingerprint(),
                "rewrite": bool(rewrite), "rewrites": [list(x) for x in applied],
                "num_operators": len(g.nodes), "num_primitives": len(prim.nodes),
                "opaque": [list(x) for x in fr.opaque], "fission_rules": fr.rules_applied},
        device=dev_dict, kernels=kernels, order=order,
        solver=sel.to_dict(), timing=timing,
        stats={"enumeration": est.to_dict(), "recomputed_primitives": recomputed_primitives(cands, sel.chosen),
               "cost_model": getattr(cm, "describe", lambda: {"name": getattr(cm, "name", type(cm).__name__)})(),
               "unfused_s": float(sum(cost_of[c.id] for c in cands if len(c.nodes) == 1 and c.kind != "region")),
               "ort_regions": {"candidates": n_regions,
                               "selected": sum(1 for i in sel.chosen if by_id[i].kind == "region"),
                               "kernels_after_merge": sum(1 for k in kernels if k.kind == "region"),
                               "primitives": sum(len(k.nodes) for k in kernels if k.kind == "region")}},
        options={"rewrite": bool(rewrite), "winograd": bool(winograd and rewrite), "regions": use_regions, "region_segments": region_segments, "kernel_overhead_s": kernel_overhead_s, "max_nodes": max_nodes,
                 "max_reduces": max_reduces, "linear_epilogue": linear_epilogue,
                 "recompute": recompute, "cuts": cuts, "time_limit": time_limit, "method": method,
                 "cost": getattr(cm, "name", type(cm).__name__)},
    )
    try:
        verify(plan, prim)
    except PlanError as e:
        raise PlanError(f"internal error: the {method} plan for '{spec_name}' failed verification: {e}") from e
    plan_buffers(plan, prim)
    timing["total_s"] = time.perf_counter() - t_all
    return plan


def _first_pos(prim: Graph, cand) -> int:
    pos = _pos_cache(prim)
    return pos[cand.nodes[-1]]


_POS: dict[int, tuple[int, dict[str, int]]] = {}


def _pos_cache(prim: Graph) -> dict[str, int]:
    hit = _POS.get(id(prim))
    if hit is None or hit[0] != len(prim.nodes):
        hit = (len(prim.nodes), {n.name: k for k, n in enumerate(prim.nodes)})
        _POS[id(prim)] = hit
    return hit[1]
