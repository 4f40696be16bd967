"""Operator fission: rewrite ONNX operators into Korch-style *primitives*.

Why: Korch's orchestration only finds good kernels if compound operators
(Softmax, LayerNorm, GELU, Gemm, ...) are broken into the elementwise /
reduce / layout / linear primitives they are made of, so that the planner can
fuse them freely with their neighbours (and recompute cheap ones).

The result is an ordinary `Graph` whose nodes use *standard ONNX op types*
(Add, Mul, Exp, ReduceMax, ReduceSum, Reshape, MatMul, Conv, ...), emitted in
the form valid at the graph's opset (e.g. `ReduceSum` takes `axes` as an input
from opset 13, the other Reduce ops from opset 18), so the reference executor,
`graph_to_onnx` and ONNX Runtime all run it unchanged. `reduce_axes(graph,
node)` reads the axes of any Reduce node in either form.

Contract (other modules code against it):

- `CATEGORY: dict[str, str]` op type -> "elementwise" | "reduce" | "layout" |
  "linear" | "opaque" (`category(op)` returns "opaque" for unknown ops).
- `fission(graph) -> FissionResult` with `.graph` (primitive Graph, pruned,
  topologically sorted, every node single-output except opaque ones),
  `.opaque` (list of (node_name, op) that have no rule and run alone),
  `.origin` (primitive node name -> original node name).

Design decisions (documented here because Korch leaves them open):

- Pooling: `MaxPool` / `AveragePool` / `LpPool` stay single primitives of
  category "reduce" (a window reduction: memory-bound, fusable with
  elementwise neighbours). `GlobalAveragePool` becomes `ReduceSum + Mul`,
  `GlobalMaxPool` becomes `ReduceMax`.
- Conv keeps its bias (as Korch's cuDNN "mode 1"); Gemm becomes
  [Transpose] -> MatMul -> [Mul alpha] -> [Add beta*C] (constant operands are
  transposed/scaled at fission time, not at run time).
- `Flatten`, `Squeeze`, `Unsqueeze` become `Reshape` (static shapes), so the
  layout primitives a backend must lower are few.
- `Expand` feeding only broadcasting elementwise ops is removed (broadcast is
  implicit, as korch.md recommends); otherwise it stays a layout primitive.
- `Resize`/`Upsample` nearest with integer scales and asymmetric/floor
  coordinates becomes Reshape -> Expand -> Reshape; any other Resize stays a
  single "layout" primitive.
- `Pad` (all modes) stays a single layout primitive.
- Anything without a rule and not in `CATEGORY` is "opaque": it forms a
  kernel alone and runs through the reference executor / torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph, Node, Tensor

_ELEMENTWISE = """Add Sub Mul Div Pow Max Min Mod Where Equal Less Greater LessOrEqual GreaterOrEqual
And Or Xor Not BitShift Relu LeakyRelu PRelu Sigmoid HardSigmoid Tanh Erf Exp Log Sqrt Reciprocal Neg
Abs Clip Softplus Softsign Elu Selu Celu ThresholdedRelu Cast CastLike Identity Floor Ceil Round Sign
Sin Cos Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh IsNaN IsInf""".split()
_REDUCE = """ReduceSum ReduceMax ReduceMin ReduceProd ReduceMean ReduceL1 ReduceL2 ReduceSumSquare
ReduceLogSum ReduceLogSumExp MaxPool AveragePool LpPool GlobalAveragePool GlobalMaxPool""".split()
_LAYOUT = """Transpose Reshape Flatten Squeeze Unsqueeze Slice Concat Pad Gather Expand Tile
DepthToSpace SpaceToDepth Resize Upsample""".split()
_LINEAR = "MatMul Conv ConvTranspose Gemm".split()

#: op type -> primitive category. Ops not listed are "opaque".
CATEGORY: dict[str, str] = {
    **{op: "elementwise" for op in _ELEMENTWISE},
    **{op: "reduce" for op in _REDUCE},
    **{op: "layout" for op in _LAYOUT},
    **{op: "linear" for op in _LINEAR},
}

#: Elementwise ops that broadcast their inputs numpy-style (used by the Expand rule).
BROADCASTING = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "Where", "Equal", "Less",
                "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "PRelu"}


def category(op: str) -> str:
    """The primitive category of an op type ("opaque" when unknown)."""
    return CATEGORY.get(op, "opaque")


@dataclass
class FissionResult:
    """Output of `fission`: the primitive graph plus bookkeeping."""

    graph: Graph
    opaque: list[tuple[str, str]] = field(default_factory=list)  # (node_name, op)
    origin: dict[str, str] = field(default_factory=dict)  # prim node -> original node
    rules_applied: dict[str, int] = field(default_factory=dict)  # op -> count rewritten

    def summary(self) -> dict[str, Any]:
        cats: dict[str, int] = {}
        for n in self.graph.nodes:
            c = category(n.op) if (n.name, n.op) not in set(self.opaque) else "opaque"
            cats[c] = cats.get(c, 0) + 1
        return {"primitives": len(self.graph.nodes), "categories": cats,
                "opaque": [list(x) for x in self.opaque], "rules_applied": dict(self.rules_applied)}


# ---------------------------------------------------------------------------------------------
# helpers to read attributes in any opset form
# ---------------------------------------------------------------------------------------------

def const_value(g: Graph, name: str) -> np.ndarray | None:
    """The data of a constant tensor, or None for "" / non-constant tensors."""
    if not name:
        return None
    t = g.tensors.get(name)
    return None if t is None or t.data is None else np.asarray(t.data)


def _attr_str(v: Any, default: str = "") -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def reduce_axes(g: Graph, node: Node) -> tuple[int, ...]:
    """Normalised (non-negative, sorted) reduction axes of a Reduce* node, attr or input form.

    An empty/missing axes list means all axes unless `noop_with_empty_axes` is set, in which case
    it returns () (the op is an identity)."""
    rank = len(g.tensors[node.inputs[0]].shape)
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        v = const_value(g, node.inputs[1])
        if v is None:
            raise TensorplanError(f"node '{node.name}' ({node.op}) has non-constant axes")
        axes = v.tolist()
    if axes is None or len(list(np.atleast_1d(axes))) == 0:
        if node.attrs.get("noop_with_empty_axes", 0):
            return ()
        return tuple(range(rank))
    return tuple(sorted(int(a) % rank for a in np.atleast_1d(axes)))


def _keepdims(node: Node) -> bool:
    return bool(node.attrs.get("keepdims", 1))


# ---------------------------------------------------------------------------------------------
# the builder rules use to emit primitives
# ---------------------------------------------------------------------------------------------

class _Emitter:
    """Emits primitive nodes replacing one original node; tracks shapes and unique names."""

    def __init__(self, g: Graph, orig: Node, names: set[str]):
        self.g, self.orig, self.names = g, orig, names
        self.nodes: list[Node] = []
        self.opset = g.opset

    def _name(self, base: str) -> str:
        k = 0
        cand = f"{self.orig.name}/{base}"
        while cand in self.names:
            k += 1
            cand = f"{self.orig.name}/{base}_{k}"
        self.names.add(cand)
        return cand

    def shape(self, t: str) -> tuple[int, ...]:
        return tuple(self.g.tensors[t].shape)

    def dtype(self, t: str) -> str:
        return self.g.tensors[t].dtype

    def const(self, value: Any, dtype: str = "float32", base: str = "c") -> str:
        arr = np.asarray(value, dtype=dtype)
        name = self._name(base)
        self.g.add_tensor(Tensor(name, tuple(arr.shape), str(arr.dtype), arr))
        return name

    def op(self, op: str, inputs: list[str], shape: tuple[int, ...], dtype: str | None = None,
           attrs: dict | None = None, out: str | None = None) -> str:
        dtype = dtype or self.dtype(next(i for i in inputs if i))
        out = out or self._name(f"{op.lower()}_out")
        if out not in self.g.tensors or self.g.tensors[out].shape != tuple(shape):
            self.g.add_tensor(Tensor(out, tuple(int(s) for s in shape), dtype))
        self.nodes.append(Node(self._name(op), op, list(inputs), [out], dict(attrs or {})))
        return out

    # -- typed helpers ----------------------------------------------------------------------
    def unary(self, op: str, x: str, out: str | None = None, **attrs) -> str:
        return self.op(op, [x], self.shape(x), attrs=attrs, out=out)

    def binary(self, op: str, a: str, b: str, out: str | None = None) -> str:
        shape = np.broadcast_shapes(self.shape(a), self.shape(b))
        dtype = self.dtype(a)
        return self.op(op, [a, b], shape, dtype=dtype, out=out)

    def scalar(self, op: str, x: str, value: float, out: str | None = None) -> str:
        return self.binary(op, x, self.const(value, self.dtype(x)), out=out)

    def reduce(self, op: str, x: str, axes: tuple[int, ...], keepdims: bool = True,
               out: str | None = None) -> str:
        shp = self.shape(x)
        axes = tuple(sorted(a % len(shp) for a in axes))
        oshape = tuple((1 if i in axes else s) for i, s in enumerate(shp)) if keepdims else \
            tuple(s for i, s in enumerate(shp) if i not in axes)
        axes_input = self.opset >= 13 if op == "ReduceSum" else self.opset >= 18
        if axes_input:
            ax = self.const(list(axes), "int64", base="axes")
            return self.op(op, [x, ax], oshape, attrs={"keepdims": int(keepdims)}, out=out)
        return self.op(op, [x], oshape, attrs={"axes": list(axes), "keepdims": int(keepdims)}, out=out)

    def reshape(self, x: str, shape: tuple[int, ...], out: str | None = None) -> str:
        shape = tuple(int(s) for s in shape)
        return self.op("Reshape", [x, self.const(list(shape), "int64", base="shape")], shape, out=out)

    def transpose(self, x: str, perm: list[int], out: str | None = None) -> str:
        shp = self.shape(x)
        return self.op("Transpose", [x], tuple(shp[p] for p in perm), attrs={"perm": list(perm)}, out=out)

    def expand(self, x: str, shape: tuple[int, ...], out: str | None = None) -> str:
        oshape = np.broadcast_shapes(self.shape(x), tuple(shape))
        return self.op("Expand", [x, self.const(list(shape), "int64", base="shape")], oshape, out=out)

    def slice(self, x: str, starts, ends, axes, out: str | None = None) -> str:
        shp = list(self.shape(x))
        for s, e, a in zip(starts, ends, axes):
            shp[a] = len(range(*slice(s, e).indices(shp[a])))
        if self.opset >= 10:
            ins = [x, self.const(list(starts), "int64", "starts"), self.const(list(ends), "int64", "ends"),
                   self.const(list(axes), "int64", "axes")]
            return self.op("Slice", ins, tuple(shp), out=out)
        return self.op("Slice", [x], tuple(shp), out=out,
                       attrs={"starts": list(starts), "ends": list(ends), "axes": list(axes)})

    def clip(self, x: str, lo: float, hi: float, out: str | None = None) -> str:
        if self.opset >= 11:
            dt = self.dtype(x)
            return self.op("Clip", [x, self.const(lo, dt, "min"), self.const(hi, dt, "max")],
                           self.shape(x), out=out)
        return self.op("Clip", [x], self.shape(x), attrs={"min": float(lo), "max": float(hi)}, out=out)

    def channel_param(self, p: str, rank: int, base: str) -> str:
        """A per-channel [C] parameter reshaped to [C,1,...,1] for broadcasting against NC..."""
        v = const_value(self.g, p)
        shape = (self.shape(p)[0],) + (1,) * (rank - 2)
        if v is not None:
            return self.const(v.reshape(shape), str(v.dtype), base)
        return self.reshape(p, shape)


Rule = Callable[[_Emitter, Node], "bool | None"]

# ---------------------------------------------------------------------------------------------
# rules: each emits primitives that write the original output tensor name, or returns False
# (rule does not apply to this instance: the node is kept as is / becomes opaque)
# ---------------------------------------------------------------------------------------------


def _softmax_axes(e: _Emitter, n: Node) -> tuple[int, ...]:
    rank = len(e.shape(n.inputs[0]))
    if e.opset < 13:  # coerce-to-2D semantics: normalise over every dim >= axis
        axis = int(n.attrs.get("axis", 1)) % rank
        return tuple(range(axis, rank))
    return (int(n.attrs.get("axis", -1)) % rank,)


def rule_softmax(e: _Emitter, n: Node):
    """Softmax = Exp(x - max) / sum, with the max-subtraction (Korch drops it and overflows)."""
    x, axes = n.inputs[0], _softmax_axes(e, n)
    m = e.reduce("ReduceMax", x, axes)
    ex = e.unary("Exp", e.binary("Sub", x, m))
    e.binary("Div", ex, e.reduce("ReduceSum", ex, axes), out=n.outputs[0])


def rule_logsoftmax(e: _Emitter, n: Node):
    """LogSoftmax = d - Log(ReduceSum(Exp(d))), d = x - max."""
    x, axes = n.inputs[0], _softmax_axes(e, n)
    d = e.binary("Sub", x, e.reduce("ReduceMax", x, axes))
    s = e.reduce("ReduceSum", e.unary("Exp", d), axes)
    e.binary("Sub", d, e.unary("Log", s), out=n.outputs[0])


def _normalize(e: _Emitter, x: str, axes: tuple[int, ...], eps: float) -> str:
    """(x - mean) / sqrt(var + eps) over `axes`, with ReduceSum * 1/n for the means."""
    shp = e.shape(x)
    inv_n = 1.0 / float(np.prod([shp[a] for a in axes]))
    mu = e.scalar("Mul", e.reduce("ReduceSum", x, axes), inv_n)
    c = e.binary("Sub", x, mu)
    var = e.scalar("Mul", e.reduce("ReduceSum", e.binary("Mul", c, c), axes), inv_n)
    sd = e.unary("Sqrt", e.scalar("Add", var, eps))
    return e.binary("Div", c, sd)


def rule_layernorm(e: _Emitter, n: Node):
    """LayerNormalization(axis, eps) -> the 11-primitive normalise + scale + bias chain."""
    if sum(1 for o in n.outputs if o) > 1:
        return False  # Mean / InvStdDev outputs requested: keep opaque
    x = n.inputs[0]
    rank = len(e.shape(x))
    axis = int(n.attrs.get("axis", -1)) % rank
    y = _normalize(e, x, tuple(range(axis, rank)), float(n.attrs.get("epsilon", 1e-5)))
    has_b = len(n.inputs) > 2 and n.inputs[2]
    y = e.binary("Mul", y, n.inputs[1], out=None if has_b else n.outputs[0])
    if has_b:
        e.binary("Add", y, n.inputs[2], out=n.outputs[0])


def rule_instancenorm(e: _Emitter, n: Node):
    """InstanceNormalization -> normalise over spatial axes, then [C,1,..] scale and bias."""
    x = n.inputs[0]
    rank = len(e.shape(x))
    y = _normalize(e, x, tuple(range(2, rank)), float(n.attrs.get("epsilon", 1e-5)))
    y = e.binary("Mul", y, e.channel_param(n.inputs[1], rank, "scale"))
    e.binary("Add", y, e.channel_param(n.inputs[2], rank, "bias"), out=n.outputs[0])


def rule_groupnorm(e: _Emitter, n: Node):
    """GroupNormalization -> Reshape [N,G,-1], normalise, Reshape back, [C,1,..] affine.

    Opset 18 gives scale/bias per group ([G]); opset 21 per channel ([C])."""
    x = n.inputs[0]
    shp = e.shape(x)
    N, C, G = shp[0], shp[1], int(n.attrs["num_groups"])
    rank = len(shp)
    scale, bias = const_value(e.g, n.inputs[1]), const_value(e.g, n.inputs[2])
    if scale is None or bias is None or C % G:
        return False
    if scale.shape[0] == G and G != C:
        scale, bias = np.repeat(scale, C // G), np.repeat(bias, C // G)
    xr = e.reshape(x, (N, G, int(np.prod(shp)) // (N * G)))
    y = e.reshape(_normalize(e, xr, (2,), float(n.attrs.get("epsilon", 1e-5))), shp)
    cshape = (C,) + (1,) * (rank - 2)
    y = e.binary("Mul", y, e.const(scale.reshape(cshape), str(scale.dtype), "scale"))
    e.binary("Add", y, e.const(bias.reshape(cshape), str(bias.dtype), "bias"), out=n.outputs[0])


def rule_batchnorm(e: _Emitter, n: Node):
    """BatchNormalization (inference) -> x*a + b with a, b folded per channel when constant."""
    if n.attrs.get("training_mode", 0) or sum(1 for o in n.outputs if o) > 1:
        return False
    x, s, b, m, v = n.inputs[:5]
    rank = len(e.shape(x))
    eps = float(n.attrs.get("epsilon", 1e-5))
    vals = [const_value(e.g, t) for t in (s, b, m, v)]
    cshape = (e.shape(x)[1],) + (1,) * (rank - 2)
    if all(val is not None for val in vals):
        sv, bv, mv, vv = (val.astype(np.float64) for val in vals)
        a = sv / np.sqrt(vv + eps)
        dt = e.dtype(x)
        y = e.binary("Mul", x, e.const((a).reshape(cshape), dt, "bn_scale"))
        e.binary("Add", y, e.const((bv - mv * a).reshape(cshape), dt, "bn_shift"), out=n.outputs[0])
        return None
    sd = e.unary("Sqrt", e.scalar("Add", e.channel_param(v, rank, "var"), eps))
    c = e.binary("Sub", x, e.channel_param(m, rank, "mean"))
    y = e.binary("Mul", e.binary("Div", c, sd), e.channel_param(s, rank, "scale"))
    e.binary("Add", y, e.channel_param(b, rank, "bias"), out=n.outputs[0])


def rule_gelu(e: _Emitter, n: Node):
    """Gelu: erf form 0.5*x*(1+erf(x/sqrt2)); tanh form with 0.044715*x^3."""
    x = n.inputs[0]
    approx = _attr_str(n.attrs.get("approximate"), "none")
    if n.op == "FastGelu" or approx == "tanh":
        x3 = e.binary("Mul", e.binary("Mul", x, x), x)
        inner = e.binary("Add", x, e.scalar("Mul", x3, 0.044715))
        t = e.unary("Tanh", e.scalar("Mul", inner, math.sqrt(2.0 / math.pi)))
    else:
        t = e.unary("Erf", e.scalar("Div", x, math.sqrt(2.0)))
    y = e.binary("Mul", x, e.scalar("Add", t, 1.0))
    e.scalar("Mul", y, 0.5, out=n.outputs[0])


def rule_swish(e: _Emitter, n: Node):
    """Swish/SiLU(alpha) -> x * Sigmoid(alpha*x)."""
    x = n.inputs[0]
    alpha = float(n.attrs.get("alpha", 1.0))
    sx = e.unary("Sigmoid", x if alpha == 1.0 else e.scalar("Mul", x, alpha))
    e.binary("Mul", x, sx, out=n.outputs[0])


def rule_hardsigmoid(e: _Emitter, n: Node):
    """HardSigmoid -> Clip(alpha*x + beta, 0, 1)."""
    x = n.inputs[0]
    a = e.scalar("Mul", x, float(n.attrs.get("alpha", 0.2)))
    e.clip(e.scalar("Add", a, float(n.attrs.get("beta", 0.5))), 0.0, 1.0, out=n.outputs[0])


def rule_hardswish(e: _Emitter, n: Node):
    """HardSwish -> x * Clip(x/6 + 1/2, 0, 1) (ONNX's exact alpha/beta form)."""
    x = n.inputs[0]
    h = e.clip(e.scalar("Add", e.scalar("Mul", x, 1.0 / 6.0), 0.5), 0.0, 1.0)
    e.binary("Mul", x, h, out=n.outputs[0])


def rule_mish(e: _Emitter, n: Node):
    """Mish -> x * Tanh(Softplus(x))."""
    x = n.inputs[0]
    e.binary("Mul", x, e.unary("Tanh", e.unary("Softplus", x)), out=n.outputs[0])


def rule_gemm(e: _Emitter, n: Node):
    """Gemm(alpha, beta, transA, transB) -> [Transpose] MatMul [Mul alpha] [Add beta*C].

    Constant operands are transposed / scaled now, so weights cost nothing at run time."""
    a, b = n.inputs[0], n.inputs[1]
    c = n.inputs[2] if len(n.inputs) > 2 and n.inputs[2] else ""
    alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
    for flag, idx in (("transA", 0), ("transB", 1)):
        if n.attrs.get(flag, 0):
            t = (a, b)[idx]
            v = const_value(e.g, t)
            t2 = e.const(v.T, str(v.dtype), "wT") if v is not None else e.transpose(t, [1, 0])
            a, b = (t2, b) if idx == 0 else (a, t2)
    last = not c and alpha == 1.0
    oshape = (e.shape(a)[0], e.shape(b)[1])
    y = e.op("MatMul", [a, b], oshape, out=n.outputs[0] if last else None)
    if alpha != 1.0:
        y = e.scalar("Mul", y, alpha, out=n.outputs[0] if not c else None)
    if c:
        cv = const_value(e.g, c)
        if cv is not None:
            cc = e.const(cv * beta, str(cv.dtype), "bias")
        else:
            cc = c if beta == 1.0 else e.scalar("Mul", c, beta)
        y = e.binary("Add", y, cc, out=n.outputs[0])
    if e.shape(n.outputs[0]) != oshape:
        raise TensorplanError(f"Gemm '{n.name}': output shape {e.shape(n.outputs[0])} != {oshape}")


def rule_split(e: _Emitter, n: Node):
    """Split -> one Slice per output (primitives have a single output)."""
    x = n.inputs[0]
    shp = e.shape(x)
    axis = int(n.attrs.get("axis", 0)) % len(shp)
    sizes = n.attrs.get("split")
    if sizes is None and len(n.inputs) > 1 and n.inputs[1]:
        sizes = const_value(e.g, n.inputs[1])
        if sizes is None:
            return False
    if sizes is None:
        sizes = [e.shape(o)[axis] for o in n.outputs]
    start = 0
    for o, sz in zip(n.outputs, [int(s) for s in np.atleast_1d(sizes)]):
        if o:
            e.slice(x, [start], [start + sz], [axis], out=o)
        start += sz


def rule_reducemean(e: _Emitter, n: Node):
    """ReduceMean -> ReduceSum * (1/n)."""
    x = n.inputs[0]
    axes = reduce_axes(e.g, n)
    if not axes:
        return False
    inv = 1.0 / float(np.prod([e.shape(x)[a] for a in axes]))
    s = e.reduce("ReduceSum", x, axes, _keepdims(n))
    e.scalar("Mul", s, inv, out=n.outputs[0])


def rule_reduce_composite(e: _Emitter, n: Node):
    """ReduceSumSquare / ReduceL1 / ReduceL2 / ReduceLogSum / ReduceLogSumExp -> primitives."""
    x = n.inputs[0]
    axes = reduce_axes(e.g, n)
    if not axes:
        return False
    kd, out = _keepdims(n), n.outputs[0]
    if n.op == "ReduceSumSquare":
        e.reduce("ReduceSum", e.binary("Mul", x, x), axes, kd, out=out)
    elif n.op == "ReduceL1":
        e.reduce("ReduceSum", e.unary("Abs", x), axes, kd, out=out)
    elif n.op == "ReduceL2":
        e.unary("Sqrt", e.reduce("ReduceSum", e.binary("Mul", x, x), axes, kd), out=out)
    elif n.op == "ReduceLogSum":
        e.unary("Log", e.reduce("ReduceSum", x, axes, kd), out=out)
    elif n.op == "ReduceLogSumExp":
        m = e.reduce("ReduceMax", x, axes, True)
        s = e.reduce("ReduceSum", e.unary("Exp", e.binary("Sub", x, m)), axes, kd)
        mm = m if kd else e.reshape(m, e.shape(s))
        e.binary("Add", e.unary("Log", s), mm, out=out)


def rule_global_pool(e: _Emitter, n: Node):
    """GlobalAveragePool -> ReduceSum(spatial) * 1/HW; GlobalMaxPool -> ReduceMax(spatial)."""
    x = n.inputs[0]
    axes = tuple(range(2, len(e.shape(x))))
    if n.op == "GlobalMaxPool":
        e.reduce("ReduceMax", x, axes, out=n.outputs[0])
    else:
        inv = 1.0 / float(np.prod([e.shape(x)[a] for a in axes]))
        e.scalar("Mul", e.reduce("ReduceSum", x, axes), inv, out=n.outputs[0])


def rule_to_reshape(e: _Emitter, n: Node):
    """Flatten / Squeeze / Unsqueeze -> Reshape to the (static) output shape."""
    e.reshape(n.inputs[0], e.shape(n.outputs[0]), out=n.outputs[0])


def rule_variadic(e: _Emitter, n: Node):
    """Sum / Mean / Max / Min with n inputs -> a chain of binary primitives."""
    ins = [i for i in n.inputs if i]
    if n.op in ("Max", "Min") and len(ins) <= 2:
        return False
    if len(ins) == 1:
        e.op("Identity", ins, e.shape(n.outputs[0]), out=n.outputs[0])
        return None
    bop = {"Sum": "Add", "Mean": "Add", "Max": "Max", "Min": "Min"}[n.op]
    acc = ins[0]
    for k, t in enumerate(ins[1:]):
        last = k == len(ins) - 2 and n.op != "Mean"
        acc = e.binary(bop, acc, t, out=n.outputs[0] if last else None)
    if n.op == "Mean":
        e.scalar("Mul", acc, 1.0 / len(ins), out=n.outputs[0])


def _resize_scales(e: _Emitter, n: Node) -> list[float] | None:
    xs, ys = e.shape(n.inputs[0]), e.shape(n.outputs[0])
    if len(xs) != len(ys) or any(y % x for x, y in zip(xs, ys)):
        return None
    return [y // x for x, y in zip(xs, ys)]


def rule_resize(e: _Emitter, n: Node):
    """Nearest Resize/Upsample with integer scales (asymmetric, floor) -> Reshape-Expand-Reshape."""
    mode = _attr_str(n.attrs.get("mode"), "nearest")
    ctm = _attr_str(n.attrs.get("coordinate_transformation_mode"), "half_pixel" if n.op == "Resize" else "asymmetric")
    nm = _attr_str(n.attrs.get("nearest_mode"), "round_prefer_floor")
    scales = _resize_scales(e, n)
    if mode != "nearest" or scales is None:
        return False
    if n.op == "Upsample" or e.opset < 11:
        ok = True  # Upsample / Resize-10 nearest is floor(o / scale)
    else:
        # asymmetric: x = o / s; floor(x) = o // s always; round_prefer_floor agrees for s <= 2
        # (ties at .5 go down), round_prefer_ceil / ceil do not (they round .5 up)
        ok = ctm == "asymmetric" and (nm == "floor" or (nm == "round_prefer_floor"
                                                         and all(s in (1, 2) for s in scales)))
    if not ok:
        return False
    x = n.inputs[0]
    xs = e.shape(x)
    inter = tuple(d for s, sc in zip(xs, scales) for d in (s, 1))
    big = tuple(d for s, sc in zip(xs, scales) for d in (s, sc))
    r = e.reshape(x, inter)
    e.reshape(e.expand(r, big), e.shape(n.outputs[0]), out=n.outputs[0])


def rule_constant(e: _Emitter, n: Node):
    """Constant node -> a constant tensor (no node)."""
    val = None
    for k in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if k in n.attrs:
            val = np.asarray(n.attrs[k], dtype=np.float32 if "float" in k else (np.int64 if "int" in k else None))
            break
    if val is None:
        return False
    t = e.g.tensors.get(n.outputs[0])
    if t is None:
        e.g.add_tensor(Tensor(n.outputs[0], tuple(val.shape), str(val.dtype), val))
    else:
        t.data = val


def rule_dropout(e: _Emitter, n: Node):
    """Dropout (inference) -> Identity when the mask output is unused."""
    if sum(1 for o in n.outputs if o) > 1:
        return False
    e.op("Identity", [n.inputs[0]], e.shape(n.outputs[0]), out=n.outputs[0])


#: op type -> rewrite rule. A rule emits primitives writing the node's output name(s); returning
#: False means "does not apply here" (the node is kept, opaque if its op has no category).
RULES: dict[str, Rule] = {
    "Softmax": rule_softmax, "LogSoftmax": rule_logsoftmax,
    "LayerNormalization": rule_layernorm, "InstanceNormalization": rule_instancenorm,
    "GroupNormalization": rule_groupnorm, "BatchNormalization": rule_batchnorm,
    "Gelu": rule_gelu, "FastGelu": rule_gelu, "Swish": rule_swish, "SiLU": rule_swish,
    "HardSigmoid": rule_hardsigmoid, "HardSwish": rule_hardswish, "Mish": rule_mish,
    "Gemm": rule_gemm, "Split": rule_split, "ReduceMean": rule_reducemean,
    "ReduceSumSquare": rule_reduce_composite, "ReduceL1": rule_reduce_composite,
    "ReduceL2": rule_reduce_composite, "ReduceLogSum": rule_reduce_composite,
    "ReduceLogSumExp": rule_reduce_composite,
    "GlobalAveragePool": rule_global_pool, "GlobalMaxPool": rule_global_pool,
    "Flatten": rule_to_reshape, "Squeeze": rule_to_reshape, "Unsqueeze": rule_to_reshape,
    "Sum": rule_variadic, "Mean": rule_variadic, "Max": rule_variadic, "Min": rule_variadic,
    "Resize": rule_resize, "Upsample": rule_resize, "Constant": rule_constant, "Dropout": rule_dropout,
}


# ---------------------------------------------------------------------------------------------
# driver
# ---------------------------------------------------------------------------------------------

def _drop_implicit_expands(g: Graph, origin: dict[str, str]) -> int:
    """Remove Expand nodes whose consumers all broadcast anyway (korch.md: keep broadcast implicit)."""
    removed = 0
    for n in list(g.nodes):
        if n.op != "Expand" or n.outputs[0] in g.outputs:
            continue
        cons = g.consumers().get(n.outputs[0], [])
        if not cons:
            continue
        src = n.inputs[0]
        ok = True
        for c in cons:
            if c.op not in BROADCASTING:
                ok = False
                break
            shapes = [g.tensors[src if i == n.outputs[0] else i].shape for i in c.inputs if i]
            if np.broadcast_shapes(*shapes) != tuple(g.tensors[c.outputs[0]].shape):
                ok = False
                break
        if not ok:
            continue
        for c in cons:
            c.inputs = [src if i == n.outputs[0] else i for i in c.inputs]
        g.nodes.remove(n)
        origin.pop(n.name, None)
        removed += 1
    return removed


def fission(graph: Graph, rules: dict[str, Rule] | None = None) -> FissionResult:
    """Rewrite `graph` into primitives (a new Graph; the input is not modified).

    Every node ends up either a primitive with a known `CATEGORY` and one output, or in
    `.opaque`. Numerics: each rule matches ONNX Runtime to <= 1e-4 relative error (tests)."""
    rules = RULES if rules is None else rules
    g = graph.copy()
    g.name = f"{graph.name}.prim"
    names = {n.name for n in g.nodes} | set(g.tensors)
    out_nodes: list[Node] = []
    origin: dict[str, str] = {}
    applied: dict[str, int] = {}
    for n in g.nodes:
        # trim unused trailing outputs (MaxPool indices, Dropout mask, ...)
        rule = rules.get(n.op) if n.domain in ("", "ai.onnx", "com.microsoft") else None
        if rule is not None:
            e = _Emitter(g, n, names)
            try:
                res = rule(e, n)
            except TensorplanError:
                raise
            except Exception as ex:  # a malformed node: say which one
                raise TensorplanError(f"fission of node '{n.name}' ({n.op}) failed: {ex}") from ex
            if res is not False:
                for pn in e.nodes:
                    origin[pn.name] = n.name
                out_nodes.extend(e.nodes)
                applied[n.op] = applied.get(n.op, 0) + 1
                continue
        out_nodes.append(n)
        origin[n.name] = n.name
    g.nodes = out_nodes
    removed = _drop_implicit_expands(g, origin)
    if removed:
        applied["Expand(implicit)"] = removed
    g.prune()
    g.toposort()
    _trim_outputs(g)
    opaque = []
    for n in g.nodes:
        live = [o for o in n.outputs if o]
        if category(n.op) == "opaque" or n.domain not in ("", "ai.onnx") or len(live) > 1:
            opaque.append((n.name, n.op))
    origin = {k: v for k, v in origin.items() if k in {n.name for n in g.nodes}}
    return FissionResult(g, opaque, origin, applied)


def _optional_outputs(op: str, opset: int, domain: str) -> set[int]:
    """Positions of the outputs the ONNX schema marks optional (MaxPool indices, Dropout mask)."""
    try:
        import onnx
        sch = onnx.defs.get_schema(op, opset, domain)
        opt = onnx.defs.OpSchema.FormalParameterOption.Optional
        return {k for k, p in enumerate(sch.outputs) if p.option == opt}
    except Exception:
        return set()


def _trim_outputs(g: Graph) -> None:
    """Blank optional outputs nobody reads and drop trailing blanks, so most nodes have one live
    output (required outputs stay, e.g. TopK's indices)."""
    used = {i for n in g.nodes for i in n.inputs if i} | set(g.outputs)
    for n in g.nodes:
        if len(n.outputs) <= 1:
            continue
        optional = _optional_outputs(n.op, g.opset, n.domain)
        outs = [o if (o in used or k not in optional) else "" for k, o in enumerate(n.outputs)]
        if not any(outs):
            outs[0] = n.outputs[0]
        while len(outs) > 1 and not outs[-1]:
            outs.pop()
        n.outputs = outs
