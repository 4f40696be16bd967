"""`tensorplan optimize --precision auto` on this CPU against what users get from their runtime by
default: OpenVINO's default (bf16 on CPUs with bf16 units), OpenVINO fp32, ONNX Runtime fp32 and
ONNX Runtime int8 (static QDQ; OpenVINO int8 through NNCF beside it), with the accuracy of each.

Per model, in one process: `optimize(precision="auto", tolerance=T)` (a cold store per model unless
--store), then the kept plan and every peer timed interleaved in one run on the first calibration
sample (`workflows.peers.time_interleaved`), then each contender's outputs on every calibration
sample compared with ONNX Runtime fp32 on the model as given (`precision.accuracy.compare`). The
calibration set is what `optimize` used: `--calibration-dir DIR/<model>` when it exists, else 8 random
samples from the declared shapes (the JSON says which: random inputs measure numerical drift, not
task accuracy). Written per model to `bench/results/precision/<model>.json` (kept on a re-run unless
--force) and summarised in `bench/results/precision_bench.json`: geomean speed-up over OpenVINO's
default for the Korch models and the others, with the CPU and the precisions it runs natively.

    .venv/bin/python bench/precision_bench.py --models candy --budget 10m
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from optimize_bench import (KORCH_MODELS, OTHER_MODELS, RESULTS, geomean, log, machine_info, plan_facts,
                            run_per_model)

#: The tolerance the benchmark states: the model's outputs stay within 2 % of their range of fp32.
TOLERANCE = 0.02
BASELINE = "openvino-default"
#: `--tolerance openvino-default`: per model, the error OpenVINO's default precision makes on the same
#: calibration samples, so the plan is at equal or better accuracy by construction (the issue's bar).
MATCH = "openvino-default"


def _outputs(handle, feeds: list[dict], names: list[str]) -> list[dict]:
    """A peer's outputs (by the reference's output names, in order) on every feed: an ONNX Runtime
    session or an OpenVINO compiled model."""
    import numpy as np

    from tensorplan.workflows.peers import openvino_input_name
    if hasattr(handle, "get_outputs") and hasattr(handle, "run"):       # onnxruntime.InferenceSession
        want = [o.name for o in handle.get_outputs()]
        ins = {i.name for i in handle.get_inputs()}
        outs = []
        for f in feeds:
            got = dict(zip(want, handle.run(None, {k: v for k, v in f.items() if k in ins})))
            outs.append({n: got[n] if n in got else list(got.values())[names.index(n)] for n in names})
        return outs
    outs = []                                                            # openvino.CompiledModel
    for f in feeds:
        req = handle.create_infer_request()
        res = req.infer({k: f[openvino_input_name(p, f)] for k, p in enumerate(handle.inputs)})
        by_name = {}
        for k, port in enumerate(handle.outputs):
            for n in port.get_names():
                by_name.setdefault(n, np.array(res[port]))
        ordered = [np.array(res[port]) for port in handle.outputs]
        outs.append({n: by_name[n] if n in by_name else ordered[i] for i, n in enumerate(names)})
    return outs


def openvino_default_error(graph, feeds: list[dict], threads: int) -> float:
    """The normalised max error (`Accuracy.error`) of OpenVINO as it comes (latency hint, its default
    precision) against ONNX Runtime fp32 on `feeds`."""
    import openvino as ov

    from tensorplan.precision.accuracy import compare
    from tensorplan.runtime.executor import run_original
    from tensorplan.zoo.specs import onnx_bytes
    data = onnx_bytes(graph, 17)
    ref = [run_original(data, graph.name, f, threads=threads) for f in feeds]
    core = ov.Core()
    compiled = core.compile_model(core.read_model(data, b""), "CPU",
                                  {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": int(threads)})
    return compare(ref, _outputs(compiled, feeds, list(ref[0]))).error


def bench_model(name: str, args) -> dict:
    import tensorplan as tp
    from tensorplan.measure.timer import pinned_threads
    from tensorplan.precision.accuracy import compare
    from tensorplan.precision.calibration import load_calibration
    from tensorplan.runtime.executor import PlanExecutor, run_original
    from tensorplan.workflows.optimize import OptimizeSummary
    from tensorplan.workflows.peers import peer_runners, runners_of, time_interleaved

    out: dict = {"model": name, "budget_s": args.budget_s}
    cal_dir = Path(args.calibration_dir) / name if args.calibration_dir else None
    cal_dir = cal_dir if cal_dir is not None and cal_dir.is_dir() else None
    tolerance = args.tolerance
    if tolerance == MATCH:
        g0 = tp.load(name)
        tolerance = openvino_default_error(g0, load_calibration(g0, cal_dir).feeds, args.threads)
        log(f"{name}: tolerance = OpenVINO default's error on the calibration samples: {tolerance:.3g}")
    out["tolerance"], out["tolerance_from"] = float(tolerance), args.tolerance_label
    store = args.store or Path(tempfile.mkdtemp(prefix=f"precbench-{name}-")) / "store.sqlite"
    t0 = time.perf_counter()
    plan = tp.optimize(name, budget_s=args.budget_s, store=store, threads=args.threads, peers=False,
                       precision="auto", tolerance=float(tolerance), calibration=cal_dir,
                       progress=not args.no_progress, log=log)
    summ = OptimizeSummary.from_plan(plan)
    out["optimize"] = {**summ.to_dict(), "wall_s": time.perf_counter() - t0, **plan_facts(plan),
                       "precisions": plan.precisions()}
    g = plan.model_graph()
    cal = load_calibration(g, cal_dir)           # the samples optimize searched on (same seeds, same files)
    out["calibration"] = {"source": cal.source, "samples": len(cal.feeds), "warning": cal.warning}
    feeds = cal.feeds[0]
    data, where = plan.reference_model()
    ref_all = [run_original(data, where, f, threads=args.threads) for f in cal.feeds]
    names = list(ref_all[0])
    with pinned_threads(args.threads):
        ex = PlanExecutor(plan, plan.check(), threads=args.threads)
        ex.run(feeds)
        peers = peer_runners(g, feeds, args.threads, 17, torch_compile=False, log=log, int8_calibration=cal.feeds)
        timings = time_interleaved({"tensorplan": ex.run_bound, **runners_of(peers)}, rounds=args.rounds,
                                   peers=peers, labels={"tensorplan": "tensorplan --precision auto"})
        accuracy = {"tensorplan": compare(ref_all, [{n: o[n] for n in names}
                                                    for o in (ex.run(f) for f in cal.feeds)]).to_dict()}
        for p in peers:
            if p.skipped is None and p.handle is not None:
                try:
                    accuracy[p.name] = compare(ref_all, _outputs(p.handle, cal.feeds, names)).to_dict()
                except Exception as e:  # noqa: BLE001 - a peer whose outputs do not pair is reported, not fatal
                    accuracy[p.name] = {"error": None, "note": f"{type(e).__name__}: {str(e)[:200]}"}
    med = {k: t.median_ms for k, t in timings.runners.items()}
    out["timing"] = {"median_ms": med, "cov": {k: t.cov for k, t in timings.runners.items()},
                     "labels": {k: t.label for k, t in timings.runners.items()},
                     "precision": {k: (t.precision if t.peer else ",".join(sorted(plan.precisions())))
                                   for k, t in timings.runners.items()},
                     "noisy": timings.noise_reason, "skipped": timings.skipped, "method": timings.method}
    out["accuracy"] = accuracy
    out.update(against_openvino_default(out))
    for peer in ("openvino", "onnxruntime", "onnxruntime-int8", "openvino-int8"):
        if peer in med:
            out.setdefault("speedup_over", {})[peer] = med[peer] / med["tensorplan"]
    log(f"{name}: " + ", ".join(f"{k} {v:.2f} ms (error {accuracy.get(k, {}).get('error')})" for k, v in med.items())
        + (f"; {out['speedup_over_openvino_default']:.2f}x over OpenVINO default ({out['baseline']})"
           if "speedup_over_openvino_default" in out else "")
        + (f" (noisy: {timings.noise_reason})" if timings.noise_reason else ""))
    return out


def against_openvino_default(row: dict) -> dict:
    """The speed-up of the kept plan over OpenVINO's default and whether its error is at most
    OpenVINO default's, from one model's timing and accuracy. OpenVINO's default is the peer
    `openvino-default` where it computes in a reduced precision (bf16 on CPUs with bf16 units); where
    it computes in fp32 (no bf16 units) the peers hold only `openvino`, which then is its default."""
    med, acc = row["timing"]["median_ms"], row["accuracy"]
    base = BASELINE if BASELINE in med else "openvino" if "openvino" in med else None
    if base is None or "tensorplan" not in med:
        return {}
    a, b = acc.get("tensorplan", {}).get("error"), acc.get(base, {}).get("error")
    return {"baseline": base, "baseline_precision": row["timing"]["precision"].get(base),
            "speedup_over_openvino_default": med[base] / med["tensorplan"],
            "accuracy_at_least_openvino_default": a is not None and b is not None and a <= b}


def summarize(per_model: dict, machine: dict, tolerance: str) -> dict:
    def group(names: list[str]) -> dict:
        rows = [per_model[n] for n in names if n in per_model and "error" not in per_model[n]]
        for r in rows:                       # recomputed: results written before `baseline` was recorded
            r.update(against_openvino_default(r))
        return {"models": [r["model"] for r in rows],
                "geomean_speedup_over_openvino_default": geomean([r.get("speedup_over_openvino_default")
                                                                  for r in rows]),
                "geomean_speedup_over": {p: geomean([r.get("speedup_over", {}).get(p) for r in rows])
                                         for p in ("openvino", "onnxruntime", "onnxruntime-int8", "openvino-int8")},
                "accuracy_at_least_openvino_default": sum(1 for r in rows if r.get("accuracy_at_least_openvino_default")),
                "reduced_plans": sum(1 for r in rows if set(r["optimize"].get("precisions") or {}) - {"fp32"}),
                "median_time_to_plan_s": statistics.median([r["optimize"]["total_s"] for r in rows]) if rows else None}
    from tensorplan.precision.native import native_precisions
    native = {p: s.to_dict() for p, s in native_precisions().items()}
    from tensorplan.workflows.peers import openvino_default_precision
    return {"machine": machine, "native_precisions": native, "tolerance": tolerance, "baseline": BASELINE,
            "openvino_default_precision": openvino_default_precision(),
            "korch_models": group(KORCH_MODELS), "other_models": group([n for n in per_model if n not in KORCH_MODELS]),
            "failed": {n: r["error"] for n, r in per_model.items() if "error" in r}, "per_model": per_model}


def main(argv=None) -> int:
    from tensorplan.workflows.optimize import parse_budget

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(KORCH_MODELS + OTHER_MODELS), help="comma-separated zoo names")
    ap.add_argument("--budget", default="10m", help="optimize's budget per model (e.g. 10m)")
    ap.add_argument("--tolerance", default=str(TOLERANCE), help=f"--tolerance of optimize (default {TOLERANCE}), or "
                    f"'{MATCH}': per model, the error OpenVINO's default makes on the same samples")
    ap.add_argument("--calibration-dir", default=None, help="folder with one calibration directory per model "
                    "(DIR/<model>/*.npz or *.npy); models without one use random samples")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    ap.add_argument("--store", default=None, help="measurement store (default: a fresh one per model)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--force", action="store_true", help="re-run models that already have results")
    ap.add_argument("--results-dir", default=str(RESULTS / "precision"))
    ap.add_argument("--out", default=str(RESULTS / "precision_bench.json"))
    args = ap.parse_args(argv)
    args.budget_s = parse_budget(args.budget)
    args.tolerance_label = args.tolerance
    if args.tolerance != MATCH:
        try:
            args.tolerance = float(args.tolerance)
        except ValueError:
            ap.error(f"--tolerance {args.tolerance!r}: a number >= 0 or '{MATCH}'")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    rdir = Path(args.results_dir)
    run_per_model(args.models, rdir, args.force, lambda name: bench_model(name, args),
                  lambda name: f"{name}: optimize --precision auto --tolerance {args.tolerance_label}, "
                               f"budget {args.budget_s:.0f}s")
    per_model = {p.stem: json.loads(p.read_text()) for p in sorted(rdir.glob("*.json"))}
    summary = summarize(per_model, machine_info(args.threads), args.tolerance_label)
    Path(args.out).write_text(json.dumps(summary, indent=1, default=str))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
