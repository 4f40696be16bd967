"""Time a saved tensorplan plan against the baselines in a fresh process with nothing else in it.

Why: bench/korch_bench.py builds every ablation plan (hundreds of ONNX Runtime sessions and TVM
modules) and the cost model's kernels in one process and times them all interleaved. For the
YOLOv4 plan that process measured the *same* plan at 248 and 324 ms (two executor instances,
one run), while the plan alone runs far faster. This script separates the plan from that
crowd: the plan written by korch_bench (`~/.cache/tensorplan/plans/<model>.json`), ONNX
Runtime, PyTorch eager and torch.compile, interleaved with the same timer and bursts.

Usage: python bench/korch_standalone.py --models yolov4,segformer-b0 [--rounds 15]
Writes bench/results/korch_standalone.json (with the machine description).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="yolov4,segformer-b0")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--burst-ms", type=float, default=30.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "korch_standalone.json"))
    a = ap.parse_args()

    import torch
    from korch_bench import compile_runner, eager_runner, log, machine_info, ort_runner

    from tensorplan import zoo
    from tensorplan.ir.reference import rel_error
    from tensorplan.measure.timer import interleaved, pinned_threads
    from tensorplan.paths import cache_dir
    from tensorplan.runtime.plan import Plan
    from tensorplan.runtime.executor import PlanExecutor, ort_reference

    torch.set_num_threads(a.threads)
    out: dict = {"machine": machine_info(a.threads), "rounds": a.rounds, "burst_ms": a.burst_ms,
                 "untimed_lead_call": True, "models": {}}
    for name in [m.strip() for m in a.models.split(",") if m.strip()]:
        path = cache_dir() / "plans" / f"{name}.json"
        if not path.exists():
            raise SystemExit(f"{path} does not exist: run `python bench/korch_bench.py --models {name}` first")
        plan = Plan.load(path)
        feeds = zoo.numpy_inputs(name)
        with pinned_threads(a.threads):
            ex = PlanExecutor(plan, plan.primitive_graph(), threads=a.threads)
            got = ex.run(feeds)
            ref = ort_reference(plan, feeds, threads=a.threads)
            err = max(float(rel_error(np.atleast_1d(got[o]), np.atleast_1d(ref[o]))) for o in ref if o in got)
            ex.set_inputs(feeds)
            runners = {"tensorplan": ex.run_bound,
                       "onnxruntime": ort_runner(zoo.export(name), {k: v for k, v in feeds.items()}, a.threads)[0],
                       "pytorch": eager_runner(name)[0],
                       "torch.compile": compile_runner(name, cache_dir())[0]}
            log(f"{name}: timing {len(runners)} systems x {a.rounds} rounds")
            t0 = time.perf_counter()
            times = interleaved(runners, a.rounds, burst_s=a.burst_ms / 1e3)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        base = min(("onnxruntime", "pytorch", "torch.compile"), key=med.__getitem__)
        out["models"][name] = {"plan": str(path), "kernels": len(plan.kernels), "max_rel_err": err,
                               "median_ms": med, "best_baseline": base,
                               "speedup_vs_best_baseline": med[base] / med["tensorplan"],
                               "cov": {k: statistics.pstdev(v) / statistics.mean(v) for k, v in times.items()},
                               "loadavg": list(os.getloadavg()), "seconds": time.perf_counter() - t0}
        log(f"{name}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in med.items())
            + f" -> {med[base] / med['tensorplan']:.2f}x vs {base}")
    Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
