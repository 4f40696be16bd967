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
"""
from __future__ import annotations

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
               name: str | None = None) -> VendorKernel:
    """Any standard-ONNX sub-graph as one ONNX Runtime session driven by I/O binding."""
    import onnxruntime as ort

    from tensorplan.ir.to_onnx import graph_to_onnx
    g = out_graph(sub, outputs)
    name = name or sub.name
    try:
        model = graph_to_onnx(g)
    except Exception as e:  # noqa: BLE001
        raise CompileError(f"kernel '{name}': cannot export to ONNX: {e}") from None
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


def torch_kernel(sub: Graph, outputs: list[str] | None = None, name: str | None = None) -> VendorKernel:
    """A linear primitive (+ elementwise epilogue) through PyTorch (oneDNN conv, MKL matmul).

    torch ops allocate their results, so the final result is copied into the bound output
    buffer (for a MatMul alone, `torch.matmul(out=)` writes in place instead)."""
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
    single_mm = len(g.nodes) == 1 and g.nodes[0].op == "MatMul"

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

        def call(env0=env0, o=o):
            env = dict(env0)
            for t, fn in steps:
                env[t] = fn(env)
            o.copy_(env[out])
        return call
    return VendorKernel(name=name, backend="torch", input_names=ins, output_names=[out],
                        output_shapes=[tuple(g.tensors[out].shape)], output_dtypes=[g.tensors[out].dtype],
                        _bind=bind, schedule={})


# ------------------------------------------------------------------------------- TVM
def tvm_kernel(sub: Graph, outputs: list[str] | None = None, threads: int | None = None, name: str | None = None):
    """The TE lowering with the default schedule (MatMul only among linear ops)."""
    from tensorplan.kernels.build import compile_kernel, local_target
    return compile_kernel(sub, outputs, target=local_target(threads), threads=threads)


def make_kernel(sub: Graph, outputs: list[str] | None, backend: str, threads: int | None = None,
                schedule: dict | None = None):
    """Build one kernel on a named backend ('tvm', 'ort', 'torch', 'openvino'); `schedule` is the
    backend's knobs: TVM's schedule dict, ORT's {"threads": n, "spinning": bool}, OpenVINO's {"threads": n}.
    `threads` defaults to every usable core."""
    threads = int(threads or usable_cores())
    if backend == "tvm":
        from tensorplan.kernels.build import compile_kernel, local_target
        return compile_kernel(sub, outputs, target=local_target(threads), schedule=schedule, threads=threads)
    if backend == "ort":
        spin = (schedule or {}).get("spinning", False)
        nthr = int((schedule or {}).get("threads", threads))
        return ort_kernel(sub, outputs, nthr, spinning=bool(spin))
    if backend == "torch":
        return torch_kernel(sub, outputs)
    if backend == "openvino":
        from tensorplan.kernels.openvino import openvino_kernel
        return openvino_kernel(sub, outputs, int((schedule or {}).get("threads", threads)))
    raise CompileError(f"kernel '{sub.name}': unknown backend '{backend}' (tvm, ort, torch or openvino)")


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
