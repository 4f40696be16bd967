"""Primitive sub-graph -> TE -> TIR PrimFunc.

Every node becomes one `te.compute`; the scheduler later inlines every
injective (non-reduction, non-output) block, so a memory-bound kernel reads its
inputs once and writes only the candidate's output tensor(s). Reductions stay
materialised as their own blocks (small `[..., 1]` buffers that the scheduler
computes inside the output's row loop). Transcendentals use TVM's polynomial
`fast_*` forms: LLVM scalarises `exp`/`tanh`/`erf` calls (6-70x slower here).

Constants: scalars are inlined as immediates; other constant tensors become
extra PrimFunc parameters (`Lowered.consts`), so structurally equal kernels with
different weights share one compiled library.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tensorplan.errors import CompileError
from tensorplan.ir.graph import Graph, Node

# TVM imports torch through tvm_ffi; keep it lazy so `import tensorplan.kernels` is cheap.
_tvm = None


def _t():
    global _tvm
    if _tvm is None:
        import tvm
        from tvm import te, tirx, topi  # noqa: F401
        _tvm = tvm
    return _tvm


@dataclass
class Lowered:
    """A lowered kernel: the PrimFunc and how to call it.

    Parameter order of `func`: `inputs` (runtime tensors, by name), then `consts`
    (numpy arrays bound once), then `outputs`.
    """

    func: Any
    inputs: list[str]
    consts: list[np.ndarray]
    outputs: list[str]
    output_shapes: list[tuple[int, ...]]
    output_dtypes: list[str]
    hints: dict[str, dict] = field(default_factory=dict)  # block name -> scheduling hint
    ops: list[str] = field(default_factory=list)
    out_blocks: list[str] = field(default_factory=list)  # TIR block name writing each output


# --------------------------------------------------------------------------------------
# Context: values of graph tensors during lowering
# --------------------------------------------------------------------------------------
class _Ctx:
    def __init__(self, sub: Graph):
        self.sub = sub
        self.vals: dict[str, Any] = {}          # name -> te.Tensor
        self.const_data: dict[str, np.ndarray] = {}
        self.const_ph: dict[str, Any] = {}      # name -> placeholder (lazily created)
        self.const_order: list[str] = []
        self.hints: dict[str, dict] = {}
        self.k = 0
        self.node: Node | None = None

    # names ---------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self.k += 1
        return f"b{self.k}_{base}"

    # constants ----------------------------------------------------------
    def is_const(self, name: str) -> bool:
        return name in self.const_data

    def const(self, name: str) -> np.ndarray:
        if name not in self.const_data:
            raise self.err(f"input '{name}' must be a constant")
        return self.const_data[name]

    def opt_const(self, node: Node, idx: int) -> np.ndarray | None:
        if len(node.inputs) > idx and node.inputs[idx]:
            return self.const(node.inputs[idx])
        return None

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in self.sub.tensors[name].shape)

    def dtype(self, name: str) -> str:
        return _tvm_dtype(self.sub.tensors[name].dtype)

    def err(self, msg: str) -> CompileError:
        n = self.node
        where = f"node '{n.name}' ({n.op})" if n is not None else "kernel"
        return CompileError(f"kernel '{self.sub.name}': {where}: {msg}")

    # loads --------------------------------------------------------------
    def load(self, name: str, idx: list) -> Any:
        """Value of tensor `name` at index `idx` (exactly its rank)."""
        tvm = _t()
        if name in self.const_data:
            arr = self.const_data[name]
            if arr.size == 1:
                v = arr.reshape(()).item()
                return tvm.tirx.const(v, _tvm_dtype(str(arr.dtype)))
            if name not in self.const_ph:
                ph = tvm.te.placeholder(arr.shape, _tvm_dtype(str(arr.dtype)), name=f"c{len(self.const_order)}")
                self.const_ph[name] = ph
                self.const_order.append(name)
            ph = self.const_ph[name]
            return ph(*idx) if arr.ndim else ph()
        t = self.vals[name]
        return t(*idx) if len(t.shape) else t()

    def bload(self, name: str, out_idx: list, out_shape: tuple[int, ...]) -> Any:
        """Numpy-broadcast load of `name` at an index of the (larger) output shape."""
        shp = self.shape(name)
        off = len(out_shape) - len(shp)
        if off < 0:
            raise self.err(f"cannot broadcast '{name}' {shp} to {out_shape}")
        idx = [0 if shp[j] == 1 and out_shape[j + off] != 1 else out_idx[j + off] for j in range(len(shp))]
        idx = [_t().tirx.const(0, "int32") if isinstance(v, int) else v for v in idx]
        return self.load(name, idx)


def _dt(e) -> str:
    """dtype string of a PrimExpr (TVM 0.27 exposes `.ty`, not `.dtype`)."""
    return str(e.ty)


def _tvm_dtype(d: str) -> str:
    return {"bool": "bool"}.get(d, d)




# --------------------------------------------------------------------------------------
# Op lowerings: fn(ctx, node) -> te.Tensor for node.outputs[0]
# --------------------------------------------------------------------------------------
LOWERINGS: dict[str, Callable] = {}


def _reg(*ops):
    def deco(fn):
        for o in ops:
            LOWERINGS[o] = fn
        return fn
    return deco


def _compute(ctx: _Ctx, shape, fn, base: str, dtype: str | None = None):
    tvm = _t()
    name = ctx.fresh(base)

    def body(*i):
        e = fn(list(i))
        if dtype is not None and _dt(e) != dtype:
            e = e.astype(dtype)
        return e
    return tvm.te.compute(tuple(shape), body, name=name)


def _out_shape(ctx: _Ctx, node: Node) -> tuple[int, ...]:
    return ctx.shape(node.outputs[0])


def _out_dtype(ctx: _Ctx, node: Node) -> str:
    return ctx.dtype(node.outputs[0])


def _f(v, dtype):
    return _t().tirx.const(v, dtype)


# -- elementwise -----------------------------------------------------------------------
# Vectorisable polynomial forms of exp / tanh / erf (LLVM would call libm per lane).
# The argument is bound once with a `Let`, so an inlined producer is not duplicated
# into every term of the polynomial.
_USE_LET = [True]


def _let(e, body_fn):
    """Bind `e` once (a TIR Let); meta_schedule cannot featurise Let, so tuning lowers
    with substitution instead (`lower(..., use_let=False)`)."""
    if not _USE_LET[0]:
        return body_fn(e)
    tvm = _t()
    v = tvm.tirx.Var("t", _dt(e))
    return tvm.tirx.Let(v, e, body_fn(v))


def _poly(x, coeffs):
    """Horner: coeffs from highest degree to lowest."""
    acc = _f(coeffs[0], "float32")
    for c in coeffs[1:]:
        acc = acc * x + _f(c, "float32")
    return acc


def fast_exp(e):
    """exp(x), Cephes-style range reduction + degree-7 polynomial; rel err ~1e-7."""
    tvm = _t()
    te, tirx = tvm.te, tvm.tirx

    def body(x):
        def b2(xc):
            def b3(n):
                def b4(r):
                    p = _poly(r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                                  1.6666665459e-1, 5.0000001201e-1])
                    p = p * r * r + r + _f(1.0, "float32")
                    scale = tirx.reinterpret("float32", (n.astype("int32") + 127) << 23)
                    return scale * p
                return _let(xc - n * _f(0.69314718056, "float32"), b4)
            return _let(te.floor(xc * _f(1.44269504089, "float32") + _f(0.5, "float32")), b3)
        return _let(te.max(te.min(x, _f(88.3762626647949, "float32")), _f(-88.3762626647949, "float32")), b2)
    return _let(e, body)


def fast_tanh(e):
    """tanh(x) as a [13/6] rational function on [-9, 9]; abs err ~1e-7."""
    te = _t().te

    def body(x):
        def b2(x2):
            num = _poly(x2, [-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
                             5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
                             4.89352455891786e-03])
            den = _poly(x2, [1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                             4.89352518554385e-03])
            return x * num / den
        return _let(x * x, b2)
    return _let(te.max(te.min(e, _f(9.0, "float32")), _f(-9.0, "float32")), body)


def fast_erf(e):
    """erf(x) as a rational function on [-4, 4]; abs err ~1e-7."""
    te = _t().te

    def body(x):
        def b2(x2):
            num = _poly(x2, [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
                             -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
                             -1.60960333262415e-02])
            den = _poly(x2, [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                             -7.37332916720468e-03, -1.42647390514189e-02])
            return x * num / den
        return _let(x * x, b2)
    return _let(te.max(te.min(e, _f(4.0, "float32")), _f(-4.0, "float32")), body)


_FAST = {"fast_exp": fast_exp, "fast_tanh": fast_tanh, "fast_erf": fast_erf}


def _unary(ctx: _Ctx, node: Node, fn):
    x = node.inputs[0]
    shp = _out_shape(ctx, node)
    return _compute(ctx, shp, lambda i: fn(ctx.bload(x, i, shp)), node.op, _out_dtype(ctx, node))


def _fast_unary(ctx: _Ctx, node: Node, which: str, pre=None, post=None):
    """post(fast(pre(x)), x) as one expression (x bound once)."""
    shp = _out_shape(ctx, node)
    x = node.inputs[0]
    dt = ctx.dtype(x)
    if dt != "float32":
        raise ctx.err(f"only float32 is supported, got {dt}")
    pre = pre or (lambda e: e)
    fast = _FAST[which]

    def f(i):
        def with_x(xv):
            b = fast(pre(xv))
            return b if post is None else post(b, xv)
        return _let(ctx.bload(x, i, shp), with_x)
    return _compute(ctx, shp, f, node.op)


def _fast_log_expr(x):
    """log(x) for x > 0 with a vectorisable series (rel err < 1e-6).

    x = m * 2^e with m in [sqrt(.5), sqrt(2)); log(m) = 2*atanh((m-1)/(m+1)) series.
    """
    tvm = _t()
    tirx = tvm.tirx

    def body(xv):
        bits = tirx.reinterpret("int32", xv)
        e = ((bits >> 23) & 0xFF) - 127
        mbits = (bits & 0x007FFFFF) | 0x3F800000
        m = tirx.reinterpret("float32", mbits)          # [1, 2)
        big = m > _f(1.41421356, "float32")
        m = tirx.Select(big, m * _f(0.5, "float32"), m)
        ef = tirx.Select(big, e + 1, e).astype("float32")

        def b2(s):
            def b3(s2):
                p = _poly(s2, [2.0 / 11, 2.0 / 9, 2.0 / 7, 2.0 / 5, 2.0 / 3, 2.0])
                return ef * _f(math.log(2.0), "float32") + s * p
            return _let(s * s, b3)
        return _let((m - _f(1.0, "float32")) / (m + _f(1.0, "float32")), b2)
    return _let(x, body)


@_reg("Exp")
def _exp(ctx, node):
    return _fast_unary(ctx, node, "fast_exp")


@_reg("Tanh")
def _tanh(ctx, node):
    return _fast_unary(ctx, node, "fast_tanh")


@_reg("Erf")
def _erf(ctx, node):
    return _fast_unary(ctx, node, "fast_erf")


@_reg("Sigmoid")
def _sigmoid(ctx, node):
    one = _f(1.0, "float32")
    return _fast_unary(ctx, node, "fast_exp", pre=lambda e: -e, post=lambda b, x: one / (one + b))


@_reg("Softplus")
def _softplus(ctx, node):
    # max(x,0) + log(1 + exp(-|x|)): stable for large |x|
    tvm = _t()
    one = _f(1.0, "float32")
    zero = _f(0.0, "float32")
    return _fast_unary(ctx, node, "fast_exp", pre=lambda e: -tvm.te.abs(e),
                       post=lambda b, x: tvm.te.max(x, zero) + _fast_log_expr(one + b))


@_reg("Mish")
def _mish(ctx, node):
    tvm = _t()
    one = _f(1.0, "float32")
    zero = _f(0.0, "float32")

    def post(b, x):  # x * tanh(softplus(x)), b = exp(-|x|)
        return x * fast_tanh(tvm.te.max(x, zero) + _fast_log_expr(one + b))
    return _fast_unary(ctx, node, "fast_exp", pre=lambda e: -tvm.te.abs(e), post=post)


@_reg("Elu")
def _elu(ctx, node):
    tvm = _t()
    alpha = float(node.attrs.get("alpha", 1.0))
    one = _f(1.0, "float32")
    zero = _f(0.0, "float32")
    return _fast_unary(ctx, node, "fast_exp", pre=lambda e: tvm.te.min(e, zero),
                       post=lambda b, x: tvm.tirx.Select(x > zero, x, _f(alpha, "float32") * (b - one)))


@_reg("Selu")
def _selu(ctx, node):
    tvm = _t()
    alpha = float(node.attrs.get("alpha", 1.67326319217681884765625))
    gamma = float(node.attrs.get("gamma", 1.05070102214813232421875))
    one = _f(1.0, "float32")
    zero = _f(0.0, "float32")
    return _fast_unary(ctx, node, "fast_exp", pre=lambda e: tvm.te.min(e, zero),
                       post=lambda b, x: _f(gamma, "float32") * tvm.tirx.Select(
                           x > zero, x, _f(alpha, "float32") * (b - one)))


@_reg("Gelu")
def _gelu(ctx, node):
    approx = node.attrs.get("approximate", "none")
    if isinstance(approx, bytes):
        approx = approx.decode()
    half = _f(0.5, "float32")
    one = _f(1.0, "float32")
    if approx == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return _fast_unary(ctx, node, "fast_tanh",
                           pre=lambda e: _f(c, "float32") * (e + _f(0.044715, "float32") * e * e * e),
                           post=lambda b, x: half * x * (one + b))
    return _fast_unary(ctx, node, "fast_erf", pre=lambda e: e * _f(1 / math.sqrt(2.0), "float32"),
                       post=lambda b, x: half * x * (one + b))


@_reg("Log")
def _log(ctx, node):
    tvm = _t()
    # exact semantics at 0 / negatives: -inf / nan, like numpy
    def f(x):
        return tvm.tirx.Select(x > _f(0.0, "float32"), _fast_log_expr(x),
                               tvm.tirx.Select(tvm.tirx.EQ(x, _f(0.0, "float32")), _f(-np.inf, "float32"),
                                               _f(np.nan, "float32")))
    return _unary(ctx, node, f)


def _simple_unary(fn_of_x):
    def lower(ctx, node):
        return _unary(ctx, node, lambda x: fn_of_x(x, node))
    return lower


def _zero(x):
    return _t().tirx.const(0, _dt(x))


def _one(x):
    return _t().tirx.const(1, _dt(x))


_UNARY: dict[str, Callable] = {
    "Relu": lambda x, n: _t().te.max(x, _zero(x)),
    "Neg": lambda x, n: -x,
    "Abs": lambda x, n: _t().te.abs(x),
    "Sqrt": lambda x, n: _t().te.sqrt(x),
    "Reciprocal": lambda x, n: _one(x) / x,
    "Identity": lambda x, n: x,
    "Floor": lambda x, n: _t().te.floor(x),
    "Ceil": lambda x, n: _t().te.ceil(x),
    "Round": lambda x, n: _t().te.nearbyint(x),
    "Sin": lambda x, n: _t().te.sin(x),
    "Cos": lambda x, n: _t().te.cos(x),
    "Not": lambda x, n: _t().tirx.Not(x),
    "Sign": lambda x, n: _t().tirx.Select(x > _zero(x), _one(x),
                                          _t().tirx.Select(x < _zero(x), -_one(x), _zero(x))),
    "LeakyRelu": lambda x, n: _t().tirx.Select(x >= _zero(x), x, x * _f(float(n.attrs.get("alpha", 0.01)),
                                                                        _dt(x))),
    "HardSigmoid": lambda x, n: _t().te.max(_zero(x), _t().te.min(_one(x), x * _f(float(n.attrs.get(
        "alpha", 0.2)), _dt(x)) + _f(float(n.attrs.get("beta", 0.5)), _dt(x)))),
    "HardSwish": lambda x, n: x * _t().te.max(_zero(x), _t().te.min(_one(x), x * _f(1 / 6, _dt(x))
                                                                        + _f(0.5, _dt(x)))),
    "Softsign": lambda x, n: x / (_one(x) + _t().te.abs(x)),
    "ThresholdedRelu": lambda x, n: _t().tirx.Select(x > _f(float(n.attrs.get("alpha", 1.0)), _dt(x)),
                                                     x, _zero(x)),
    "IsNaN": lambda x, n: _t().te.isnan(x),
    "IsInf": lambda x, n: _t().te.isinf(x),
}
for _op, _fn in _UNARY.items():
    LOWERINGS[_op] = _simple_unary(_fn)


@_reg("Cast")
def _cast(ctx, node):
    return _unary(ctx, node, lambda x: x)  # _compute casts to the output dtype


def _binary_expr(op: str, a, b, node: Node):
    tvm = _t()
    te, tirx = tvm.te, tvm.tirx
    if op == "Add":
        return a + b
    if op == "Sub":
        return a - b
    if op == "Mul":
        return a * b
    if op == "Div":
        if _dt(a).startswith("int"):
            return tirx.truncdiv(a, b)
        return a / b
    if op == "Max":
        return te.max(a, b)
    if op == "Min":
        return te.min(a, b)
    if op == "Equal":
        return tirx.EQ(a, b)
    if op == "Less":
        return a < b
    if op == "Greater":
        return a > b
    if op == "LessOrEqual":
        return a <= b
    if op == "GreaterOrEqual":
        return a >= b
    if op == "And":
        return tirx.And(a, b)
    if op == "Or":
        return tirx.Or(a, b)
    if op == "Xor":
        return tirx.Select(a, tirx.Not(b), b)
    if op == "PRelu":
        return tirx.Select(a >= _zero(a), a, a * b)
    if op == "Mod":
        if int(node.attrs.get("fmod", 0)) or _dt(a).startswith("float"):
            if _dt(a).startswith("float"):  # llvm has no fmod intrinsic: a - b*trunc(a/b)
                q = a / b
                return a - b * tirx.Select(q >= _zero(q), te.floor(q), te.ceil(q))
            return tirx.truncmod(a, b)
        return tirx.floormod(a, b)
    raise KeyError(op)


def _lower_binary(ctx, node):
    shp = _out_shape(ctx, node)
    a, b = node.inputs[0], node.inputs[1]
    return _compute(ctx, shp, lambda i: _binary_expr(node.op, ctx.bload(a, i, shp), ctx.bload(b, i, shp), node),
                    node.op, _out_dtype(ctx, node))


for _op in ("Add", "Sub", "Mul", "Div", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
            "And", "Or", "Xor", "PRelu", "Mod"):
    LOWERINGS[_op] = _lower_binary


@_reg("Max", "Min", "Sum", "Mean")
def _nary(ctx, node):
    shp = _out_shape(ctx, node)
    ins = [i for i in node.inputs if i]
    if node.op in ("Max", "Min") and len(ins) == 2:
        return _lower_binary(ctx, node)

    def f(i):
        acc = ctx.bload(ins[0], i, shp)
        for n in ins[1:]:
            v = ctx.bload(n, i, shp)
            if node.op == "Max":
                acc = _t().te.max(acc, v)
            elif node.op == "Min":
                acc = _t().te.min(acc, v)
            else:
                acc = acc + v
        if node.op == "Mean":
            acc = acc * _f(1.0 / len(ins), _dt(acc))
        return acc
    return _compute(ctx, shp, f, node.op, _out_dtype(ctx, node))


@_reg("Pow")
def _pow(ctx, node):
    tvm = _t()
    shp = _out_shape(ctx, node)
    a, b = node.inputs
    if ctx.is_const(b) and ctx.const(b).size == 1:
        p = float(ctx.const(b).reshape(()))
        simple = {1.0: lambda x: x, 2.0: lambda x: x * x, 3.0: lambda x: x * x * x,
                  0.5: lambda x: tvm.te.sqrt(x), -1.0: lambda x: _one(x) / x,
                  -0.5: lambda x: _one(x) / tvm.te.sqrt(x), 0.0: lambda x: _one(x)}
        if p in simple:
            return _compute(ctx, shp, lambda i: simple[p](ctx.bload(a, i, shp)), "Pow", _out_dtype(ctx, node))
    if ctx.dtype(a) != "float32":
        raise ctx.err("Pow with a non-constant exponent needs float32")
    # x^y = exp(y * log|x|) with the sign fixed for odd integer y; fast vectorisable forms.
    def fin(i):
        def with_xy(x):
            def inner(y):
                odd = tvm.tirx.EQ(y - _f(2.0, "float32") * tvm.te.floor(y * _f(0.5, "float32")), _f(1.0, "float32"))
                ex = fast_exp(y * _fast_log_expr(tvm.te.abs(x)))
                mag = tvm.tirx.Select(tvm.tirx.EQ(x, _f(0.0, "float32")),
                                      tvm.tirx.Select(tvm.tirx.EQ(y, _f(0.0, "float32")), _f(1.0, "float32"),
                                                      _f(0.0, "float32")), ex)
                return _let(mag, lambda m: tvm.tirx.Select(tvm.tirx.And(x < _f(0.0, "float32"), odd), -m, m))
            return _let(ctx.bload(b, i, shp).astype("float32"), inner)
        return _let(ctx.bload(a, i, shp), with_xy)
    return _compute(ctx, shp, fin, "Pow", _out_dtype(ctx, node))


@_reg("Clip")
def _clip(ctx, node):
    tvm = _t()
    shp = _out_shape(ctx, node)
    x = node.inputs[0]
    dt = ctx.dtype(x)
    lo = hi = None
    if ctx.sub.opset < 11 or len(node.inputs) == 1:
        if "min" in node.attrs:
            lo = float(node.attrs["min"])
        if "max" in node.attrs:
            hi = float(node.attrs["max"])
    if len(node.inputs) > 1 and node.inputs[1]:
        lo = node.inputs[1]
    if len(node.inputs) > 2 and node.inputs[2]:
        hi = node.inputs[2]

    def bound(v, i):
        if v is None:
            return None
        if isinstance(v, float):
            return _f(v, dt)
        return ctx.bload(v, i, shp)

    def f(i):
        e = ctx.bload(x, i, shp)
        lo_e, hi_e = bound(lo, i), bound(hi, i)
        if lo_e is not None:
            e = tvm.te.max(e, lo_e)
        if hi_e is not None:
            e = tvm.te.min(e, hi_e)
        return e
    return _compute(ctx, shp, f, "Clip", _out_dtype(ctx, node))


@_reg("Where")
def _where(ctx, node):
    shp = _out_shape(ctx, node)
    c, a, b = node.inputs
    return _compute(ctx, shp, lambda i: _t().tirx.Select(ctx.bload(c, i, shp), ctx.bload(a, i, shp),
                                                         ctx.bload(b, i, shp)), "Where", _out_dtype(ctx, node))


# -- reductions ------------------------------------------------------------------------
def _reduce_axes(ctx: _Ctx, node: Node, rank: int) -> list[int] | None:
    axes = node.attrs.get("axes")
    if len(node.inputs) > 1 and node.inputs[1]:
        axes = [int(v) for v in np.asarray(ctx.const(node.inputs[1])).reshape(-1)]
    if axes is None or len(axes) == 0:
        if int(node.attrs.get("noop_with_empty_axes", 0)):
            return None
        axes = list(range(rank))
    return sorted({int(a) % rank for a in axes}) if rank else []


_REDUCERS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
             "ReduceL1", "ReduceL2", "ReduceLogSumExp", "GlobalAveragePool", "GlobalMaxPool")


@_reg(*_REDUCERS)
def _reduce(ctx, node):
    tvm = _t()
    te, tirx = tvm.te, tvm.tirx
    x = node.inputs[0]
    ishp = ctx.shape(x)
    rank = len(ishp)
    if node.op.startswith("Global"):
        axes = list(range(2, rank))
        keep = True
    else:
        axes = _reduce_axes(ctx, node, rank)
        keep = bool(int(node.attrs.get("keepdims", 1)))
    oshp = _out_shape(ctx, node)
    if axes is None:  # noop
        return _compute(ctx, oshp, lambda i: ctx.load(x, i), "noop")
    op = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}.get(node.op, node.op)
    dt = ctx.dtype(x)
    if op == "ReduceLogSumExp":
        raise ctx.err("ReduceLogSumExp is not lowered; fission should split it")
    name = ctx.fresh(op)
    raxes = [te.reduce_axis((0, ishp[a]), name=f"{name}_r{a}") for a in axes]
    n_red = int(np.prod([ishp[a] for a in axes])) if axes else 1

    def in_index(i):
        idx, ri, oi = [], 0, 0
        for d in range(rank):
            if d in axes:
                idx.append(raxes[ri].var)
                ri += 1
                if keep:
                    oi += 1
            else:
                idx.append(i[oi])
                oi += 1
        return idx

    def body(*i):
        v = ctx.load(x, in_index(list(i)))
        if op in ("ReduceSumSquare", "ReduceL2"):
            v = v * v
        elif op == "ReduceL1":
            v = te.abs(v)
        if op in ("ReduceMax",):
            return te.max(v, axis=raxes)
        if op == "ReduceMin":
            return te.min(v, axis=raxes)
        if op == "ReduceProd":
            prod = te.comm_reducer(lambda a, b: a * b, lambda t: tirx.const(1, t), name="prod")
            return prod(v, axis=raxes)
        return te.sum(v, axis=raxes)
    red = te.compute(tuple(oshp), body, name=name)
    # scheduling hint: the input's dim order as (kind, loop index) pairs
    order, si = [], 0
    for d in range(rank):
        if d in axes:
            order.append(("r", axes.index(d)))
            if keep:
                si += 1
        else:
            order.append(("s", si))
            si += 1
    ctx.hints[name] = {"kind": "reduce", "order": order}
    if op == "ReduceMean":
        return _compute(ctx, oshp, lambda i: red(*i) * _f(1.0 / n_red, dt), "mean")
    if op == "ReduceL2":
        return _compute(ctx, oshp, lambda i: te.sqrt(red(*i)), "l2")
    return red


@_reg("MaxPool", "AveragePool", "LpPool")
def _pool(ctx, node):
    tvm = _t()
    te, tirx = tvm.te, tvm.tirx
    if len(node.outputs) > 1 and node.outputs[1]:
        raise ctx.err("MaxPool with an Indices output is not supported")
    if node.op == "LpPool":
        raise ctx.err("LpPool is not lowered")
    x = node.inputs[0]
    ishp = ctx.shape(x)
    oshp = _out_shape(ctx, node)
    nsp = len(ishp) - 2
    ks = [int(k) for k in node.attrs["kernel_shape"]]
    st = [int(s) for s in node.attrs.get("strides", [1] * nsp)]
    dil = [int(d) for d in node.attrs.get("dilations", [1] * nsp)]
    pads = [int(p) for p in node.attrs.get("pads", [0] * (2 * nsp))]
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nsp)
        for d in range(nsp):
            total = max(0, (oshp[2 + d] - 1) * st[d] + (ks[d] - 1) * dil[d] + 1 - ishp[2 + d])
            lo = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pads[d], pads[nsp + d] = lo, total - lo
    elif auto_pad == "VALID":
        pads = [0] * (2 * nsp)
    is_max = node.op == "MaxPool"
    dt = ctx.dtype(x)
    name = ctx.fresh(node.op)
    raxes = [te.reduce_axis((0, ks[d]), name=f"{name}_k{d}") for d in range(nsp)]
    need_pad = any(pads) or any((oshp[2 + d] - 1) * st[d] + (ks[d] - 1) * dil[d] >= ishp[2 + d]
                              for d in range(nsp))

    def body(*i):
        pos = [i[2 + d] * st[d] - pads[d] + raxes[d].var * dil[d] for d in range(nsp)]
        v = ctx.load(x, [i[0], i[1]] + pos)
        if need_pad:
            inb = tirx.const(True, "bool")
            for d in range(nsp):
                inb = tirx.And(inb, tirx.And(pos[d] >= 0, pos[d] < ishp[2 + d]))
            pad_v = te.min_value(dt) if is_max else tirx.const(0, dt)
            safe = [i[0], i[1]] + [te.max(te.min(p, ishp[2 + d] - 1), 0) for d, p in enumerate(pos)]
            v = tirx.if_then_else(inb, ctx.load(x, safe), pad_v)
        return te.max(v, axis=raxes) if is_max else te.sum(v, axis=raxes)
    red = te.compute(tuple(oshp), body, name=name)
    ctx.hints[name] = {"kind": "window"}
    if is_max:
        return red
    cip = int(node.attrs.get("count_include_pad", 0))
    if not need_pad:
        return _compute(ctx, oshp, lambda i: red(*i) * _f(1.0 / int(np.prod(ks)), dt), "avg")
    if any(d != 1 for d in dil):
        raise ctx.err("AveragePool with dilations is not lowered")

    def avg(i):
        cnt = None
        for d in range(nsp):
            s = i[2 + d] * st[d] - pads[d]
            if cip:
                e = te.min(s + ks[d], ishp[2 + d] + pads[nsp + d])
                c = e - s
            else:
                c = te.min(s + ks[d], ishp[2 + d]) - te.max(s, 0)
            cnt = c if cnt is None else cnt * c
        return red(*i) / cnt.astype(dt)
    return _compute(ctx, oshp, avg, "avg")


# -- layout ----------------------------------------------------------------------------


def _reshape_groups(out_shape, in_shape):
    """Split a reshape into independent groups of dims with equal products, e.g.
    (64, 112, 2, 112, 2) -> (64, 224, 224) is [64]->[64], [112,2]->[224], [112,2]->[224].
    Returns [(out_dims, in_dims)] as index lists, or None when shapes do not line up."""
    groups = []
    i = j = 0
    no, ni = len(out_shape), len(in_shape)
    while i < no or j < ni:
        go, gi = [], []
        po = pi = 1
        # take at least one dim from each side (unit dims attach to the current group)
        if i < no:
            go.append(i)
            po *= out_shape[i]
            i += 1
        if j < ni:
            gi.append(j)
            pi *= in_shape[j]
            j += 1
        while po != pi:
            if po < pi and i < no:
                go.append(i)
                po *= out_shape[i]
                i += 1
            elif pi < po and j < ni:
                gi.append(j)
                pi *= in_shape[j]
                j += 1
            else:
                return None
        # trailing unit dims join this group
        while i < no and out_shape[i] == 1 and (j >= ni or in_shape[j] != 1):
            go.append(i)
            i += 1
        while j < ni and in_shape[j] == 1 and (i >= no or out_shape[i] != 1):
            gi.append(j)
            j += 1
        groups.append((go, gi))
    return groups


def _reshape_index(out_idx, out_shape, in_shape):
    """Map an output index of a reshape to the input index (row-major), group by group so
    that div/mod only appear where dims really merge or split (by constants)."""
    tvm = _t()
    zero = tvm.tirx.const(0, "int32")
    groups = _reshape_groups(list(out_shape), list(in_shape))
    if groups is None:
        groups = [(list(range(len(out_shape))), list(range(len(in_shape))))]
    res = [zero] * len(in_shape)
    for go, gi in groups:
        od = [k for k in go if out_shape[k] != 1]
        idd = [k for k in gi if in_shape[k] != 1]
        if len(od) == 1 and len(idd) == 1:
            res[idd[0]] = out_idx[od[0]]
            continue
        if [out_shape[k] for k in od] == [in_shape[k] for k in idd]:
            for a, b in zip(od, idd):
                res[b] = out_idx[a]
            continue
        lin = zero
        for k in od:
            lin = lin * out_shape[k] + out_idx[k]
        stride = 1
        for k in reversed(idd):
            v = tvm.tirx.floordiv(lin, stride) if stride != 1 else lin
            res[k] = tvm.tirx.floormod(v, in_shape[k]) if k != idd[0] else v
            stride *= in_shape[k]
    return res


@_reg("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(ctx, node):
    x = node.inputs[0]
    ishp = ctx.shape(x)
    oshp = _out_shape(ctx, node)
    if int(np.prod(ishp, dtype=np.int64)) != int(np.prod(oshp, dtype=np.int64)):
        raise ctx.err(f"reshape {ishp} -> {oshp} changes the element count")
    return _compute(ctx, oshp, lambda i: ctx.load(x, _reshape_index(i, oshp, ishp)), node.op)


@_reg("Transpose")
def _transpose(ctx, node):
    x = node.inputs[0]
    ishp = ctx.shape(x)
    perm = node.attrs.get("perm") or list(reversed(range(len(ishp))))
    perm = [int(p) for p in perm]
    oshp = _out_shape(ctx, node)

    def f(i):
        idx = [None] * len(ishp)
        for o, p in enumerate(perm):
            idx[p] = i[o]
        return ctx.load(x, idx)
    return _compute(ctx, oshp, f, "Transpose")


@_reg("Expand")
def _expand(ctx, node):
    oshp = _out_shape(ctx, node)
    return _compute(ctx, oshp, lambda i: ctx.bload(node.inputs[0], i, oshp), "Expand")


@_reg("Tile")
def _tile(ctx, node):
    tvm = _t()
    x = node.inputs[0]
    ishp = ctx.shape(x)
    oshp = _out_shape(ctx, node)
    return _compute(ctx, oshp, lambda i: ctx.load(x, [tvm.tirx.floormod(v, d) if d != 1 else 0 * v
                                                      for v, d in zip(i, ishp)]), "Tile")


@_reg("Concat")
def _concat(ctx, node):
    tvm = _t()
    oshp = _out_shape(ctx, node)
    ax = int(node.attrs.get("axis", 0)) % len(oshp)
    ins = [i for i in node.inputs if i and ctx.shape(i)[ax] > 0]
    offs, o = [], 0
    for n in ins:
        offs.append(o)
        o += ctx.shape(n)[ax]

    def f(i):
        def load_k(k):
            idx = list(i)
            idx[ax] = i[ax] - offs[k]
            return ctx.load(ins[k], idx)
        e = load_k(len(ins) - 1)
        for k in range(len(ins) - 2, -1, -1):
            e = tvm.tirx.if_then_else(i[ax] < offs[k + 1], load_k(k), e)
        return e
    return _compute(ctx, oshp, f, "Concat")


def _slice_params(ctx, node, ishp):
    rank = len(ishp)
    if ctx.sub.opset < 10 and "starts" in node.attrs:
        starts = list(node.attrs["starts"])
        ends = list(node.attrs["ends"])
        axes = list(node.attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    else:
        starts = [int(v) for v in ctx.const(node.inputs[1]).reshape(-1)]
        ends = [int(v) for v in ctx.const(node.inputs[2]).reshape(-1)]
        a = ctx.opt_const(node, 3)
        axes = [int(v) for v in a.reshape(-1)] if a is not None else list(range(len(starts)))
        s = ctx.opt_const(node, 4)
        steps = [int(v) for v in s.reshape(-1)] if s is not None else [1] * len(starts)
    st = [0] * rank
    sp = [1] * rank
    for s, e, a, k in zip(starts, ends, axes, steps):
        a = int(a) % rank
        d = ishp[a]
        if s < 0:
            s += d
        if k > 0:
            s = min(max(s, 0), d)
        else:
            s = min(max(s, 0), d - 1)
        st[a], sp[a] = s, k
    return st, sp


@_reg("Slice")
def _slice(ctx, node):
    x = node.inputs[0]
    ishp = ctx.shape(x)
    oshp = _out_shape(ctx, node)
    st, sp = _slice_params(ctx, node, ishp)
    return _compute(ctx, oshp, lambda i: ctx.load(x, [s + v * k for v, s, k in zip(i, st, sp)]), "Slice")


@_reg("Split")
def _split(ctx, node):
    # Multi-output: returns a list of tensors, one per output.
    x = node.inputs[0]
    ishp = ctx.shape(x)
    ax = int(node.attrs.get("axis", 0)) % len(ishp)
    outs, off = [], 0
    for o in node.outputs:
        oshp = ctx.shape(o)
        start = off
        outs.append(_compute(ctx, oshp, lambda i, s=start: ctx.load(
            x, [v + s if d == ax else v for d, v in enumerate(i)]), "Split"))
        off += oshp[ax]
    return outs


@_reg("Gather")
def _gather(ctx, node):
    tvm = _t()
    x, ind = node.inputs
    ishp = ctx.shape(x)
    ax = int(node.attrs.get("axis", 0)) % len(ishp)
    oshp = _out_shape(ctx, node)
    if not ctx.is_const(ind):
        # data-dependent (e.g. embedding lookup): indices are a runtime input; clamp for safety
        q = len(ctx.shape(ind))

        def fdyn(i):
            raw = ctx.load(ind, list(i[ax:ax + q])).astype("int32")
            g = tvm.tirx.Select(raw < 0, raw + ishp[ax], raw)
            g = tvm.te.max(tvm.te.min(g, ishp[ax] - 1), 0)
            return ctx.load(x, list(i[:ax]) + [g] + list(i[ax + q:]))
        return _compute(ctx, oshp, fdyn, "Gather")
    idx = np.asarray(ctx.const(ind)).astype(np.int64)
    idx = np.where(idx < 0, idx + ishp[ax], idx)
    if idx.min(initial=0) < 0 or idx.max(initial=0) >= ishp[ax]:
        raise ctx.err("Gather indices out of range")
    q = idx.ndim
    name = f"{ind}__norm"
    ctx.const_data[name] = idx.astype(np.int32)

    def f(i):
        if q == 0:
            g = tvm.tirx.const(int(idx), "int32")
        else:
            g = ctx.load(name, list(i[ax:ax + q]))
        return ctx.load(x, list(i[:ax]) + [g] + list(i[ax + q:]))
    return _compute(ctx, oshp, f, "Gather")


@_reg("Pad")
def _pad(ctx, node):
    tvm = _t()
    tirx, te = tvm.tirx, tvm.te
    x = node.inputs[0]
    ishp = ctx.shape(x)
    rank = len(ishp)
    oshp = _out_shape(ctx, node)
    mode = node.attrs.get("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if "pads" in node.attrs and (len(node.inputs) < 2 or not node.inputs[1]):
        pads = [int(p) for p in node.attrs["pads"]]
        cval = float(node.attrs.get("value", 0.0))
        axes = list(range(rank))
    else:
        pads = [int(p) for p in ctx.const(node.inputs[1]).reshape(-1)]
        c = ctx.opt_const(node, 2)
        cval = c.reshape(-1)[0].item() if c is not None and c.size else 0
        a = ctx.opt_const(node, 3)
        axes = [int(v) % rank for v in a.reshape(-1)] if a is not None else list(range(rank))
    n = len(axes)
    begin = [0] * rank
    for k, a in enumerate(axes):
        begin[a] = pads[k]
    dt = ctx.dtype(x)

    def f(i):
        idx = [v - b for v, b in zip(i, begin)]
        if mode == "constant":
            inb = tirx.const(True, "bool")
            for d in range(rank):
                if begin[d] or oshp[d] != ishp[d]:
                    inb = tirx.And(inb, tirx.And(idx[d] >= 0, idx[d] < ishp[d]))
            safe = [te.max(te.min(v, ishp[d] - 1), 0) if (begin[d] or oshp[d] != ishp[d]) else v
                    for d, v in enumerate(idx)]
            return tirx.if_then_else(inb, ctx.load(x, safe), tirx.const(cval, dt))
        out = []
        for d, v in enumerate(idx):
            if not begin[d] and oshp[d] == ishp[d]:
                out.append(v)
            elif mode == "edge":
                out.append(te.max(te.min(v, ishp[d] - 1), 0))
            elif mode == "reflect":
                m = ishp[d] - 1
                v = te.abs(v)                       # reflect at 0
                v = tirx.Select(v > m, 2 * m - v, v)  # reflect at the end (pads < dim)
                out.append(v)
            elif mode == "wrap":
                out.append(tirx.floormod(v, ishp[d]))
            else:
                raise ctx.err(f"Pad mode '{mode}' is not lowered")
        return ctx.load(x, out)
    del n
    return _compute(ctx, oshp, f, "Pad")


@_reg("Resize", "Upsample")
def _resize(ctx, node):
    tvm = _t()
    tirx, te = tvm.tirx, tvm.te
    x = node.inputs[0]
    ishp = ctx.shape(x)
    oshp = _out_shape(ctx, node)
    rank = len(ishp)

    def s_attr(k, d):
        v = node.attrs.get(k, d)
        return v.decode() if isinstance(v, bytes) else v
    mode = s_attr("mode", "nearest")
    ctm = s_attr("coordinate_transformation_mode", "half_pixel" if node.op == "Resize" else "asymmetric")
    nmode = s_attr("nearest_mode", "round_prefer_floor")
    if node.op == "Upsample" or ctx.sub.opset < 11:
        ctm = "asymmetric" if mode == "nearest" else ctm
        if ctx.sub.opset < 11 and node.op == "Resize":
            ctm = "asymmetric"
    if mode not in ("nearest", "linear"):
        raise ctx.err(f"Resize mode '{mode}' is not lowered")
    scales = None
    if node.op == "Upsample":
        scales = node.attrs.get("scales")
        if scales is None and len(node.inputs) > 1:
            scales = ctx.const(node.inputs[1]).reshape(-1).tolist()
    else:
        sidx = 2 if ctx.sub.opset >= 11 else 1
        sc = ctx.opt_const(node, sidx)
        if sc is not None and sc.size:
            scales = sc.reshape(-1).astype(np.float64).tolist()
    axes = node.attrs.get("axes")
    if scales is not None and axes is not None and len(scales) != rank:
        full = [1.0] * rank
        for a, s in zip(axes, scales):
            full[int(a) % rank] = s
        scales = full
    if scales is None:
        scales = [oshp[d] / ishp[d] for d in range(rank)]
    rs_axes = [d for d in range(rank) if ishp[d] != oshp[d] or scales[d] != 1.0]

    def src(d, v):
        """Source coordinate (float32 expr) for output index v along axis d."""
        s = float(scales[d])
        fv = v.astype("float32")
        if ctm == "asymmetric":
            return fv * _f(1.0 / s, "float32")
        if ctm == "half_pixel":
            return (fv + _f(0.5, "float32")) * _f(1.0 / s, "float32") - _f(0.5, "float32")
        if ctm == "pytorch_half_pixel":
            if oshp[d] <= 1:
                return _f(0.0, "float32")
            return (fv + _f(0.5, "float32")) * _f(1.0 / s, "float32") - _f(0.5, "float32")
        if ctm == "align_corners":
            if oshp[d] <= 1:
                return _f(0.0, "float32")
            return fv * _f((ishp[d] - 1) / (oshp[d] - 1), "float32")
        if ctm == "tf_half_pixel_for_nn":
            return (fv + _f(0.5, "float32")) * _f(1.0 / s, "float32")
        raise ctx.err(f"coordinate_transformation_mode '{ctm}' is not lowered")

    def clampi(e, d):
        return te.max(te.min(e, ishp[d] - 1), 0)

    if mode == "nearest":
        def f(i):
            idx = list(i)
            for d in rs_axes:
                c = src(d, i[d])
                if nmode == "round_prefer_floor":
                    r = te.ceil(c - _f(0.5, "float32"))
                elif nmode == "round_prefer_ceil":
                    r = te.floor(c + _f(0.5, "float32"))
                elif nmode == "floor":
                    r = te.floor(c)
                elif nmode == "ceil":
                    r = te.ceil(c)
                else:
                    raise ctx.err(f"nearest_mode '{nmode}' is not lowered")
                idx[d] = clampi(r.astype("int32"), d)
            return ctx.load(x, idx)
        return _compute(ctx, oshp, f, "ResizeNearest")

    def lin(i):
        parts = []
        for d in rs_axes:
            c = src(d, i[d])
            c = te.max(te.min(c, _f(float(ishp[d] - 1), "float32")), _f(0.0, "float32"))
            i0 = te.floor(c).astype("int32")
            i1 = te.min(i0 + 1, ishp[d] - 1)
            w = c - i0.astype("float32")
            parts.append((d, i0, i1, w))
        acc = None
        for mask in range(1 << len(parts)):
            idx = list(i)
            wt = None
            for b, (d, i0, i1, w) in enumerate(parts):
                hi = (mask >> b) & 1
                idx[d] = i1 if hi else i0
                ww = w if hi else _f(1.0, "float32") - w
                wt = ww if wt is None else wt * ww
            term = ctx.load(x, idx) * wt if wt is not None else ctx.load(x, idx)
            acc = term if acc is None else acc + term
        return acc
    return _compute(ctx, oshp, lin, "ResizeLinear")


@_reg("DepthToSpace")
def _d2s(ctx, node):
    tvm = _t()
    x = node.inputs[0]
    n, c, h, w = ctx.shape(x)
    b = int(node.attrs["blocksize"])
    mode = node.attrs.get("mode", "DCR")
    if isinstance(mode, bytes):
        mode = mode.decode()
    oshp = _out_shape(ctx, node)
    oc = c // (b * b)
    fd, fm = tvm.tirx.floordiv, tvm.tirx.floormod

    def f(i):
        ni, ci, hi, wi = i
        bh, bw = fm(hi, b), fm(wi, b)
        ch = (bh * b + bw) * oc + ci if mode == "DCR" else ci * b * b + bh * b + bw
        return ctx.load(x, [ni, ch, fd(hi, b), fd(wi, b)])
    return _compute(ctx, oshp, f, "DepthToSpace")


@_reg("SpaceToDepth")
def _s2d(ctx, node):
    tvm = _t()
    x = node.inputs[0]
    n, c, h, w = ctx.shape(x)
    b = int(node.attrs["blocksize"])
    oshp = _out_shape(ctx, node)
    fd, fm = tvm.tirx.floordiv, tvm.tirx.floormod

    def f(i):
        ni, co, ho, wo = i
        blk, ci = fd(co, c), fm(co, c)
        return ctx.load(x, [ni, ci, ho * b + fd(blk, b), wo * b + fm(blk, b)])
    return _compute(ctx, oshp, f, "SpaceToDepth")


# -- linear (TVM fallback; vendor libraries are usually faster, see linear.py) -----------
@_reg("MatMul")
def _matmul(ctx, node):
    tvm = _t()
    te = tvm.te
    a, b = node.inputs
    ashp, bshp = ctx.shape(a), ctx.shape(b)
    if len(ashp) < 2 or len(bshp) < 2:
        raise ctx.err("MatMul with 1-D operands is not lowered")
    oshp = _out_shape(ctx, node)
    K = ashp[-1]
    name = ctx.fresh("MatMul")
    k = te.reduce_axis((0, K), name=f"{name}_k")
    ob = oshp[:-2]

    def body(*i):
        i = list(i)
        bi = i[:-2]
        ai_idx = [0 if d == 1 and ob[j + len(ob) - len(ashp[:-2])] != 1 else bi[j + len(ob) - len(ashp[:-2])]
                  for j, d in enumerate(ashp[:-2])]
        bb_idx = [0 if d == 1 and ob[j + len(ob) - len(bshp[:-2])] != 1 else bi[j + len(ob) - len(bshp[:-2])]
                  for j, d in enumerate(bshp[:-2])]
        return te.sum(ctx.load(a, ai_idx + [i[-2], k]) * ctx.load(b, bb_idx + [k, i[-1]]), axis=k)
    out = te.compute(tuple(oshp), body, name=name)
    ctx.hints[name] = {"kind": "matmul"}
    return out


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------
def lower(sub: Graph, outputs: list[str] | None = None, use_let: bool = True) -> Lowered:
    """Lower a primitive sub-graph to a TIR PrimFunc materialising only `outputs`."""
    _USE_LET[0] = use_let
    try:
        return _lower(sub, outputs)
    finally:
        _USE_LET[0] = True


def _lower(sub: Graph, outputs: list[str] | None = None) -> Lowered:
    tvm = _t()
    te = tvm.te
    outputs = list(outputs or sub.outputs)
    if not outputs:
        raise CompileError(f"kernel '{sub.name}': no outputs to materialise")
    ctx = _Ctx(sub)
    for name, t in sub.tensors.items():
        if t.is_constant:
            ctx.const_data[name] = np.asarray(t.data)
    in_names = [i for i in sub.inputs if not sub.tensors[i].is_constant]
    placeholders = []
    for k, name in enumerate(in_names):
        ph = te.placeholder(ctx.shape(name), ctx.dtype(name), name=f"in{k}")
        ctx.vals[name] = ph
        placeholders.append(ph)
    ops = []
    produced = set()
    for node in sub.nodes:
        ctx.node = node
        fn = LOWERINGS.get(node.op)
        if fn is None or node.domain not in ("", "ai.onnx"):
            raise ctx.err("no TE lowering for this op (it must run as an opaque/linear kernel)")
        for i in node.inputs:
            if i and i not in ctx.vals and i not in ctx.const_data:
                raise ctx.err(f"input '{i}' is neither a kernel input, a constant nor produced earlier")
        try:
            res = fn(ctx, node)
        except CompileError:
            raise
        except Exception as e:  # noqa: BLE001 - any TVM/TE failure becomes a one-line CompileError
            raise ctx.err(f"lowering failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        res = res if isinstance(res, list) else [res]
        for o, r in zip([o for o in node.outputs if o], res):
            ctx.vals[o] = r
            produced.add(o)
        ops.append(node.op)
    ctx.node = None
    outs = []
    for o in outputs:
        if o not in produced:
            raise CompileError(f"kernel '{sub.name}': output '{o}' is not produced by its nodes")
        t = ctx.vals[o]
        want = ctx.dtype(o)
        if str(t.dtype) != want:
            t = _compute(ctx, ctx.shape(o), lambda i, t=t: t(*i), "cast", want)
        if any(t is u for u in outs) or t.op.name in {p.op.name for p in placeholders}:
            t = _compute(ctx, ctx.shape(o), lambda i, t=t: t(*i), "copy")
        outs.append(t)
    const_phs = [ctx.const_ph[n] for n in ctx.const_order]
    try:
        func = te.create_prim_func(placeholders + const_phs + outs)
    except Exception as e:  # noqa: BLE001
        raise CompileError(f"kernel '{sub.name}': create_prim_func failed: {str(e).splitlines()[0]}")
    return Lowered(func=func, inputs=in_names,
                   consts=[np.ascontiguousarray(ctx.const_data[n]) for n in ctx.const_order],
                   outputs=outputs, output_shapes=[ctx.shape(o) for o in outputs],
                   output_dtypes=[ctx.dtype(o) for o in outputs], hints=ctx.hints, ops=ops,
                   out_blocks=[t.op.name for t in outs])


def lower_kernel(sub: Graph, outputs: list[str] | None = None):
    """The TIR PrimFunc of a primitive sub-graph (see `lower` for the parameter order)."""
    return lower(sub, outputs).func


def supported_ops() -> set[str]:
    """Op types with a TE lowering (others must run on a linear/opaque backend)."""
    return set(LOWERINGS)
