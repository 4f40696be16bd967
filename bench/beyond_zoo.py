"""Models a user brings that the zoo does not have: int8 models from ONNX Runtime's quantizer, an
LSTM, a com.microsoft contrib op, torch's MultiheadAttention, a half-precision CNN.

Why: the zoo's 26 models use operators tensorplan has numpy rules for. Real models also carry
operators it has none for; those now run node by node in ONNX Runtime (`graph.ort_node`) and stay
opaque in plans. This runs `tensorplan demo`'s workflow on each such model: import, reference
executor vs ONNX Runtime, the plan (measured kernel costs, raced), its output vs ONNX Runtime and
its time against ONNX Runtime, interleaved (and `torch.compile` where there is a module).

    python bench/beyond_zoo.py            # -> bench/results/beyond_zoo.json
"""
from __future__ import annotations

import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import typer

OUT = Path("bench/results/beyond_zoo.json")

FACTORIES = '''
import torch
from torch import nn


class Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(64, 128, num_layers=2, batch_first=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.head(y[:, -1])


def lstm():
    torch.manual_seed(0)
    return Lstm().eval(), (torch.randn(1, 32, 64),)


class Mha(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(128, 4, 256, batch_first=True), 2)

    def forward(self, x):
        return self.enc(x)


def mha():
    torch.manual_seed(0)
    return Mha().eval(), (torch.randn(1, 64, 128),)


def half_cnn():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU()).eval().half()
    return net, (torch.randn(1, 3, 64, 64).half(),)
'''


def _quantized(src: str, out: Path, fmt: str) -> str:
    """ONNX Runtime's quantizer on `src`: dynamic (ConvInteger/MatMulInteger) or static QOperator."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)

    from tensorplan.zoo.specs import load_model
    if fmt == "dynamic":
        quantize_dynamic(src, str(out), weight_type=QuantType.QInt8)
        return str(out)
    g = load_model(src)
    name, shape = g.inputs[0], g.tensors[g.inputs[0]].shape

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.left = [{name: np.random.default_rng(k).standard_normal(shape).astype(np.float32)} for k in range(8)]

        def get_next(self):
            return self.left.pop() if self.left else None
    quantize_static(src, str(out), Reader(), quant_format=QuantFormat.QOperator,   # uint8 activations:
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # ORT's advice on x64
    return str(out)


def _contrib_mlp(out: Path) -> str:
    """MatMul -> com.microsoft BiasGelu -> MatMul -> com.microsoft SkipLayerNormalization, 4 blocks."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.default_rng(0)
    d, f = 256, 1024
    nodes, inits, x = [], [], "x"
    for b in range(4):
        p = f"b{b}_"
        inits += [nh.from_array((rng.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32), p + "w1"),
                  nh.from_array((rng.standard_normal(f) * 0.1).astype(np.float32), p + "b1"),
                  nh.from_array((rng.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32), p + "w2"),
                  nh.from_array(np.ones(d, np.float32), p + "g"), nh.from_array(np.zeros(d, np.float32), p + "beta")]
        nodes += [h.make_node("MatMul", [x, p + "w1"], [p + "m1"], name=p + "mm1"),
                  h.make_node("BiasGelu", [p + "m1", p + "b1"], [p + "a"], name=p + "gelu", domain="com.microsoft"),
                  h.make_node("MatMul", [p + "a", p + "w2"], [p + "m2"], name=p + "mm2"),
                  h.make_node("SkipLayerNormalization", [p + "m2", x, p + "g", p + "beta"], [p + "y"], name=p + "ln",
                              domain="com.microsoft", epsilon=1e-5)]
        x = p + "y"
    g = h.make_graph(nodes, "contrib_mlp", [h.make_tensor_value_info("x", T.FLOAT, [1, 128, d])],
                     [h.make_tensor_value_info(x, T.FLOAT, [1, 128, d])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    onnx.save(m, str(out))
    return str(out)


def models(work: Path) -> dict[str, str]:
    from tensorplan.zoo.specs import resolve_model_path
    (work / "beyond_zoo_models.py").write_text(FACTORIES)
    r50 = str(resolve_model_path("resnet-50"))
    return {"resnet-50 int8 dynamic": _quantized(r50, work / "r50_dyn.onnx", "dynamic"),
            "resnet-50 int8 QOperator": _quantized(r50, work / "r50_qop.onnx", "qoperator"),
            "contrib MLP (BiasGelu, SkipLayerNorm)": _contrib_mlp(work / "contrib_mlp.onnx"),
            "LSTM (2 layers)": f"{work / 'beyond_zoo_models.py'}:lstm",
            "TransformerEncoder (nn.MultiheadAttention)": f"{work / 'beyond_zoo_models.py'}:mha",
            "fp16 CNN": f"{work / 'beyond_zoo_models.py'}:half_cnn"}


def main(out: Path = typer.Option(OUT, help="Results JSON."),
         only: str = typer.Option("", help="Comma-separated substrings of model labels to run.")) -> None:
    from tensorplan.devices import resolve
    from tensorplan.workflows.inspect import inspect_model
    from tensorplan.workflows.demo import run_demo
    work = Path(tempfile.mkdtemp(prefix="beyond_zoo_"))
    rows = []
    for label, spec in models(work).items():
        if only and not any(s in label for s in only.split(",")):
            continue
        t0 = time.time()
        rep = inspect_model(spec)
        foreign = sorted({(f"{u['domain']}::" if u["domain"] else "") + u["op"] for u in rep.foreign})
        d = run_demo(spec).to_dict()
        p = d["plan"]
        tc = p.get("torch_compile") or {}
        row = {"model": label, "foreign_ops": foreign, "nodes": rep.nodes, "gflops": rep.flops / 1e9,
               "reference_rel_error": d["max_rel_error"], "tolerance": d["tolerance"],
               "plan_kernels": p["kernels"], "plan_backends": p["backends"], "plan_rel_error": p["max_rel_error"],
               "plan_agrees": p["agree"], "ort_ms": p["ort_median_ms"], "plan_ms": p["plan_median_ms"],
               "speedup_vs_ort": p["speedup_vs_ort"], "torch_compile_ms": tc.get("median_ms"),
               "torch_compile_note": tc.get("skipped"), "optimise_s": p["optimise_s"], "wall_s": time.time() - t0}
        rows.append(row)
        print(f"{label:44s} foreign {','.join(foreign) or '-':40s} plan {row['plan_ms']:8.3f} ms  ORT "
              f"{row['ort_ms']:8.3f} ms  x{row['speedup_vs_ort']:.2f}  err {row['plan_rel_error']:.1e}", flush=True)
    res = {"bench": "beyond_zoo", "rows": rows, "machine": {"cpu": platform.processor() or platform.machine(),
                                                         "device": resolve("local").to_dict()},
           "created": time.time()}
    out.write_text(json.dumps(res, indent=1, default=float))
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
