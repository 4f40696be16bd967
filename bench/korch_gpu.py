"""Korch on a CUDA GPU: tensorplan plans vs PyTorch eager and torch.compile, one interleaved run.

    python bench/korch_gpu.py --models candy efficientvit-b1        # -> bench/results/korch_gpu.json

Per model: fission, candidate enumeration, every unique candidate built with PyTorch (Inductor
fuses a memory-bound candidate into one Triton kernel; linear primitives call cuDNN/cuBLAS) and
timed on the GPU as CUDA-graph replays (`cost.torch_device`), the BLP, and the plan run as one
CUDA graph (`runtime.torch_runner`). Baselines on the same GPU in the same interleaved rounds:
PyTorch eager, `torch.compile` (default, mode="max-autotune-no-cudagraphs", and
mode="reduce-overhead", which also replays CUDA graphs), plus the ablations greedy fusion and no
fusion over the same kernels. Every system's
output is checked against ONNX Runtime (CPU) on the same inputs. TF32 is off for every system
(fp32 results comparable to 1e-4). The roofline bound uses the GPU's fp32 peak and bandwidth
measured in the same run. Results are written after each model, and a rerun skips models
already in the file (`--force` redoes them). Needs a CUDA GPU; elsewhere it says so and skips.
`--device cpu` runs the same protocol on this CPU (no CUDA graphs; a dry run of the script, not
a GPU result: bench/gpu_step2_korch.py run --dry-run).
`--merge A.json B.json` folds result files fetched from GPU machines into --out (no GPU needed).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def gpu_peaks(device: str = "cuda") -> dict:
    """fp32 (no TF32) matmul GFLOP/s and device-to-device copy GB/s (read + write), measured now."""
    import torch
    from tensorplan.cost.torch_device import cuda_graph_timer
    if device != "cuda":
        from tensorplan.devices import resolve
        spec = resolve("local")
        return {"fp32_matmul_gflops": spec.peak_fp32_gflops, "copy_gbs": spec.mem_bw_gbs,
                "method": "tensorplan.devices 'local' (this CPU's measured GEMM and bandwidth)"}
    n = 8192
    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    mm = cuda_graph_timer(lambda: torch.mm(a, b), calls=3, budget_s=0.3)
    x = torch.randn(256 * 2 ** 20, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    cp = cuda_graph_timer(lambda: y.copy_(x), calls=5, budget_s=0.3)
    return {"fp32_matmul_gflops": 2 * n ** 3 / mm / 1e9, "copy_gbs": 2 * x.numel() * 4 / cp / 1e9,
            "method": "torch.mm 8192^3 fp32 (TF32 off) and a 1 GiB copy_, CUDA-graph replays, median"}


def machine(device: str = "cuda") -> dict:
    import subprocess

    import onnxruntime
    import torch
    if device != "cuda":
        return {"gpu": None, "device": "cpu (dry run)", "cpu": platform.processor() or platform.machine(),
                "platform": platform.platform(), "python": platform.python_version(), "nproc": os.cpu_count(),
                "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__}}
    import triton
    p = torch.cuda.get_device_properties(0)
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # noqa: BLE001
        drv = None
    return {"gpu": p.name, "sms": p.multi_processor_count, "gpu_mem_gb": round(p.total_memory / 2 ** 30, 1),
            "driver": drv, "capability": list(torch.cuda.get_device_capability(0)),
            "platform": platform.platform(), "python": platform.python_version(), "nproc": os.cpu_count(),
            "versions": {"torch": torch.__version__, "triton": triton.__version__,
                         "onnxruntime": onnxruntime.__version__}}


def costs_path(folder: str | Path, name: str) -> Path:
    return Path(folder) / f"korch_gpu_costs_{name}.json"


def load_costs(folder: str | Path | None, name: str, gpu: str | None) -> dict[str, float]:
    """Candidate latencies (canonical hash -> seconds) timed on a GPU of the same name in an earlier
    call (bench/gpu_step2_korch.py profiles a large model over several calls); {} if none."""
    if not folder or not costs_path(folder, name).exists():
        return {}
    doc = json.loads(costs_path(folder, name).read_text())
    if doc.get("gpu") != gpu:
        log(f"{name}: {costs_path(folder, name)} was timed on {doc.get('gpu')}, not {gpu}: not used")
        return {}
    return {k: float(v) for k, v in doc["costs"].items()}


def zoo_setup(name: str, dev: str) -> tuple[dict, list, object, tuple]:
    """A zoo model's inputs as numpy feeds, ONNX Runtime's outputs on them (CPU, the reference every
    system is checked against), its PyTorch module in eval mode on `dev` and the inputs there."""
    import onnxruntime as ort

    from tensorplan import zoo
    entry = zoo.get_entry(name)
    inputs = zoo.example_inputs(name)
    feeds = {k: v.numpy() for k, v in zip(entry.input_shapes, inputs)}
    sess = ort.InferenceSession(str(zoo.export(name)), providers=["CPUExecutionProvider"])
    ref = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
    module, _ = zoo.build_torch(name)
    return feeds, ref, module.to(dev).eval(), tuple(x.to(dev) for x in inputs)


def first_output(out):
    """A module's first output (tensor, tuple/list, dict, or `.logits`) as a float32 numpy array."""
    o = out[0] if isinstance(out, (tuple, list)) else (next(iter(out.values())) if isinstance(out, dict) else out)
    o = getattr(o, "logits", o)
    return o.detach().float().cpu().numpy()


def bench_model(name: str, args, peaks: dict) -> dict:
    import torch

    from tensorplan.cost.torch_device import TorchDeviceCost
    from tensorplan.devices import resolve
    from tensorplan.ir import analysis
    from tensorplan import zoo
    from tensorplan.ir.reference import rel_error
    from tensorplan.measure.timer import interleaved
    from tensorplan.workflows.orchestrate import orchestrate
    from tensorplan.runtime.torch_runner import TorchPlanRunner

    res: dict = {"model": name, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    g = zoo.load(name)
    flops, mbytes = analysis.graph_flops(g), analysis.min_bytes(g)
    roof_ms = analysis.roofline_ms(flops, mbytes, peaks["fp32_matmul_gflops"], peaks["copy_gbs"])
    res["roofline"] = {"gflops": flops / 1e9, "min_mbytes": mbytes / 1e6, "bound_ms": roof_ms}
    log(f"{name}: {len(g.nodes)} ops, {flops / 1e9:.2f} GFLOP, {mbytes / 1e6:.1f} MB, roofline {roof_ms:.3f} ms")

    dev = args.device
    spec = resolve("cuda" if dev == "cuda" else "local")
    cm = TorchDeviceCost(dev, jobs=args.jobs, log=log)
    cm.cache.update(load_costs(args.costs, name, machine(dev)["gpu"]))
    res["costs_preloaded"] = len(cm.cache)
    plans = {}
    for key, method in (("tensorplan", "blp"), ("greedy", "greedy"), ("no-fusion", "none")):
        plans[key] = orchestrate(name, device=spec, cost=cm, regions=False, max_nodes=args.max_nodes,
                                 method=method, time_limit=60.0, progress=False, log=log)
    res["orchestrate"] = {k: {"kernels": len(p.kernels), "predicted_ms": sum(x.predicted_s for x in p.kernels) * 1e3,
                              "timing": p.timing, "solver": p.solver} for k, p in plans.items()}
    res["cost_model"] = cm.describe()
    res["candidate_errors"] = dict(list(cm.errors.items())[:5])
    res["enumeration"] = plans["tensorplan"].stats["enumeration"]
    plans["tensorplan"].save(Path(args.out).with_name(f"korch_gpu_{name}.plan.json"))

    feeds_np, ref, module, dev_inputs = zoo_setup(name, dev)
    first = first_output

    runners, errors, build = {}, {}, {}
    with torch.inference_mode():
        runners["pytorch"] = lambda: module(*dev_inputs)
        errors["pytorch"] = rel_error(first(module(*dev_inputs)), ref[0])
        for key, mode in (("torch.compile", None), ("torch.compile-max-autotune", "max-autotune-no-cudagraphs"),
                          ("torch.compile-cudagraphs", "reduce-overhead")):
            t0 = time.perf_counter()
            try:
                cmod = torch.compile(module, mode=mode) if mode else torch.compile(module)
                for _ in range(3):
                    out = cmod(*dev_inputs)
                if dev == "cuda":
                    torch.cuda.synchronize()
                build[key] = time.perf_counter() - t0
                errors[key] = rel_error(first(out), ref[0])
                runners[key] = (lambda c: (lambda: c(*dev_inputs)))(cmod)
            except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, not fatal
                errors[key] = f"{type(e).__name__}: {str(e)[:300]}"
    prim = plans["tensorplan"].primitive_graph()
    for key, p in plans.items():
        for graph in ((True, False) if key == "tensorplan" else (True,)) if dev == "cuda" else (False,):
            label = key if graph or dev != "cuda" else f"{key} (no CUDA graph)"
            t0 = time.perf_counter()
            r = TorchPlanRunner(p, prim, device=dev, cuda_graph=graph)
            r.bind(feeds_np)
            out = r.outputs_numpy(r.replay())
            build[label] = time.perf_counter() - t0
            errors[label] = max(rel_error(out[o], x) for o, x in zip(prim.outputs, ref))
            runners[label] = r.replay
    log(f"{name}: max rel error vs ONNX Runtime: " +
        ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}" for k, v in errors.items()))

    def synced(fn):
        if dev != "cuda":
            return fn

        def run():
            fn()
            torch.cuda.synchronize()
        return run

    with torch.inference_mode():
        times = interleaved({k: synced(f) for k, f in runners.items()}, args.rounds, pause_s=0.0,
                            burst_s=args.burst_s, max_burst=50)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    res["median_ms"] = med
    res["rounds_ms"] = {k: [x * 1e3 for x in v] for k, v in times.items()}
    res["max_rel_err_vs_ort"] = errors
    res["build_s"] = build
    base = [k for k in ("pytorch", "torch.compile", "torch.compile-max-autotune", "torch.compile-cudagraphs")
            if k in med]
    best = min(base, key=med.get)
    res["best_baseline"] = best
    res["speedup_vs_best_baseline"] = med[best] / med["tensorplan"]
    res["speedup_vs"] = {k: med[k] / med["tensorplan"] for k in base}
    res["vs_roofline"] = med["tensorplan"] / roof_ms
    res["predicted_vs_measured"] = {"predicted_ms": res["orchestrate"]["tensorplan"]["predicted_ms"],
                                    "measured_ms": med["tensorplan"]}
    log(f"{name}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(med.items(), key=lambda kv: kv[1])) +
        f"; tensorplan {res['speedup_vs_best_baseline']:.2f}x vs {best}, {res['vs_roofline']:.2f}x roofline")
    return res


def summarize(doc: dict) -> None:
    """Geomean speedup over the best baseline per model, and each model's medians."""
    import math
    ok = {k: v for k, v in doc.get("models", {}).items() if "speedup_vs_best_baseline" in v}
    if not ok:
        return
    sp = [v["speedup_vs_best_baseline"] for v in ok.values()]
    doc["summary"] = {"geomean_speedup_vs_best_baseline": math.exp(sum(map(math.log, sp)) / len(sp)),
                      "models": {k: {"speedup": v["speedup_vs_best_baseline"], "best": v["best_baseline"],
                                     "vs_roofline": v["vs_roofline"], "median_ms": v["median_ms"],
                                     "kernels": v["orchestrate"]["tensorplan"]["kernels"],
                                     "gpu": v.get("machine", {}).get("gpu")}
                                 for k, v in ok.items()}}


def merge(out: Path, files: list[str]) -> int:
    """Fold the models of other result files (e.g. fetched from a GPU machine) into `out`."""
    doc = json.loads(out.read_text()) if out.exists() else {"models": {}}
    for f in files:
        other = json.loads(Path(f).read_text())
        for name, res in other.get("models", {}).items():
            if "median_ms" in res:
                res.setdefault("machine", other.get("machine"))
                res.setdefault("peaks", other.get("peaks"))
                doc.setdefault("models", {})[name] = res
        doc.setdefault("machine", other.get("machine"))
        doc.setdefault("peaks", other.get("peaks"))
    summarize(doc)
    out.write_text(json.dumps(doc, indent=1, default=float))
    print(json.dumps(doc.get("summary"), indent=1, default=float))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["candy", "efficientvit-b1"])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the same protocol on this CPU, a dry run of the script (no GPU result)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--burst-s", type=float, default=0.05)
    ap.add_argument("--max-nodes", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=max(1, min(12, (os.cpu_count() or 2) - 2)),
                    help="processes that pre-compile candidates (Inductor caches)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "korch_gpu.json"))
    ap.add_argument("--force", action="store_true", help="redo models already in --out")
    ap.add_argument("--costs", metavar="DIR",
                    help="candidate timings of earlier calls on this GPU (DIR/korch_gpu_costs_MODEL.json)")
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="no measuring: fold these result files' models into --out and re-summarize")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(Path(args.out), args.merge)
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print("korch_gpu: skipped, no CUDA GPU here (the CPU results come from korch_bench.py)")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc["machine"] = machine(args.device)
    doc["peaks"] = gpu_peaks(args.device)
    doc["command"] = "bench/korch_gpu.py " + " ".join(argv if argv is not None else sys.argv[1:])
    log(f"{doc['machine']['gpu'] or doc['machine']['device']}: fp32 {doc['peaks']['fp32_matmul_gflops'] / 1e3:.1f} TFLOP/s, "
        f"copy {doc['peaks']['copy_gbs']:.0f} GB/s")
    models = doc.setdefault("models", {})
    for name in args.models:
        if name in models and "median_ms" in models[name] and not args.force:
            log(f"{name}: already measured, skipped (--force redoes it)")
            continue
        try:
            models[name] = bench_model(name, args, doc["peaks"])
            models[name]["machine"] = doc["machine"]  # a rerun may land on another machine of the kind
            models[name]["peaks"] = doc["peaks"]
        except Exception as e:  # noqa: BLE001 - keep the other models' results
            import traceback
            traceback.print_exc()
            models[name] = {"model": name, "error": f"{type(e).__name__}: {str(e)[:500]}"}
        out.write_text(json.dumps(doc, indent=1, default=float))
    summarize(doc)
    out.write_text(json.dumps(doc, indent=1, default=float))
    print(json.dumps(doc.get("summary"), indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
