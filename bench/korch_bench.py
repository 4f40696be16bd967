"""Korch end to end on this CPU: tensorplan plans vs ONNX Runtime, OpenVINO, PyTorch eager, torch.compile
and TVM Relax, interleaved in one run at the same thread count, plus ablations.

Per model: median latency of every system (rotating order, 50 ms pauses so spinning thread
pools park), ratio to the best fp32 baseline (the peers of tensorplan.workflows.peers: ONNX
Runtime, OpenVINO fp32, torch.compile; plus eager and Relax; OpenVINO's default precision, bf16 on
CPUs with bf16 units, is timed beside and labelled, never the baseline), a noise flag (CoV of
rounds above 10 % or load above the cores), kernels per inference, predicted (sum of profiled
kernels) vs measured end-to-end, optimisation time split (enumerate / profile / solve), and
distance to the roofline bound (FLOPs / measured peak, minimum bytes / measured bandwidth).
Ablations: no ONNX Runtime regions (Korch's kernels only), no fission, greedy fusion over the
same measured kernels, no recomputation.

Resumable: kernel timings live in the measurement store (a killed run re-profiles nothing it
already measured) and each finished model is written to `bench/results/korch_<model>.json`
(skipped on the next run unless --force). The summary goes to `bench/results/korch_bench.json`.

    .venv/bin/python bench/korch_bench.py --models candy,yolox-nano --quick
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
REFERENCE_PEAK_GFLOPS = 419.0  # best fp32 GEMM measured on this machine (MLAS, 2 threads; baselines.md)
REFERENCE_BW_GBS = 43.7        # typical 1 GiB copy bandwidth measured on this machine (baselines.md)
GEMM_PROBE, GEMM_PROBE_N = "gemm-probe", 1024  # the peak's workload, timed in every round
DEFAULT_MODELS = ["candy", "segformer-b0", "efficientvit-b1", "yolox-nano", "yolov4", "resnet-50", "bert-base"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def machine_info(threads: int) -> dict:
    import onnx
    import onnxruntime
    import torch
    import tvm

    from tensorplan.devices import device
    spec = device("local")
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu": spec.name,
            "device": spec.to_dict(), "threads": threads, "nproc": os.cpu_count(),
            "loadavg": list(os.getloadavg()),
            "versions": {"torch": torch.__version__, "tvm": tvm.__version__, "onnxruntime": onnxruntime.__version__,
                         "onnx": onnx.__version__}}


# ------------------------------------------------------------------------------------- systems
# ONNX Runtime, OpenVINO (fp32 and its default precision) and torch.compile are the peers of
# tensorplan.workflows.peers, built on the original model and checked against ONNX Runtime;
# PyTorch eager and TVM Relax stay here as extra columns.
def ort_runner(path: Path, feeds: dict, threads: int):
    """One more ONNX Runtime session as the peers build it (the `ort-control` column; also used by
    bench/korch_standalone.py): (runner, session)."""
    from tensorplan.workflows.peers import ort_cpu_session
    sess = ort_cpu_session(str(path), threads)
    f = {i.name: feeds[i.name] for i in sess.get_inputs()}
    return lambda: sess.run(None, f), sess


def eager_runner(name: str):
    import torch

    from tensorplan import zoo
    module, inputs = zoo.build_torch(name)

    def run():
        with torch.inference_mode():
            return module(*inputs)
    return run, (module, inputs)


def compile_runner(name: str, cache: Path):
    """torch.compile of zoo model `name` as the peers build it (for bench/korch_standalone.py):
    (runner, compile seconds)."""
    from tensorplan import zoo
    from tensorplan.workflows.peers import torch_compile_peer
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    g = zoo.load(name)
    feeds = zoo.numpy_inputs(name)
    peer = torch_compile_peer(g, 17, [feeds[n] for n in g.inputs], None)
    if peer.skipped:
        raise RuntimeError(f"{name}: {peer.skipped}")
    return peer.runner, peer.build_s


def relax_runner(graph, feeds: dict, threads: int):
    """TVM Relax default build (no tuning) of the constant-folded imported graph."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    from tensorplan.ir.to_onnx import graph_to_onnx
    from tensorplan.kernels.build import local_target
    t0 = time.perf_counter()
    mod = from_onnx(graph_to_onnx(graph), keep_params_in_input=False)
    ex = tvm.compile(mod, target=tvm.target.Target(local_target(threads)))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(np.ascontiguousarray(feeds[i])) for i in graph.inputs]
    build_s = time.perf_counter() - t0
    return lambda: vm["main"](*args), build_s


@contextlib.contextmanager
def no_fission_rules():
    """orchestrate() always fissions; for the ablation make it apply no rule (compound ops stay
    whole and run as opaque ONNX Runtime kernels)."""
    import tensorplan.korch  # noqa: F401 - (the package re-exports a function of the module's name)
    from tensorplan.korch.fission import fission
    orch = sys.modules["tensorplan.workflows.orchestrate"]
    old = orch.fission
    orch.fission = lambda g, rules=None: fission(g, rules={})
    try:
        yield
    finally:
        orch.fission = old


# -------------------------------------------------------------------------------------- model
def bench_model(name: str, args, store) -> dict:
    import torch

    from tensorplan.cost.measured import MeasuredCost
    from tensorplan.devices import device
    from tensorplan.ir import analysis
    from tensorplan import zoo
    from tensorplan.korch.fission import fission
    from tensorplan.ir.reference import rel_error
    from tensorplan.paths import cache_dir
    from tensorplan.workflows.orchestrate import orchestrate
    from tensorplan.runtime.executor import PlanExecutor, ort_reference
    from tensorplan.workflows.peers import peer_runners, runners_of, time_interleaved

    res: dict = {"model": name, "threads": args.threads, "quick": args.quick, "started": time.time(),
                 "loadavg_start": list(os.getloadavg())}
    torch.set_num_threads(args.threads)
    path = zoo.export(name)
    g = zoo.load(name)
    feeds = zoo.numpy_inputs(name)
    feeds = {k: v for k, v in feeds.items() if k in g.inputs}
    spec = device("local")
    flops, mbytes = analysis.graph_flops(g), analysis.min_bytes(g)
    # The device figures are measured when first resolved; on a shared machine that can be under
    # load, so the bound also uses the best ceilings ever measured here (baselines.md) when higher:
    # the tighter (smaller) bound is the honest one.
    peak = max(spec.peak_fp32_gflops, REFERENCE_PEAK_GFLOPS)
    bw = max(spec.mem_bw_gbs, REFERENCE_BW_GBS)
    roof_ms = analysis.roofline_ms(flops, mbytes, peak, bw)
    res["roofline"] = {"gflops": flops / 1e9, "min_mbytes": mbytes / 1e6, "peak_gflops": peak, "bw_gbs": bw,
                       "bound_ms": roof_ms, "device_spec_peak_gflops": spec.peak_fp32_gflops,
                       "device_spec_bw_gbs": spec.mem_bw_gbs,
                       "bound_ms_device_spec": analysis.roofline_ms(flops, mbytes, spec.peak_fp32_gflops,
                                                                    spec.mem_bw_gbs)}
    log(f"{name}: {len(g.nodes)} ops, {flops / 1e9:.2f} GFLOP, roofline {roof_ms:.2f} ms")

    cm = MeasuredCost(store=store, device=spec, threads=args.threads, budget_s=args.kernel_budget)
    plans = {}
    opts = dict(max_nodes=args.max_nodes, time_limit=args.time_limit, progress=not args.no_progress,
                linear_epilogue=args.epilogue, kernel_overhead_s=args.kernel_overhead)
    res["kernel_overhead_s"] = args.kernel_overhead
    res["kernel_overhead_from"] = args.kernel_overhead_from
    res["linear_epilogue"] = args.epilogue

    def raced(key: str, **extra) -> dict | None:
        """The plan as `tensorplan orchestrate` keeps it: the BLP's plan raced end to end against
        its finalists (tensorplan.workflows.race: fewest kernels, no recomputation; the fewest
        kernels within --race-margin of the fastest wins)."""
        plan = orchestrate(
            g, device=spec, cost=cm, log=(lambda m: log(f"  {m}")) if key == "tensorplan" else None,
            race=not args.no_race, threads=args.threads, race_rounds=args.race_rounds,
            race_margin=args.race_margin, race_burst_s=args.burst_ms / 1e3, feeds=feeds, **opts, **extra)
        plans[key] = plan
        return plan.stats.get("race")

    t0 = time.perf_counter()
    race = raced("tensorplan")
    if race:
        res["race"] = race
    res["optimise_wall_s"] = time.perf_counter() - t0
    plan_dir = cache_dir() / "plans"
    plan_dir.mkdir(parents=True, exist_ok=True)
    res["plan_path"] = str(plans["tensorplan"].save(plan_dir / f"{name}.json"))
    res["cost_stats"] = dict(cm.stats)
    prims = {"tensorplan": plans["tensorplan"].primitive_graph()}
    # what the plan computes after rewrite/passes.py (the bound above is for the model as given)
    res["roofline"]["rewritten_gflops"] = analysis.graph_flops(plans["tensorplan"].source_graph()) / 1e9
    if not args.no_ablations:
        # the exact rewrites of rewrite/passes.py off (prim graph of the original model), raced like
        # the plan itself so that the difference is the rewrites alone
        race = raced("no-rewrite", rewrite=False)
        if race:
            res["race_no_rewrite"] = race
        prims["no-rewrite"] = plans["no-rewrite"].primitive_graph()
        plans["no-regions"] = orchestrate(g, device=spec, cost=cm, regions=False, race=False, **opts)
        prims["no-regions"] = prims["tensorplan"]
        plans["greedy"] = orchestrate(g, device=spec, cost=cm, method="greedy", race=False, **opts)
        prims["greedy"] = prims["tensorplan"]
        plans["no-recompute"] = orchestrate(g, device=spec, cost=cm, recompute=False, race=False, **opts)
        prims["no-recompute"] = prims["tensorplan"]
        with no_fission_rules():
            plans["no-fission"] = orchestrate(g, device=spec, cost=cm, race=False, **opts)
        prims["no-fission"] = fission(plans["no-fission"].source_graph(), rules={}).graph

    # -- build everything, then time interleaved -------------------------------------------
    runners: dict = {}
    info: dict = {"systems": {}}
    # the peers on the original model (ONNX Runtime, OpenVINO fp32 + its default precision, torch.compile),
    # each checked against ONNX Runtime; one that fails is recorded with why
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
    peers = peer_runners(g, feeds, args.threads, torch_compile=not args.no_compile, log=lambda m: log(f"  {m}"))
    runners.update(runners_of(peers))
    info["peers"] = {p.name: {"label": p.label, "precision": p.precision, "build_s": p.build_s,
                              "max_rel_err_vs_ort": p.max_rel_error, "note": p.error_note, "skipped": p.skipped}
                     for p in peers}
    for p in peers:
        info["systems"][p.name] = ({"error": p.skipped} if p.skipped else
                                   {"compile_s": p.build_s, "precision": p.precision, "max_rel_err": p.max_rel_error})
    # a second, identical ONNX Runtime session: not a baseline but the noise floor of this run
    # (how far two identical systems timed interleaved in one process land apart)
    fn, _sess2 = ort_runner(path, feeds, args.threads)
    runners["ort-control"] = fn
    ref = ort_reference(plans["tensorplan"], feeds, threads=args.threads)
    try:
        fn, keep = eager_runner(name)
        out = fn()
        runners["pytorch"] = fn
        o0 = out[0] if isinstance(out, (tuple, list)) else (next(iter(out.values())) if isinstance(out, dict)
                                                          else getattr(out, "logits", out))
        info["systems"]["pytorch"] = {"max_rel_err_vs_ort_first_output":
                                      float(rel_error(np.asarray(o0), np.asarray(next(iter(ref.values())))))
                                      if tuple(np.asarray(o0).shape) == tuple(next(iter(ref.values())).shape)
                                      else None}
    except Exception as e:  # noqa: BLE001
        info["systems"]["pytorch"] = {"error": f"{type(e).__name__}: {e}"}
    executors = {}
    for key, plan in plans.items():
        try:
            ex = PlanExecutor(plan, prims[key], threads=args.threads)
            out = ex.run(feeds)
            errs = {o: float(rel_error(np.atleast_1d(out[o]), np.atleast_1d(ref[o]))) for o in ref if o in out}
            executors[key] = ex
            runners[key] = ex.run_bound
            info["systems"][key] = {"kernels": len(plan.kernels), "predicted_ms": plan.predicted_s * 1e3,
                                    "max_rel_err": max(errs.values()) if errs else None,
                                    "backends": ex.backend_counts(), "compile_s": ex.compile_s,
                                    "timing": plan.timing, "solver": {k: plan.solver.get(k) for k in
                                                                      ("status", "mip_gap", "solve_s", "variables")},
                                    "recomputed_primitives": plan.stats.get("recomputed_primitives"),
                                    "arena_mib": ex.arena_bytes / 2**20,
                                    "fallbacks": [n for s in ex.slots for n in s.notes][:10]}
        except Exception as e:  # noqa: BLE001
            info["systems"][key] = {"error": f"{type(e).__name__}: {str(e)[:400]}",
                                    "trace": traceback.format_exc()[-1500:]}
    # the machine's own speed, round by round: the peak's GEMM (devices.detect) timed like a system, so
    # the bound can also be taken at the speed the shared machine offered in that round
    from tensorplan.devices.detect import GEMM_BACKENDS
    runners[GEMM_PROBE] = GEMM_BACKENDS["onnxruntime"](GEMM_PROBE_N, args.threads)
    log(f"  timing {len(runners) - 1} systems + the GEMM probe x {args.rounds} rounds (interleaved)")
    timed = time_interleaved(runners, args.rounds, peers=peers, burst_s=args.burst_ms / 1e3)  # workflows.peers
    times = {k: [x / 1e3 for x in t.rounds_ms] for k, t in timed.runners.items()}
    probe = times.pop(GEMM_PROBE)
    res["gemm_probe_gflops"] = [round(2.0 * GEMM_PROBE_N ** 3 / t / 1e9, 1) for t in probe]
    res["burst_ms"] = args.burst_ms
    res["untimed_lead_call"] = True  # timer.interleaved: one untimed call before each burst
    med = {k: statistics.median(v) for k, v in times.items()}
    if "tensorplan" in executors:
        ksum = sum(executors["tensorplan"].kernel_times(budget_s=0.01))
        info["systems"]["tensorplan"]["measured_kernel_sum_ms"] = ksum * 1e3
    if not args.no_relax:
        try:
            fn, build_s = relax_runner(g, feeds, args.threads)
            ts = []
            for _ in range(args.relax_runs):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            med["tvm-relax"] = statistics.median(ts)
            times["tvm-relax"] = ts
            info["systems"]["tvm-relax"] = {"build_s": build_s, "note": "untuned default build, timed separately"}
        except Exception as e:  # noqa: BLE001
            info["systems"]["tvm-relax"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    # every fp32 baseline competes for "best" (OpenVINO fp32 included); OpenVINO's default (bf16 on
    # CPUs with bf16 units) is a column beside them, never the baseline
    fp32_peers = [p.name for p in peers if p.skipped is None and p.fp32]
    baselines = [k for k in (*fp32_peers, "pytorch", "tvm-relax") if k in med]
    best = min(baselines, key=lambda k: med[k])
    res["best_fp32_peer"] = timed.best_peer()
    res["beside"] = {p.name: p.precision for p in peers if p.skipped is None and not p.fp32}
    # workflows.peers' noise flag: any system's (or the GEMM probe's) rounds spread above 10 %, or the
    # 1-minute load above the usable cores just before or after the interleaved run
    res["noisy"], res["noise_reason"] = timed.noisy, timed.noise_reason
    res["loadavg_timing"] = [timed.load_before, timed.load_after]
    res.update(info)
    res["median_ms"] = {k: v * 1e3 for k, v in med.items()}
    res["cov"] = {k: (statistics.pstdev(v) / statistics.mean(v) if len(v) > 1 else 0.0) for k, v in times.items()}
    res["times_ms"] = {k: [round(x * 1e3, 4) for x in v] for k, v in times.items()}  # every round, in run order
    res["best_baseline"] = best
    if "tensorplan" in med:
        tp = med["tensorplan"]
        res["speedup_vs_best_baseline"] = med[best] / tp
        res["speedup_vs"] = {k: med[k] / tp for k in (*baselines, *res["beside"]) if k in med}
        if best in times and len(times[best]) == len(times["tensorplan"]):
            # the same ratio taken round by round (both ran in every round, seconds apart): robust
            # to the machine's slow phases, which move every system of a round together
            res["speedup_paired_median"] = statistics.median(
                b / t for b, t in zip(times[best], times["tensorplan"]))
        res["vs_roofline"] = tp * 1e3 / roof_ms
        if len(probe) == len(times["tensorplan"]):
            # the same distance with each round's bound at that round's measured GEMM rate (bandwidth
            # as above): what is left when the machine's slow phases are taken out
            res["vs_roofline_in_run"] = statistics.median(
                t * 1e3 / analysis.roofline_ms(flops, mbytes, 2.0 * GEMM_PROBE_N ** 3 / g / 1e9, bw)
                for t, g in zip(times["tensorplan"], probe))
        p = plans["tensorplan"]
        res["kernels_per_inference"] = len(p.kernels)
        res["plan_backends"] = dict(collections.Counter(k.backend or "?" for k in p.kernels))
        res["primitives"] = p.source.get("num_primitives")
        res["predicted_ms"] = p.predicted_s * 1e3
        res["measured_ms"] = tp * 1e3
        res["optimise_split_s"] = {k: p.timing.get(k) for k in ("fission_s", "enumerate_s", "profile_s", "solve_s",
                                                                  "total_s")}
        res["candidates"] = p.stats.get("enumeration", {}).get("candidates")
        res["unique_candidates"] = p.stats.get("enumeration", {}).get("unique_hashes")
        res["ort_regions"] = p.stats.get("ort_regions")
        res["rewrites"] = p.source.get("rewrites", [])
        for key in ("no-rewrite", "no-regions", "greedy", "no-recompute", "no-fission"):
            if key in med:
                res.setdefault("ablations", {})[key] = {"median_ms": med[key] * 1e3, "slowdown": med[key] / tp,
                                                        "kernels": len(plans[key].kernels),
                                                        "predicted_ms": plans[key].predicted_s * 1e3}
    res["loadavg_end"] = list(os.getloadavg())
    res["finished"] = time.time()
    return res


def resolve_overhead(value: str, results_dir: Path) -> tuple[float, str]:
    """The per-kernel overhead for the objective: a number, or 'auto' = the median over earlier
    per-model results of (measured - predicted) / kernels for the plan without regions (the
    'no-regions' ablation, or the main plan of results made before regions existed)."""
    if value != "auto":
        return float(value), "command line"
    per = []
    for p in sorted(results_dir.glob("korch_*.json")):
        r = json.loads(p.read_text())
        if "median_ms" not in r:
            continue
        ab = (r.get("ablations") or {}).get("no-regions")
        if ab:
            per.append((ab["median_ms"] - ab["predicted_ms"]) / 1e3 / ab["kernels"])
        elif not r.get("ort_regions") and r.get("kernels_per_inference"):
            per.append((r["measured_ms"] - r["predicted_ms"]) / 1e3 / r["kernels_per_inference"])
    if not per:
        return 0.0, f"no earlier results in {results_dir}"
    where = results_dir.resolve()
    where = where.relative_to(ROOT.parent) if where.is_relative_to(ROOT.parent) else where
    return max(0.0, statistics.median(per)), f"median of {len(per)} models in {where}"


def summarize(per_model: dict, machine: dict) -> dict:
    ok = {m: r for m, r in per_model.items() if "speedup_vs_best_baseline" in r}
    sp = [r["speedup_vs_best_baseline"] for r in ok.values()]
    rf = [r["vs_roofline"] for r in ok.values()]
    geo = lambda xs: float(math.exp(statistics.fmean(math.log(x) for x in xs))) if xs else None  # noqa: E731
    return {"machine": machine, "models": per_model,
            "geomean_speedup_vs_best_baseline": geo(sp), "geomean_vs_roofline": geo(rf),
            "table": [{"model": m, "tensorplan_ms": r.get("measured_ms"), "best_baseline": r.get("best_baseline"),
                       "best_baseline_ms": r["median_ms"].get(r.get("best_baseline")),
                       "speedup": r.get("speedup_vs_best_baseline"), "roofline_ms": r["roofline"]["bound_ms"],
                       "vs_roofline": r.get("vs_roofline"), "vs_roofline_in_run": r.get("vs_roofline_in_run"),
                       "speedup_paired": r.get("speedup_paired_median"), "kernels": r.get("kernels_per_inference"),
                       "predicted_ms": r.get("predicted_ms"), "best_fp32_peer": r.get("best_fp32_peer"),
                       "beside_ms": {k: r["median_ms"].get(k) for k in r.get("beside") or {}},
                       "noisy": r.get("noisy"), "noise_reason": r.get("noise_reason")}
                      for m, r in per_model.items() if "median_ms" in r]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated zoo names")
    ap.add_argument("--quick", action="store_true", help="fewer rounds, shorter kernel timing, no TVM Relax")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--kernel-budget", type=float, default=None, help="seconds of timing per candidate kernel")
    ap.add_argument("--max-nodes", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=60.0, help="BLP solver time limit (s)")
    ap.add_argument("--store", default=None, help="measurement store (default: tensorplan's)")
    ap.add_argument("--epilogue", action=argparse.BooleanOptionalAction, default=True,
                    help="let a linear primitive absorb an elementwise epilogue (Conv+bias+ReLU as one kernel)")
    ap.add_argument("--kernel-overhead", default="auto",
                    help="seconds added per kernel in the BLP objective; 'auto' = median over the models in "
                         "--overhead-from of (measured - predicted) / kernels of the region-free plan")
    ap.add_argument("--overhead-from", default=str(RESULTS / "korch_final"),
                    help="earlier results directory that 'auto' derives the per-kernel overhead from")
    ap.add_argument("--no-race", action="store_true",
                    help="keep the BLP plan without racing it against the fewest-kernels plan")
    ap.add_argument("--race-rounds", type=int, default=15, help="interleaved rounds of the finalists' race")
    ap.add_argument("--race-margin", type=float, default=0.10,
                    help="a plan with more kernels must beat the fewer-kernel finalists by this fraction")
    ap.add_argument("--no-ablations", action="store_true")
    ap.add_argument("--burst-ms", type=float, default=30.0,
                    help="per round, run each system back to back for about this long and keep the burst's "
                         "median (steady state; 0 = one cold call per round)")
    ap.add_argument("--no-relax", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--relax-runs", type=int, default=2)
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--force", action="store_true", help="re-run models that already have results")
    ap.add_argument("--results-dir", default=str(RESULTS), help="where per-model JSON files go")
    ap.add_argument("--out", default=None, help="summary JSON (default: <results-dir>/korch_bench.json)")
    args = ap.parse_args(argv)
    args.rounds = args.rounds or (8 if args.quick else 25)
    args.kernel_budget = args.kernel_budget or (0.02 if args.quick else 0.05)
    if args.quick:
        args.no_relax = True
    args.kernel_overhead, args.kernel_overhead_from = resolve_overhead(args.kernel_overhead, Path(args.overhead_from))
    log(f"per-kernel overhead in the objective: {args.kernel_overhead * 1e6:.1f} us ({args.kernel_overhead_from})")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from tensorplan.measure.store import Store
    from tensorplan.measure.timer import pinned_threads
    store = Store(args.store)
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    args.out = args.out or str(results / "korch_bench.json")
    machine = machine_info(args.threads)
    per_model: dict = {}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        out = results / f"korch_{name}.json"
        if out.exists() and not args.force:
            per_model[name] = json.loads(out.read_text())
            log(f"{name}: cached result {out.name} (use --force to re-run)")
            continue
        log(f"{name}: start")
        try:
            with pinned_threads(args.threads):
                r = bench_model(name, args, store)
        except Exception as e:  # noqa: BLE001 - one broken model must not lose the others
            r = {"model": name, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
            log(f"{name}: FAILED {r['error']}")
        else:
            out.write_text(json.dumps(r, indent=1, default=float))
            log(f"{name}: tensorplan {r.get('measured_ms', float('nan')):.2f} ms, best baseline "
                f"{r.get('best_baseline')} {r['median_ms'].get(r.get('best_baseline'), float('nan')):.2f} ms, "
                f"speedup {r.get('speedup_vs_best_baseline', float('nan')):.2f}x, "
                f"{r.get('vs_roofline', float('nan')):.2f}x roofline"
                + (f"; NOISY RUN: {r['noise_reason']}" if r.get("noisy") else ""))
        per_model[name] = r
    for p in sorted(results.glob("korch_*.json")):   # models of earlier runs stay in the summary
        name = p.stem[len("korch_"):]
        if name != "bench" and name not in per_model:
            per_model[name] = json.loads(p.read_text())
    summary = summarize(per_model, machine)
    Path(args.out).write_text(json.dumps(summary, indent=1, default=float))
    log(f"wrote {args.out}: geomean speedup {summary['geomean_speedup_vs_best_baseline']}, "
        f"geomean vs roofline {summary['geomean_vs_roofline']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
