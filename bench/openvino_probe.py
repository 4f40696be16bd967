"""Would OpenVINO's CPU runtime be a better ONNX Runtime region backend on this machine? (a probe)

Why: efficientvit-b1 and yolox-nano sit 1.7-1.9x above the roofline bound because ONNX Runtime's
convolutions cannot fuse SiLU and run depthwise convolutions at a fifth of peak (docs/results.md);
OpenVINO fuses Swish into its convolutions and has blocked depthwise kernels. This times the same
ONNX files in both runtimes (2 threads, latency hint, fp32), interleaved as the benchmarks do
(`measure.timer.interleaved`: random order, 50 ms pauses, bursts), and checks their outputs agree.

OpenVINO is pinned in pyproject.toml (openvino==2026.4.1; tensorplan uses it as a region backend since
this probe, kernels/openvino.py):

    python bench/openvino_probe.py --models yolox-nano,efficientvit-b1   # -> bench/results/openvino_probe.json
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import typer


def main(models: str = typer.Option("yolox-nano,efficientvit-b1", help="Comma-separated zoo models."),
         rounds: int = typer.Option(15, help="Interleaved rounds."),
         out: Path = typer.Option(Path("bench/results/openvino_probe.json"), help="Results JSON.")) -> None:
    try:
        import openvino as ov
    except ImportError:
        raise SystemExit("openvino is not installed: .venv/bin/pip install openvino==2026.4.1") from None
    from tensorplan.devices import resolve
    from tensorplan.zoo.specs import load_model, resolve_model_path
    from tensorplan.ir.reference import random_feeds, rel_error
    from tensorplan.ir.to_onnx import ort_session
    from tensorplan.measure.timer import interleaved, pinned_threads
    import onnx
    core = ov.Core()
    rows = []
    for m in models.split(","):
        path = str(resolve_model_path(m))
        feeds = random_feeds(load_model(m), seed=0)
        with pinned_threads(2):
            sess = ort_session(onnx.load(path), threads=2)
            names = [o.name for o in sess.get_outputs()]
            cm = core.compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": 2, "INFERENCE_PRECISION_HINT": "f32",
                                                  "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
            req = cm.create_infer_request()
            want = sess.run(names, feeds)
            req.infer(feeds)
            got = [req.get_output_tensor(i).data.copy() for i in range(len(names))]
            err = max(rel_error(g, w) for g, w in zip(got, want))
            times = interleaved({"onnxruntime": lambda: sess.run(names, feeds), "openvino": lambda: req.infer(feeds)},
                                rounds, burst_s=0.03)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        rows.append({"model": m, "median_ms": med, "openvino_speedup": med["onnxruntime"] / med["openvino"],
                     "max_rel_err": err})
        print(f"{m:18s} ORT {med['onnxruntime']:8.2f} ms  OpenVINO {med['openvino']:8.2f} ms  "
              f"ORT/OpenVINO {med['onnxruntime'] / med['openvino']:.2f}x  rel err {err:.1e}", flush=True)
    res = {"bench": "openvino_probe", "openvino": ov.__version__, "rounds": rounds, "threads": 2, "rows": rows,
           "machine": resolve("local").to_dict(), "created": time.time()}
    out.write_text(json.dumps(res, indent=1, default=float))
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
