"""`tensorplan optimize` on this CPU: time to plan, what was measured, and the plan against the peers.

Per model, in one process: `optimize` from a cold store (a fresh one per model: nothing measured
before), the same with Korch's kernels only (`regions=False`, the store now warm), optionally a
fully measured `orchestrate` (`--full`: compiles and times every unique candidate; on the shared
persistent store, so a re-run reuses its timings), then every plan and the peers users would
otherwise deploy (ONNX Runtime, OpenVINO fp32 and its default precision, torch.compile) timed
interleaved in one run (`workflows.peers.time_interleaved`). Written per model to
`bench/results/optimize/<model>.json` (skipped on a re-run unless --force) and summarised in
`bench/results/optimize_bench.json`: geomean speed-up over the best fp32 peer for the Korch
benchmark models and for the others (models no rewrite was written for among them).

    .venv/bin/python bench/optimize_bench.py --models candy --budget 10m
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
KORCH_MODELS = ["candy", "segformer-b0", "efficientvit-b1", "yolox-nano", "yolov4", "resnet-50", "bert-base"]
# zoo models outside the Korch set: the rewrites were not written for them
OTHER_MODELS = ["convnext-tiny", "swin-tiny", "gpt2", "efficientnet-b0", "mobilenet-v3-large", "mobilevit-s"]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def machine_info(threads: int) -> dict:
    import onnxruntime
    import torch
    import tvm

    from tensorplan.devices import device
    spec = device("local")
    return {"platform": platform.platform(), "python": platform.python_version(), "cpu": spec.name,
            "device": spec.to_dict(), "threads": threads, "nproc": os.cpu_count(), "loadavg": list(os.getloadavg()),
            "versions": {"torch": torch.__version__, "tvm": tvm.__version__, "onnxruntime": onnxruntime.__version__}}


def plan_facts(plan) -> dict:
    """What a plan is made of: kernels per backend, whether it mixes backends, rewrites that fired."""
    backends = Counter(k.backend for k in plan.kernels)
    return {"kernels": len(plan.kernels), "backends": dict(backends), "mixed": len(plan.kernels) > 1,
            "rewrites": dict(Counter(r for r, _ in plan.source.get("rewrites") or [])),
            "race": plan.stats.get("race")}


def bench_model(name: str, args, shared_store) -> dict:
    import tensorplan as tp
    from tensorplan.ir.reference import random_feeds
    from tensorplan.measure.timer import pinned_threads
    from tensorplan.runtime.executor import PlanExecutor
    from tensorplan.workflows.optimize import OptimizeSummary
    from tensorplan.workflows.peers import peer_runners, runners_of, time_interleaved

    out: dict = {"model": name, "budget_s": args.budget_s}
    cold = Path(tempfile.mkdtemp(prefix=f"optbench-{name}-")) / "store.sqlite"
    t0 = time.perf_counter()
    plan = tp.optimize(name, budget_s=args.budget_s, store=cold, threads=args.threads, peers=False,
                       progress=not args.no_progress, log=log)
    out["optimize"] = {**OptimizeSummary.from_plan(plan).to_dict(), "wall_s": time.perf_counter() - t0,
                       **plan_facts(plan)}
    plans = {"optimize": plan}
    if not args.no_korch_only:
        t0 = time.perf_counter()
        korch = tp.optimize(name, budget_s=args.budget_s, store=cold, threads=args.threads, peers=False,
                            regions=False, progress=not args.no_progress, log=log)
        out["korch_kernels"] = {**OptimizeSummary.from_plan(korch).to_dict(), "wall_s": time.perf_counter() - t0,
                                **plan_facts(korch)}
        plans["korch-kernels"] = korch
    if args.full:
        t0 = time.perf_counter()
        full = tp.orchestrate(name, cost="measured", store=shared_store, threads=args.threads,
                              progress=not args.no_progress, log=log)
        out["full"] = {"wall_s": time.perf_counter() - t0, "cost_model": full.stats.get("cost_model"),
                       "unique_kernels": full.stats.get("enumeration", {}).get("unique_hashes"), **plan_facts(full)}
        plans["full-measured"] = full
    feeds = random_feeds(plan.primitive_graph(), seed=0)
    runners, labels = {}, {}
    with pinned_threads(args.threads):
        for key, p in plans.items():
            ex = PlanExecutor(p, p.check(), threads=args.threads)
            ex.run(feeds)
            runners[key], labels[key] = ex.run_bound, f"tensorplan {key}"
        peers = peer_runners(plan.model_graph(), feeds, args.threads, 17, log=log)
        timings = time_interleaved({**runners, **runners_of(peers)}, rounds=args.rounds, peers=peers, labels=labels)
    med = {k: t.median_ms for k, t in timings.runners.items()}
    best = timings.best_peer()
    out["timing"] = {"median_ms": med, "cov": {k: t.cov for k, t in timings.runners.items()},
                     "best_peer": best, "noisy": timings.noise_reason, "skipped": timings.skipped,
                     "peer_precision": {k: t.precision for k, t in timings.runners.items() if t.peer},
                     "method": timings.method}
    if best is not None:
        out["speedup_over_best"] = {k: med[best] / med[k] for k in plans}
    if "full-measured" in med:
        out["optimize_vs_full"] = med["optimize"] / med["full-measured"]
        full_unique = out["full"]["unique_kernels"] or out["optimize"]["unique_kernels"]
        out["measured_vs_full"] = out["optimize"]["measured"] / max(full_unique, 1)
    log(f"{name}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in med.items())
        + (f"; optimize {out['speedup_over_best']['optimize']:.2f}x over {best}" if best else "")
        + (f" (noisy: {timings.noise_reason})" if timings.noise_reason else ""))
    return out


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def summarize(per_model: dict, machine: dict) -> dict:
    def group(names: list[str]) -> dict:
        rows = [per_model[n] for n in names if n in per_model and "error" not in per_model[n]]
        return {"models": [r["model"] for r in rows],
                "geomean_speedup_over_best": geomean([r.get("speedup_over_best", {}).get("optimize") for r in rows]),
                "geomean_korch_kernels_over_best": geomean([r.get("speedup_over_best", {}).get("korch-kernels")
                                                            for r in rows]),
                "median_time_to_plan_s": statistics.median([r["optimize"]["total_s"] for r in rows]) if rows else None,
                "median_measured_share": statistics.median([r["optimize"]["measured_share"] for r in rows])
                if rows else None,
                "mixed_plans": sum(1 for r in rows if r["optimize"]["mixed"])}
    return {"machine": machine, "korch_models": group(KORCH_MODELS),
            "other_models": group([n for n in per_model if n not in KORCH_MODELS]), "per_model": per_model}


def run_per_model(models: str, rdir: Path, force: bool, bench: Callable[[str], dict],
                  headline: Callable[[str], str]) -> None:
    """Resumable per-model loop: `bench(name)` for each comma-separated model without a result in
    `rdir` (all with `force`), its dict written to `rdir/<name>.json`; a model that raises is
    recorded with its error and the others still run; a later run retries it."""
    rdir.mkdir(parents=True, exist_ok=True)
    for name in [m.strip() for m in models.split(",") if m.strip()]:
        path = rdir / f"{name}.json"
        if path.exists() and not force and "error" not in json.loads(path.read_text()):
            log(f"{name}: kept {path} (--force re-runs)")
            continue
        log(headline(name))
        try:
            res = bench(name)
        except Exception as e:  # noqa: BLE001 - one model's failure is recorded, the others still run
            res = {"model": name, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
            log(f"{name}: FAILED {res['error']}")
        res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        path.write_text(json.dumps(res, indent=1, default=str))


def main(argv=None) -> int:
    from tensorplan.workflows.optimize import parse_budget

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(KORCH_MODELS + OTHER_MODELS), help="comma-separated zoo names")
    ap.add_argument("--budget", default="10m", help="optimize's budget per model (e.g. 10m)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds")
    ap.add_argument("--full", action=argparse.BooleanOptionalAction, default=True,
                    help="also plan with a fully measured orchestrate (slow cold; cached in --store)")
    ap.add_argument("--no-korch-only", action="store_true", help="skip the regions=False plan")
    ap.add_argument("--store", default=None, help="store of the fully measured runs (default: tensorplan's)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--force", action="store_true", help="re-run models that already have results")
    ap.add_argument("--results-dir", default=str(RESULTS / "optimize"))
    ap.add_argument("--out", default=str(RESULTS / "optimize_bench.json"))
    args = ap.parse_args(argv)
    args.budget_s = parse_budget(args.budget)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    from tensorplan.measure.store import Store
    shared = Store(args.store)
    rdir = Path(args.results_dir)
    run_per_model(args.models, rdir, args.force, lambda name: bench_model(name, args, shared),
                  lambda name: f"{name}: optimize, budget {args.budget_s:.0f}s")
    per_model = {p.stem: json.loads(p.read_text()) for p in sorted(rdir.glob("*.json"))}
    summary = summarize(per_model, machine_info(args.threads))
    Path(args.out).write_text(json.dumps(summary, indent=1, default=str))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
