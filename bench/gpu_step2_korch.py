"""Issue 62, step 2: Korch on a lent CUDA GPU for the models not yet measured there, in calls sized to fit.

    python bench/gpu_step2_korch.py prepare                 # here (CPU): -> bench/gpu_inputs/korch_gpu_calls.json
    python bench/gpu_step2_korch.py run --call 1            # device: the models of call 1 -> $OUT/korch_gpu.json
    python bench/gpu_step2_korch.py run --dry-run           # here: the same run on this CPU, tiny models
    python bench/gpu_step2_korch.py merge DIR/korch_gpu.json  # here: fold the fetched file into bench/results/korch_gpu.json

Why a wrapper: the GPU machine is lent for minutes (one command <= 10 min, 15 min of device time
per session), has PyTorch, Triton and ONNX Runtime but no TVM, and carries 64 MiB. The Korch GPU
path (`bench/korch_gpu.py`: candidates built by PyTorch/Inductor, timed as CUDA graphs, the BLP,
the plan replayed as one CUDA graph) needs no TVM, so nothing is prepared with TVM here. What is
prepared here is the sizing: `prepare` loads each model on this CPU exactly as the device will
(zoo export, rewrites, fission, candidate enumeration with korch_gpu's `--max-nodes`), counts
the unique candidates (each is compiled and timed on the GPU: that is the bulk of a call) and
estimates a call's device time from the seconds per candidate and per model that the H100 run
in bench/results/korch_gpu.json recorded; models are then grouped into calls of about 8 minutes.
The zoo's ONNX files (15-440 MB of random weights) are rebuilt from code on the device, not
carried. `run` passes korch_gpu.py the issue's protocol: >= 200 timed runs per system, single
calls interleaved round by round after warm-up (`--rounds 200 --burst-s 0`), PyTorch eager and
torch.compile default, max-autotune-no-cudagraphs and reduce-overhead (CUDA graphs).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

MODELS = ("bert-base", "resnet-50", "segformer-b0", "yolov4")   # the four not yet measured on a GPU
DRY_MODELS = ("tiny-cnn",)            # 17 unique candidates: Inductor compiles each on the CPU too
CALLS_JSON = ROOT / "bench" / "gpu_inputs" / "korch_gpu_calls.json"
H100_JSON = ROOT / "bench" / "results" / "korch_gpu.json"
CALL_BUDGET_S = 480.0        # about 8 minutes of a 10-minute command limit: room for the machine's own start-up
ROUNDS = 200                 # timed runs per system (single calls, interleaved)
BENCH_S = 300.0              # seconds kept for one model's measuring phase (solve, baselines' compiles, plan builds, timing)
MAX_NODES = 8                # korch_gpu.py's default candidate size cap


T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def h100_rates() -> dict:
    """Seconds the H100 run spent per unique candidate (warm + compile + time, i.e. profile_s) and
    per model outside profiling (solve, baselines' and plans' builds), worst of its models."""
    doc = json.loads(H100_JSON.read_text())
    per_cand, fixed = [], []
    for name, r in doc["models"].items():
        if "orchestrate" not in r:
            continue
        t = r["orchestrate"]["tensorplan"]["timing"]
        per_cand.append(t["profile_s"] / max(1, r["enumeration"]["unique_hashes"]))
        fixed.append(t["solve_s"] + sum(r.get("build_s", {}).values()))
    return {"s_per_unique_candidate": max(per_cand), "s_fixed_per_model": max(fixed),
            "from": f"{H100_JSON.relative_to(ROOT)} ({', '.join(doc['models'])}; "
                    f"{doc['machine']['gpu']}), the worst model of each"}


def candidates(name: str, max_nodes: int):
    """(primitive graph, candidates, stats, rewrite result, load seconds) exactly as korch_gpu's
    `orchestrate` call makes them (default rewrites, max_reduces, no linear epilogues, no regions),
    so the canonical hashes timed here are the ones it looks up."""
    from tensorplan import zoo
    from tensorplan.korch.candidates import EnumerationStats, enumerate_candidates
    from tensorplan.korch.fission import fission
    from tensorplan.rewrite import rewrite

    t0 = time.perf_counter()
    g = zoo.load(name)
    load_s = time.perf_counter() - t0
    rr = rewrite(g)
    fr = fission(rr.graph)
    est = EnumerationStats()
    cands = enumerate_candidates(fr.graph, max_nodes=max_nodes, opaque={n for n, _ in fr.opaque}, stats=est)
    return g, fr.graph, cands, est, rr, load_s


def enumerate_model(name: str, max_nodes: int) -> dict:
    """What the device will enumerate for `name`: korch_gpu's orchestrate steps up to the costs."""
    from tensorplan import zoo

    g, _, _, est, rr, load_s = candidates(name, max_nodes)
    onnx_path = zoo.export(name)
    return {"operators": len(g.nodes), "rewrites": dict(rr.counts), "primitives": est.primitives,
            "candidates": est.candidates, "unique_candidates": est.unique_hashes,
            "onnx_mb": round(onnx_path.stat().st_size / 1e6, 1), "load_s_here": round(load_s, 1)}


def group_calls(models: dict, budget_s: float) -> list[list[str]]:
    """Calls of about `budget_s` each, models in the given order: a model's candidate profiling
    (`profile_s`) may spread over several calls (each resumes the last one's costs file) and its
    measuring phase (`bench_s`) comes in the call that completes the profile; a call holds a
    second model only if that one fits whole in what is left."""
    calls: list[list[str]] = []
    left = 0.0
    for name, m in models.items():
        need = m["profile_s"] + m["bench_s"]
        if calls and need <= left:
            calls[-1].append(name)
            left -= need
            continue
        while need > budget_s:                 # profile-only calls
            calls.append([name])
            need -= budget_s - 30.0            # each call pays ~30 s to load the model and start its pool
        calls.append([name])
        left = budget_s - need
    return calls


def prepare(args) -> int:
    rates = h100_rates()
    models = {}
    for name in args.models:
        log(f"{name}: load, rewrite, fission, enumerate (max_nodes={args.max_nodes})")
        m = enumerate_model(name, args.max_nodes)
        m["profile_s"] = round(m["unique_candidates"] * rates["s_per_unique_candidate"], 0)
        m["bench_s"] = BENCH_S
        models[name] = m
        log(f"{name}: {m['operators']} ops -> {m['primitives']} primitives, {m['candidates']} candidates "
            f"({m['unique_candidates']} unique); estimated {m['profile_s']:.0f} s profiling + {BENCH_S:.0f} s "
            "measuring on the device")
    doc = {"command": "python bench/gpu_step2_korch.py prepare " + " ".join(sys.argv[2:]),
           "max_nodes": args.max_nodes, "call_budget_s": CALL_BUDGET_S, "rates": rates, "models": models,
           "calls": group_calls(models, CALL_BUDGET_S),
           "note": "profile_s = unique candidates x the H100's seconds per candidate; bench_s = the time "
                   "kept for a model's measuring phase (the H100's worst solve + builds, "
                   f"{rates['s_fixed_per_model']:.0f} s, plus torch.compile max-autotune-no-cudagraphs, "
                   "which that run did not have); a call runs `run --call K` and resumes the costs files "
                   "committed under bench/gpu_inputs/"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    log(f"wrote {out}: calls {doc['calls']}")
    return 0


def profile(name: str, folder_in: Path, out_dir: Path, deadline: float, jobs: int, device: str) -> dict:
    """Time `name`'s unique candidates on the device until `deadline` (perf_counter), resuming from
    `folder_in`'s costs file of an earlier call on the same GPU; the costs file is rewritten in
    `out_dir` after every chunk, so a call cut short keeps what it timed."""
    import korch_gpu
    from tensorplan.cost.torch_device import TorchDeviceCost

    gpu = korch_gpu.machine(device)["gpu"]
    _, prim, cands, est, _, _ = candidates(name, MAX_NODES)
    cm = TorchDeviceCost(device, jobs=jobs, log=log)
    cm.cache.update(korch_gpu.load_costs(folder_in, name, gpu))
    unique = list({c.canonical_hash: c for c in cands}.values())
    todo = [c for c in unique if c.canonical_hash not in cm.cache]
    log(f"{name}: {len(unique)} unique candidates, {len(unique) - len(todo)} timed in earlier calls, "
        f"{len(todo)} to time")
    path = korch_gpu.costs_path(out_dir, name)
    rate, done, error = None, 0, None

    def save():
        path.write_text(json.dumps({"model": name, "gpu": gpu, "max_nodes": MAX_NODES, "unique": len(unique),
                                    "costs": cm.cache, "errors": cm.errors}, indent=0) + "\n")

    while done < len(todo):
        left = deadline - time.perf_counter()
        n = 150 if rate is None else min(600, int(0.8 * left / rate))   # 0.8: a chunk runs to its end; each chunk restarts the compile pool
        if n < max(jobs, 10):
            break
        chunk = todo[done:done + n]
        t0 = time.perf_counter()
        try:
            cm.cost_many(prim, chunk)
        except Exception as e:  # noqa: BLE001 - a primitive that cannot run: report, keep what was timed
            error = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"{name}: costing stopped: {error}")
            break
        done += len(chunk)
        rate = (time.perf_counter() - t0) / len(chunk)
        save()
        log(f"{name}: {len(unique) - len(todo) + done}/{len(unique)} candidates timed ({rate:.2f} s each)")
    save()
    return {"unique": len(unique), "timed": len(cm.cache), "complete": len(cm.cache) >= len(unique),
            "s_per_candidate": rate, "error": error, "costs_file": str(path)}


def run(args) -> int:
    import korch_gpu

    if args.dry_run:
        models, device = list(args.models or DRY_MODELS), "cpu"
        rounds, jobs = args.rounds or 5, 1
        out = Path(args.out or "/tmp/gpu_step2_dry/korch_gpu.json")
        log(f"DRY RUN on this CPU (device cpu, no CUDA graphs; timings are not GPU results): {models}")
    else:
        if args.models:
            models = list(args.models)
        else:
            calls = json.loads(CALLS_JSON.read_text())["calls"]
            if not 1 <= args.call <= len(calls):
                print(f"gpu_step2_korch: --call {args.call}: {CALLS_JSON} has calls 1..{len(calls)}",
                      file=sys.stderr)
                return 2
            models = calls[args.call - 1]
        device, rounds, jobs = "cuda", args.rounds or ROUNDS, max(1, min(14, (os.cpu_count() or 2) - 2))
        out = Path(args.out or Path(os.environ.get("OUT", "/tmp/out")) / "korch_gpu.json")
        if not __import__("torch").cuda.is_available():
            print("gpu_step2_korch: no CUDA GPU here; --dry-run runs the same on this CPU", file=sys.stderr)
            return 2
    out.parent.mkdir(parents=True, exist_ok=True)
    # 1. profile: every model's candidates timed (resumed from earlier calls' costs files), leaving
    #    each model's measuring phase its estimated time; 2. measure the models whose profile is complete
    t_end = T0 + args.budget_s
    bench_s = args.bench_s if args.bench_s is not None else (0.0 if args.dry_run else BENCH_S)
    ready, status = [], {}
    for k, name in enumerate(models):
        later = bench_s * (len(models) - k - 1)      # the measuring phases of the models after this one
        status[name] = profile(name, Path(args.costs), out.parent, t_end - later, jobs, device)
        status[name]["measure_now"] = status[name]["complete"] and t_end - later - time.perf_counter() >= bench_s
        if status[name]["measure_now"]:
            ready.append(name)
        elif status[name]["complete"]:
            log(f"{name}: every candidate timed, too little time left to measure it: the next call does")
    (out.parent / "korch_gpu_profile.json").write_text(json.dumps(status, indent=1) + "\n")
    if not ready:
        log("no model measured in this call: commit the costs files from $OUT to "
            f"{Path(args.costs).relative_to(ROOT) if Path(args.costs).is_relative_to(ROOT) else args.costs}"
            " and run this call again")
        return 1 if any(st["error"] for st in status.values()) else 3
    argv = ["--models", *ready, "--device", device, "--rounds", str(rounds), "--burst-s", "0",
            "--jobs", str(jobs), "--max-nodes", str(MAX_NODES), "--costs", str(out.parent), "--out", str(out)]
    log("bench/korch_gpu.py " + " ".join(argv))
    rc = korch_gpu.main(argv)
    if rc:
        return rc
    doc = json.loads(out.read_text())
    for n, st in status.items():
        if not st["complete"]:
            log(f"{n}: {st['timed']}/{st['unique']} candidates timed; the next call resumes from its costs file")
    bad = [f"{n}: costing failed: {st['error']}" for n, st in status.items() if st["error"]]
    for name in ready:
        r = doc["models"].get(name, {})
        if "median_ms" not in r:
            bad.append(f"{name}: {r.get('error', 'no result')}")
            continue
        errs = {k: v for k, v in r["max_rel_err_vs_ort"].items() if not isinstance(v, float) or v > 1e-3}
        if errs:
            bad.append(f"{name}: outputs off ONNX Runtime: {errs}")
        short = {k: len(v) for k, v in r["rounds_ms"].items() if len(v) < rounds}
        if short:
            bad.append(f"{name}: fewer than {rounds} timed runs: {short}")
        log(f"{name}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(r["median_ms"].items(), key=lambda kv: kv[1]))
            + f" ({rounds} runs each)")
    for b in bad:
        log("CHECK FAILED " + b)
    return 1 if bad else 0


def merge(args) -> int:
    import korch_gpu

    for f in args.files:
        if not (json.loads(Path(f).read_text()).get("machine") or {}).get("gpu"):
            print(f"gpu_step2_korch merge: {f} holds no GPU run (a dry run?): not merged", file=sys.stderr)
            return 2
    return korch_gpu.merge(Path(args.out or H100_JSON), args.files)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="here: enumerate the models' candidates, estimate, group into calls")
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--max-nodes", type=int, default=MAX_NODES)
    p.add_argument("--out", default=str(CALLS_JSON))
    r = sub.add_parser("run", help="device: Korch on the GPU for one call's models (or --dry-run here)")
    r.add_argument("--call", type=int, default=1, help="which call of bench/gpu_inputs/korch_gpu_calls.json")
    r.add_argument("--models", nargs="+", help="these models instead of a call's")
    r.add_argument("--rounds", type=int, help=f"timed runs per system (default {ROUNDS}; dry run 5)")
    r.add_argument("--out", help="result JSON (default $OUT/korch_gpu.json; dry run /tmp/gpu_step2_dry)")
    r.add_argument("--dry-run", action="store_true", help="on this CPU, tiny models, no GPU needed")
    r.add_argument("--budget-s", type=float, default=CALL_BUDGET_S, help="seconds this call may take")
    r.add_argument("--bench-s", type=float, help="seconds kept per model for its measuring phase "
                   "(default 300; dry run 0)")
    r.add_argument("--costs", default=str(CALLS_JSON.parent),
                   help="folder of earlier calls' costs files (korch_gpu_costs_MODEL.json)")
    m = sub.add_parser("merge", help="here: fold fetched result files into bench/results/korch_gpu.json")
    m.add_argument("files", nargs="+")
    m.add_argument("--out", help="default bench/results/korch_gpu.json")
    args = ap.parse_args(argv)
    return {"prepare": prepare, "run": run, "merge": merge}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
