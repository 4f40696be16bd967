"""`optimize`: one call from a model to a deployable, verified plan within a time budget.

Why: a fully measured `orchestrate` compiles and times every unique candidate kernel, although
the solver keeps a few percent of them. Here CDMPP prices the TIR kernels over sampled schedules
and a fitted work model prices the rest (`cost.lazy.PredictedCost`); the BLP is solved on the
predictions, the kernels of the solution (and, while time allows, of the runner-up solution) are
compiled and timed, the measurements replace the predictions and the BLP is solved again, until
the solution uses measured kernels only and stops changing, or the measurement budget ends.
The finalists then race end to end, the kept plan is checked against ONNX Runtime on the model
as given and timed against the runtimes users would otherwise deploy (`workflows.peers`), and
the plan, the deployable file and the HTML report are written. With a reduced precision requested,
the kept plan's heaviest kernels are re-priced at bf16/fp16/int8 under an accuracy budget between
the race and the check (`workflows.precision_search`).

Budget: ~30 % of `budget_s` sizes the schedule sampling, measurement stops at ~70 %, the race,
the check and the peers' timing take the rest (each phase's seconds are in the plan's
`stats["optimize"]["phases"]`). With a reduced precision, measurement stops at ~50 % and the
precision search at ~85 %.
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
from tensorplan.workflows.lazy_loop import MEASURE_UNTIL, Iteration, measure_what_decides, priced_problem
from tensorplan.workflows.optimize_summary import OptimizeSummary
from tensorplan.workflows.orchestrate import race_finalists, solve_problem
from tensorplan.workflows.precision_search import FP32_RUNNER
from tensorplan.workflows.precision_search import check_arguments as check_precision_arguments
from tensorplan.zoo.specs import as_graph

SAMPLE_SHARE = 0.30      # of the budget: schedule sampling + featurising + prediction
MEASURE_UNTIL_PRECISION = 0.50   # the same when a reduced precision is searched after the race
PRECISION_UNTIL = 0.85   # of the budget: the precision search stops trying new variants after this
PRECISION_MIN_SHARE = 0.10       # ... but has at least this share of the budget after the race
RACE_MIN_SHARE = 0.10      # of the budget left, or the race is skipped (the budget holds)
INDUCTOR_MIN_SHARE = 0.25  # of the budget left, or the race leaves out the torch.compile finalist


def parse_budget(text: str | float | int) -> float:
    """'10m', '90s', '1h', '600' -> seconds (> 0); a clear error otherwise."""
    if isinstance(text, (int, float)):
        val = float(text)
    else:
        t = str(text).strip().lower()
        scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:], None)
        try:
            val = float(t[:-1]) * scale if scale else float(t)
        except ValueError:
            raise TensorplanError(f"budget '{text}': give seconds or a duration such as 90s, 10m, 1h") from None
    if not (val > 0 and math.isfinite(val)):
        raise TensorplanError(f"budget '{text}': must be a positive duration")
    return val


def optimize(model: str | Path | Graph, *, device: Any = "local", budget_s: float | str = 600.0,
             out_dir: str | Path | None = None, store: Any = None, threads: int | None = None,
             input_shapes: dict[str, tuple[int, ...]] | None = None, opset: int = 17,
             samples: int | None = None, top_k: int = 3, race: bool = True, peers: bool = True, regions: bool = True,
             max_nodes: int = 8, max_reduces: int | None = 2, time_limit: float | None = None,
             feeds: dict[str, np.ndarray] | None = None, progress: bool = False,
             log: Callable[[str], None] | None = None, ray_address: str | None = None, precision: str = "fp32",
             tolerance: float = 0.02, calibration: str | Path | None = None, price_as: str | None = None,
             price_only: bool = False) -> Plan:
    """Plan `model` (a `Graph`, ONNX path, zoo name or PyTorch factory) on `device` within `budget_s`
    seconds (or '10m'); returns the verified plan, its summary in `plan.stats["optimize"]`
    (`OptimizeSummary.from_plan`).

    `samples`: schedules sampled per TIR kernel (default: what the budget affords, 4..32); `top_k`:
    the predicted-fastest schedules timed per chosen TIR kernel. `regions=False` plans with Korch's
    own kernels only (no ONNX Runtime / OpenVINO regions). `race`: the finalists race end to end;
    `peers`: the kept plan is timed against ONNX Runtime, OpenVINO and torch.compile on the original
    model. `out_dir`: writes `plan.json`, `report.html` and, when ONNX Runtime runs the whole plan,
    the plan as one ONNX file (`model.onnx`); otherwise the plan JSON is the artifact (`tensorplan
    run`). `store`: the measurement store (default the project's); `feeds`: the inputs the race, the
    check and the timing use (default seeded random). `ray_address`: the kernels that decide are
    compiled and timed on that Ray cluster's workers offering this device (`measure.cluster`).

    `precision`: "fp32" (default), one of "bf16", "fp16", "int8", or "auto" (every precision this
    CPU runs natively): after the fp32 plan is chosen, each of its heaviest kernels gets the fastest
    (backend, precision) whose model outputs on the calibration inputs stay within `tolerance` of
    ONNX Runtime fp32 on the model as given (normalised max error: max |out - ref| / max |ref|); every
    variant tried is recorded with its accuracy (`workflows.precision_search`, `plan.stats["precision"]`).
    `calibration`: a directory of inputs (one .npz per sample, or NAME.npy per input with a leading
    sample axis); without one, 8 random samples are drawn, with a warning (they measure numerical
    drift, not task accuracy). With a reduced precision the race, the check and the timing run on the
    first calibration sample unless `feeds` is given.

    On a GPU (`device` 'cuda', `workflows.optimize_gpu`) the shipped GPU predictor prices the
    candidates (as `price_as`, default the catalog GPU this one is) and PyTorch builds and times the
    kernels that decide; `price_only` with a catalog GPU ('h100') prices them into the store on any
    machine, for a GPU machine without TVM to plan from. fp32 only, no regions, no race."""
    from tensorplan.cost.lazy import LazyCost, PredictedCost
    from tensorplan.ir.reference import random_feeds

    say = log or (lambda msg: None)
    budget = parse_budget(budget_s)
    t_start = time.perf_counter()
    deadline = t_start + budget
    phases: dict[str, float] = {}
    check_precision_arguments(precision, tolerance)
    if precision == "fp32" and calibration is not None:
        raise TensorplanError(f"calibration '{calibration}' calibrates reduced precision, which --precision fp32 does "
                              "not use: pass --precision auto (or bf16, fp16, int8) with it, or leave it out")

    t0 = time.perf_counter()
    g = as_graph(model, input_shapes, opset)
    phases["load_s"] = time.perf_counter() - t0
    say(f"loaded {g.source or g.name}: {len(g.nodes)} operators ({phases['load_s']:.2f}s)")
    cal = None
    if precision != "fp32":   # read (and refused) before any time is spent planning
        from tensorplan.precision.calibration import load_calibration
        cal = load_calibration(g, calibration)
        if cal.warning:
            _warn(f"calibration: {cal.warning}", log)
        say(f"calibration: {cal.source}")
    spec = devices.device(device)
    if spec.kind == "gpu":
        if precision != "fp32" or ray_address:
            raise TensorplanError(f"optimize on a GPU ('{spec.name}') plans fp32 kernels on this machine only: "
                                  "leave out --precision and --ray")
        from tensorplan.workflows.optimize_gpu import optimize_gpu
        return optimize_gpu(g, spec, budget_s=budget, t_start=t_start, phases=phases, store=store, samples=samples,
                            max_nodes=max_nodes, max_reduces=max_reduces, time_limit=time_limit, feeds=feeds,
                            peers=peers, opset=opset, out_dir=out_dir, price_as=price_as, price_only=price_only,
                            progress=progress, say=say)
    if price_only or price_as:
        raise TensorplanError(f"--price-only and --price-as price a GPU's kernels; '{spec.name}' is a CPU, whose "
                              "kernels optimize prices and times here")
    local = devices.is_local(spec)
    threads = int(threads or devices.default_threads(spec))
    if cal is not None:
        from tensorplan.workflows.precision_search import precisions_to_try
        tried, _, emulated = precisions_to_try(precision, spec)
        for w in emulated:
            _warn(w, log)
        say(f"precision {precision}: trying {', '.join(tried)} within tolerance {tolerance:g}")
    from tensorplan.measure.store import Store
    st = store if isinstance(store, Store) else Store(store)
    predicted = PredictedCost(device=spec, store=st, threads=threads, samples=int(samples or 16))
    lazy = LazyCost(predicted, top_k=top_k, sample_budget_s=None if samples else SAMPLE_SHARE * budget)
    if ray_address:
        from tensorplan.measure.cluster import job_runner
        lazy.measured.runner = job_runner(ray_address)
    if not local:
        raise TensorplanError(f"optimize measures the kernels that decide on this machine, so the device must be "
                              f"this CPU ('local', 'local-<N>t'), not '{getattr(spec, 'name', device)}'; "
                              "`tensorplan orchestrate --cost predicted` plans another device from predictions only")
    problem = priced_problem(g, spec, lazy, phases=phases, threads=threads, max_nodes=max_nodes,
                             max_reduces=max_reduces, regions=regions, progress=progress, say=say)
    cands = problem.cands
    uniq = {c.canonical_hash for c in cands}
    tst = predicted.tuned.stats
    say(f"predicted {len(uniq)} kernels: {tst.get('draws', 0)} schedules sampled for "
        f"{tst.get('searched', 0)} TIR kernels (at most {predicted.tuned.samples} each, "
        f"{tst.get('cache_hits', 0)} predicted before); {lazy.stats['from_store']} kernels already measured in the "
        f"store ({phases['predict_s']:.1f}s)")

    from tensorplan.cost.plan_time import PlanTimeModel, load_runs
    plan_model = PlanTimeModel.load(st, spec, refit=True)    # fitted on the plans this store saw run
    n_runs = len(load_runs(st, spec))
    if n_runs:
        say(f"plan-time model fitted on {n_runs} plans measured end to end on this device")
    solve_limit = float(time_limit or max(5.0, min(60.0, 0.05 * budget)))
    measure_until = MEASURE_UNTIL if cal is None else MEASURE_UNTIL_PRECISION
    iterations, stop = measure_what_decides(problem, lazy, plan_model, deadline=t_start + measure_until * budget,
                                             time_limit=solve_limit, progress=progress, say=say)
    phases["measure_s"] = sum(it.measure_s for it in iterations)
    phases["solve_s"] = sum(it.solve_s for it in iterations)

    problem.costs = np.array(lazy.cost_many(problem.prim, cands), dtype=np.float64)
    problem.overhead = plan_model.overheads(problem.prim, cands, problem.costs, info=lazy.kernel_info)
    solve = dict(method="blp", recompute=True, cuts=True, time_limit=solve_limit, require_optimal=False,
                 kernel_overhead_s=0.0)
    plan = solve_problem(problem, say=say, **solve)
    if feeds is None:
        feeds = cal.feeds[0] if cal is not None else random_feeds(problem.prim, seed=0)
    finalists: dict[str, dict[str, float]] = {}

    def predicted_vs_measured(plans: dict[str, Plan], result: Any) -> None:
        for name, fin in plans.items():
            if name in result.median_s:
                finalists[name] = {"kernels": len(fin.kernels), "solo_sum_ms": fin.predicted_s * 1e3,
                                   "predicted_ms": plan_model.predict(fin, problem.prim) * 1e3,
                                   "measured_ms": result.median_s[name] * 1e3}

    left = deadline - time.perf_counter()
    if race and left < RACE_MIN_SHARE * budget:
        by_id = {c.id: c for c in cands}
        guessed = [k for k in plan.kernels if k.candidate in by_id and not lazy.is_measured(by_id[k.candidate])]
        if guessed:
            # no time to check predictions end to end: the plan with the fewest kernels (the rewritten
            # model in one runtime session) is the one a misprediction cannot make slow
            plan = solve_problem(problem, say=say, **{**solve, "kernel_overhead_s": 1.0})
            say(f"race skipped: {max(left, 0):.0f}s of the budget left and {len(guessed)} of the solution's "
                f"kernels never timed; kept the fewest-kernels plan ({len(plan.kernels)} kernels)")
        else:
            say(f"race skipped: {max(left, 0):.0f}s of the budget left; the solver's plan (all timed) is kept")
    elif race:
        t0 = time.perf_counter()
        # Inductor's finalist compiles the whole graph with torch.compile (tens of seconds)
        inductor = left > INDUCTOR_MIN_SHARE * budget
        if not inductor:
            say(f"race without the Inductor finalist: {left:.0f}s of the budget left")
        plan = race_finalists(problem, plan, solve, threads=threads, inductor=inductor, rounds=_race_rounds(deadline),
                              margin=0.10, burst_s=0.03, feeds=feeds, say=say, on_result=predicted_vs_measured)
        phases["race_s"] = time.perf_counter() - t0

    fp32_plan, search = plan, None
    if cal is not None:
        from tensorplan.workflows.precision_search import search_precision
        t0 = time.perf_counter()
        until = max(t_start + PRECISION_UNTIL * budget, t0 + PRECISION_MIN_SHARE * budget)
        plan, search = search_precision(plan, cal, precision=precision, tolerance=tolerance, threads=threads,
                                        deadline=until, spec=spec, progress=progress, say=say)
        phases["precision_s"] = time.perf_counter() - t0

    summary = OptimizeSummary(
        model=str(g.source or g.name), device=str(getattr(spec, "name", device)), budget_s=budget,
        samples=int(predicted.tuned.samples), draws=int(predicted.tuned.stats.get("draws", 0)),
        searched=int(predicted.tuned.stats.get("searched", 0)),
        top_k=int(top_k), candidates=len(cands), unique_kernels=len(uniq),
        measured=int(lazy.stats["measured"]), from_store=int(lazy.stats["from_store"]), stop=stop,
        iterations=iterations, phases=phases, solo_sum_ms=plan.predicted_s * 1e3,
        predicted_plan_ms=None if plan is not fp32_plan else plan_model.predict(plan, problem.prim) * 1e3,
        plan_model_runs=n_runs, finalists=finalists, precision=search)   # the plan-time model knows fp32 kernels
    _check_and_time(plan, summary, feeds, threads, peers=peers, opset=opset, say=say,
                    fp32_plan=fp32_plan if fp32_plan is not plan else None, calibration=cal)
    if fp32_plan is plan:   # the plan-time model learns what fp32 kernels cost inside a plan
        from tensorplan.cost.plan_time import record_plan_run
        cov = summary.timings["runners"]["tensorplan"]["cov"]
        record_plan_run(st, spec, plan, summary.measured_plan_ms / 1e3, cov, label="optimize", prim=problem.prim,
                        threads=threads)
    plan.stats["cost_model"] = lazy.describe()
    if out_dir is not None:
        t0 = time.perf_counter()
        summary.artifacts = _write(plan, Path(out_dir), threads=threads, say=say)
        phases["write_s"] = time.perf_counter() - t0
    summary.total_s = time.perf_counter() - t_start
    plan.timing["total_s"] = summary.total_s
    plan.stats["optimize"] = summary.to_dict()
    if out_dir is not None:     # the saved plan and report carry the final summary
        from tensorplan.workflows.optimize_report import write_optimize_report
        plan.save(Path(out_dir) / "plan.json")
        write_optimize_report(plan, summary, Path(out_dir) / "report.html")
    say(f"optimize: {summary.total_s:.1f}s of a {budget:.0f}s budget; measured {summary.measured} of "
        f"{summary.unique_kernels} kernels ({100 * summary.measured_share:.1f}%), {len(iterations)} solves, "
        f"stopped: {stop}")
    return plan


def _warn(msg: str, log: Callable[[str], None] | None) -> None:
    """A warning the user must see: through `log` when given (the CLI prints it on stderr), else as a
    Python warning (stderr by default)."""
    if log is not None:
        log(f"warning: {msg}")
    else:
        import warnings
        warnings.warn(msg, stacklevel=3)


def _race_rounds(deadline: float) -> int:
    """Fewer race rounds when the budget is nearly spent (never fewer than 5)."""
    left = deadline - time.perf_counter()
    return 15 if left > 60 else 9 if left > 20 else 5


def _check_and_time(plan: Plan, summary: OptimizeSummary, feeds: dict[str, np.ndarray], threads: int, *,
                    peers: bool, opset: int, say: Callable[[str], None], fp32_plan: Plan | None = None,
                    calibration: Any = None) -> None:
    """Run the kept plan against ONNX Runtime on the model as given (a disagreement is an error, never
    a plan), then time it against the peers users would otherwise deploy, interleaved. A plan with
    reduced-precision kernels is held to the search's accuracy tolerance instead of fp32 rounding, and
    is timed beside `fp32_plan` (the plan before the search) and, with `calibration`, the ONNX Runtime
    int8 peer."""
    from tensorplan.ir.reference import default_tolerance, rel_error
    from tensorplan.measure.timer import pinned_threads
    from tensorplan.runtime.executor import PlanExecutor, run_original

    t0 = time.perf_counter()
    prim = plan.check()
    data, where = plan.reference_model()
    with pinned_threads(threads):
        ex = PlanExecutor(plan, prim, threads=threads)
        outs = ex.run(feeds)
    ref = run_original(data, where, feeds, threads=threads)
    errs = [float(rel_error(np.atleast_1d(outs[o]), np.atleast_1d(ref[o]))) for o in prim.outputs if o in ref]
    tol = default_tolerance(prim)
    if summary.reduced:
        tol = max(tol, summary.precision.tolerance)
    summary.max_rel_err = max(errs) if errs else None
    summary.tolerance, summary.reference = tol, where
    summary.phases["verify_s"] = time.perf_counter() - t0
    if summary.reduced and (summary.max_rel_err is None or summary.max_rel_err > tol):
        raise PlanError(f"the reduced-precision plan for '{summary.model}' ({summary.precision.reduced}) is within "
                        f"the tolerance {tol:g} on its {summary.precision.samples} calibration samples but not on "
                        f"the check inputs (error {summary.max_rel_err} vs ONNX Runtime on {where}): pass inputs "
                        "like your data with --calibration DIR, raise --tolerance, or plan with --precision fp32")
    if summary.max_rel_err is None or summary.max_rel_err > tol:
        raise PlanError(f"the optimized plan for '{summary.model}' disagrees with ONNX Runtime on {where}: max "
                        f"relative error {summary.max_rel_err} > {tol:g}; this is a tensorplan bug, please report "
                        "it with the model (`tensorplan orchestrate` plans it with measured costs meanwhile)")
    say(f"verified against ONNX Runtime on {where}: max relative error {summary.max_rel_err:.2e}")
    t0 = time.perf_counter()
    from tensorplan.workflows.peers import peer_runners, runners_of, time_interleaved
    extra, labels = {}, {"tensorplan": "tensorplan plan"}
    with pinned_threads(threads):
        if fp32_plan is not None:        # the same plan before the precision search, in the same rounds
            ex32 = PlanExecutor(fp32_plan, prim, threads=threads)
            ex32.run(feeds)
            extra[FP32_RUNNER], labels[FP32_RUNNER] = ex32.run_bound, "tensorplan plan at fp32"
            labels["tensorplan"] = "tensorplan plan (" + ", ".join(sorted(set(summary.precision.chosen.values()))) + ")"
        int8 = calibration.feeds if calibration is not None else None   # each runtime's own int8, as users get it
        found = peer_runners(plan.model_graph(), feeds, threads, opset, int8_calibration=int8) if peers else []
        timings = time_interleaved({"tensorplan": ex.run_bound, **extra, **runners_of(found)}, peers=found,
                                   labels=labels)
    mine = timings.runners["tensorplan"]      # the plan's own row: what it computes in, its checked error
    mine.precision, mine.max_rel_error = "+".join(sorted(plan.precisions())), summary.max_rel_err
    if FP32_RUNNER in timings.runners:
        timings.runners[FP32_RUNNER].precision = "fp32"
    summary.take_timings(timings, found)
    summary.phases["peers_s"] = time.perf_counter() - t0
    say(summary.timed_line({k: timings.runners[k].median_ms for k in extra}))


def _write(plan: Plan, out: Path, *, threads: int, say: Callable[[str], None]) -> dict[str, str]:
    """The deployable artifact: one ONNX file when one runtime runs the whole plan (ONNX Runtime, or
    OpenVINO when the kept plan is one OpenVINO model of the rewritten graph), checked against ONNX
    Runtime on the original by `Plan.export`; otherwise the plan JSON (`tensorplan run`)."""
    out.mkdir(parents=True, exist_ok=True)
    arts = {"plan": str(out / "plan.json"), "report": str(out / "report.html")}
    reduced = sorted({k.precision for k in plan.kernels} - {"fp32"})
    if reduced:     # Plan.export writes fp32 operators only: the plan (and its int8 models) is the artifact
        say(f"the plan runs kernels at {', '.join(reduced)}: deploy {arts['plan']} with `tensorplan run`")
        return arts
    one = plan.kernels[0] if len(plan.kernels) == 1 else None
    outside = sorted({k.backend for k in plan.kernels} - {"ort"})
    if outside and not (one is not None and one.backend == "openvino"):   # no one-runtime file: no export
        say(f"the plan runs kernels outside ONNX Runtime ({', '.join(outside)}): deploy {arts['plan']} with "
            "`tensorplan run`")
        return arts
    onnx = out / "model.onnx"
    res = plan.export(onnx, threads=threads, check=True, rounds=0)
    if res.exact:
        arts["onnx"], arts["onnx_runtime"] = res.path, "onnxruntime"
        say(f"wrote {res.path}: {res.relation}")
    elif one is not None and one.kind == "region" and one.backend == "openvino":
        arts["onnx"], arts["onnx_runtime"] = res.path, "openvino"
        say(f"wrote {res.path}: the plan is one OpenVINO model of this file (fp32 hint, "
            f"{one.schedule.get('threads', threads)} threads): run it with OpenVINO, or the plan with `tensorplan run`")
    else:
        onnx.unlink(missing_ok=True)
        say(f"the plan runs kernels outside ONNX Runtime ({', '.join(f'{b}: {n}' for b, n in res.outside_ort.items())}"
            f"): deploy {arts['plan']} with `tensorplan run`")
    return arts


__all__ = ["Iteration", "OptimizeSummary", "optimize", "parse_budget"]
