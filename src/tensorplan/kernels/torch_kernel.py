"""Primitive sub-graphs as PyTorch programs, on any torch device, optionally fused by Inductor.

Why: on a GPU tensorplan has no TVM runtime (the apache-tvm wheel emits CUDA source but cannot
launch it), so a plan's kernels there are built from PyTorch: a memory-bound candidate becomes one
`torch.fx` graph that Inductor fuses into one Triton kernel, a linear primitive runs through
cuDNN / cuBLAS (Inductor calls them as extern kernels, an elementwise epilogue fused after).
The same builder runs on the CPU, which is how it is tested against ONNX Runtime where no GPU is.

Each primitive op gets a builder that reads its attributes and constant inputs once (pads,
shapes, Resize taps are plain Python/numpy at build time, shapes are static) and returns the
tensor function; `build_kernel` chains them over a candidate's nodes and traces the chain into
one `torch.fx.GraphModule` (a code object of its own, so Dynamo never hits its recompile limit
across kernels).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from tensorplan.errors import CompileError, UnsupportedOperatorError
from tensorplan.ir import reference as ref
from tensorplan.ir.graph import Graph, Node

TensorFn = Callable[[list], list]
Builder = Callable[[Node, list], TensorFn]
_BUILDERS: dict[str, Builder] = {}


def _torch():
    import torch
    return torch


def _reg(*names: str):
    def deco(fn: Builder) -> Builder:
        for n in names:
            _BUILDERS[n] = fn
        return fn
    return deco


def supported_ops() -> set[str]:
    """Op types this builder can run (everything fission emits for the zoo, and more)."""
    return set(_BUILDERS)


def _dev(arr, dtype: str, device) -> Any:
    """A constant tensor made outside the trace, so `make_fx` keeps it as a constant already on
    `device` (made inside, it would be a host tensor copied at every run, which also breaks
    CUDA-graph capture)."""
    torch = _torch()
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    with disable_proxy_modes_tracing():
        return torch.as_tensor(np.ascontiguousarray(arr, dtype=dtype), device=device)


def _s(node: Node, name: str, default: Any = None) -> Any:
    v = node.attrs.get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _const(consts: list, k: int) -> np.ndarray | None:
    return consts[k] if len(consts) > k else None


def _need_const(node: Node, consts: list, k: int, what: str) -> np.ndarray:
    v = _const(consts, k)
    if v is None:
        raise UnsupportedOperatorError([(node.name, f"{node.op} with a computed {what}")])
    return v


# ------------------------------------------------------------------------------- elementwise
def _unary(fn_name: str) -> Builder:
    def build(node: Node, consts: list) -> TensorFn:
        torch = _torch()
        f = {"Softplus": torch.nn.functional.softplus, "Mish": torch.nn.functional.mish,
             "Softsign": torch.nn.functional.softsign}.get(fn_name) or getattr(torch, fn_name)
        return lambda x: [f(x[0])]
    return build


for _onnx, _t in {"Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Tanh": "tanh", "Neg": "neg",
                  "Abs": "abs", "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sin": "sin",
                  "Cos": "cos", "Sign": "sign", "Erf": "erf", "Sigmoid": "sigmoid", "Relu": "relu",
                  "Reciprocal": "reciprocal", "Softplus": "Softplus", "Mish": "Mish",
                  "Softsign": "Softsign"}.items():
    _BUILDERS[_onnx] = _unary(_t)


@_reg("Identity")
def _identity(node, consts):
    return lambda x: [x[0]]


def _binary(fn_name: str) -> Builder:
    def build(node: Node, consts: list) -> TensorFn:
        f = getattr(_torch(), fn_name)
        return lambda x: [f(x[0], x[1])]
    return build


for _onnx, _t in {"Add": "add", "Sub": "sub", "Mul": "mul", "Pow": "pow", "Equal": "eq",
                  "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge",
                  "And": "logical_and", "Or": "logical_or", "Xor": "logical_xor"}.items():
    _BUILDERS[_onnx] = _binary(_t)


@_reg("Div")
def _div(node, consts):
    torch = _torch()

    def run(x):
        if x[0].dtype.is_floating_point:
            return [x[0] / x[1]]
        return [torch.div(x[0], x[1], rounding_mode="trunc")]
    return run


@_reg("Max", "Min", "Sum")
def _variadic(node, consts):
    torch = _torch()
    f = {"Max": torch.maximum, "Min": torch.minimum, "Sum": torch.add}[node.op]

    def run(x):
        xs = [v for v in x if v is not None]
        out = xs[0]
        for v in xs[1:]:
            out = f(out, v)
        return [out]
    return run


@_reg("Where")
def _where(node, consts):
    torch = _torch()
    return lambda x: [torch.where(x[0], x[1], x[2])]


@_reg("Clip")
def _clip(node, consts):
    torch = _torch()
    lo = _const(consts, 1)
    hi = _const(consts, 2)
    lo = float(lo.reshape(-1)[0]) if lo is not None and lo.size else node.attrs.get("min")
    hi = float(hi.reshape(-1)[0]) if hi is not None and hi.size else node.attrs.get("max")
    return lambda x: [torch.clamp(x[0], lo, hi)]


@_reg("LeakyRelu")
def _leaky(node, consts):
    F = _torch().nn.functional
    a = float(_s(node, "alpha", 0.01))
    return lambda x: [F.leaky_relu(x[0], a)]


@_reg("HardSigmoid")
def _hsig(node, consts):
    torch = _torch()
    a, b = float(_s(node, "alpha", 0.2)), float(_s(node, "beta", 0.5))
    return lambda x: [torch.clamp(x[0] * a + b, 0.0, 1.0)]


@_reg("HardSwish")
def _hswish(node, consts):
    F = _torch().nn.functional
    return lambda x: [F.hardswish(x[0])]


@_reg("Cast")
def _cast(node, consts):
    torch = _torch()
    np_dt = np.dtype(ref.ONNX_TO_NP[int(node.attrs["to"])])
    dt = getattr(torch, "bool" if np_dt == np.bool_ else np_dt.name)
    return lambda x: [x[0].to(dt)]


# ------------------------------------------------------------------------------- reductions
@_reg("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean")
def _reduce(node, consts):
    torch = _torch()
    axes_c = _const(consts, 1)
    if len(node.inputs) > 1 and node.inputs[1] and axes_c is None:
        raise UnsupportedOperatorError([(node.name, f"{node.op} with computed axes")])
    axes = ref._ints(axes_c) if axes_c is not None else (ref._ints(node.attrs["axes"])
                                                         if "axes" in node.attrs else None)
    axes = axes or None
    keep = bool(_s(node, "keepdims", 1))
    noop = bool(_s(node, "noop_with_empty_axes", 0))

    def run(x):
        v = x[0]
        if axes is None and noop:
            return [v]
        dims = tuple(range(v.dim())) if axes is None else tuple(a % v.dim() for a in axes)
        if node.op == "ReduceSum":
            return [torch.sum(v, dim=dims, keepdim=keep)]
        if node.op == "ReduceMean":
            return [torch.mean(v, dim=dims, keepdim=keep)]
        f = torch.amax if node.op == "ReduceMax" else torch.amin
        return [f(v, dim=dims, keepdim=keep)]
    return run


# ------------------------------------------------------------------------------- layout
@_reg("Transpose")
def _transpose(node, consts):
    perm = node.attrs.get("perm")
    return lambda x: [x[0].permute(*(perm if perm is not None else range(x[0].dim() - 1, -1, -1)))]


@_reg("Reshape")
def _reshape(node, consts):
    shape = ref._ints(_need_const(node, consts, 1, "shape"))
    allowzero = bool(_s(node, "allowzero", 0))

    def run(x):
        v = x[0]
        out = [v.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
        return [v.reshape(out)]
    return run


@_reg("Flatten")
def _flatten(node, consts):
    axis = int(_s(node, "axis", 1))

    def run(x):
        v = x[0]
        a = axis % v.dim() if axis < 0 else axis
        return [v.reshape(int(np.prod(v.shape[:a], dtype=np.int64)), -1)]
    return run


@_reg("Squeeze", "Unsqueeze")
def _squeeze(node, consts):
    c = _const(consts, 1)
    axes = ref._ints(c) if c is not None else (ref._ints(node.attrs["axes"]) if "axes" in node.attrs else None)

    def run(x):
        v = x[0]
        if node.op == "Squeeze":
            if axes is None:
                return [v.squeeze()]
            return [v.squeeze(tuple(a % v.dim() for a in axes))]
        rank = v.dim() + len(axes)
        for a in sorted(a % rank for a in axes):
            v = v.unsqueeze(a)
        return [v]
    return run


@_reg("Concat")
def _concat(node, consts):
    torch = _torch()
    axis = int(node.attrs["axis"])
    return lambda x: [torch.cat([v for v in x if v is not None], dim=axis)]


@_reg("Split")
def _split(node, consts):
    torch = _torch()
    axis = int(_s(node, "axis", 0))
    c = _const(consts, 1)
    if len(node.inputs) > 1 and node.inputs[1] and c is None:
        raise UnsupportedOperatorError([(node.name, "Split with computed split sizes")])
    sizes = ref._ints(c) if c is not None else (ref._ints(node.attrs["split"]) if "split" in node.attrs else None)
    n = len(node.outputs)

    def run(x):
        v = x[0]
        a = axis % v.dim()
        sz = sizes
        if sz is None:
            num = int(_s(node, "num_outputs", n))
            d = v.shape[a]
            chunk = -(-d // num)
            sz = [chunk] * (num - 1) + [d - chunk * (num - 1)]
        return list(torch.split(v, sz, dim=a))
    return run


@_reg("Slice")
def _slice(node, consts):
    if len(node.inputs) > 1 and node.inputs[1]:
        starts = ref._ints(_need_const(node, consts, 1, "starts"))
        ends = ref._ints(_need_const(node, consts, 2, "ends"))
        ax = _const(consts, 3)
        st = _const(consts, 4)
        if (len(node.inputs) > 3 and node.inputs[3] and ax is None) or \
                (len(node.inputs) > 4 and node.inputs[4] and st is None):
            raise UnsupportedOperatorError([(node.name, "Slice with computed axes/steps")])
        axes = ref._ints(ax) if ax is not None else list(range(len(starts)))
        steps = ref._ints(st) if st is not None else [1] * len(starts)
    else:
        starts, ends = ref._ints(node.attrs["starts"]), ref._ints(node.attrs["ends"])
        axes = ref._ints(node.attrs.get("axes", list(range(len(starts)))))
        steps = [1] * len(starts)

    def run(x):
        v = x[0]
        for s, e, a, step in zip(starts, ends, axes, steps):
            a = a % v.dim()
            idx = range(v.shape[a])[slice(s, e, step)]  # python clamps like ONNX
            if step == 1:
                v = v.narrow(a, idx.start if len(idx) else 0, len(idx))
            else:
                v = v.index_select(a, _dev(list(idx), "int64", v.device))
        return [v]
    return run


@_reg("Gather")
def _gather(node, consts):
    torch = _torch()
    axis = int(_s(node, "axis", 0))
    ci = _const(consts, 1)

    def run(x):
        v = x[0]
        a = axis % v.dim()
        idx = x[1]
        if ci is not None:
            idx_np = np.where(ci < 0, ci + v.shape[a], ci)
            if idx_np.ndim == 0:
                return [v.select(a, int(idx_np))]
            idx = _dev(idx_np, "int64", v.device)
        else:
            idx = torch.where(idx < 0, idx + v.shape[a], idx)
        out = v.index_select(a, idx.reshape(-1))
        return [out.reshape(*v.shape[:a], *idx.shape, *v.shape[a + 1:])]
    return run


@_reg("Expand")
def _expand(node, consts):
    shape = ref._ints(_need_const(node, consts, 1, "shape"))

    def run(x):
        v = x[0]
        out = np.broadcast_shapes(tuple(v.shape), tuple(shape))
        return [v.expand(*out)]
    return run


@_reg("Tile")
def _tile(node, consts):
    reps = ref._ints(_need_const(node, consts, 1, "repeats"))
    return lambda x: [x[0].repeat(*reps)]


@_reg("Pad")
def _pad(node, consts):
    torch = _torch()
    F = torch.nn.functional
    mode = _s(node, "mode", "constant")
    if len(node.inputs) > 1 and node.inputs[1]:
        pads = ref._ints(_need_const(node, consts, 1, "pads"))
        cv = _const(consts, 2)
        cval = 0.0 if cv is None or cv.size == 0 else float(cv.reshape(-1)[0])
        ax = _const(consts, 3)
        axes = ref._ints(ax) if ax is not None else None
    else:
        pads = ref._ints(node.attrs["pads"])
        cval = float(_s(node, "value", 0.0))
        axes = None
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise UnsupportedOperatorError([(node.name, f"Pad mode '{mode}'")])
    np_mode = {"edge": "edge", "reflect": "reflect", "wrap": "wrap"}.get(mode)

    def run(x):
        v = x[0]
        r = v.dim()
        ax = list(range(r)) if axes is None else [a % r for a in axes]
        n = len(ax)
        width = [[0, 0] for _ in range(r)]
        for i, a in enumerate(ax):
            width[a] = [pads[i], pads[i + n]]
        for a, (b, e) in enumerate(width):  # negative pads crop
            if b < 0 or e < 0:
                v = v.narrow(a, max(-b, 0), v.shape[a] - max(-b, 0) - max(-e, 0))
                width[a] = [max(b, 0), max(e, 0)]
        if mode == "constant":
            flat: list[int] = []
            for a in reversed(range(r)):
                flat += width[a]
            return [F.pad(v, flat, value=cval)]
        for a, (b, e) in enumerate(width):  # reflect/edge/wrap: one gather per padded axis
            if b or e:
                idx = np.pad(np.arange(v.shape[a]), (b, e), mode=np_mode)
                v = v.index_select(a, _dev(idx, "int64", v.device))
        return [v]
    return run


@_reg("DepthToSpace", "SpaceToDepth")
def _d2s(node, consts):
    b = int(node.attrs["blocksize"])
    mode = _s(node, "mode", "DCR")

    def run(x):
        v = x[0]
        n, c, h, w = v.shape
        if node.op == "SpaceToDepth":
            t = v.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
            return [t.reshape(n, c * b * b, h // b, w // b)]
        if mode == "DCR":
            t = v.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
        else:
            t = v.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
        return [t.reshape(n, c // (b * b), h * b, w * b)]
    return run


@_reg("Resize")
def _resize(node, consts):
    """Per resized axis: gather the taps (indices and weights computed once, from the reference
    executor's tap rule, so every ONNX mode matches) and sum them."""
    torch = _torch()
    scales = _const(consts, 2)
    sizes = _const(consts, 3)
    if scales is not None and scales.size == 0:
        scales = None
    if sizes is not None and sizes.size == 0:
        sizes = None
    if int(_s(node, "antialias", 0)) or _s(node, "keep_aspect_ratio_policy", "stretch") != "stretch" \
            or _s(node, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        raise UnsupportedOperatorError([(node.name, "Resize with antialias / aspect policy / crop")])
    mode = _s(node, "mode", "nearest")
    coord = _s(node, "coordinate_transformation_mode", "half_pixel")
    nearest = _s(node, "nearest_mode", "round_prefer_floor")
    cubic_a = float(_s(node, "cubic_coeff_a", -0.75))
    excl = bool(_s(node, "exclude_outside", 0))
    axes_attr = node.attrs.get("axes")

    def run(x):
        v = x[0]
        r = v.dim()
        _, full, out_shape = ref.resize_geometry(node, tuple(v.shape), scales, sizes, axes_attr)
        out = v
        for a in range(r):
            if out_shape[a] == v.shape[a] and full[a] == 1.0:
                continue
            idx, w, _ = ref._resize_taps(mode, coord, nearest, v.shape[a], out_shape[a], full[a],
                                         cubic_a, excl, None, 0.0)
            acc = None
            for tap in range(idx.shape[1]):
                part = out.index_select(a, _dev(idx[:, tap], "int64", v.device))
                if mode != "nearest":
                    wshape = [1] * r
                    wshape[a] = -1
                    part = part * _dev(w[:, tap], "float32", v.device).reshape(wshape)
                acc = part if acc is None else acc + part
            out = acc
        return [out]
    return run


# ------------------------------------------------------------------------------- linear, pooling
@_reg("MatMul")
def _matmul(node, consts):
    torch = _torch()
    return lambda x: [torch.matmul(x[0], x[1])]


@_reg("Gemm")
def _gemm(node, consts):
    ta, tb = bool(_s(node, "transA", 0)), bool(_s(node, "transB", 0))
    alpha, beta = float(_s(node, "alpha", 1.0)), float(_s(node, "beta", 1.0))

    def run(x):
        a = x[0].t() if ta else x[0]
        b = x[1].t() if tb else x[1]
        y = a @ b
        if alpha != 1.0:
            y = y * alpha
        if len(x) > 2 and x[2] is not None:
            y = y + (x[2] * beta if beta != 1.0 else x[2])
        return [y]
    return run


def _conv_attrs(node: Node, nd: int) -> tuple[list[int], list[int], int]:
    """(strides, dilations, group) of a Conv / ConvTranspose with `nd` spatial dims."""
    return (ref._ints(node.attrs.get("strides", [1] * nd)), ref._ints(node.attrs.get("dilations", [1] * nd)),
            int(node.attrs.get("group", 1)))


@_reg("Conv")
def _conv(node, consts):
    F = _torch().nn.functional

    def run(x):
        v, w = x[0], x[1]
        b = x[2] if len(x) > 2 else None
        nd = v.dim() - 2
        strides, dil, group = _conv_attrs(node, nd)
        pads = ref._conv_pads(node, list(v.shape[2:]), list(w.shape[2:]), strides, dil)
        if pads[:nd] == pads[nd:]:
            padding = pads[:nd]
        else:
            v = F.pad(v, ref._torch_pad_arg(pads))
            padding = [0] * nd
        fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
        return [fn(v, w, b, stride=strides, padding=padding, dilation=dil, groups=group)]
    return run


@_reg("ConvTranspose")
def _convt(node, consts):
    F = _torch().nn.functional
    if "output_shape" in node.attrs or _s(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise UnsupportedOperatorError([(node.name, "ConvTranspose with output_shape / SAME auto_pad")])

    def run(x):
        v, w = x[0], x[1]
        b = x[2] if len(x) > 2 else None
        nd = v.dim() - 2
        strides, dil, group = _conv_attrs(node, nd)
        out_pad = ref._ints(node.attrs.get("output_padding", [0] * nd))
        pads = [0] * (2 * nd) if _s(node, "auto_pad", "NOTSET") == "VALID" else \
            ref._ints(node.attrs.get("pads", [0] * (2 * nd)))
        fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
        out = fn(v, w, b, stride=strides, dilation=dil, groups=group, output_padding=out_pad)
        for i in range(nd):
            out = out.narrow(2 + i, pads[i], out.shape[2 + i] - pads[i] - pads[i + nd])
        return [out]
    return run


@_reg("MaxPool", "AveragePool")
def _pool(node, consts):
    F = _torch().nn.functional
    if node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        raise UnsupportedOperatorError([(node.name, "MaxPool with the Indices output")])

    def run(x):
        v = x[0]
        nd = v.dim() - 2
        kernel, strides, dil, pads, extra = ref._pool_geometry(node, np.empty(tuple(v.shape), dtype=np.uint8))
        all_pads = pads[:nd] + [pads[nd + i] + extra[i] for i in range(nd)]
        if node.op == "MaxPool":
            if any(all_pads):
                v = F.pad(v, ref._torch_pad_arg(all_pads), value=-float("inf"))
            fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
            return [fn(v, kernel, strides, 0, dil)]
        if any(d != 1 for d in dil) or any(extra) or pads[:nd] != pads[nd:]:
            raise UnsupportedOperatorError([(node.name, "AveragePool with dilations/ceil overhang/asymmetric pads")])
        fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nd]
        return [fn(v, kernel, strides, pads[:nd], count_include_pad=bool(int(_s(node, "count_include_pad", 0))))]
    return run


@_reg("GlobalAveragePool", "GlobalMaxPool")
def _gpool(node, consts):
    torch = _torch()

    def run(x):
        v = x[0]
        dims = tuple(range(2, v.dim()))
        return [v.mean(dim=dims, keepdim=True) if node.op == "GlobalAveragePool" else torch.amax(v, dim=dims, keepdim=True)]
    return run


# ------------------------------------------------------------------------------- kernels
# Kernels hand dense tensors to each other: Inductor must not pad the strides of what it
# returns (on CUDA it pads rows for alignment by default, and the next kernel, compiled for
# dense inputs, then rejects them).
_INDUCTOR_OPTIONS = {"comprehensive_padding": False, "pad_outputs": False}


@dataclass
class TorchKernel:
    """One kernel: call with its input tensors (in `inputs` order), get its outputs (in `outputs` order)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    module: Any  # ATen-level torch.fx.GraphModule holding the weights
    fn: Callable  # compiled (Inductor) or the module itself
    compiled: bool

    def __call__(self, *tensors):
        outs = self.fn(*tensors)
        if self.compiled:  # Inductor may hand back a strided view; the next kernel expects dense
            return [o if o.is_contiguous() else o.contiguous() for o in outs]
        return outs


def example_inputs(prim: Graph, names: Sequence[str], device: Any) -> list:
    """Random tensors of the graph's static shapes for `names` (tracing, compiling, timing)."""
    return [_example(prim, n, device) for n in names]


def _example(prim: Graph, name: str, device: Any):
    torch = _torch()
    t = prim.tensors[name]
    dt = np.dtype(t.dtype)
    if np.issubdtype(dt, np.floating):
        return torch.randn(tuple(t.shape), dtype=getattr(torch, dt.name), device=device)
    return torch.zeros(tuple(t.shape), dtype=torch.bool if dt == np.bool_ else getattr(torch, dt.name),
                       device=device)


def _graph_module(prim: Graph, nodes: Sequence[Node], inputs: Sequence[str], outputs: Sequence[str],
                  device: Any, autocast: Any = None):
    """Trace the chained builders at the graph's static shapes into an ATen-level GraphModule
    (`make_fx`); the weights become its constants, already on `device`. With `autocast` (a torch
    dtype: bfloat16 or float16) the chain is traced under `torch.autocast`, so the casts are part
    of the program, and each output is cast back to its graph dtype (kernels hand fp32 tensors on)."""
    torch = _torch()
    from torch.fx.experimental.proxy_tensor import make_fx
    fns = []
    weights: dict[str, Any] = {}
    for n in nodes:
        if n.op not in _BUILDERS or n.domain not in ("", "ai.onnx"):
            raise UnsupportedOperatorError([(n.name, n.op)])
        consts = []
        for i in n.inputs:
            t = prim.tensors.get(i) if i else None
            consts.append(t.data if t is not None and t.data is not None else None)
        fns.append((n, _BUILDERS[n.op](n, consts)))
        for i in n.inputs:
            t = prim.tensors.get(i) if i else None
            if t is not None and t.data is not None and i not in weights:
                weights[i] = torch.as_tensor(np.ascontiguousarray(t.data)).to(device)

    def forward(*xs):
        env = dict(weights)
        env.update(zip(inputs, xs))
        for n, f in fns:
            for name, val in zip(n.outputs, f([env[i] if i else None for i in n.inputs])):
                if name:
                    env[name] = val
        # dense outputs: the next kernel was compiled for contiguous inputs
        return tuple(env[o].contiguous() for o in outputs)

    traced = forward
    if autocast is not None:
        want = [getattr(torch, np.dtype(prim.tensors[o].dtype).name) for o in outputs]
        kind = torch.device(device).type

        def traced(*xs):
            with torch.autocast(kind, dtype=autocast):
                res = forward(*xs)
            return tuple(r if r.dtype == w else r.to(w) for r, w in zip(res, want))

    with torch.inference_mode(False), torch.no_grad():
        return make_fx(traced)(*example_inputs(prim, inputs, device))


def build_kernel(prim: Graph, node_names: Sequence[str], inputs: Sequence[str], outputs: Sequence[str],
                 *, device: Any = "cpu", compile: bool = True, autocast: Any = None) -> TorchKernel:
    """A candidate or plan kernel as one torch program on `device`; `compile` fuses it with Inductor;
    `autocast` (torch.bfloat16 / torch.float16) computes it at that precision, outputs cast back.

    Raises `UnsupportedOperatorError` naming the node for an op with no builder, and
    `CompileError` when tracing fails (the kernel then cannot be one fused program)."""
    torch = _torch()
    byname = {n.name: n for n in prim.nodes}
    nodes = [byname[x] for x in node_names]
    try:
        gm = _graph_module(prim, nodes, list(inputs), list(outputs), device, autocast)
    except UnsupportedOperatorError:
        raise
    except Exception as e:  # noqa: BLE001 - name the kernel, keep the cause
        raise CompileError(f"kernel over {list(node_names)[:3]}...: tracing to torch.fx failed: "
                           f"{type(e).__name__}: {e}") from e
    fn = gm
    if compile:
        try:
            fn = torch._inductor.compile(gm, example_inputs(prim, inputs, device), options=_INDUCTOR_OPTIONS)
        except Exception as e:  # noqa: BLE001 - a kernel Inductor cannot build is not a candidate
            raise CompileError(f"kernel over {list(node_names)[:3]}...: Inductor failed: "
                               f"{type(e).__name__}: {str(e)[:300]}") from e
    return TorchKernel(tuple(inputs), tuple(outputs), gm, fn, bool(compile))


def run_graph(prim: Graph, feeds: dict[str, np.ndarray], *, device: Any = "cpu") -> dict[str, np.ndarray]:
    """Run a whole graph eagerly through the builders (the check that every op matches ONNX)."""
    torch = _torch()
    k = build_kernel(prim, [n.name for n in prim.nodes], list(prim.inputs), list(prim.outputs),
                     device=device, compile=False)
    with torch.inference_mode():
        outs = k(*[torch.as_tensor(feeds[i]).to(device) for i in prim.inputs])
    return {o: v.detach().cpu().numpy() for o, v in zip(prim.outputs, outs)}


__all__ = ["TorchKernel", "build_kernel", "example_inputs", "run_graph", "supported_ops"]
