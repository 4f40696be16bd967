"""OpenVINO's CPU runtime as a kernel backend: a sub-graph (in practice an ONNX Runtime *region*,
several original operators) compiled by OpenVINO and run in place on the plan's buffers.

Why: Korch takes, per kernel, the minimum over its profilers. On this AMD CPU OpenVINO runs five of
the seven benchmark models more than 5 % faster than ONNX Runtime (YOLOv4 2.4x, SegFormer-b0 1.6x;
YOLOX-nano 0.86x; bench/openvino_probe.py): it fuses Swish/GELU into its convolutions and keeps
blocked layouts across a region. Offering it next to ONNX Runtime lets the BLP pick per region.

It is also how a kernel runs at bf16 or fp16 (INFERENCE_PRECISION_HINT, refused where this CPU
would quietly substitute another precision) and at int8 (an NNCF-quantized model, stored as
OpenVINO IR bytes by `to_ir` so a plan keeps it).

Same calling convention as every vendor kernel (`kernels.base.VendorKernel`): `bind` wraps the
given torch tensors as OpenVINO tensors sharing their memory, so a call copies nothing.
"""
from __future__ import annotations

import functools

from tensorplan.devices import usable_cores
from tensorplan.errors import CompileError
from tensorplan.ir.graph import Graph
from tensorplan.kernels.base import VendorKernel, out_graph

#: The pinned version (pyproject.toml); other versions may work but were not measured.
VERSION = "2026.4.1"


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """Whether OpenVINO imports here (it is a dependency, but a broken install must not break plans)."""
    try:
        import openvino  # noqa: F401
    except Exception:  # noqa: BLE001 - ImportError or a missing shared library
        return False
    return True


@functools.lru_cache(maxsize=1)
def _core():
    import openvino as ov
    return ov.Core()


#: OpenVINO's INFERENCE_PRECISION_HINT for each precision a kernel runs at. An int8 kernel runs a
#: quantized model (its quantized operations in int8) with the rest at f32, never the CPU's default.
HINTS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16", "int8": "f32"}
_TYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


def openvino_kernel(sub: Graph, outputs: list[str] | None = None, threads: int | None = None,
                    name: str | None = None, precision: str = "fp32", model=None) -> VendorKernel:
    """`sub` as one OpenVINO compiled model (CPU, latency hint, `threads` threads; default every
    usable core) at `precision`: fp32, bf16 or fp16 by INFERENCE_PRECISION_HINT; int8 runs `model`
    (an `openvino.Model` quantized by NNCF, with `sub`'s inputs and outputs). Inputs and outputs
    stay fp32 at every precision. CompileError when this CPU would run another precision than the
    one asked for (OpenVINO silently computes fp16 requests in bf16 on CPUs without fp16 units)."""
    from tensorplan.ir.to_onnx import graph_to_onnx
    threads = int(threads or usable_cores())
    name = name or sub.name
    if precision not in HINTS:
        raise CompileError(f"kernel '{name}': OpenVINO has no precision {precision!r} ({', '.join(HINTS)})")
    if precision == "int8" and model is None:
        raise CompileError(f"kernel '{name}': an int8 OpenVINO kernel runs a quantized model (kernels.vendor."
                           "make_kernel quantizes it on calibration data)")
    if not available():
        raise CompileError(f"kernel '{name}': OpenVINO is not installed (pip install openvino=={VERSION})")
    import openvino as ov
    g = out_graph(sub, outputs)
    hint = HINTS[precision]
    try:
        core = _core()
        if model is None:
            model = core.read_model(graph_to_onnx(g).SerializeToString(), b"")
        compiled = core.compile_model(model, "CPU",
                                      {"INFERENCE_NUM_THREADS": int(threads), "INFERENCE_PRECISION_HINT": hint,
                                       "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
        got = str(compiled.get_property("INFERENCE_PRECISION_HINT"))   # "<Type: 'bfloat16'>"
        got = got.split("'")[1] if got.count("'") == 2 else got
    except Exception as e:  # noqa: BLE001 - OpenVINO raises RuntimeError with multi-line reports
        msg = str(e).strip().splitlines()
        raise CompileError(f"kernel '{name}' ({len(g.nodes)} operators, {precision}): OpenVINO rejected it: "
                           f"{msg[0][:200] if msg else type(e).__name__}") from None
    if got != _TYPES[hint]:
        ran = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(got, got)
        raise CompileError(f"kernel '{name}': OpenVINO on this CPU runs {ran} "
                           f"when asked for {precision} (INFERENCE_PRECISION_HINT={hint}): this CPU has no "
                           f"{precision} support in OpenVINO; choose another precision")
    ins, outs = list(g.inputs), list(g.outputs)
    port_in = {p.get_any_name(): k for k, p in enumerate(compiled.inputs)}
    port_out = {}
    for k, p in enumerate(compiled.outputs):
        for n in p.get_names():
            port_out.setdefault(n, k)
    missing = [n for n in ins if n not in port_in] + [n for n in outs if n not in port_out]
    if missing:
        raise CompileError(f"kernel '{name}': OpenVINO renamed or dropped tensors {missing[:3]}")

    def bind(inputs: list, outputs_: list):
        req = compiled.create_infer_request()
        for n, t in zip(ins, inputs):
            req.set_input_tensor(port_in[n], ov.Tensor(t.numpy(), shared_memory=True))
        for n, t in zip(outs, outputs_):
            req.set_output_tensor(port_out[n], ov.Tensor(t.numpy(), shared_memory=True))
        keep = (inputs, outputs_)  # the shared buffers must outlive the request

        def call(req=req, keep=keep):
            req.infer()
        return call
    return VendorKernel(name=name, backend="openvino", input_names=ins, output_names=outs,
                        output_shapes=[tuple(g.tensors[o].shape) for o in outs],
                        output_dtypes=[g.tensors[o].dtype for o in outs], _bind=bind,
                        schedule={"threads": int(threads)} if precision == "fp32" else
                        {"threads": int(threads), "precision": precision}, keep=compiled)


def to_ir(model) -> tuple[bytes, bytes]:
    """An `openvino.Model` as OpenVINO IR bytes (XML, weights), uncompressed: how a plan stores an
    int8 OpenVINO kernel's quantized model."""
    import tempfile
    from pathlib import Path

    import openvino as ov
    with tempfile.TemporaryDirectory(prefix="tensorplan-ir-") as d:
        xml = Path(d) / "model.xml"
        ov.save_model(model, str(xml), compress_to_fp16=False)
        return xml.read_bytes(), xml.with_suffix(".bin").read_bytes()


def from_ir(xml: bytes, weights: bytes, name: str = ""):
    """The `openvino.Model` of IR bytes written by `to_ir` (CompileError naming the kernel when
    OpenVINO cannot read them)."""
    import numpy as np
    import openvino as ov
    try:
        return _core().read_model(xml, ov.Tensor(np.frombuffer(weights, dtype=np.uint8).copy()))
    except Exception as e:  # noqa: BLE001 - OpenVINO raises RuntimeError with multi-line reports
        msg = str(e).strip().splitlines()
        raise CompileError(f"kernel '{name}': its stored OpenVINO model does not read: "
                           f"{msg[0][:200] if msg else type(e).__name__}") from None
