"""Export every zoo model at opsets 11 and 17 (writing the cache, so it is warm afterwards) and
report per model and opset: export time (build + trace + fold + check + write, median of
--repeats), parameters (torch, and ONNX initializer elements after BN folding), GFLOPs
(2 x MACs of Conv/MatMul/Gemm, biases not counted, as in reference/baselines.md), node count,
file size, whether LayerNormalization appears, and the ONNX Runtime vs PyTorch eager error
max|ort - torch| / max|torch| over all outputs.

    .venv/bin/python bench/zoo_export.py [--models a,b] [--opsets 11,17] [--repeats 1]

Writes bench/results/zoo_export.json (with the machine description).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from tensorplan.devices.detect import machine_info

# reference/baselines.md: (GFLOPs, params in millions)
BASELINE = {"candy": (15.43, 1.68), "segformer-b0": (15.53, 3.71), "resnet-50": (8.17, 23.51),
            "bert-base": (22.35, 108.89), "vit-b16": (35.13, 85.80), "mobilenet-v2": (0.60, 3.50),
            "yolox-nano": (1.05, 0.91)}


def linear_flops(model) -> int:
    """2 x MACs of Conv/ConvTranspose/MatMul/Gemm from the file's static value_info."""
    g = model.graph
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(g.input) + list(g.value_info) + list(g.output)}
    shapes.update({t.name: list(t.dims) for t in g.initializer})
    total = 0
    for n in g.node:
        attrs = {a.name: a for a in n.attribute}
        if n.op_type == "Conv":
            total += 2 * int(np.prod(shapes[n.output[0]])) * int(np.prod(shapes[n.input[1]][1:]))
        elif n.op_type == "ConvTranspose":
            w = shapes[n.input[1]]  # (Cin, Cout/group, k...) : every input element hits Cout/g * k taps
            total += 2 * int(np.prod(shapes[n.input[0]])) * int(np.prod(w[1:]))
        elif n.op_type in ("MatMul", "Gemm"):
            a = shapes[n.input[0]]
            k = a[-2] if "transA" in attrs and attrs["transA"].i else a[-1]
            total += 2 * int(np.prod(shapes[n.output[0]])) * k
    return total


def ort_vs_torch(name: str, model) -> tuple[float, float]:
    """(max relative error over outputs, ORT single-run seconds)."""
    import onnxruntime as ort
    import torch

    from tensorplan import zoo

    module, inputs = zoo.build_torch(name)
    with torch.no_grad():
        ref = module(*inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = zoo.numpy_inputs(name)
    t = time.perf_counter()
    outs = sess.run(None, feeds)
    dt = time.perf_counter() - t
    err = max(float(np.abs(o - r.numpy()).max() / max(float(np.abs(r.numpy()).max()), 1e-30))
              for o, r in zip(outs, ref))
    return err, dt


def main() -> None:
    import onnx
    from rich.progress import Progress

    from tensorplan import zoo

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--opsets", default="11,17")
    ap.add_argument("--repeats", type=int, default=1, help="exports timed per model and opset (median)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "zoo_export.json"))
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m] or [e.name for e in zoo.list_models()]
    opsets = [int(o) for o in args.opsets.split(",")]
    rows = []
    with Progress() as prog:
        task = prog.add_task("export + check", total=len(names) * len(opsets))
        for name in names:
            for opset in opsets:
                prog.update(task, description=f"{name} opset {opset}")
                row = {"model": name, "opset": opset}
                try:
                    times = []
                    for _ in range(args.repeats):
                        t = time.perf_counter()
                        path = zoo.export(name, opset, force=True)
                        times.append(time.perf_counter() - t)
                    model = onnx.load(str(path))
                    ops = {n.op_type for n in model.graph.node}
                    err, ort_s = ort_vs_torch(name, model)
                    row.update({
                        "export_s": statistics.median(times), "export_s_all": times,
                        "params_torch": zoo.param_count(name),
                        "params_onnx": int(sum(int(np.prod(t.dims)) for t in model.graph.initializer
                                               if t.data_type == onnx.TensorProto.FLOAT)),
                        "gflops": linear_flops(model) / 1e9, "nodes": len(model.graph.node),
                        "file_mb": path.stat().st_size / 2**20,
                        "has_layernorm": "LayerNormalization" in ops,
                        "ort_vs_torch_rel_err": err, "ort_first_run_s": ort_s,
                    })
                    if name in BASELINE:
                        row["baseline_gflops"], row["baseline_params_m"] = BASELINE[name]
                except Exception as e:  # noqa: BLE001 - record and go on with the other models
                    row["error"] = f"{type(e).__name__}: {e}"
                rows.append(row)
                prog.advance(task)
    out = {"machine": machine_info(), "zoo_version": zoo.ZOO_VERSION, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"{'model':22s} {'opset':>5s} {'export s':>8s} {'params M':>8s} {'GFLOPs':>7s} {'base':>6s} "
          f"{'nodes':>5s} {'LN':>3s} {'rel err':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:22s} {r['opset']:5d} ERROR {r['error']}")
            continue
        base = f"{r['baseline_gflops']:6.2f}" if "baseline_gflops" in r else "     -"
        print(f"{r['model']:22s} {r['opset']:5d} {r['export_s']:8.2f} {r['params_torch'] / 1e6:8.3f} "
              f"{r['gflops']:7.3f} {base} {r['nodes']:5d} {'y' if r['has_layernorm'] else 'n':>3s} "
              f"{r['ort_vs_torch_rel_err']:8.1e}")
    print(f"wrote {args.out}")
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
