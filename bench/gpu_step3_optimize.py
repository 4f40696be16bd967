"""Issue 62, step 3: `optimize --device cuda` (the H100 predictor prices, only what decides is timed) vs Korch fully measured.

    python bench/gpu_step3_optimize.py prepare          # here (TVM): price the models' candidates as h100
                                                        #   -> bench/gpu_inputs/optimize_gpu_predictions.sqlite (+ .json)
    python bench/gpu_step3_optimize.py check            # here: the committed store still answers every price
    python bench/gpu_step3_optimize.py run              # device: both ways of planning per model -> $OUT/optimize_gpu.json
    python bench/gpu_step3_optimize.py run --dry-run    # here: the same on this CPU (tiny-cnn), no GPU

Why split: the GPU machine has PyTorch but no TVM, and the predictor prices a candidate from its
CUDA programs, which TVM draws. So pricing runs here, into a measurement store that travels with
the tree (`optimize --price-only`), and the GPU machine plans from it: `optimize_gpu` with the same
store reads every prediction and only builds and times the kernels the solver's solutions use.

Per model, on the device: (a) `optimize_gpu` from the stored predictions, (b) Korch fully measured
(`orchestrate` with `TorchDeviceCost`: every unique candidate built by Inductor and timed, the
path of bench/korch_gpu.py) over the same candidates, each in its own process with its own empty
Inductor cache, so neither reuses the other's compiled kernels; then (c) both plans (one CUDA graph
each), PyTorch eager and torch.compile (default and with CUDA graphs) timed in the same interleaved
rounds (>= 200 single runs each after warm-up), every output checked against ONNX Runtime.
Time to plan for (a) = its GPU seconds + the pricing seconds of `prepare` (here, on this 2-core
VM: an upper bound for a machine with more cores, as pricing runs in forked workers).
Exit status: 0 every check passed, 1 a check failed, 2 not runnable here.
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

MODELS = ("resnet-50", "bert-base")    # the two with the fewest candidates of the four step 2 measures
DRY_MODELS = ("tiny-cnn",)
PRICE_AS = "h100"                      # the shipped GPU predictor's GPU: what every candidate is priced as
INPUTS = ROOT / "bench" / "gpu_inputs"
STORE = INPUTS / "optimize_gpu_predictions.sqlite"
PRICING_JSON = INPUTS / "optimize_gpu_predictions.json"
ROUNDS = 200
MAX_NODES = 8
T0 = time.perf_counter()
# the dry run's planning processes run as on the device, where TVM is absent: importing it fails
NO_TVM_SITE = """
import importlib.abc, importlib.machinery, sys
class _NoTVM(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tvm", "tvm_ffi"):
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        raise ImportError(f"No module named '{spec.name}' (the dry run hides TVM, as the GPU machine lacks it)")
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, _NoTVM())
"""


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- here ------------------------------------------------------------------------------------------
def prepare(args) -> int:
    """Price every candidate of each model as `PRICE_AS` into the store (cached: a rerun prices nothing)."""
    import platform

    from tensorplan import devices
    from tensorplan.workflows.optimize_gpu import GPU_SAMPLES, optimize_gpu
    from tensorplan.zoo.specs import as_graph

    store = Path(args.store)
    store.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {"models": {}}
    for name in args.models:
        t0 = time.perf_counter()
        plan = optimize_gpu(as_graph(name, None, 17), devices.device(PRICE_AS), budget_s=3600.0, t_start=t0,
                            phases={}, store=store, samples=GPU_SAMPLES, max_nodes=MAX_NODES, price_only=True, say=log)
        opt, tuned = plan.stats["optimize"], plan.stats["cost_model"]["tuned"]
        prev = doc["models"].get(name, {})
        fresh = tuned["searched"] > 0 or not prev       # a rerun that priced nothing keeps the first run's seconds
        doc["models"][name] = prev if not fresh else {
            "candidates": opt["candidates"], "unique_kernels": opt["unique_kernels"],
            "cuda_kernels_priced_by_cdmpp": tuned["tuned"], "by_work_model": tuned["fallback"],
            "draws": tuned["draws"], "pricing_s": round(opt["phases"]["predict_s"], 2),
            "total_s": round(time.perf_counter() - t0, 2),
            "plan_on_predictions": {"kernels": len(plan.kernels), "predicted_ms": plan.predicted_s * 1e3}}
        log(f"{name}: {opt['unique_kernels']} unique kernels priced in {opt['phases']['predict_s']:.1f}s")
    doc.update({"command": "python bench/gpu_step3_optimize.py prepare " + " ".join(sys.argv[2:]),
                "price_as": PRICE_AS, "samples": GPU_SAMPLES, "max_nodes": MAX_NODES,
                "store": str(store.relative_to(ROOT)) if store.is_relative_to(ROOT) else str(store),
                "machine": {"cpu": platform.processor() or platform.machine(), "nproc": os.cpu_count(),
                            "note": "pricing ran here (TVM draws the CUDA programs); the device only reads it"}})
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    with sqlite3.connect(store) as db:      # the WAL folded in: the one file that is committed holds it all
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    log(f"wrote {args.out} and {store} ({store.stat().st_size / 1e6:.1f} MB)")
    return 0


def check(args) -> int:
    """Price each model again on a copy of the committed store: every price must be found there
    (nothing drawn), or the device, which has no TVM, would stop; e.g. after the GPU model changed."""
    from tensorplan import devices
    from tensorplan.workflows.optimize_gpu import GPU_SAMPLES, optimize_gpu
    from tensorplan.zoo.specs import as_graph

    stale = []
    with tempfile.TemporaryDirectory() as td:
        copy = Path(td) / "copy.sqlite"
        with sqlite3.connect(args.store) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)
        for name in args.models:
            plan = optimize_gpu(as_graph(name, None, 17), devices.device(PRICE_AS), budget_s=3600.0,
                                t_start=time.perf_counter(), phases={}, store=copy, samples=GPU_SAMPLES,
                                max_nodes=MAX_NODES, price_only=True)
            tuned = plan.stats["cost_model"]["tuned"]
            log(f"{name}: {tuned['cache_hits']} CUDA prices found in the store, {tuned['searched']} missing")
            if tuned["searched"]:
                stale.append(name)
    if stale:
        log(f"STALE: {', '.join(stale)} would need TVM on the device: rerun `prepare` and commit the store")
    return 1 if stale else 0


# -- one way of planning, in its own process ---------------------------------------------------------
def plan_one(args) -> int:
    """Child process: plan `args.model` one way, save the plan and what it took."""
    import torch

    from tensorplan import devices

    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    t0 = time.perf_counter()
    if args.how == "lazy":
        from tensorplan.workflows.optimize_gpu import optimize_gpu
        from tensorplan.zoo.specs import as_graph
        spec = devices.device("cuda") if args.device == "cuda" else devices.device(PRICE_AS)
        plan = optimize_gpu(as_graph(args.model, None, 17), spec, budget_s=args.budget_s, t_start=t0, phases={},
                            store=args.store, max_nodes=MAX_NODES, price_as=PRICE_AS, peers=False,
                            torch_device=args.device, jobs=args.jobs, say=log)
        opt = plan.stats["optimize"]
        info = {"measured": opt["measured"], "from_store": opt["from_store"], "unique_kernels": opt["unique_kernels"],
                "candidates": opt["candidates"], "stop": opt["stop"], "solves": len(opt["iterations"]),
                "iterations": opt["iterations"], "phases": opt["phases"], "max_rel_err": opt["max_rel_err"],
                "cost_model": plan.stats["cost_model"], "kernels_priced_vs_timed": plan.stats["gpu"]["kernels"]}
    else:
        from tensorplan.cost.torch_device import TorchDeviceCost
        from tensorplan.workflows.orchestrate import orchestrate
        cm = TorchDeviceCost(args.device, jobs=args.jobs, log=log)
        spec = devices.device("cuda") if args.device == "cuda" else devices.device("local")
        plan = orchestrate(args.model, device=spec, cost=cm, regions=False, max_nodes=MAX_NODES, method="blp",
                           time_limit=60.0, log=log)
        info = {"measured": len(cm.cache), "candidates": plan.stats["enumeration"]["candidates"],
                "unique_kernels": plan.stats["enumeration"]["unique_hashes"], "timing": plan.timing,
                "cost_model": cm.describe()}
    info["time_to_plan_s"] = time.perf_counter() - t0
    if args.how == "lazy":     # optimize also checked its plan against ONNX Runtime: not planning, reported apart
        info["verify_s"] = info["phases"].get("verify_s", 0.0) + info["phases"].get("peers_s", 0.0)
        info["time_to_plan_s"] -= info["verify_s"]
    info["plan_kernels"] = len(plan.kernels)
    info["solo_sum_ms"] = plan.predicted_s * 1e3
    plan.save(args.plan)
    Path(args.info).write_text(json.dumps(info, indent=1, default=float) + "\n")
    log(f"{args.model} ({args.how}): {len(plan.kernels)} kernels, {info['measured']} of {info['unique_kernels']} "
        f"kernels timed, {info['time_to_plan_s']:.1f}s")
    return 0


def _child(how: str, model: str, work: Path, device: str, jobs: int, store: Path | None, budget_s: float) -> dict:
    cache = work / f"inductor_{how}"
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "TRITON_CACHE_DIR": str(cache / "triton"),
           "PYTHONUNBUFFERED": "1"}
    if device != "cuda":                  # dry run: no TVM in the planning process, as on the device
        site = work / "no_tvm_site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(NO_TVM_SITE)
        env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    cmd = [sys.executable, __file__, "plan", how, model, "--device", device, "--jobs", str(jobs),
           "--plan", str(work / f"{how}.plan.json"), "--info", str(work / f"{how}.json"), "--budget-s", str(budget_s)]
    if store is not None:
        cmd += ["--store", str(store)]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        return {"error": f"exit status {r.returncode}", "wall_s": wall}
    info = json.loads((work / f"{how}.json").read_text())
    info["wall_s"] = wall           # process start and model load included
    return info


# -- the device call -------------------------------------------------------------------------------------
def bench_model(name: str, work: Path, device: str, jobs: int, rounds: int, budget_s: float, pricing: dict) -> dict:
    import torch

    import korch_gpu
    from tensorplan.ir.reference import rel_error
    from tensorplan.measure.timer import interleaved
    from tensorplan.runtime.plan import Plan
    from tensorplan.runtime.torch_runner import TorchPlanRunner

    res: dict = {"model": name, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    store = work / "predictions.sqlite"
    with sqlite3.connect(STORE if device == "cuda" else pricing["_store"]) as src, sqlite3.connect(store) as dst:
        src.backup(dst)                     # a consistent copy (WAL included); the committed file stays as it is
    res["lazy"] = _child("lazy", name, work, device, jobs, store, budget_s)
    res["full"] = _child("full", name, work, device, jobs, None, budget_s)
    if "error" in res["lazy"] or "error" in res["full"]:
        return res
    pr = pricing.get("models", {}).get(name, {})
    res["lazy"]["pricing_s_here"] = pr.get("pricing_s")
    res["time_to_plan_s"] = {"optimize (priced + timed what decides)": res["lazy"]["time_to_plan_s"] + (pr.get("pricing_s") or 0.0),
                             "optimize, GPU side only": res["lazy"]["time_to_plan_s"],
                             "Korch fully measured": res["full"]["time_to_plan_s"]}
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    feeds, ref, module, dev_inputs = korch_gpu.zoo_setup(name, device)
    first = korch_gpu.first_output
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    runners, errors = {}, {}
    with torch.inference_mode():
        for how, label in (("lazy", "optimize plan"), ("full", "fully measured plan")):
            plan = Plan.load(work / f"{how}.plan.json")
            prim = plan.primitive_graph()
            r = TorchPlanRunner(plan, prim, device=device, cuda_graph=device == "cuda")
            r.bind(feeds)
            out = r.outputs_numpy(r.replay())
            errors[label] = max(float(rel_error(out[o], x)) for o, x in zip(prim.outputs, ref))
            runners[label] = r.replay
        runners["pytorch"] = lambda: module(*dev_inputs)
        errors["pytorch"] = float(rel_error(first(module(*dev_inputs)), ref[0]))
        for key, mode in (("torch.compile", None), ("torch.compile-cudagraphs", "reduce-overhead")):
            if mode and device != "cuda":
                continue
            try:
                cmod = torch.compile(module, mode=mode) if mode else torch.compile(module)
                for _ in range(3):
                    out = cmod(*dev_inputs)
                sync()
                errors[key] = float(rel_error(first(out), ref[0]))
                runners[key] = (lambda c: (lambda: c(*dev_inputs)))(cmod)
            except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
                errors[key] = f"{type(e).__name__}: {str(e)[:300]}"

        def synced(fn):
            def run():
                fn()
                sync()
            return run
        times = interleaved({k: synced(f) for k, f in runners.items()}, rounds, pause_s=0.0, burst_s=0.0,
                            max_burst=50)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    res["median_ms"] = med
    res["runs"] = {k: len(v) for k, v in times.items()}
    res["max_rel_err_vs_ort"] = errors
    res["optimize_vs_full"] = med["optimize plan"] / med["fully measured plan"]
    res["kernels_timed_share"] = res["lazy"]["measured"] / max(1, res["full"]["measured"])
    res["planning_speedup"] = res["full"]["time_to_plan_s"] / res["time_to_plan_s"]["optimize (priced + timed what decides)"]
    log(f"{name}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(med.items(), key=lambda kv: kv[1]))
        + f"; optimize plan / fully measured plan {res['optimize_vs_full']:.3f}; planned in "
        f"{res['time_to_plan_s']['optimize (priced + timed what decides)']:.0f}s vs {res['full']['time_to_plan_s']:.0f}s, "
        f"timing {res['lazy']['measured']} of {res['full']['measured']} kernels")
    return res


def run(args) -> int:
    import torch

    import korch_gpu

    if args.dry_run:
        device, rounds, jobs = "cpu", args.rounds or 5, 1
        models = list(args.models or DRY_MODELS)
        out = Path(args.out or "/tmp/gpu_step3_dry/optimize_gpu.json")
        work = Path(tempfile.mkdtemp(prefix="gpu_step3_"))
        store = work / "dry_predictions.sqlite"
        log(f"DRY RUN on this CPU (PyTorch CPU kernels, no CUDA graphs; not a GPU result): {models}")
        pricing_json = work / "pricing.json"
        rc = prepare(argparse.Namespace(models=models, store=str(store), out=str(pricing_json)))
        if rc:
            return rc
        pricing = {**json.loads(pricing_json.read_text()), "_store": store}
    else:
        if not torch.cuda.is_available():
            print("gpu_step3_optimize: no CUDA GPU here; --dry-run runs the same on this CPU", file=sys.stderr)
            return 2
        if not STORE.exists():
            print(f"gpu_step3_optimize: {STORE} is missing: run `prepare` where TVM is and commit it", file=sys.stderr)
            return 2
        device, rounds = "cuda", args.rounds or ROUNDS
        jobs = max(1, min(12, (os.cpu_count() or 2) - 2))
        models = list(args.models or MODELS)
        out = Path(args.out or Path(os.environ.get("OUT", "/tmp/out")) / "optimize_gpu.json")
        work = Path(tempfile.mkdtemp(prefix="gpu_step3_"))
        pricing = json.loads(PRICING_JSON.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"command": "python bench/gpu_step3_optimize.py run " + " ".join(sys.argv[2:]), "dry_run": args.dry_run,
           "machine": korch_gpu.machine(device), "price_as": PRICE_AS, "rounds": rounds, "jobs": jobs,
           "pricing": {k: v for k, v in pricing.items() if k != "_store"}, "models": {}}
    bad = []
    for name in models:
        if time.perf_counter() - T0 > args.budget_s:
            log(f"{name}: not started, the call's {args.budget_s:.0f}s are spent")
            break
        mwork = work / name
        mwork.mkdir(parents=True, exist_ok=True)
        r = bench_model(name, mwork, device, jobs, rounds, args.budget_s, pricing)
        doc["models"][name] = r
        out.write_text(json.dumps(doc, indent=1, default=float) + "\n")
        for how in ("lazy", "full"):
            if "error" in r.get(how, {}):
                bad.append(f"{name} ({how}): {r[how]['error']}")
        for k, v in (r.get("max_rel_err_vs_ort") or {}).items():
            if not isinstance(v, float) or v > 1e-3:
                bad.append(f"{name}: {k} off ONNX Runtime: {v}")
        short = {k: n for k, n in (r.get("runs") or {}).items() if n < rounds}
        if short:
            bad.append(f"{name}: fewer than {rounds} timed runs: {short}")
    log(f"wrote {out}")
    for b in bad:
        log("CHECK FAILED " + b)
    return 1 if bad or not doc["models"] else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="here (TVM): price the models' candidates as h100 into the store")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--store", default=str(STORE))
    p.add_argument("--out", default=str(PRICING_JSON))
    k = sub.add_parser("check", help="here: the committed store answers every price (no TVM needed there)")
    k.add_argument("--models", nargs="+", default=list(MODELS))
    k.add_argument("--store", default=str(STORE))
    r = sub.add_parser("run", help="device: optimize from the stored predictions vs Korch fully measured")
    r.add_argument("--models", nargs="+", help=f"default {' '.join(MODELS)} (dry run: tiny-cnn)")
    r.add_argument("--rounds", type=int, help=f"timed runs per system (default {ROUNDS}; dry run 5)")
    r.add_argument("--out", help="result JSON (default $OUT/optimize_gpu.json; dry run /tmp/gpu_step3_dry)")
    r.add_argument("--dry-run", action="store_true", help="on this CPU, tiny-cnn, no GPU needed")
    r.add_argument("--budget-s", type=float, default=480.0, help="no model starts after this many seconds")
    c = sub.add_parser("plan", help="internal: one way of planning one model, in its own process")
    c.add_argument("how", choices=("lazy", "full"))
    c.add_argument("model")
    c.add_argument("--device", default="cuda")
    c.add_argument("--jobs", type=int, default=1)
    c.add_argument("--store")
    c.add_argument("--plan", required=True)
    c.add_argument("--info", required=True)
    c.add_argument("--budget-s", type=float, default=480.0)
    args = ap.parse_args(argv)
    return {"prepare": prepare, "check": check, "run": run, "plan": plan_one}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
