"""Finalists' race: the BLP's plan is checked end to end against its nearest alternatives.

Why: the BLP minimises a sum of *solo* kernel timings. Inside a running plan every kernel
boundary costs more than solo timings show (thread pools waking, cold caches), so a plan that
wins on paper can lose on the machine. Before a plan is kept, the BLP's plan, the plan with the
fewest kernels (the BLP with 1 s per kernel: as few ONNX Runtime sessions as possible), when
the BLP recomputes, the BLP without recomputation, and (`inductor=True`, CPU plans) the whole
primitive graph as one Inductor program run interleaved on the same inputs; a finalist that is
one ONNX Runtime session or one OpenVINO model also runs on the other backend and at the other
thread count (`session_backend_variants`, `session_thread_variants`). The winner
is the plan with the fewest kernels among those within `margin` of the fastest: identical plans
already land up to ~8 % apart between two executors in one run (docs/results.md, noise floor),
so a smaller lead is not evidence that more kernel boundaries pay.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from tensorplan.workflows.orchestrate import make_cost, orchestrate, resolve_device
from tensorplan.runtime.plan import Plan


@dataclass
class RaceResult:
    """Medians (seconds) of the finalists, which one was kept and why."""

    median_s: dict[str, float]
    kernels: dict[str, int]
    chosen: str
    fastest: str
    margin: float
    rounds: int
    threads: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["median_ms"] = {k: v * 1e3 for k, v in d.pop("median_s").items()}
        return d


def pick_finalist(median_s: dict[str, float], kernels: dict[str, int], margin: float) -> tuple[str, str]:
    """(chosen, fastest): the fewest-kernel finalist among those within `margin` of the fastest."""
    fastest = min(median_s, key=median_s.get)
    near = [k for k, v in median_s.items() if v <= median_s[fastest] * (1 + margin)]
    return min(near, key=lambda k: (kernels[k], median_s[k])), fastest


def finalists(model: Any, plan: Plan, cost: Any, **opts) -> dict[str, Plan]:
    """The BLP's `plan` and its alternatives made from the same costs (cached: no new profiling)."""
    quiet = {**opts, "progress": False, "log": None}
    out = {"blp": plan}
    fewest = orchestrate(model, cost=cost, **{**quiet, "kernel_overhead_s": 1.0})
    if len(fewest.kernels) != len(plan.kernels):
        out["fewest-kernels"] = fewest
    if len(plan.kernels) > 1 and opts.get("recompute", True) and plan.stats.get("recomputed_primitives"):
        norec = orchestrate(model, cost=cost, **{**quiet, "recompute": False})
        if len(norec.kernels) > 1 and norec.stats.get("recomputed_primitives") == 0:
            out["blp-no-recompute"] = norec
    return out


def session_thread_variants(cands: dict[str, Plan], threads: int) -> dict[str, Plan]:
    """`cands` plus, for each finalist that is one ONNX Runtime session, the same session at the other
    thread count (`NAME@Nt`). Why: regions are profiled with spinning off, where one thread often wins
    (no worker to wake per operator); a plan that is one session spins (`orchestrate`), and then full
    threads can win instead. The race measures both rather than trusting either solo profile."""
    out = dict(cands)
    if threads <= 1:
        return out
    for name, p in cands.items():
        if len(p.kernels) == 1 and p.kernels[0].backend == "ort":
            cur = int(p.kernels[0].schedule.get("threads", threads))
            other = 1 if cur != 1 else threads
            v = Plan.from_dict(p.to_dict())
            v.kernels[0].schedule["threads"] = other
            out[f"{name}@{other}t"] = v
    return out


REGION_BACKENDS = ("ort", "openvino")


def session_backend_variants(cands: dict[str, Plan]) -> dict[str, Plan]:
    """`cands` plus, for each finalist that is one region kernel (the whole model as one ONNX Runtime
    session or one OpenVINO model), the same operators on the other region backend (`NAME@BACKEND`).

    Why: the BLP picks a region's backend from solo timings of the *regions* it enumerates, taken
    one after another, often sessions apart; the whole graph as one session is not among them, and
    the two backends' costs can be timed under different machine load. On YOLOX-nano the BLP chose
    two OpenVINO regions (4.1 ms predicted) while ONNX Runtime runs the same rewritten graph in 3.6
    (one interleaved run). The race times both end to end instead of trusting either profile."""
    from tensorplan.kernels.openvino import available
    out = dict(cands)
    for name, p in cands.items():
        if len(p.kernels) != 1 or p.kernels[0].kind != "region" or p.kernels[0].backend not in REGION_BACKENDS:
            continue
        for b in REGION_BACKENDS:
            if b == p.kernels[0].backend or (b == "openvino" and not available()):
                continue
            v = Plan.from_dict(p.to_dict())
            k = v.kernels[0]
            keep = {key: k.schedule[key] for key in ("operators", "span") if key in k.schedule}
            # one ORT session is the whole plan: it spins between operators (orchestrate does the same)
            k.backend, k.schedule = b, {**keep, **({"spinning": True} if b == "ort" else {})}
            out[f"{name}@{b}"] = v
    return out


def whole_graph_inductor(plan: Plan, prim: Any, threads: int = 2) -> Plan:
    """The whole (rewritten, fissioned) primitive graph as one Inductor-compiled program on the CPU.

    Why a finalist: on a CPU, PyTorch's compiler fuses the elementwise tails into its convolution
    and GEMM calls across the whole graph, which no set of separately timed kernels captures; fed
    the rewritten graph (fewer FLOPs than the model as given) it can beat both ONNX Runtime and
    `torch.compile` of the original module. Its predicted time is its own solo median."""
    from tensorplan.measure.timer import measure, pinned_threads
    from tensorplan.runtime.plan import PlanKernel, plan_buffers, verify
    from tensorplan.kernels.torch_kernel import build_kernel, example_inputs
    import torch
    nodes = [n.name for n in prim.nodes]
    with pinned_threads(threads):
        k = build_kernel(prim, nodes, list(prim.inputs), list(prim.outputs), device="cpu", compile=True)
        xs = example_inputs(prim, prim.inputs, "cpu")
        with torch.inference_mode():
            solo = measure(lambda: k(*xs), warmup=2, budget_s=0.3).median_s
    d = plan.to_dict()
    whole = Plan.from_dict(d)
    whole.kernels = [PlanKernel(id="k0", nodes=nodes, inputs=list(prim.inputs), outputs=list(prim.outputs),
                                kind="memory" if not any(n.op in ("Conv", "MatMul", "Gemm", "ConvTranspose")
                                                         for n in prim.nodes) else "linear",
                                predicted_s=float(solo), backend="torch-inductor",
                                schedule={"device": "cpu", "whole_graph": True})]
    whole.order = ["k0"]
    whole.solver = {**plan.solver, "finalist": "inductor-whole-graph"}  # the BLP it was raced against
    regions = dict(plan.stats.get("ort_regions") or {})
    regions.update(selected=0, kernels_after_merge=0, primitives=0)
    whole.stats = {**plan.stats, "recomputed_primitives": 0, "ort_regions": regions}
    verify(whole, prim)
    plan_buffers(whole, prim)
    return whole


def orchestrate_raced(model: Any, *, threads: int = 2, rounds: int = 15, margin: float = 0.10,
                      burst_s: float = 0.03, feeds: dict[str, np.ndarray] | None = None,
                      race: bool = True, inductor: bool = True, log: Callable[[str], None] | None = None,
                      **opts) -> tuple[Plan, RaceResult | None]:
    """`plan.orchestrate(model, **opts)`, then the finalists' race (module docstring).

    Returns (kept plan, race result or None when there was only one finalist or `race` is
    False). The kept plan records the race in `stats["race"]` and its time in `timing["race_s"]`.
    `feeds` default to `graph.reference.random_feeds` of the plan's primitive graph."""
    from tensorplan.runtime.executor import race_plans

    cm = make_cost(opts.pop("cost", None), resolve_device(opts.get("device", "local")), opts.pop("store", None))
    plan = orchestrate(model, cost=cm, log=log, **opts)
    if not race or not getattr(cm, "races", True):
        return plan, None
    t0 = time.perf_counter()
    cands = session_thread_variants(session_backend_variants(finalists(model, plan, cm, **opts)), threads)
    if len(cands) == 1 and not inductor:
        return plan, None
    prim = plan.primitive_graph()
    if inductor:
        try:
            cands["inductor"] = whole_graph_inductor(plan, prim, threads=threads)
        except Exception as e:  # noqa: BLE001 - a graph Inductor cannot build is simply no finalist
            if log:
                from tensorplan.errors import UnsupportedOperatorError
                why = (f"{type(e).__name__}: {str(e)[:200]}" if not isinstance(e, UnsupportedOperatorError) else
                       "no PyTorch rule for " + ", ".join(f"{op} (node '{name}')" for name, op in e.ops[:5]))
                log(f"race: no Inductor finalist ({why})")
    if len(cands) == 1:
        return plan, None
    if feeds is None:
        from tensorplan.ir.reference import random_feeds
        feeds = random_feeds(prim, seed=0)
    _, med = race_plans(cands, prim, feeds, threads=threads, rounds=rounds, burst_s=burst_s)
    n_kernels = {k: len(p.kernels) for k, p in cands.items()}
    chosen, fastest = pick_finalist(med, n_kernels, margin)
    result = RaceResult(median_s=med, kernels=n_kernels, chosen=chosen, fastest=fastest, margin=margin,
                        rounds=rounds, threads=threads, seconds=time.perf_counter() - t0)
    if log:
        log(f"race: {', '.join(f'{k} {v * 1e3:.3f} ms ({n_kernels[k]} kernels)' for k, v in med.items())}"
            f" -> {chosen}" + (f" (fewer kernels, within {margin:.0%} of {fastest})" if chosen != fastest else "")
            + f" ({result.seconds:.1f}s)")
    kept = cands[chosen]
    kept.stats["race"] = result.to_dict()
    # the optimisation time is the BLP's pipeline plus the race (finalists' solves included)
    kept.timing = {**{k: v for k, v in plan.timing.items() if k != "total_s"}, "race_s": result.seconds,
                   "total_s": plan.timing.get("total_s", 0.0) + result.seconds}
    return kept, result


__all__ = ["RaceResult", "finalists", "orchestrate_raced", "pick_finalist", "session_backend_variants",
           "session_thread_variants",
           "whole_graph_inductor"]
