"""OpenVINO's CPU runtime as a kernel backend: a sub-graph (in practice an ONNX Runtime *region*,
several original operators) compiled by OpenVINO and run in place on the plan's buffers.

Why: Korch takes, per kernel, the minimum over its profilers. On this AMD CPU OpenVINO runs five of
the seven benchmark models more than 5 % faster than ONNX Runtime (YOLOv4 2.4x, SegFormer-b0 1.6x;
YOLOX-nano 0.86x; bench/openvino_probe.py): it fuses Swish/GELU into its convolutions and keeps
blocked layouts across a region. Offering it next to ONNX Runtime lets the BLP pick per region.

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


def openvino_kernel(sub: Graph, outputs: list[str] | None = None, threads: int | None = None,
                    name: str | None = None) -> VendorKernel:
    """`sub` as one OpenVINO compiled model (CPU, fp32, latency hint, `threads` threads; default
    every usable core)."""
    from tensorplan.ir.to_onnx import graph_to_onnx
    threads = int(threads or usable_cores())
    name = name or sub.name
    if not available():
        raise CompileError(f"kernel '{name}': OpenVINO is not installed (pip install openvino=={VERSION})")
    import openvino as ov
    g = out_graph(sub, outputs)
    try:
        model = graph_to_onnx(g)
        core = _core()
        compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                      {"INFERENCE_NUM_THREADS": int(threads), "INFERENCE_PRECISION_HINT": "f32",
                                       "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
    except Exception as e:  # noqa: BLE001 - OpenVINO raises RuntimeError with multi-line reports
        msg = str(e).strip().splitlines()
        raise CompileError(f"kernel '{name}' ({len(g.nodes)} operators): OpenVINO rejected it: "
                           f"{msg[0][:200] if msg else type(e).__name__}") from None
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
                        schedule={"threads": int(threads)}, keep=compiled)
