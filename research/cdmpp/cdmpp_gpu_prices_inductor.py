"""How well does the shipped H100 predictor price the kernels Inductor builds on an H100? (issue 62, step 3)

Why: `optimize --device cuda` ranks every Korch candidate by the H100 CDMPP model's price of its
TVM CUDA program, while what runs (and is timed) is the kernel Inductor builds. The lazy loop only
times what the solutions on those prices use, so how well the prices track Inductor's times decides
how many kernels it times and how close its plan comes to the fully measured one. No GPU here, but
the H100 run of Korch fully measured (bench/korch_gpu.py, bench/results/korch_gpu_MODEL.plan.json)
kept each chosen kernel's H100 time with its canonical hash: this script enumerates the same
candidates, prices them as optimize does (`PredictedCost` for h100, `GPU_SAMPLES` draws) and
compares, kernel by kernel, for the models measured there (candy, efficientvit-b1, yolox-nano).

    python research/cdmpp/cdmpp_gpu_prices_inductor.py          # -> research/cdmpp/results/cdmpp_gpu_prices_inductor.json

Caveat: only the kernels the fully measured BLP chose have an H100 time (the plan keeps no other),
so this is the predictor on the winners, not on every candidate.

Finding (2026-12-06, results JSON): CDMPP prices Inductor's memory kernels 4-7x high (median), the
roofline work model prices cuDNN/cuBLAS kernels ~2x low: two sources on different scales, which
the solver would mix. Hence `LazyCost.tuned_scale` (one scale fitted on the kernels timed so far);
in sample, one scale leaves a median error of 1.4-2.4x on CDMPP's kernels.
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import time

import _path  # noqa: F401 - research/ on sys.path
from _path import RESULTS, ROOT

import numpy as np

MODELS = ("candy", "efficientvit-b1", "yolox-nano")
OUT = RESULTS / "cdmpp_gpu_prices_inductor.json"


def check(name: str, store: str) -> dict:
    from scipy.stats import spearmanr

    from tensorplan import devices
    from tensorplan.cost.lazy import PredictedCost
    from tensorplan.workflows.lazy_loop import priced_problem
    from tensorplan.workflows.optimize_gpu import GPU_SAMPLES
    from tensorplan.zoo.specs import as_graph

    plan = json.loads((ROOT / "bench" / "results" / f"korch_gpu_{name}.plan.json").read_text())
    measured = {k["canonical_hash"]: float(k["predicted_s"]) for k in plan["kernels"]}
    kinds = {k["canonical_hash"]: k["kind"] for k in plan["kernels"]}
    calls = {}
    for k in plan["kernels"]:
        calls[k["canonical_hash"]] = calls.get(k["canonical_hash"], 0) + 1
    pc = PredictedCost(device=devices.device("h100"), store=store, samples=GPU_SAMPLES)
    phases: dict[str, float] = {}
    t0 = time.perf_counter()
    problem = priced_problem(as_graph(name, None, 17), devices.device("h100"), pc, phases=phases,
                             threads=devices.usable_cores(), max_nodes=8, max_reduces=2, regions=False,
                             progress=False, say=lambda m: None)
    price_s = time.perf_counter() - t0
    by_hash = {c.canonical_hash: (c, float(v)) for c, v in zip(problem.cands, problem.costs)}
    rows = []
    for h, m in measured.items():
        if h not in by_hash:
            continue
        c, p = by_hash[h]
        rows.append({"hash": h, "kind": kinds[h], "by": "cdmpp" if pc.by_tuned(c) else "work model",
                     "primitives": len(c.nodes), "calls": calls[h], "measured_us": m * 1e6, "predicted_us": p * 1e6})
    out = {"model": name, "plan_kernels": len(plan["kernels"]), "unique_plan_kernels": len(measured),
           "found": len(rows), "unique_candidates": len({c.canonical_hash for c in problem.cands}),
           "pricing_s": round(price_s, 1), "gpu": plan.get("device", {}).get("name") if isinstance(plan.get("device"), dict) else None}
    for by in ("all", "cdmpp", "work model"):
        sel = [r for r in rows if by == "all" or r["by"] == by]
        if len(sel) < 3:
            out[by] = {"kernels": len(sel)}
            continue
        m = np.array([r["measured_us"] for r in sel])
        p = np.array([r["predicted_us"] for r in sel])
        ratio = p / m
        w = np.array([r["calls"] for r in sel], dtype=float)
        out[by] = {"kernels": len(sel), "spearman": float(spearmanr(p, m).statistic),
                   "median_ratio_pred_over_meas": float(np.median(ratio)),
                   "median_abs_log2_ratio": float(np.median(np.abs(np.log2(ratio)))),
                   "within_2x": float(np.mean((ratio >= 0.5) & (ratio <= 2.0))),
                   # what one scale (as `LazyCost.tuned_scale` fits on the kernels it timed) leaves: in-sample
                   "median_abs_log2_after_one_scale": float(np.median(np.abs(np.log2(ratio) - np.median(np.log2(ratio))))),
                   "sum_measured_ms": float((m * w).sum() / 1e3), "sum_predicted_ms": float((p * w).sum() / 1e3)}
    out["rows"] = rows
    return out


def main() -> int:
    doc = {"command": "python research/cdmpp/cdmpp_gpu_prices_inductor.py", "models": {},
           "measured_by": "bench/results/korch_gpu_MODEL.plan.json: Inductor kernels timed as CUDA-graph replays on "
                          "the H100 of bench/results/korch_gpu.json (the fully measured BLP's kernels only)",
           "priced_by": "PredictedCost('h100'): the shipped cdmpp-h100.pt on TVM CUDA programs (memory kernels), "
                        "the roofline work model with no GPU point (linear kernels)"}
    with tempfile.TemporaryDirectory() as td:
        for name in MODELS:
            r = check(name, f"{td}/s.sqlite")
            doc["models"][name] = r
            a = r["all"]
            print(f"{name}: {r['found']}/{r['unique_plan_kernels']} plan kernels priced; spearman {a.get('spearman', float('nan')):.2f}, "
                  f"median pred/meas {a.get('median_ratio_pred_over_meas', float('nan')):.2f}, within 2x "
                  f"{a.get('within_2x', float('nan')):.0%}; plan sum measured {a.get('sum_measured_ms', math.nan):.3f} ms "
                  f"vs predicted {a.get('sum_predicted_ms', math.nan):.3f} ms", flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
