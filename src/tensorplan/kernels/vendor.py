"""Vendor kernels: linear primitives (MatMul/Gemm/Conv/ConvTranspose, + elementwise
epilogue) and any op TVM cannot lower, run through ONNX Runtime, PyTorch or TVM.

Korch takes the minimum over profilers (cuDNN, cuBLAS, TVM); here the same idea
on CPU: ONNX Runtime's MLAS reaches ~400 GFLOP/s on this class of machine where
`torch.mm` (MKL on its AVX2 path on AMD) gets ~200, while oneDNN convolutions are
sometimes faster than MLAS. `best_kernel` builds every backend that accepts the
sub-graph, checks it against the first, times each and keeps the fastest.

All kernels share one calling convention with `CompiledKernel`: `k(*inputs)`
returns new outputs, `k.bind(inputs, outputs)` returns a zero-argument callable
writing into given (aligned, contiguous) torch tensors — for ONNX Runtime that is
an I/O binding on the raw pointers, so no data is copied.

`make_kernel` is also where a kernel gets its precision (issue 63), the way users know each
runtime: OpenVINO's INFERENCE_PRECISION_HINT (bf16/fp16) and NNCF int8, ONNX Runtime's static
QDQ int8, torch autocast (bf16/fp16). A kernel at any precision still takes and returns fp32
tensors, so one plan mixes precisions; an int8 kernel keeps its quantized model
(`Int8Kernel.quantized`) so a saved plan rebuilds it without calibration data.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tensorplan.devices import usable_cores
from tensorplan.errors import CompileError
from tensorplan.ir.graph import Graph
from tensorplan.kernels.base import VendorKernel, np_dtype, out_graph, torch_dtype

LINEAR_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
EPILOGUE_OPS = {"Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Clip", "LeakyRelu", "Identity", "Max",
                "Min", "Neg", "Abs"}


# -------------------------------------------------------------------------------- ORT
def ort_kernel(sub: Graph, outputs: list[str] | None = None, threads: int | None = None, spinning: bool = False,
               name: str | None = None, model=None) -> VendorKernel:
    """Any standard-ONNX sub-graph as one ONNX Runtime session driven by I/O binding. `model` (an
    `onnx.ModelProto` with the sub-graph's inputs and outputs, e.g. its int8 quantization) runs
    instead of the sub-graph's own export."""
    import onnxruntime as ort

    g = out_graph(sub, outputs)
    name = name or sub.name
    if model is None:
        model = _onnx_model(g, name)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    # Per-session pools (ORT's global pool would force every session in the process onto it);
    # no spinning: idle workers must not steal the cores TVM and torch kernels run on next.
    so.intra_op_num_threads = int(threads or usable_cores())
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()
        raise CompileError(f"kernel '{name}' ({'+'.join(n.op for n in g.nodes)}): ONNX Runtime rejected it: "
                           f"{msg[0] if msg else type(e).__name__}") from None
    ins = list(g.inputs)
    outs = list(g.outputs)
    in_meta = [(i, np_dtype(g.tensors[i].dtype), list(g.tensors[i].shape)) for i in ins]
    out_meta = [(o, np_dtype(g.tensors[o].dtype), list(g.tensors[o].shape)) for o in outs]

    def bind(inputs: list, outputs_: list):
        io = sess.io_binding()
        for (n, dt, shp), t in zip(in_meta, inputs):
            io.bind_input(n, "cpu", 0, dt, shp, t.data_ptr())
        for (n, dt, shp), t in zip(out_meta, outputs_):
            io.bind_output(n, "cpu", 0, dt, shp, t.data_ptr())
        run = sess.run_with_iobinding
        keep = (inputs, outputs_)  # the pointers must stay valid while bound

        def call(io=io, run=run, keep=keep):
            run(io)
        return call
    return VendorKernel(name=name, backend="ort", input_names=ins, output_names=outs,
                        output_shapes=[tuple(g.tensors[o].shape) for o in outs],
                        output_dtypes=[g.tensors[o].dtype for o in outs], _bind=bind,
                        schedule={"spinning": spinning}, keep=sess)


# ------------------------------------------------------------------------------ torch
def _conv_padding(node, x_shape, w_shape) -> tuple[list[int], list[int]]:
    """(begin, end) pads per spatial dim, resolving auto_pad."""
    nsp = len(x_shape) - 2
    ks = list(node.attrs.get("kernel_shape") or w_shape[2:])
    st = list(node.attrs.get("strides", [1] * nsp))
    dl = list(node.attrs.get("dilations", [1] * nsp))
    pads = list(node.attrs.get("pads", [0] * (2 * nsp)))
    ap = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(ap, bytes):
        ap = ap.decode()
    if ap in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nsp)
        for d in range(nsp):
            out = -(-x_shape[2 + d] // st[d])
            total = max(0, (out - 1) * st[d] + (ks[d] - 1) * dl[d] + 1 - x_shape[2 + d])
            lo = total // 2 if ap == "SAME_UPPER" else total - total // 2
            pads[d], pads[nsp + d] = lo, total - lo
    elif ap == "VALID":
        pads = [0] * (2 * nsp)
    return pads[:nsp], pads[nsp:]


def _torch_linear_fn(g: Graph, node) -> Callable:
    """fn(env) -> tensor for one linear node, with constant weights pre-converted."""
    import torch
    import torch.nn.functional as F

    def const_or_input(name):
        t = g.tensors[name]
        if t.is_constant:
            c = torch.from_numpy(np.ascontiguousarray(t.data))
            return lambda env, c=c: c
        return lambda env, n=name: env[n]

    ins = [const_or_input(i) if i else (lambda env: None) for i in node.inputs]
    if node.op == "MatMul":
        a, b = ins
        return lambda env: torch.matmul(a(env), b(env))
    if node.op == "Gemm":
        alpha = float(node.attrs.get("alpha", 1.0))
        beta = float(node.attrs.get("beta", 1.0))
        ta, tb = int(node.attrs.get("transA", 0)), int(node.attrs.get("transB", 0))
        a, b = ins[0], ins[1]
        c = ins[2] if len(ins) > 2 and node.inputs[2] else None

        def gemm(env):
            A, B = a(env), b(env)
            A = A.t() if ta else A
            B = B.t() if tb else B
            if c is not None:
                return torch.addmm(c(env), A, B, beta=beta, alpha=alpha)
            y = A @ B
            return y * alpha if alpha != 1.0 else y
        return gemm
    x_shape = g.tensors[node.inputs[0]].shape
    w_shape = g.tensors[node.inputs[1]].shape
    nsp = len(x_shape) - 2
    if nsp not in (1, 2, 3):
        raise CompileError(f"node '{node.name}' ({node.op}): {nsp}-D convolution is not supported by torch")
    st = list(node.attrs.get("strides", [1] * nsp))
    dl = list(node.attrs.get("dilations", [1] * nsp))
    group = int(node.attrs.get("group", 1))
    x, w = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 and node.inputs[2] else (lambda env: None)
    if node.op == "Conv":
        lo, hi = _conv_padding(node, x_shape, w_shape)
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
        if lo == hi:
            return lambda env: conv(x(env), w(env), bias(env), st, lo, dl, group)
        pad = []
        for d in reversed(range(nsp)):
            pad += [lo[d], hi[d]]
        return lambda env: conv(F.pad(x(env), pad), w(env), bias(env), st, 0, dl, group)
    # ConvTranspose
    if node.attrs.get("output_shape") is not None or node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise CompileError(f"node '{node.name}' (ConvTranspose): output_shape/auto_pad not supported by torch")
    pads = list(node.attrs.get("pads", [0] * (2 * nsp)))
    if pads[:nsp] != pads[nsp:]:
        raise CompileError(f"node '{node.name}' (ConvTranspose): asymmetric pads not supported by torch")
    op_ = list(node.attrs.get("output_padding", [0] * nsp))
    convt = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nsp]
    return lambda env: convt(x(env), w(env), bias(env), st, pads[:nsp], op_, group, dl)


def _torch_epilogue_fn(g: Graph, node) -> Callable:
    import torch
    from tensorplan.ir.reference import OPS  # noqa: F401 - semantics reference only

    def arg(name):
        t = g.tensors[name]
        if t.is_constant:
            c = torch.from_numpy(np.ascontiguousarray(t.data))
            return lambda env, c=c: c
        return lambda env, n=name: env[n]
    ins = [arg(i) for i in node.inputs if i]
    op = node.op
    if op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        f = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div,
             "Max": torch.maximum, "Min": torch.minimum}[op]
        a, b = ins[0], ins[1]
        return lambda env: f(a(env), b(env))
    if op == "Relu":
        return lambda env: torch.relu(ins[0](env))
    if op == "Sigmoid":
        return lambda env: torch.sigmoid(ins[0](env))
    if op == "Tanh":
        return lambda env: torch.tanh(ins[0](env))
    if op == "Neg":
        return lambda env: -ins[0](env)
    if op == "Abs":
        return lambda env: torch.abs(ins[0](env))
    if op == "Identity":
        return lambda env: ins[0](env)
    if op == "LeakyRelu":
        alpha = float(node.attrs.get("alpha", 0.01))
        return lambda env: torch.nn.functional.leaky_relu(ins[0](env), alpha)
    if op == "Clip":
        lo = float(np.asarray(g.tensors[node.inputs[1]].data)) if len(node.inputs) > 1 and node.inputs[1] else None
        hi = float(np.asarray(g.tensors[node.inputs[2]].data)) if len(node.inputs) > 2 and node.inputs[2] else None
        return lambda env: torch.clamp(ins[0](env), lo, hi)
    raise CompileError(f"node '{node.name}' ({op}): no torch epilogue")


def torch_kernel(sub: Graph, outputs: list[str] | None = None, name: str | None = None,
                 precision: str = "fp32") -> VendorKernel:
    """A linear primitive (+ elementwise epilogue) through PyTorch (oneDNN conv, MKL matmul).

    torch ops allocate their results, so the final result is copied into the bound output
    buffer (for a MatMul alone at fp32, `torch.matmul(out=)` writes in place instead). At bf16 or
    fp16 the kernel runs under `torch.autocast` on the CPU and the copy casts its result back to
    the fp32 buffer."""
    import torch
    g = out_graph(sub, outputs)
    name = name or sub.name
    if len(g.outputs) != 1:
        raise CompileError(f"kernel '{name}': the torch backend produces one output")
    lin = [n for n in g.nodes if n.op in LINEAR_OPS]
    if len(lin) != 1:
        raise CompileError(f"kernel '{name}': the torch backend needs exactly one linear primitive")
    for n in g.nodes:
        if n.op not in LINEAR_OPS and n.op not in EPILOGUE_OPS:
            raise CompileError(f"kernel '{name}': op {n.op} (node '{n.name}') has no torch epilogue")
        if n.op not in LINEAR_OPS and any(g.tensors[i].dtype != "float32" for i in n.inputs if i):
            raise CompileError(f"kernel '{name}': non-float epilogue")
    if any(g.tensors[i].is_constant and g.tensors[i].data.dtype != np.float32 for n in lin for i in n.inputs if i):
        raise CompileError(f"kernel '{name}': torch backend needs float32 weights")
    for n in g.nodes:
        if any(g.tensors[i].is_constant and g.tensors[i].data.dtype == np.float64 for i in n.inputs if i):
            raise CompileError(f"kernel '{name}': float64 constant")
    steps = [(n.outputs[0], _torch_linear_fn(g, n) if n.op in LINEAR_OPS else _torch_epilogue_fn(g, n))
             for n in g.nodes]
    ins = list(g.inputs)
    out = g.outputs[0]
    autocast = _autocast_dtype(precision, "torch", name)
    single_mm = len(g.nodes) == 1 and g.nodes[0].op == "MatMul" and autocast is None

    def bind(inputs: list, outputs_: list):
        o = outputs_[0]
        if single_mm:
            a_name, b_name = g.nodes[0].inputs
            a = inputs[ins.index(a_name)] if a_name in ins else torch.from_numpy(np.ascontiguousarray(
                g.tensors[a_name].data))
            b = inputs[ins.index(b_name)] if b_name in ins else torch.from_numpy(np.ascontiguousarray(
                g.tensors[b_name].data))
            mm = torch.matmul

            def call_mm(a=a, b=b, o=o):
                mm(a, b, out=o)
            return call_mm
        env0 = dict(zip(ins, inputs))
        if autocast is not None:
            def call_cast(env0=env0, o=o, dt=autocast):
                env = dict(env0)
                with torch.autocast("cpu", dtype=dt):
                    for t, fn in steps:
                        env[t] = fn(env)
                o.copy_(env[out])
            return call_cast

        def call(env0=env0, o=o):
            env = dict(env0)
            for t, fn in steps:
                env[t] = fn(env)
            o.copy_(env[out])
        return call
    return VendorKernel(name=name, backend="torch", input_names=ins, output_names=[out],
                        output_shapes=[tuple(g.tensors[out].shape)], output_dtypes=[g.tensors[out].dtype],
                        _bind=bind, schedule={} if precision == "fp32" else {"precision": precision})


def inductor_kernel(sub: Graph, name: str | None = None, precision: str = "fp32") -> VendorKernel:
    """A kernel compiled by PyTorch Inductor (kernels.torch_kernel) on the CPU, writing its results
    into the bound buffers (one copy per output: Inductor allocates its own outputs). At bf16/fp16
    the traced program computes under autocast and returns its outputs cast back to fp32."""
    from tensorplan.errors import TensorplanError
    from tensorplan.kernels.torch_kernel import build_kernel as build_torch
    name = name or sub.name
    dt = _autocast_dtype(precision, "torch-inductor", name)
    ins = [i for i in sub.inputs if not sub.tensors[i].is_constant]
    outs = list(sub.outputs)
    try:
        k = build_torch(sub, [n.name for n in sub.nodes], ins, outs, device="cpu", compile=True, autocast=dt)
    except CompileError as e:
        raise CompileError(f"kernel '{name}' (torch-inductor{'' if dt is None else ', ' + precision}): {e}") from e
    except TensorplanError as e:  # an op with no torch builder: let the executor fall back
        raise CompileError(f"torch-inductor: {e}") from e

    def bind(inputs, outputs_):
        def call():
            for t, r in zip(outputs_, k(*inputs)):
                t.copy_(r)
        return call
    return VendorKernel(name=name, backend="torch-inductor", input_names=ins, output_names=outs,
                        output_shapes=[tuple(sub.tensors[o].shape) for o in outs],
                        output_dtypes=[sub.tensors[o].dtype for o in outs], _bind=bind,
                        schedule={} if precision == "fp32" else {"precision": precision})


def _autocast_dtype(precision: str, backend: str, name: str):
    """The torch dtype `torch.autocast` computes in for `precision` (None at fp32); CompileError for
    a precision torch kernels do not run (int8: torch has no post-training int8 path here)."""
    import torch
    if precision == "fp32":
        return None
    if precision in ("bf16", "fp16"):
        return torch.bfloat16 if precision == "bf16" else torch.float16
    raise CompileError(f"kernel '{name}': the {backend} backend has no {precision} kernels (it runs fp32, bf16 "
                       "and fp16 by autocast); run an int8 kernel on 'ort' or 'openvino'")


# ------------------------------------------------------------------------------- TVM
def tvm_kernel(sub: Graph, outputs: list[str] | None = None, threads: int | None = None, name: str | None = None):
    """The TE lowering with the default schedule (MatMul only among linear ops)."""
    from tensorplan.kernels.build import compile_kernel, local_target
    return compile_kernel(sub, outputs, target=local_target(threads), threads=threads)


#: The precisions each backend builds kernels at (a kernel takes and returns fp32 tensors at every
#: precision). ORT's CPU provider has no bf16/fp16 kernels; TVM and the reference run fp32 only.
BACKEND_PRECISIONS: dict[str, tuple[str, ...]] = {
    "tvm": ("fp32",), "ort": ("fp32", "int8"), "openvino": ("fp32", "bf16", "fp16", "int8"),
    "torch": ("fp32", "bf16", "fp16"), "torch-inductor": ("fp32", "bf16", "fp16"), "reference": ("fp32",)}


_BUILDS = ("tvm", "ort", "torch", "torch-inductor", "openvino")     # what make_kernel builds


@dataclass
class QuantizedModel:
    """An int8 kernel's quantized model, kept so that the kernel rebuilds without calibration data:
    an ONNX model in QDQ form (`format="onnx"`, for ONNX Runtime) or an OpenVINO IR (`"openvino"`:
    the XML in `model`, its weights in `weights`). A plan stores it in a file beside plan.json."""

    format: str
    model: bytes
    weights: bytes = b""


@dataclass
class Int8Kernel(VendorKernel):
    """A vendor kernel that runs a quantized model, which it keeps (`quantized`) for a plan to store."""

    quantized: QuantizedModel | None = None


def check_precision_backend(name: str, backend: str, precision: str) -> None:
    """CompileError naming the kernel when `backend` builds no kernel at `precision`."""
    ok = BACKEND_PRECISIONS.get(backend)
    if ok is None:
        raise CompileError(f"kernel '{name}': unknown backend '{backend}' ({', '.join(BACKEND_PRECISIONS)})")
    if precision not in ok:
        why = {"ort": "ONNX Runtime's CPU provider has no bf16/fp16 kernels",
               "tvm": "tensorplan's TVM kernels are generated at fp32 only",
               "reference": "the reference executor computes in fp32"}.get(backend, "")
        other = [b for b, ps in BACKEND_PRECISIONS.items() if precision in ps]
        raise CompileError(f"kernel '{name}': backend '{backend}' cannot build it at {precision}"
                           + (f" ({why})" if why else "") + f"; backends with {precision} kernels: "
                           + ", ".join(other))


def quantize_kernel(sub: Graph, outputs: list[str] | None, backend: str, calibration: list[dict],
                    name: str | None = None) -> QuantizedModel:
    """`sub` quantized to int8 for `backend` on `calibration` (a list of feeds for its non-constant
    inputs): ONNX Runtime static QDQ quantization ('ort') or NNCF post-training quantization
    ('openvino'), both by tensorplan.precision.quantize."""
    from tensorplan.precision.quantize import openvino_int8, ort_int8
    name = name or sub.name
    check_precision_backend(name, backend, "int8")
    g = out_graph(sub, outputs)
    feeds = _calibration_feeds(g, calibration, name)
    model = _onnx_model(g, name)
    model.graph.name = name
    if backend == "ort":
        return QuantizedModel("onnx", ort_int8(model, feeds, name=name).SerializeToString())
    from tensorplan.kernels.openvino import to_ir
    xml, weights = to_ir(openvino_int8(model, feeds, name=name))
    return QuantizedModel("openvino", xml, weights)


def _calibration_feeds(g: Graph, calibration: list[dict] | None, name: str) -> list[dict]:
    """The calibration feeds of one kernel, checked: a non-empty list of dicts holding each of its
    inputs at its shape (CompileError naming the kernel and input otherwise)."""
    if not calibration:
        raise CompileError(f"kernel '{name}': an int8 kernel needs calibration feeds for its inputs "
                           f"{list(g.inputs)[:4]} (PlanExecutor.capture gives them) or its stored quantized model")
    out = []
    for j, feed in enumerate(calibration):
        if not isinstance(feed, dict):
            raise CompileError(f"kernel '{name}': calibration[{j}] must map input names to arrays")
        one = {}
        for i in g.inputs:
            t = g.tensors[i]
            if i not in feed:
                raise CompileError(f"kernel '{name}': calibration[{j}] has no array for input '{i}'")
            a = np.ascontiguousarray(np.asarray(feed[i]), dtype=np_dtype(t.dtype))
            if tuple(a.shape) != tuple(t.shape):
                raise CompileError(f"kernel '{name}': calibration[{j}]['{i}'] has shape {tuple(a.shape)}, the "
                                   f"kernel's input is {tuple(t.shape)}")
            one[i] = a
        out.append(one)
    return out


def _onnx_model(g: Graph, name: str):
    """`g` as an ONNX model (CompileError naming the kernel when it does not export)."""
    from tensorplan.ir.to_onnx import graph_to_onnx
    try:
        return graph_to_onnx(g)
    except Exception as e:  # noqa: BLE001
        raise CompileError(f"kernel '{name}': cannot export to ONNX: {e}") from None


def make_kernel(sub: Graph, outputs: list[str] | None, backend: str, threads: int | None = None,
                schedule: dict | None = None, precision: str = "fp32", calibration: list[dict] | None = None,
                quantized: QuantizedModel | None = None):
    """Build one kernel on a named backend ('tvm', 'ort', 'torch', 'torch-inductor', 'openvino') at `precision`
    (fp32, bf16, fp16 or int8; `BACKEND_PRECISIONS` says which backend runs which); `schedule` is
    the backend's knobs: TVM's schedule dict, ORT's {"threads": n, "spinning": bool}, OpenVINO's
    {"threads": n}. `threads` defaults to every usable core.

    Whatever the precision, the kernel takes and returns fp32 tensors (it casts inside), so a plan
    mixes precisions freely. OpenVINO runs bf16/fp16 by `INFERENCE_PRECISION_HINT` (refused when
    this CPU would substitute another precision), torch by autocast. An int8 kernel runs
    `quantized` (a stored quantized model) or quantizes `sub` on `calibration` (feeds for its
    inputs, e.g. from `PlanExecutor.capture`) and keeps the result in `kernel.quantized`
    (`Int8Kernel`), so a plan can store it and rebuild the kernel without calibration data.
    CompileError naming the kernel and the precision when the backend cannot build it."""
    threads = int(threads or usable_cores())
    name = sub.name
    known = sorted({p for ps in BACKEND_PRECISIONS.values() for p in ps})
    if precision not in known:
        raise CompileError(f"kernel '{name}': precision {precision!r} is not one of {', '.join(known)}")
    if backend not in _BUILDS:
        raise CompileError(f"kernel '{name}': unknown backend '{backend}' ({', '.join(_BUILDS)})")
    check_precision_backend(name, backend, precision)
    if precision == "int8":
        if quantized is None:
            quantized = quantize_kernel(sub, outputs, backend, calibration, name)
        elif quantized.format != ("onnx" if backend == "ort" else "openvino"):
            raise CompileError(f"kernel '{name}': its quantized model is {quantized.format}, which backend "
                               f"'{backend}' does not run; quantize it again for {backend}")
        k = _int8_kernel(sub, outputs, backend, threads, schedule, quantized, name)
        return Int8Kernel(**{f.name: getattr(k, f.name) for f in dataclasses.fields(k)}, quantized=quantized)
    if backend == "tvm":
        from tensorplan.kernels.build import compile_kernel, local_target
        return compile_kernel(sub, outputs, target=local_target(threads), schedule=schedule, threads=threads)
    if backend == "ort":
        spin = (schedule or {}).get("spinning", False)
        nthr = int((schedule or {}).get("threads", threads))
        return ort_kernel(sub, outputs, nthr, spinning=bool(spin))
    if backend == "torch":
        return torch_kernel(sub, outputs, precision=precision)
    if backend == "torch-inductor":
        return inductor_kernel(out_graph(sub, outputs), name, precision=precision)
    from tensorplan.kernels.openvino import openvino_kernel
    return openvino_kernel(sub, outputs, int((schedule or {}).get("threads", threads)), precision=precision)


def _int8_kernel(sub: Graph, outputs: list[str] | None, backend: str, threads: int, schedule: dict | None,
                 q: QuantizedModel, name: str) -> VendorKernel:
    """The kernel that runs a quantized model on its backend."""
    if backend == "ort":
        import onnx
        try:
            model = onnx.load_model_from_string(q.model)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise CompileError(f"kernel '{name}': its quantized ONNX model does not parse: {e}") from None
        k = ort_kernel(sub, outputs, int((schedule or {}).get("threads", threads)),
                       spinning=bool((schedule or {}).get("spinning", False)), name=name, model=model)
    else:
        from tensorplan.kernels.openvino import from_ir, openvino_kernel
        k = openvino_kernel(sub, outputs, int((schedule or {}).get("threads", threads)), name=name,
                            precision="int8", model=from_ir(q.model, q.weights, name))
    k.schedule = {**k.schedule, "precision": "int8"}
    return k


@dataclass
class BackendChoice:
    """The result of `best_kernel`: the fastest kernel and every backend's time (s)."""

    kernel: Any
    backend: str
    times: dict[str, float]
    errors: dict[str, str]


_INPUT_CACHE: dict = {}


def random_inputs(sub: Graph, names: list[str], seed: int = 0, cache: bool = True) -> list:
    """Random aligned torch inputs (normal floats, 0/1 ints and bools) for a kernel's inputs.

    Cached by (shape, dtype): profiling hundreds of candidates reuses the same few tensors
    (kernels only read their inputs), and numpy's normal sampler costs ~10 ms per MB."""
    import torch
    out = []
    for n in names:
        t = sub.tensors[n]
        key = (tuple(t.shape), t.dtype, seed)
        x = _INPUT_CACHE.get(key) if cache else None
        if x is None:
            gen = torch.Generator().manual_seed(seed)
            if t.dtype.startswith("float"):
                x = torch.randn(t.shape, generator=gen, dtype=torch_dtype(t.dtype))
            elif t.dtype == "bool":
                x = torch.rand(t.shape, generator=gen) < 0.5
            else:
                x = torch.randint(0, 2, t.shape, generator=gen, dtype=torch_dtype(t.dtype))
            if cache:
                if len(_INPUT_CACHE) > 64:
                    _INPUT_CACHE.clear()
                _INPUT_CACHE[key] = x
        out.append(x)
    return out


def best_kernel(sub: Graph, outputs: list[str] | None = None, backends: tuple[str, ...] = ("ort", "torch", "tvm"),
                threads: int | None = None, budget_s: float = 0.1, check: bool = True) -> BackendChoice:
    """Build `sub` on each backend that accepts it, check they agree, time them, keep the fastest."""
    from tensorplan.measure.timer import measure
    threads = int(threads or usable_cores())
    built: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for b in backends:
        try:
            built[b] = make_kernel(sub, outputs, b, threads)
        except CompileError as e:
            errors[b] = str(e)
    if not built:
        raise CompileError(f"kernel '{sub.name}': no backend can run it: " + "; ".join(errors.values()))
    first = next(iter(built.values()))
    inputs = random_inputs(sub, first.input_names)
    times: dict[str, float] = {}
    ref = None
    for b, k in list(built.items()):
        outs = k.alloc_outputs()
        fn = k.bind(inputs, outs)
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            errors[b] = f"run failed: {e}"
            del built[b]
            continue
        if check:
            if ref is None:
                ref = [o.clone() for o in outs]
            elif not all(_close(o, r) for o, r in zip(outs, ref)):
                errors[b] = "disagrees with " + next(iter(built))
                del built[b]
                continue
        times[b] = measure(fn, warmup=2, min_repeats=3, max_repeats=50, budget_s=budget_s).median_s
    if not times:
        raise CompileError(f"kernel '{sub.name}': every backend failed: " + "; ".join(errors.values()))
    best = min(times, key=times.get)
    return BackendChoice(kernel=built[best], backend=best, times=times, errors=errors)


def _close(a, b, tol: float = 1e-4) -> bool:
    import torch
    if a.dtype in (torch.float32, torch.float64, torch.float16):
        denom = max(float(b.abs().max()) if b.numel() else 0.0, 1e-6)
        return float((a - b).abs().max()) / denom <= tol if a.numel() else True
    return bool(torch.equal(a, b))


@functools.lru_cache(maxsize=None)
def call_overheads(threads: int | None = None) -> dict[str, float]:
    """Per-call overhead (s) of each backend on a 16-element Relu (what fusion saves per launch)."""
    from tensorplan.ir.graph import Node, Tensor
    from tensorplan.measure.timer import measure
    g = Graph("overhead", 17)
    g.add_tensor(Tensor("x", (16,)))
    g.add_tensor(Tensor("y", (16,)))
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_node(Node("relu", "Relu", ["x"], ["y"]))
    import torch
    x, y = torch.randn(16), torch.empty(16)
    out = {}
    for b in ("tvm", "ort"):
        k = make_kernel(g, ["y"], b, threads)
        fn = k.bind([x], [y])
        out[b] = measure(fn, warmup=100, min_repeats=5, budget_s=0.1, number=200).median_s
    out["torch"] = measure(lambda: torch.clamp_min(x, 0.0, out=y), warmup=100, min_repeats=5,
                           budget_s=0.1, number=200).median_s
    return out
