"""`optimize` on a CUDA GPU: the GPU's CDMPP predictor prices every candidate, PyTorch times what decides.

Why: Korch on a GPU (`orchestrate` with `cost.torch_device.TorchDeviceCost`) compiles every unique
candidate with Inductor and times it, ~0.6 s each on an H100 (bench/results/korch_gpu.json), so a
model with thousands of candidates takes half an hour. Here the shipped H100 CDMPP model prices the
memory kernels (their CUDA programs drawn from TVM's design space and ranked, `cost.tuned`), a work
model that starts at the roofline and is refitted on every timing prices the linear ones
(cuDNN/cuBLAS), and the lazy loop (`workflows.lazy_loop`) times the solution's kernels with PyTorch
until the solution stops changing. The predictions rank TVM's programs while Inductor's run: they
choose what to time, the timings choose the plan. The plan replays as one CUDA graph, so no
plan-time overhead term is added (a kernel's CUDA-graph time is what it costs inside the plan).
The kept plan is checked against ONNX Runtime and timed, interleaved, against `torch.compile`
(default and with CUDA graphs) on the same GPU.

Pricing draws CUDA schedules with TVM. A GPU machine without TVM plans from predictions made
elsewhere into the same store: `price_only=True` (`tensorplan optimize MODEL --device h100
--price-only --store S`) prices on any machine, then `--device cuda --price-as h100 --store S` on
the GPU reads them (bench/gpu_step3_optimize.py does exactly that).
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tensorplan import devices
from tensorplan.errors import PlanError, TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.runtime.plan import Plan
from tensorplan.workflows.lazy_loop import MEASURE_UNTIL, measure_what_decides, priced_problem
from tensorplan.workflows.optimize_summary import OptimizeSummary
from tensorplan.workflows.orchestrate import solve_problem

GPU_SAMPLES = 16          # CUDA schedules drawn per memory kernel (the search stops earlier when stable)
PRICE_AS = "h100"         # the GPU the shipped GPU predictor learnt: what an unknown GPU is priced as


def pricing_device(spec: Any, price_as: str | None, say: Callable[[str], None]) -> Any:
    """The GPU whose predictions price the candidates: `price_as`, else the catalog GPU this one is
    (an H100 is priced as itself), else the shipped predictor's GPU, said."""
    if price_as:
        ps = devices.device(price_as)
    elif not devices.is_local(spec):
        ps = spec
    elif (spec.extra or {}).get("catalog"):
        ps = devices.device(spec.extra["catalog"])
    else:
        say(f"{spec.model or spec.name} is not in the device catalog: its kernels are priced as '{PRICE_AS}' "
            "(pass --price-as to choose)")
        ps = devices.device(PRICE_AS)
    if ps.kind != "gpu":
        raise TensorplanError(f"--price-as '{price_as}': '{ps.name}' is a {ps.kind}, not a GPU; name a GPU "
                              "such as h100")
    return ps


def optimize_gpu(g: Graph, spec: Any, *, budget_s: float, t_start: float, phases: dict[str, float],
                 store: Any = None, samples: int | None = None, max_nodes: int = 8, max_reduces: int | None = 2,
                 time_limit: float | None = None, feeds: dict[str, np.ndarray] | None = None, peers: bool = True,
                 opset: int = 17, out_dir: str | Path | None = None, price_as: str | None = None,
                 price_only: bool = False, torch_device: str | None = None, compile: bool = True,
                 jobs: int | None = None, progress: bool = False, say: Callable[[str], None] = lambda m: None) -> Plan:
    """`workflows.optimize.optimize` for a GPU `spec` (module docstring). `price_only`: price every
    candidate into the store and return the plan solved on predictions alone (no GPU needed, nothing
    timed or checked). `torch_device`: where kernels are built and timed (default 'cuda'; 'cpu' runs
    the same loop with PyTorch's CPU kernels, a dry run of the GPU path on a machine without one).
    `jobs`: processes that compile a round's kernels in parallel before they are timed one by one
    (default: every usable core but two, at most 12, on a GPU; 1 on a CPU, whose cores time them)."""
    from tensorplan.cost.lazy import LazyCost, PredictedCost
    from tensorplan.measure.store import Store

    local = devices.is_local(spec)
    if not local and not price_only and torch_device is None:
        raise TensorplanError(f"optimize times the kernels that decide on the GPU itself, and '{spec.name}' is not "
                              "this machine's: run it where that GPU is with --device cuda, or here with "
                              "--price-only to price the candidates into the store that run reads (--store)")
    budget = float(budget_s)
    deadline = t_start + budget
    price_spec = pricing_device(spec, price_as, say)
    st = store if isinstance(store, Store) else Store(store)
    predicted = PredictedCost(device=price_spec, store=st, samples=int(samples if samples is not None else GPU_SAMPLES))
    if price_only:
        cm: Any = predicted
    else:
        from tensorplan.cost.torch_device import TorchDeviceCost
        tdev = torch_device or "cuda"
        _fp32_only(tdev)
        if jobs is None:
            jobs = max(1, min(12, devices.usable_cores() - 2)) if tdev.startswith("cuda") else 1
        cm = LazyCost(predicted, measured=TorchDeviceCost(tdev, compile=compile, store=st, log=say, jobs=int(jobs)))
    threads = devices.usable_cores()
    problem = priced_problem(g, spec, cm, phases=phases, threads=threads, max_nodes=max_nodes,
                             max_reduces=max_reduces, regions=False, progress=progress, say=say)
    cands = problem.cands
    uniq = {c.canonical_hash for c in cands}
    tst = predicted.tuned.stats
    say(f"priced {len(uniq)} kernels as '{price_spec.name}': {tst.get('searched', 0)} CUDA kernels' schedules "
        f"sampled now, {tst.get('cache_hits', 0)} predicted before ({phases['predict_s']:.1f}s)")
    solve_limit = float(time_limit or max(5.0, min(60.0, 0.05 * budget)))
    solve = dict(method="blp", recompute=True, cuts=True, time_limit=solve_limit, require_optimal=False,
                 kernel_overhead_s=0.0)
    iterations, stop = [], "price-only"
    if not price_only:
        iterations, stop = measure_what_decides(problem, cm, None, deadline=t_start + MEASURE_UNTIL * budget,
                                                time_limit=solve_limit, progress=progress, say=say)
        problem.costs = np.array(cm.cost_many(problem.prim, cands), dtype=np.float64)
    phases["measure_s"] = sum(it.measure_s for it in iterations)
    phases["solve_s"] = sum(it.solve_s for it in iterations)
    plan = solve_problem(problem, say=say, **solve)
    measured = cm.stats["measured"] if not price_only else 0
    summary = OptimizeSummary(
        model=str(g.source or g.name), device=str(spec.name), budget_s=budget, samples=int(predicted.tuned.samples),
        draws=int(tst.get("draws", 0)), searched=int(tst.get("searched", 0)), top_k=0, candidates=len(cands),
        unique_kernels=len(uniq), measured=int(measured), from_store=int(cm.stats["from_store"]) if not price_only else 0,
        stop=stop, iterations=iterations, phases=phases, solo_sum_ms=plan.predicted_s * 1e3)
    plan.stats["gpu"] = {"priced_as": price_spec.name, "torch_device": None if price_only else torch_device or "cuda",
                         "kernels": _priced_vs_timed(plan, cands, cm)}
    if not price_only:
        _check_and_time(plan, problem.prim, summary, feeds, device=torch_device or "cuda", compile=compile,
                        peers=peers, opset=opset, deadline=deadline, say=say)
    plan.stats["cost_model"] = cm.describe()
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        summary.artifacts = {"plan": str(out / "plan.json"), "report": str(out / "report.html")}
    summary.total_s = time.perf_counter() - t_start
    plan.timing["total_s"] = summary.total_s
    plan.stats["optimize"] = summary.to_dict()
    if out is not None:     # the saved plan and report carry the final summary
        from tensorplan.workflows.optimize_report import write_optimize_report
        out.mkdir(parents=True, exist_ok=True)
        plan.save(out / "plan.json")
        write_optimize_report(plan, summary, out / "report.html")
    if price_only:
        say(f"price-only: {len(uniq)} kernels priced into {st.path}; the plan on predictions has "
            f"{len(plan.kernels)} kernels, {plan.predicted_s * 1e3:.3f} ms predicted (not timed, not checked)")
    else:
        say(f"optimize: {summary.total_s:.1f}s of a {budget:.0f}s budget; timed {summary.measured} of "
            f"{summary.unique_kernels} kernels ({100 * summary.measured_share:.1f}%), {len(iterations)} solves, "
            f"stopped: {stop}")
    return plan


def _fp32_only(device: str) -> None:
    """TF32 off (cuDNN convolutions default to it): fp32 kernels agree with ONNX Runtime to 1e-4."""
    import torch
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise TensorplanError(f"device '{device}': no CUDA GPU is visible to torch on this machine")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def _priced_vs_timed(plan: Plan, cands: list, cm: Any) -> list[dict[str, Any]]:
    """Per kernel of the plan: its predicted and (when timed) measured milliseconds, and who priced it."""
    by_id = {c.id: c for c in cands}
    pred = getattr(cm, "predicted_s", None)
    meas = getattr(cm, "measured_s", None)
    priced_by = getattr(cm, "predicted", cm)
    rows = []
    for k in plan.kernels:
        c = by_id.get(k.candidate)
        if c is None:
            continue
        p = pred(c) if callable(pred) else float(k.predicted_s)
        m = meas(c) if callable(meas) else None
        rows.append({"kernel": k.id, "kind": c.kind, "primitives": len(c.nodes),
                     "by": "cdmpp" if priced_by.by_tuned(c) else "work model",
                     "predicted_ms": None if p is None or not math.isfinite(p) else p * 1e3,
                     "measured_ms": None if m is None or not math.isfinite(m) else m * 1e3})
    return rows


def _check_and_time(plan: Plan, prim: Graph, summary: OptimizeSummary, feeds: dict[str, np.ndarray] | None, *,
                    device: str, compile: bool, peers: bool, opset: int, deadline: float,
                    say: Callable[[str], None]) -> None:
    """Run the plan on the device against ONNX Runtime on the model as given (a disagreement is an
    error, never a plan), then time it against torch.compile on the same device, interleaved."""
    import torch

    from tensorplan.ir.reference import default_tolerance, random_feeds, rel_error
    from tensorplan.runtime.executor import ort_reference
    from tensorplan.runtime.torch_runner import TorchPlanRunner
    from tensorplan.workflows.peers import runners_of, time_interleaved, torch_compile_peer

    t0 = time.perf_counter()
    model_graph = plan.model_graph()
    feeds = feeds if feeds is not None else random_feeds(model_graph, seed=0)
    runner = TorchPlanRunner(plan, prim, device=device, compile=compile)
    runner.bind(feeds)
    outs = runner.outputs_numpy(runner.replay())
    ref = ort_reference(plan, feeds)
    errs = [float(rel_error(np.atleast_1d(outs[o]), np.atleast_1d(ref[o]))) for o in prim.outputs if o in ref]
    tol = default_tolerance(prim)
    summary.max_rel_err = max(errs) if errs else None
    summary.tolerance, summary.reference = tol, plan.reference_model()[1]
    summary.phases["verify_s"] = time.perf_counter() - t0
    if summary.max_rel_err is None or summary.max_rel_err > tol:
        raise PlanError(f"the optimized GPU plan for '{summary.model}' disagrees with ONNX Runtime on "
                        f"{summary.reference}: max relative error {summary.max_rel_err} > {tol:g}; this is a "
                        "tensorplan bug, please report it with the model")
    say(f"verified against ONNX Runtime on {summary.reference}: max relative error {summary.max_rel_err:.2e}")
    t0 = time.perf_counter()
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)

    def run_plan():
        runner.replay()
        sync()
    found = []
    if peers:
        args = [feeds[n] for n in model_graph.inputs]
        found.append(torch_compile_peer(model_graph, opset, args, ref, say, device=device))
        if runner.device.type == "cuda" and time.perf_counter() < deadline:
            found.append(torch_compile_peer(model_graph, opset, args, ref, say, device=device, mode="reduce-overhead"))
    with torch.inference_mode():
        timings = time_interleaved({"tensorplan": run_plan, **runners_of(found)}, peers=found,
                                   labels={"tensorplan": "tensorplan plan" + (" (one CUDA graph)"
                                                                              if runner.use_graph else "")})
    mine = timings.runners["tensorplan"]
    mine.precision, mine.max_rel_error = "fp32", summary.max_rel_err
    summary.take_timings(timings, found)
    summary.phases["peers_s"] = time.perf_counter() - t0
    say(summary.timed_line())


__all__ = ["GPU_SAMPLES", "PRICE_AS", "optimize_gpu", "pricing_device"]
