"""How close `optimize`'s tuned memory kernels come to the memory-bandwidth bound, against the default schedule.

Per model: `optimize` with Korch's kernels only (`regions=False`, no race: the solver's plan, which
keeps TVM memory kernels; a fresh store, so the schedule sampling is this run's), then every memory kernel of the
plan that runs on TVM is compiled twice, with tensorplan's hand-written default schedule and with
the schedule `optimize` kept (the fastest measured of the predictor's top-k and the default), and
the two are timed interleaved. Each kernel's distance to its bandwidth bound is measured time /
(bytes moved / the device's measured bandwidth), 1 = at the bound (`cost.tuned.bandwidth_distance`).
Also: the share of sampled schedules that were compiled and timed. Written to
`bench/results/tuned_bandwidth.json` (merged per model; a re-run skips models already there unless
--force).

    .venv/bin/python bench/tuned_bandwidth.py --models candy,segformer-b0 --budget 10m
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
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "tuned_bandwidth.json"
KORCH_MODELS = ["candy", "segformer-b0", "efficientvit-b1", "yolox-nano", "yolov4", "resnet-50", "bert-base"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def bench_model(name: str, args) -> dict:
    import numpy as np

    import tensorplan as tp
    from tensorplan.cost.tuned import KernelTiming, bandwidth_distance
    from tensorplan.kernels.vendor import make_kernel, random_inputs
    from tensorplan.measure.timer import interleaved, pinned_threads
    from tensorplan.runtime.executor import kernel_graph
    from tensorplan.workflows.optimize import OptimizeSummary

    store = Path(tempfile.mkdtemp(prefix=f"bw-{name}-")) / "store.sqlite"
    t0 = time.perf_counter()
    plan = tp.optimize(name, budget_s=args.budget_s, store=store, threads=args.threads, peers=False,
                       regions=False, race=False, progress=not args.no_progress, log=log)
    summary = OptimizeSummary.from_plan(plan)
    prim = plan.primitive_graph()
    memory = [k for k in plan.kernels if k.kind == "memory" and k.backend == "tvm"]
    log(f"{name}: {len(plan.kernels)} kernels, {len(memory)} TVM memory kernels; timing default vs tuned")
    rows, timings, skipped = [], [], []
    with pinned_threads(args.threads):
        for k in memory:
            sub = kernel_graph(prim, k)
            tuned_sched = {x: v for x, v in k.schedule.items() if x != "operators"}
            try:
                built = {"default": make_kernel(sub, list(k.outputs), "tvm", threads=args.threads),
                         "tuned": make_kernel(sub, list(k.outputs), "tvm", threads=args.threads,
                                              schedule=tuned_sched or None)}
            except tp.TensorplanError as e:
                skipped.append({"kernel": k.id, "why": str(e)[:200]})
                continue
            fns = {}
            for key, kern in built.items():
                ins = random_inputs(sub, list(kern.input_names))
                fns[key] = kern.bind(ins, kern.alloc_outputs())
            times = interleaved(fns, rounds=args.rounds, pause_s=0.0, burst_s=0.02)
            med = {key: statistics.median(v) for key, v in times.items()}
            consts = [t for t in sub.constants()]
            cand = SimpleNamespace(id=k.id, nodes=list(k.nodes), inputs=list(k.inputs), const_inputs=consts,
                                   outputs=list(k.outputs))
            timings.append(KernelTiming(cand, med["default"], med["tuned"]))
            rows.append({"kernel": k.id, "nodes": len(k.nodes), "default_ms": med["default"] * 1e3,
                         "tuned_ms": med["tuned"] * 1e3, "tuned_is_default": tuned_sched.get("name", "default") == "default",
                         "schedule": tuned_sched})
    out: dict = {"model": name, "plan_kernels": len(plan.kernels), "memory_kernels": len(memory),
                 "skipped": skipped, "wall_s": time.perf_counter() - t0,
                 "optimize": {key: getattr(summary, key) for key in
                              ("samples", "draws", "searched", "top_k", "unique_kernels", "measured", "total_s", "phases")},
                 "loadavg": list(os.getloadavg())}
    # schedules compiled and timed / schedules sampled: each searched TIR kernel that was measured
    # had at most top_k sampled schedules timed (the default is not a sampled one)
    if summary.draws:
        tuned_timed = sum(1 for r in rows if not r["tuned_is_default"])
        out["sampled_timed_upper_bound"] = summary.measured * summary.top_k
        out["share_of_sampled_timed_upper_bound"] = min(1.0, summary.measured * summary.top_k / summary.draws)
        out["tuned_kernels_not_default"] = tuned_timed
    if timings:
        rep = bandwidth_distance(prim, timings, device="local")
        by_id = {r.kernel: r for r in rep.rows}
        for r in rows:
            b = by_id.get(r["kernel"])
            if b is not None:
                r.update(bytes=b.nbytes, bound_ms=b.bound_s * 1e3, default_ratio=b.default_ratio,
                         tuned_ratio=b.tuned_ratio)
        out.update(bandwidth_gbs=rep.bandwidth_gbs, default_median=rep.default_median, default_p90=rep.default_p90,
                   tuned_median=rep.tuned_median, tuned_p90=rep.tuned_p90,
                   default_sum_ms=float(np.sum([r["default_ms"] for r in rows])),
                   tuned_sum_ms=float(np.sum([r["tuned_ms"] for r in rows])))
        log(f"{name}: distance to the bandwidth bound, median/p90: default {rep.default_median:.2f}/"
            f"{rep.default_p90:.2f}, tuned {rep.tuned_median:.2f}/{rep.tuned_p90:.2f}")
    out["kernels"] = rows
    return out


def main(argv=None) -> int:
    from tensorplan.workflows.optimize import parse_budget

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(KORCH_MODELS), help="comma-separated zoo names")
    ap.add_argument("--budget", default="10m", help="optimize's budget per model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds per kernel")
    ap.add_argument("--force", action="store_true", help="re-run models already in the results")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    args.budget_s = parse_budget(args.budget)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    out = Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else {"per_model": {}}
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        if name in results["per_model"] and not args.force:
            log(f"{name}: kept (--force re-runs)")
            continue
        results["per_model"][name] = bench_model(name, args)
        results["per_model"][name]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        results["summary"] = summarize(results["per_model"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=str))
    log(f"wrote {out}")
    return 0


def summarize(per_model: dict) -> dict:
    """Median / p90 of the distance over every model's memory kernels together."""
    import numpy as np
    d = [r["default_ratio"] for m in per_model.values() for r in m.get("kernels", []) if "default_ratio" in r]
    t = [r["tuned_ratio"] for m in per_model.values() for r in m.get("kernels", []) if "tuned_ratio" in r]
    if not d:
        return {"models": list(per_model), "kernels": 0}
    return {"models": list(per_model), "kernels": len(d),
            "default_median": float(np.median(d)), "default_p90": float(np.percentile(d, 90)),
            "tuned_median": float(np.median(t)), "tuned_p90": float(np.percentile(t, 90)),
            "tuned_faster": int(sum(1 for a, b in zip(d, t) if b < a * 0.95)),
            "tuned_slower": int(sum(1 for a, b in zip(d, t) if b > a * 1.05))}


if __name__ == "__main__":
    sys.exit(main())
