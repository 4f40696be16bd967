"""Finalists' race: the BLP's plan is checked end to end against its nearest alternatives.

Why: the BLP minimises a sum of *solo* kernel timings. Inside a running plan every kernel
boundary costs more than solo timings show (thread pools waking, cold caches), so a plan that
wins on paper can lose on the machine. Before a plan is kept, the BLP's plan, the plan with the
fewest kernels (the BLP with 1 s per kernel: as few ONNX Runtime sessions as possible), when
the BLP recomputes, the BLP without recomputation, and (`race_inductor`, CPU plans) the whole
primitive graph as one Inductor program run interleaved on the same inputs; a finalist that is
one ONNX Runtime session or one OpenVINO model also runs on the other backend and at the other
thread count (`session_backend_variants`, `session_thread_variants`). The winner
is the plan with the fewest kernels among those within `margin` of the fastest: identical plans
already land up to ~8 % apart between two executors in one run (docs/results.md, noise floor),
so a smaller lead is not evidence that more kernel boundaries pay.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tensorplan.devices import usable_cores
from tensorplan.ir.graph import Graph
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
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["median_ms"] = {k: v * 1e3 for k, v in d.pop("median_s").items()}
        return d


def pick_finalist(median_s: dict[str, float], kernels: dict[str, int], margin: float) -> tuple[str, str]:
    """(chosen, fastest): the fewest-kernel finalist among those within `margin` of the fastest."""
    fastest = min(median_s, key=median_s.get)
    near = [k for k, v in median_s.items() if v <= median_s[fastest] * (1 + margin)]
    return min(near, key=lambda k: (kernels[k], median_s[k])), fastest


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
            v = p.copy()
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
        if (len(p.kernels) != 1 or p.kernels[0].kind != "region" or p.kernels[0].backend not in REGION_BACKENDS
                or p.kernels[0].precision != "fp32"):    # a quantized / bf16 region keeps its backend
            continue
        for b in REGION_BACKENDS:
            if b == p.kernels[0].backend or (b == "openvino" and not available()):
                continue
            v = p.copy()
            k = v.kernels[0]
            keep = {key: k.schedule[key] for key in ("operators", "span") if key in k.schedule}
            # one ORT session is the whole plan: it spins between operators (orchestrate does the same)
            k.backend, k.schedule = b, {**keep, **({"spinning": True} if b == "ort" else {})}
            out[f"{name}@{b}"] = v
    return out


def whole_graph_inductor(plan: Plan, threads: int | None = None) -> Plan:
    """The whole (rewritten, fissioned) primitive graph of `plan` as one Inductor-compiled program on
    the CPU.

    Why a finalist: on a CPU, PyTorch's compiler fuses the elementwise tails into its convolution
    and GEMM calls across the whole graph, which no set of separately timed kernels captures; fed
    the rewritten graph (fewer FLOPs than the model as given) it can beat both ONNX Runtime and
    `torch.compile` of the original module. Its predicted time is its own solo median."""
    import torch

    from tensorplan.kernels.torch_kernel import build_kernel, example_inputs
    from tensorplan.measure.timer import measure, pinned_threads
    from tensorplan.runtime.buffers import plan_buffers
    from tensorplan.runtime.plan import PlanKernel, verify
    prim = plan.primitive_graph()
    nodes = [n.name for n in prim.nodes]
    with pinned_threads(int(threads or usable_cores())):
        k = build_kernel(prim, nodes, list(prim.inputs), list(prim.outputs), device="cpu", compile=True)
        xs = example_inputs(prim, prim.inputs, "cpu")
        with torch.inference_mode():
            solo = measure(lambda: k(*xs), warmup=2, budget_s=0.3).median_s
    whole = plan.copy()
    whole.kernels = [PlanKernel(id="k0", nodes=nodes, inputs=list(prim.inputs), outputs=list(prim.outputs),
                                kind="memory" if not any(n.op in ("Conv", "MatMul", "Gemm", "ConvTranspose")
                                                         for n in prim.nodes) else "linear",
                                predicted_s=float(solo), backend="torch-inductor",
                                schedule={"device": "cpu", "whole_graph": True})]
    whole.order = ["k0"]
    whole.buffers, whole.slots = [], []       # the BLP plan's buffers: planned again below
    whole.solver = {**plan.solver, "finalist": "inductor-whole-graph"}  # the BLP it was raced against
    regions = dict(plan.stats.get("ort_regions") or {})
    regions.update(selected=0, kernels_after_merge=0, primitives=0)
    whole.stats = {**plan.stats, "recomputed_primitives": 0, "ort_regions": regions}
    verify(whole, prim)
    plan_buffers(whole, prim)
    return whole


def race_plans(plans: dict[str, Plan], prim: Graph, feeds: dict[str, np.ndarray], threads: int | None = None,
               rounds: int = 7, pause_s: float = 0.05, burst_s: float = 0.0) -> tuple[str, dict[str, float]]:
    """Run several plans of one model interleaved (random order per round, a pause before each
    run, as the benchmark does) and return (fastest name, median seconds per plan).

    Why: the BLP adds solo kernel timings, and inside a running plan every kernel boundary
    costs more than solo timings show (thread pools waking, cold caches); a plan that looks
    cheaper on paper can run slower. Measuring the finalists end to end is the proof."""
    from tensorplan.measure.timer import interleaved, pinned_threads
    from tensorplan.runtime.executor import PlanExecutor
    from tensorplan.runtime.torch_runner import TorchPlanRunner, is_torch_plan
    threads = int(threads or usable_cores())
    with pinned_threads(threads):
        runs = {}
        for name, p in plans.items():
            if is_torch_plan(p):
                r = TorchPlanRunner(p, prim, device=p.kernels[0].schedule["device"], cuda_graph=False)
                r.bind(feeds)
                runs[name] = r.replay
                continue
            ex = PlanExecutor(p, prim, threads=threads)
            ex.set_inputs(feeds)
            runs[name] = ex.run_bound
        times = interleaved(runs, rounds, pause_s=pause_s, burst_s=burst_s)
    med = {n: statistics.median(v) for n, v in times.items()}
    return min(med, key=med.get), med


def run_race(cands: dict[str, Plan], prim: Graph, feeds: dict[str, np.ndarray], *, threads: int | None = None,
             rounds: int = 15, margin: float = 0.10, burst_s: float = 0.03) -> RaceResult:
    """Race the finalists end to end and pick the one to keep (`pick_finalist`)."""
    threads = int(threads or usable_cores())
    _, med = race_plans(cands, prim, feeds, threads=threads, rounds=rounds, burst_s=burst_s)
    n_kernels = {k: len(p.kernels) for k, p in cands.items()}
    chosen, fastest = pick_finalist(med, n_kernels, margin)
    return RaceResult(median_s=med, kernels=n_kernels, chosen=chosen, fastest=fastest, margin=margin,
                      rounds=rounds, threads=threads)


__all__ = ["RaceResult", "pick_finalist", "race_plans", "run_race", "session_backend_variants",
           "session_thread_variants", "whole_graph_inductor"]
