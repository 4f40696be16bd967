"""Reference executor: runs a `Graph` node by node in numpy (torch for conv/pool).

It is the numerical ground truth inside tensorplan (constant folding at import,
checks of fissioned graphs and of compiled plans), so it favours clarity and
exact ONNX semantics over speed. `OPS` maps an ONNX op type to
`fn(node, inputs) -> outputs`; omitted optional inputs arrive as `None`.

Opset differences (Softmax before 13, Reduce* axes as attribute or input,
Split sizes, Pad/Clip/Resize inputs) are handled by accepting both forms; the
one ambiguity that needs the opset (Softmax/LogSoftmax/Hardmax axis semantics)
reads `current_opset()`, which `run_reference` sets from `graph.opset`.

Relative error, used everywhere we compare against ONNX Runtime, is
`max|a-b| / max(max|b|, eps)` (see `rel_error`).
"""
from __future__ import annotations

import contextvars
import math
from typing import Any, Callable

import numpy as np

from tensorplan.errors import TensorplanError, UnsupportedOperatorError
from tensorplan.ir.graph import Graph, Node

_OPSET: contextvars.ContextVar[int] = contextvars.ContextVar("tensorplan_opset", default=17)
_DOMAIN_OPSETS: contextvars.ContextVar[dict] = contextvars.ContextVar("tensorplan_domain_opsets", default={})

OpFn = Callable[[Node, list], list]
OPS: dict[str, OpFn] = {}

# ONNX TensorProto elem types -> numpy dtypes (the ones a model can realistically hold).
ONNX_TO_NP = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
              7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32,
              13: np.uint64}


class ShapeValueError(TensorplanError):
    """A shape-controlling input value (a shape, step, size, scale, k, repeat count) that the op
    cannot use. The message names the node, op, input and value, and nothing else: the value may be
    one tensorplan's import probe chose for a runtime input, so it never says the model is wrong.
    `.node` and `.op` name the node (the importer turns a probe's failure into a data-dependent
    shape error naming them)."""

    def __init__(self, message: str, node: str = "", op: str = ""):
        super().__init__(message)
        self.node, self.op = node, op


def _bad_value(node: Node, what: str) -> ShapeValueError:
    return ShapeValueError(f"node '{node.name}' ({node.op}): {what}", node.name, node.op)


def current_opset() -> int:
    """The opset whose semantics ops follow (set by `run_reference`, default 17)."""
    return _OPSET.get()


def register(*names: str) -> Callable[[OpFn], OpFn]:
    def deco(fn: OpFn) -> OpFn:
        for n in names:
            OPS[n] = fn
        return fn
    return deco


FP32_TOLERANCE = 1e-4


def default_tolerance(graph: Graph) -> float:
    """Relative-error bar for `graph`'s outputs against ONNX Runtime: 1e-4 for fp32 and wider, 8
    machine epsilons for narrower floats (fp16 7.8e-3, bf16 6.3e-2), where rounding alone passes 1e-4."""
    tol = FP32_TOLERANCE
    for o in graph.outputs:
        t = graph.tensors.get(o)
        if t is not None and t.dtype in ("float16", "bfloat16"):
            tol = max(tol, 8 * (2.0 ** -10 if t.dtype == "float16" else 2.0 ** -7))
    return tol


def rel_error(a: np.ndarray, b: np.ndarray, eps: float = 1e-6) -> float:
    """max|a-b| / max(max|b|, eps): scale-free, robust to outputs near zero.

    `b` is the reference (ONNX Runtime). Non-float outputs compare exactly (0 or 1
    is returned as the mismatch fraction's max would be meaningless)."""
    a = np.atleast_1d(np.asarray(a))  # 0-d outputs (scalars) compare like 1-element arrays
    b = np.atleast_1d(np.asarray(b))
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    if not np.issubdtype(b.dtype, np.floating):
        return 0.0 if np.array_equal(a, b) else 1.0
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    same_inf = np.isinf(a64) & (a64 == b64)
    ok = both_nan | same_inf
    if np.isnan(a64[~ok]).any() or np.isnan(b64[~ok]).any() or np.isinf(a64[~ok]).any() \
            or np.isinf(b64[~ok]).any():
        return float("inf")
    diff = np.abs(a64 - b64)
    diff[ok] = 0.0
    finite_b = np.abs(b64[np.isfinite(b64)])
    scale = max(float(finite_b.max()) if finite_b.size else 0.0, eps)
    return float(diff.max() / scale)


def _a(node: Node, name: str, default: Any = None) -> Any:
    return node.attrs.get(name, default)


def _ints(x: Any) -> list[int]:
    return [int(v) for v in np.asarray(x).reshape(-1)]


def _opt(inputs: list, k: int):
    return inputs[k] if len(inputs) > k and inputs[k] is not None else None


# ---------------------------------------------------------------- elementwise
def _unary(fn: Callable[[np.ndarray], np.ndarray]) -> OpFn:
    def run(node: Node, x: list) -> list:
        out = fn(x[0])
        return [np.asarray(out).astype(x[0].dtype, copy=False)]
    return run


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf
    return erf(x.astype(np.float64)).astype(x.dtype)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    from scipy.special import expit
    return expit(x)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0, x.astype(np.float64)).astype(x.dtype)


def _round_half_even(x: np.ndarray) -> np.ndarray:
    return np.round(x)


for _name, _fn in {
    "Sqrt": np.sqrt, "Exp": np.exp, "Log": np.log, "Tanh": np.tanh, "Neg": np.negative,
    "Abs": np.abs, "Floor": np.floor, "Ceil": np.ceil, "Round": _round_half_even, "Sin": np.sin,
    "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan,
    "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh, "Acosh": np.arccosh,
    "Atanh": np.arctanh, "Sign": np.sign, "Erf": _erf, "Sigmoid": _sigmoid,
    "Relu": lambda x: np.maximum(x, 0), "Softplus": _softplus,
    "Softsign": lambda x: x / (1 + np.abs(x)),
    "Reciprocal": lambda x: 1 / x, "Identity": lambda x: x.copy(),
    "Mish": lambda x: x * np.tanh(_softplus(x)),
}.items():
    OPS[_name] = _unary(_fn)


@register("Not")
def _not(node, x):
    return [np.logical_not(x[0])]


@register("IsNaN")
def _isnan(node, x):
    return [np.isnan(x[0])]


@register("IsInf")
def _isinf(node, x):
    pos, neg = _a(node, "detect_positive", 1), _a(node, "detect_negative", 1)
    r = np.isinf(x[0])
    if not pos:
        r &= x[0] < 0
    if not neg:
        r &= x[0] > 0
    return [r]


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], keep_dtype: bool = True) -> OpFn:
    def run(node: Node, x: list) -> list:
        out = np.asarray(fn(x[0], x[1]))
        if keep_dtype:
            out = out.astype(x[0].dtype, copy=False)
        return [out]
    return run


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        # ONNX integer division truncates toward zero (C semantics).
        q = np.trunc(a.astype(np.float64) / b.astype(np.float64))
        return q.astype(a.dtype)
    return a / b


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.floating):
        return np.power(a, b.astype(a.dtype))
    return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


def _mod(node: Node, x: list) -> list:
    a, b = x
    if _a(node, "fmod", 0):
        return [np.fmod(a, b)]
    return [np.mod(a, b)]


OPS["Mod"] = _mod
OPS["Add"] = _binary(np.add)
OPS["Sub"] = _binary(np.subtract)
OPS["Mul"] = _binary(np.multiply)
OPS["Div"] = _binary(_div)
OPS["Pow"] = _binary(_pow)
for _name, _fn in {"Equal": np.equal, "Less": np.less, "Greater": np.greater,
                   "LessOrEqual": np.less_equal, "GreaterOrEqual": np.greater_equal,
                   "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}.items():
    OPS[_name] = _binary(_fn, keep_dtype=False)


def _variadic(fn: Callable) -> OpFn:
    def run(node: Node, x: list) -> list:
        xs = [v for v in x if v is not None]
        out = xs[0]
        for v in xs[1:]:
            out = fn(out, v)
        return [np.asarray(out).astype(xs[0].dtype, copy=False)]
    return run


OPS["Max"] = _variadic(np.maximum)
OPS["Min"] = _variadic(np.minimum)
OPS["Sum"] = _variadic(np.add)


@register("Mean")
def _mean(node, x):
    xs = [v for v in x if v is not None]
    out = xs[0]
    for v in xs[1:]:
        out = out + v
    return [(out / len(xs)).astype(xs[0].dtype)]


@register("Where")
def _where(node, x):
    return [np.where(x[0], x[1], x[2]).astype(np.result_type(x[1], x[2]))]


@register("Clip")
def _clip(node, x):
    v = x[0]
    lo = _opt(x, 1)
    hi = _opt(x, 2)
    if lo is None and "min" in node.attrs:
        lo = node.attrs["min"]
    if hi is None and "max" in node.attrs:
        hi = node.attrs["max"]
    out = v
    if lo is not None:
        out = np.maximum(out, np.asarray(lo, dtype=v.dtype))
    if hi is not None:
        out = np.minimum(out, np.asarray(hi, dtype=v.dtype))
    return [out.astype(v.dtype, copy=False)]


@register("LeakyRelu")
def _leaky(node, x):
    a = np.float32(_a(node, "alpha", 0.01))
    return [np.where(x[0] >= 0, x[0], x[0] * a).astype(x[0].dtype)]


@register("PRelu")
def _prelu(node, x):
    return [np.where(x[0] >= 0, x[0], x[0] * x[1]).astype(x[0].dtype)]


@register("Elu")
def _elu(node, x):
    a = _a(node, "alpha", 1.0)
    v = x[0]
    return [np.where(v >= 0, v, a * np.expm1(np.minimum(v, 0))).astype(v.dtype)]


@register("Celu")
def _celu(node, x):
    a = _a(node, "alpha", 1.0)
    v = x[0]
    return [(np.maximum(v, 0) + np.minimum(0, a * np.expm1(v / a))).astype(v.dtype)]


@register("Selu")
def _selu(node, x):
    a = _a(node, "alpha", 1.67326319217681884765625)
    g = _a(node, "gamma", 1.05070102214813232421875)
    v = x[0]
    return [(g * np.where(v > 0, v, a * np.expm1(np.minimum(v, 0)))).astype(v.dtype)]


@register("ThresholdedRelu")
def _trelu(node, x):
    a = _a(node, "alpha", 1.0)
    return [np.where(x[0] > a, x[0], 0).astype(x[0].dtype)]


@register("HardSigmoid")
def _hsig(node, x):
    a = _a(node, "alpha", 0.2)
    b = _a(node, "beta", 0.5)
    v = x[0]
    return [np.clip(v * np.float32(a) + np.float32(b), 0, 1).astype(v.dtype)]


@register("HardSwish")
def _hswish(node, x):
    v = x[0]
    return [(v * np.clip(v * np.float32(1 / 6) + np.float32(0.5), 0, 1)).astype(v.dtype)]


@register("Gelu")
def _gelu(node, x):
    v = x[0].astype(np.float64)
    if _a(node, "approximate", "none") == "tanh":
        out = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    else:
        from scipy.special import erf
        out = 0.5 * v * (1 + erf(v / math.sqrt(2)))
    return [out.astype(x[0].dtype)]


@register("Shrink")
def _shrink(node, x):
    lam = _a(node, "lambd", 0.5)
    bias = _a(node, "bias", 0.0)
    v = x[0]
    return [np.where(v < -lam, v + bias, np.where(v > lam, v - bias, 0)).astype(v.dtype)]


@register("Cast")
def _cast(node, x):
    to = ONNX_TO_NP.get(int(_a(node, "to", 1)))
    if to is None:
        raise TensorplanError(f"node '{node.name}' (Cast): unsupported target type {_a(node, 'to')}")
    v = x[0]
    if np.issubdtype(np.dtype(to), np.integer) and np.issubdtype(v.dtype, np.floating):
        v = np.trunc(v)
    return [v.astype(to)]


@register("CastLike")
def _castlike(node, x):
    return [x[0].astype(x[1].dtype)]


@register("Dropout")
def _dropout(node, x):
    ratio = _opt(x, 1)
    ratio = float(np.asarray(ratio).reshape(-1)[0]) if ratio is not None else float(_a(node, "ratio", 0.5))
    training = _opt(x, 2)
    training = bool(np.asarray(training).reshape(-1)[0]) if training is not None else False
    if training and ratio != 0.0:
        raise TensorplanError(
            f"node '{node.name}' (Dropout): training_mode=true with ratio {ratio:g} draws a random mask; "
            "tensorplan runs inference only (set training_mode to false or remove the Dropout)")
    return [x[0].copy(), np.ones(x[0].shape, dtype=bool)]


# ---------------------------------------------------------------- reductions
def _reduce_axes(node: Node, x: list) -> tuple[tuple[int, ...] | None, bool]:
    """Axes from the attribute (older opsets) or second input (ReduceSum>=13, others>=18)."""
    axes = None
    if len(x) > 1 and x[1] is not None:
        axes = _ints(x[1])
    elif "axes" in node.attrs:
        axes = _ints(node.attrs["axes"])
    if axes is not None and len(axes) == 0:
        axes = None
    noop = bool(_a(node, "noop_with_empty_axes", 0))
    rank = x[0].ndim
    return (tuple(sorted(a % rank for a in axes)) if axes is not None else None), noop


def _reduce(fn: Callable) -> OpFn:
    def run(node: Node, x: list) -> list:
        axes, noop = _reduce_axes(node, x)
        keep = bool(_a(node, "keepdims", 1))
        v = x[0]
        if axes is None and noop:
            return [v.copy()]
        if axes is None:
            axes = tuple(range(v.ndim))
        out = fn(v, axes, keep)
        return [np.asarray(out).astype(v.dtype, copy=False)]
    return run


def _acc(v: np.ndarray) -> np.ndarray:
    """Accumulate float32 sums in float64: ORT's tree-summed float32 is closer to exact."""
    return v.astype(np.float64) if v.dtype == np.float32 else v


OPS["ReduceSum"] = _reduce(lambda v, a, k: np.sum(_acc(v), axis=a, keepdims=k))
OPS["ReduceMean"] = _reduce(lambda v, a, k: np.mean(_acc(v), axis=a, keepdims=k))
def _extreme(v: np.ndarray, axes: tuple[int, ...], keep: bool, largest: bool) -> np.ndarray:
    """ReduceMax / ReduceMin; over an empty set the identity (-inf / +inf, or the integer limits)."""
    fn = np.max if largest else np.min
    if v.size and all(v.shape[a] for a in axes):
        return fn(v, axis=axes, keepdims=keep)
    if v.dtype.kind == "f":
        ident = -np.inf if largest else np.inf
    elif v.dtype == np.bool_:
        ident = not largest
    else:
        info = np.iinfo(v.dtype)
        ident = info.min if largest else info.max
    shape = tuple((1 if i in axes else d) for i, d in enumerate(v.shape)) if keep else \
        tuple(d for i, d in enumerate(v.shape) if i not in axes)
    return np.full(shape, ident, dtype=v.dtype)


OPS["ReduceMax"] = _reduce(lambda v, a, k: _extreme(v, a, k, True))
OPS["ReduceMin"] = _reduce(lambda v, a, k: _extreme(v, a, k, False))
OPS["ReduceProd"] = _reduce(lambda v, a, k: np.prod(_acc(v), axis=a, keepdims=k))
OPS["ReduceL2"] = _reduce(lambda v, a, k: np.sqrt(np.sum(_acc(v) ** 2, axis=a, keepdims=k)))
OPS["ReduceL1"] = _reduce(lambda v, a, k: np.sum(np.abs(_acc(v)), axis=a, keepdims=k))
OPS["ReduceSumSquare"] = _reduce(lambda v, a, k: np.sum(_acc(v) ** 2, axis=a, keepdims=k))
OPS["ReduceLogSum"] = _reduce(lambda v, a, k: np.log(np.sum(_acc(v), axis=a, keepdims=k)))
OPS["ReduceLogSumExp"] = _reduce(
    lambda v, a, k: np.log(np.sum(np.exp(_acc(v)), axis=a, keepdims=k)))


def _arg(fn: Callable) -> OpFn:
    def run(node: Node, x: list) -> list:
        v = x[0]
        axis = int(_a(node, "axis", 0)) % v.ndim
        keep = bool(_a(node, "keepdims", 1))
        if _a(node, "select_last_index", 0):
            flipped = np.flip(v, axis)
            idx = v.shape[axis] - 1 - fn(flipped, axis=axis)
        else:
            idx = fn(v, axis=axis)
        if keep:
            idx = np.expand_dims(idx, axis)
        return [idx.astype(np.int64)]
    return run


OPS["ArgMax"] = _arg(np.argmax)
OPS["ArgMin"] = _arg(np.argmin)


def _softmax_like(kind: str) -> OpFn:
    def run(node: Node, x: list) -> list:
        v = x[0]
        opset = current_opset()
        if opset < 13:
            # Before opset 13 the input is coerced to 2-D at `axis` (default 1).
            axis = int(_a(node, "axis", 1)) % max(v.ndim, 1)
            flat = v.reshape(int(np.prod(v.shape[:axis], dtype=np.int64)), -1)
            return [run_axis(flat, 1).reshape(v.shape)]
        axis = int(_a(node, "axis", -1)) % max(v.ndim, 1)
        return [run_axis(v, axis)]

    def run_axis(v: np.ndarray, axis: int) -> np.ndarray:
        w = v.astype(np.float64)
        m = np.max(w, axis=axis, keepdims=True)
        if kind == "hardmax":
            idx = np.argmax(v, axis=axis)
            out = np.zeros_like(v)
            np.put_along_axis(out, np.expand_dims(idx, axis), 1, axis=axis)
            return out
        e = np.exp(w - m)
        s = np.sum(e, axis=axis, keepdims=True)
        if kind == "softmax":
            return (e / s).astype(v.dtype)
        return (w - m - np.log(s)).astype(v.dtype)
    return run


OPS["Softmax"] = _softmax_like("softmax")
OPS["LogSoftmax"] = _softmax_like("logsoftmax")
OPS["Hardmax"] = _softmax_like("hardmax")


@register("LayerNormalization")
def _layernorm(node, x):
    v = x[0]
    axis = int(_a(node, "axis", -1)) % v.ndim
    eps = float(_a(node, "epsilon", 1e-5))
    axes = tuple(range(axis, v.ndim))
    w = v.astype(np.float64)
    mean = w.mean(axis=axes, keepdims=True)
    var = ((w - mean) ** 2).mean(axis=axes, keepdims=True)
    inv = 1.0 / np.sqrt(var + eps)
    y = (w - mean) * inv * x[1]
    if _opt(x, 2) is not None:
        y = y + x[2]
    return [y.astype(v.dtype), mean.astype(np.float32), inv.astype(np.float32)]


@register("InstanceNormalization")
def _instnorm(node, x):
    v = x[0]
    eps = float(_a(node, "epsilon", 1e-5))
    axes = tuple(range(2, v.ndim))
    w = v.astype(np.float64)
    mean = w.mean(axis=axes, keepdims=True)
    var = ((w - mean) ** 2).mean(axis=axes, keepdims=True)
    shape = (1, -1) + (1,) * (v.ndim - 2)
    y = (w - mean) / np.sqrt(var + eps) * x[1].reshape(shape) + x[2].reshape(shape)
    return [y.astype(v.dtype)]


@register("GroupNormalization")
def _groupnorm(node, x):
    v = x[0]
    eps = float(_a(node, "epsilon", 1e-5))
    g = int(_a(node, "num_groups"))
    n, c = v.shape[:2]
    w = v.astype(np.float64).reshape(n, g, -1)
    mean = w.mean(axis=2, keepdims=True)
    var = ((w - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((w - mean) / np.sqrt(var + eps)).reshape(v.shape)
    shape = (1, -1) + (1,) * (v.ndim - 2)
    scale, bias = x[1], x[2]
    if scale.shape[0] == g and g != c:  # opset 18 form: per-group scale/bias
        scale = np.repeat(scale, c // g)
        bias = np.repeat(bias, c // g)
    y = y * scale.reshape(shape) + bias.reshape(shape)
    return [y.astype(v.dtype)]


@register("BatchNormalization")
def _batchnorm(node, x):
    v, scale, bias, mean, var = x[:5]
    eps = float(_a(node, "epsilon", 1e-5))
    shape = (1, -1) + (1,) * (v.ndim - 2)
    outs: list = []
    if _a(node, "training_mode", 0):
        # batch statistics normalise; running statistics move by `momentum` (opset 14+)
        mom = float(_a(node, "momentum", 0.9))
        axes = (0,) + tuple(range(2, v.ndim))
        w = v.astype(np.float64)
        bmean, bvar = w.mean(axis=axes), w.var(axis=axes)
        outs = [(mean * mom + bmean * (1 - mom)).astype(mean.dtype),
                (var * mom + bvar * (1 - mom)).astype(var.dtype)]
        mean, var = bmean, bvar
    inv = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    y = (v - mean.reshape(shape)) * inv.reshape(shape) + bias.reshape(shape)
    return [y.astype(v.dtype)] + outs


@register("LRN")
def _lrn(node, x):
    v = x[0].astype(np.float64)
    size = int(_a(node, "size"))
    alpha, beta, bias = _a(node, "alpha", 1e-4), _a(node, "beta", 0.75), _a(node, "bias", 1.0)
    c = v.shape[1]
    sq = v ** 2
    acc = np.zeros_like(v)
    lo_off, hi_off = (size - 1) // 2, int(math.ceil((size - 1) / 2))
    for ch in range(c):
        lo, hi = max(0, ch - lo_off), min(c - 1, ch + hi_off)
        acc[:, ch] = sq[:, lo:hi + 1].sum(axis=1)
    return [(v / (bias + alpha / size * acc) ** beta).astype(x[0].dtype)]


@register("CumSum")
def _cumsum(node, x):
    v = x[0]
    axis = int(np.asarray(x[1]).reshape(-1)[0]) % v.ndim
    rev, excl = _a(node, "reverse", 0), _a(node, "exclusive", 0)
    w = np.flip(v, axis) if rev else v
    out = np.cumsum(w, axis=axis, dtype=v.dtype)
    if excl:
        out = out - w
    if rev:
        out = np.flip(out, axis)
    return [np.ascontiguousarray(out)]


@register("TopK")
def _topk(node, x):
    v = x[0]
    k = int(np.asarray(x[1]).reshape(-1)[0])
    axis = int(_a(node, "axis", -1)) % v.ndim
    if not 0 <= k <= v.shape[axis]:
        raise _bad_value(node, f"K = {k} is outside 0..{v.shape[axis]} (the size of axis {axis})")
    largest = _a(node, "largest", 1)
    if largest:  # a decreasing key without overflow: ~v for integers (unsigned too), -v for floats
        key = np.logical_not(v) if v.dtype == np.bool_ else (~v if v.dtype.kind in "iu" else -v)
    else:
        key = v
    idx = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(idx, np.arange(k), axis=axis)
    return [np.take_along_axis(v, idx, axis=axis), idx.astype(np.int64)]


# ---------------------------------------------------------------- layout
@register("Transpose")
def _transpose(node, x):
    perm = _a(node, "perm")
    return [np.ascontiguousarray(np.transpose(x[0], perm))]


@register("Reshape")
def _reshape(node, x):
    v = x[0]
    shape = _ints(x[1])
    allowzero = _a(node, "allowzero", 0)
    out = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            if i >= v.ndim:
                raise _bad_value(node, f"target shape {shape} copies dimension {i} (a 0), but the "
                                       f"input has rank {v.ndim}")
            d = v.shape[i]
        out.append(d)
    known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
    if out.count(-1) > 1 or any(d < -1 for d in out) or (
            -1 not in out and known != v.size) or (-1 in out and (known == 0 or v.size % known)):
        raise _bad_value(node, f"cannot reshape {v.shape} ({v.size} elements) to target shape {shape}")
    return [v.reshape(out).copy()]


@register("Flatten")
def _flatten(node, x):
    v = x[0]
    axis = int(_a(node, "axis", 1))
    axis = axis % v.ndim if axis < 0 else axis
    outer = int(np.prod(v.shape[:axis], dtype=np.int64))
    return [v.reshape(outer, -1).copy()]


@register("Squeeze")
def _squeeze(node, x):
    v = x[0]
    axes = _ints(x[1]) if _opt(x, 1) is not None else _a(node, "axes")
    if axes is None:
        return [np.squeeze(v).copy()]
    axes = [int(a) for a in np.atleast_1d(axes)]
    if any(not -v.ndim <= a < v.ndim or v.shape[a % v.ndim] != 1 for a in axes):
        raise _bad_value(node, f"axes {axes} must name dimensions of size 1 of the input {v.shape}")
    return [np.squeeze(v, axis=tuple(a % v.ndim for a in axes)).copy()]


@register("Unsqueeze")
def _unsqueeze(node, x):
    v = x[0]
    axes = _ints(x[1]) if _opt(x, 1) is not None else _ints(_a(node, "axes"))
    rank = v.ndim + len(axes)
    out = v
    for a in sorted(a % rank for a in axes):
        out = np.expand_dims(out, a)
    return [out.copy()]


@register("Concat")
def _concat(node, x):
    xs = [v for v in x if v is not None]
    return [np.concatenate(xs, axis=int(_a(node, "axis")))]


@register("Split")
def _split(node, x):
    v = x[0]
    axis = int(_a(node, "axis", 0)) % v.ndim
    n = len(node.outputs)
    if _opt(x, 1) is not None:
        sizes = _ints(x[1])
    elif "split" in node.attrs:
        sizes = _ints(node.attrs["split"])
    else:
        num = int(_a(node, "num_outputs", n))
        d = v.shape[axis]
        chunk = -(-d // num)
        sizes = [chunk] * (num - 1) + [d - chunk * (num - 1)]
    idx = np.cumsum(sizes)[:-1]
    return [p.copy() for p in np.split(v, idx, axis=axis)]


@register("Slice")
def _slice(node, x):
    v = x[0]
    if _opt(x, 1) is not None:
        starts, ends = _ints(x[1]), _ints(x[2])
        axes = _ints(x[3]) if _opt(x, 3) is not None else list(range(len(starts)))
        steps = _ints(x[4]) if _opt(x, 4) is not None else [1] * len(starts)
    else:  # opset < 10 attribute form
        starts, ends = _ints(_a(node, "starts")), _ints(_a(node, "ends"))
        axes = _ints(_a(node, "axes", list(range(len(starts)))))
        steps = [1] * len(starts)
    sl = [slice(None)] * v.ndim
    if any(st == 0 for st in steps):
        raise _bad_value(node, f"steps {steps} contain a 0; every step must be non-zero")
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = a % v.ndim
        d = v.shape[a]
        # clamp like ONNX (int64 max/min sentinels included)
        s = max(-d - 1, min(s, d + 1)) if abs(s) > 2 ** 40 else s
        e = max(-d - 1, min(e, d + 1)) if abs(e) > 2 ** 40 else e
        sl[a] = slice(s, e, st)
    return [v[tuple(sl)].copy()]


def _gather_axis(node, v, idx):
    """(axis, indices with negatives counted from the end) of a Gather-like node."""
    axis = int(_a(node, "axis", 0)) % v.ndim
    return axis, np.where(idx < 0, idx + v.shape[axis], idx)


@register("Gather")
def _gather(node, x):
    axis, idx = _gather_axis(node, *x)
    return [np.take(x[0], idx, axis=axis)]


@register("GatherElements")
def _gather_el(node, x):
    axis, idx = _gather_axis(node, *x)
    return [np.take_along_axis(x[0], idx, axis=axis)]


@register("GatherND")
def _gather_nd(node, x):
    v, idx = x
    b = int(_a(node, "batch_dims", 0))
    if b != 0:  # one GatherND per batch entry (the leading b dims of data and indices agree)
        bshape = v.shape[:b]
        vb = v.reshape((-1,) + v.shape[b:])
        ib = idx.reshape((-1,) + idx.shape[b:])
        sub = Node(node.name, node.op, node.inputs, node.outputs, {})
        parts = [_gather_nd(sub, [vb[i], ib[i]])[0] for i in range(vb.shape[0])]
        return [np.stack(parts).reshape(tuple(bshape) + parts[0].shape) if parts else
                np.zeros(tuple(bshape) + idx.shape[b:-1] + v.shape[b + idx.shape[-1]:], v.dtype)]
    k = idx.shape[-1]
    flat = idx.reshape(-1, k)
    flat = np.where(flat < 0, flat + np.array(v.shape[:k]), flat)
    out = v[tuple(flat.T)]
    return [out.reshape(idx.shape[:-1] + v.shape[k:])]


@register("ScatterND")
def _scatter_nd(node, x):
    v, idx, upd = x
    out = v.copy()
    k = idx.shape[-1]
    flat = idx.reshape(-1, k)
    u = upd.reshape((flat.shape[0],) + v.shape[k:])
    red = _a(node, "reduction", "none")
    for i, ix in enumerate(flat):
        t = tuple(ix)
        if red == "add":
            out[t] += u[i]
        elif red == "mul":
            out[t] *= u[i]
        elif red == "max":
            out[t] = np.maximum(out[t], u[i])
        elif red == "min":
            out[t] = np.minimum(out[t], u[i])
        elif red != "none":
            raise TensorplanError(f"node '{node.name}' (ScatterND): reduction '{red}' is not supported")
        else:
            out[t] = u[i]
    return [out]


@register("ScatterElements")
def _scatter_el(node, x):
    v, idx, upd = x
    axis = int(_a(node, "axis", 0)) % v.ndim
    out = v.copy()
    idx = np.where(idx < 0, idx + v.shape[axis], idx)
    red = _a(node, "reduction", "none")
    # full index tuples: idx along `axis`, the element's own position elsewhere (indices may be
    # smaller than the data on the other axes too, which put_along_axis does not allow)
    grids = list(np.indices(idx.shape, sparse=False))
    grids[axis] = idx
    if red == "none":
        out[tuple(grids)] = upd
        return [out]
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}.get(red)
    if ufunc is None:
        raise TensorplanError(f"node '{node.name}' (ScatterElements): reduction '{red}' is not supported")
    ufunc.at(out, tuple(grids), upd)  # duplicates accumulate
    return [out]


@register("Expand")
def _expand(node, x):
    v = x[0]
    shape = _ints(x[1])
    try:
        out_shape = np.broadcast_shapes(v.shape, tuple(shape))
    except ValueError:
        raise _bad_value(node, f"input shape {v.shape} does not broadcast to shape {shape}") from None
    return [np.broadcast_to(v, out_shape).copy()]


@register("Tile")
def _tile(node, x):
    reps = _ints(x[1])
    if len(reps) != x[0].ndim or any(r < 0 for r in reps):
        raise _bad_value(node, f"repeats {reps} must be {x[0].ndim} non-negative counts")
    return [np.tile(x[0], reps)]


@register("Shape")
def _shape(node, x):
    shp = np.array(x[0].shape, dtype=np.int64)
    start = _a(node, "start", 0)
    end = _a(node, "end", None)
    return [shp[start:end].copy()]


@register("Size")
def _size(node, x):
    return [np.array(x[0].size, dtype=np.int64)]


@register("ConstantOfShape")
def _const_of_shape(node, x):
    val = _a(node, "value", None)
    if val is None:
        val = np.zeros(1, dtype=np.float32)
    val = np.asarray(val)
    shape = _ints(x[0])
    if any(d < 0 for d in shape):
        raise _bad_value(node, f"shape {shape} has a negative dimension")
    return [np.full(shape, val.reshape(-1)[0], dtype=val.dtype)]


@register("Range")
def _range(node, x):
    s, l, d = (np.asarray(v).reshape(()) for v in x[:3])
    if d == 0:
        raise _bad_value(node, "delta is 0; a Range needs a non-zero step")
    # ONNX: max(ceil((limit - start) / delta), 0) elements, start + i * delta
    n = max(int(math.ceil((float(l) - float(s)) / float(d))), 0)
    return [(s + np.arange(n, dtype=np.result_type(s, d)) * d).astype(s.dtype)]


@register("Constant")
def _constant(node, x):
    for k in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if k in node.attrs:
            v = node.attrs[k]
            if k in ("value_float", "value_floats"):
                return [np.asarray(v, dtype=np.float32)]
            if k in ("value_int", "value_ints"):
                return [np.asarray(v, dtype=np.int64)]
            return [np.asarray(v)]
    raise TensorplanError(f"node '{node.name}' (Constant): no supported value attribute")


@register("OneHot")
def _onehot(node, x):
    idx, depth, values = x
    depth = int(np.asarray(depth).reshape(-1)[0])
    axis = int(_a(node, "axis", -1))
    idx = np.where(idx < 0, idx + depth, idx).astype(np.int64)
    eye = (np.arange(depth) == idx[..., None])
    out = np.where(eye, values[1], values[0])
    if axis != -1:
        out = np.moveaxis(out, -1, axis)
    return [np.ascontiguousarray(out)]


@register("Trilu")
def _trilu(node, x):
    k = int(np.asarray(x[1]).reshape(-1)[0]) if _opt(x, 1) is not None else 0
    fn = np.triu if _a(node, "upper", 1) else np.tril
    return [fn(x[0], k)]


@register("Pad")
def _pad(node, x):
    v = x[0]
    mode = _a(node, "mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if _opt(x, 1) is not None:
        pads = _ints(x[1])
        cval = _opt(x, 2)
        cval = 0 if cval is None or np.asarray(cval).size == 0 else np.asarray(cval).reshape(-1)[0]
        axes = _ints(x[3]) if _opt(x, 3) is not None else list(range(v.ndim))
    else:
        pads = _ints(_a(node, "pads"))
        cval = _a(node, "value", 0.0)
        axes = list(range(v.ndim))
    n = len(axes)
    width = [[0, 0] for _ in range(v.ndim)]
    for i, a in enumerate(axes):
        width[a % v.ndim] = [pads[i], pads[i + n]]
    # negative pads crop
    crop = [slice(None)] * v.ndim
    for a, (b, e) in enumerate(width):
        if b < 0 or e < 0:
            crop[a] = slice(max(-b, 0), v.shape[a] - max(-e, 0))
            width[a] = [max(b, 0), max(e, 0)]
    v = v[tuple(crop)]
    if mode == "constant":
        return [np.pad(v, width, mode="constant", constant_values=cval)]
    if mode == "reflect":
        return [np.pad(v, width, mode="reflect")]
    if mode == "edge":
        return [np.pad(v, width, mode="edge")]
    if mode == "wrap":
        return [np.pad(v, width, mode="wrap")]
    raise TensorplanError(f"node '{node.name}' (Pad): mode '{mode}' is not supported")


@register("DepthToSpace")
def _d2s(node, x):
    v = x[0]
    b = int(_a(node, "blocksize"))
    n, c, h, w = v.shape
    mode = _a(node, "mode", "DCR")
    if mode == "DCR":
        t = v.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = v.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [t.reshape(n, c // (b * b), h * b, w * b).copy()]


@register("SpaceToDepth")
def _s2d(node, x):
    v = x[0]
    b = int(_a(node, "blocksize"))
    n, c, h, w = v.shape
    t = v.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return [t.reshape(n, c * b * b, h // b, w // b).copy()]


# ---------------------------------------------------------------- linear
@register("MatMul")
def _matmul(node, x):
    a, b = x
    return [np.matmul(a, b).astype(np.result_type(a, b))]


@register("Gemm")
def _gemm(node, x):
    a, b = x[0], x[1]
    if _a(node, "transA", 0):
        a = a.T
    if _a(node, "transB", 0):
        b = b.T
    y = np.float32(_a(node, "alpha", 1.0)) * (a @ b) if _a(node, "alpha", 1.0) != 1.0 else a @ b
    c = _opt(x, 2)
    if c is not None:
        beta = _a(node, "beta", 1.0)
        y = y + (np.float32(beta) * c if beta != 1.0 else c)
    return [y.astype(x[0].dtype)]


@register("Einsum")
def _einsum(node, x):
    eq = _a(node, "equation")
    if isinstance(eq, bytes):
        eq = eq.decode()
    return [np.einsum(eq, *x).astype(x[0].dtype)]


def _torch():
    import torch
    return torch


def _conv_pads(node: Node, spatial: list[int], kernel: list[int], strides: list[int],
               dil: list[int]) -> list[int]:
    """ONNX pads [b1..bn, e1..en] after resolving auto_pad."""
    n = len(spatial)
    auto = _a(node, "auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * n)
        for i in range(n):
            out = -(-spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - spatial[i])
            small, big = total // 2, total - total // 2
            pads[i], pads[i + n] = (small, big) if auto == "SAME_UPPER" else (big, small)
        return pads
    if auto == "VALID":
        return [0] * (2 * n)
    return _ints(_a(node, "pads", [0] * (2 * n)))


def _torch_pad_arg(pads: list[int]) -> list[int]:
    n = len(pads) // 2
    out: list[int] = []
    for i in reversed(range(n)):
        out += [pads[i], pads[i + n]]
    return out


@register("Conv")
def _conv(node, x):
    torch = _torch()
    F = torch.nn.functional
    v, w = x[0], x[1]
    b = _opt(x, 2)
    nd = v.ndim - 2
    kernel = list(w.shape[2:])
    strides = _ints(_a(node, "strides", [1] * nd))
    dil = _ints(_a(node, "dilations", [1] * nd))
    group = int(_a(node, "group", 1))
    pads = _conv_pads(node, list(v.shape[2:]), kernel, strides, dil)
    t = torch.from_numpy(np.ascontiguousarray(v))
    if any(pads):
        t = F.pad(t, _torch_pad_arg(pads))
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    with torch.no_grad():
        out = fn(t, torch.from_numpy(np.ascontiguousarray(w)),
                 None if b is None else torch.from_numpy(np.ascontiguousarray(b)),
                 stride=strides, dilation=dil, groups=group)
    return [out.numpy()]


@register("ConvTranspose")
def _convtranspose(node, x):
    torch = _torch()
    F = torch.nn.functional
    v, w = x[0], x[1]
    b = _opt(x, 2)
    nd = v.ndim - 2
    kernel = list(w.shape[2:])
    strides = _ints(_a(node, "strides", [1] * nd))
    dil = _ints(_a(node, "dilations", [1] * nd))
    group = int(_a(node, "group", 1))
    out_pad = _ints(_a(node, "output_padding", [0] * nd))
    in_sp = list(v.shape[2:])
    auto = _a(node, "auto_pad", "NOTSET")
    if isinstance(auto, bytes):
        auto = auto.decode()
    full = [(in_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 + out_pad[i]
            for i in range(nd)]
    if "output_shape" in node.attrs:
        target = _ints(node.attrs["output_shape"])[-nd:]
        pads = [0] * (2 * nd)
        for i in range(nd):
            total = full[i] - target[i]
            if auto == "SAME_UPPER":
                pads[i], pads[i + nd] = total // 2, total - total // 2
            else:
                pads[i], pads[i + nd] = total - total // 2, total // 2
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = [0] * (2 * nd)
        for i in range(nd):
            total = full[i] - in_sp[i] * strides[i]
            if auto == "SAME_UPPER":
                pads[i], pads[i + nd] = total // 2, total - total // 2
            else:
                pads[i], pads[i + nd] = total - total // 2, total // 2
    elif auto == "VALID":
        pads = [0] * (2 * nd)
    else:
        pads = _ints(_a(node, "pads", [0] * (2 * nd)))
    fn = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nd]
    with torch.no_grad():
        out = fn(torch.from_numpy(np.ascontiguousarray(v)), torch.from_numpy(np.ascontiguousarray(w)),
                 None if b is None else torch.from_numpy(np.ascontiguousarray(b)),
                 stride=strides, dilation=dil, groups=group, output_padding=out_pad)
    res = out.numpy()
    sl = [slice(None), slice(None)]
    grow = [(0, 0), (0, 0)]
    for i in range(nd):  # a negative pad (output_shape larger than the full result) adds zeros
        sl.append(slice(max(pads[i], 0), res.shape[2 + i] - max(pads[i + nd], 0)))
        grow.append((max(-pads[i], 0), max(-pads[i + nd], 0)))
    res = res[tuple(sl)]
    if any(g != (0, 0) for g in grow):
        res = np.pad(res, grow)
    return [np.ascontiguousarray(res)]


# ---------------------------------------------------------------- pooling
def _pool_geometry(node: Node, v: np.ndarray) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    nd = v.ndim - 2
    kernel = _ints(_a(node, "kernel_shape"))
    strides = _ints(_a(node, "strides", [1] * nd))
    dil = _ints(_a(node, "dilations", [1] * nd))
    pads = _conv_pads(node, list(v.shape[2:]), kernel, strides, dil)
    ceil = bool(_a(node, "ceil_mode", 0))
    extra = [0] * nd
    for i in range(nd):
        size = v.shape[2 + i]
        eff = (kernel[i] - 1) * dil[i] + 1
        span = size + pads[i] + pads[i + nd] - eff
        out = (-(-span // strides[i]) if ceil else span // strides[i]) + 1
        if ceil and (out - 1) * strides[i] >= size + pads[i]:
            out -= 1
        need = (out - 1) * strides[i] + eff - (size + pads[i] + pads[i + nd])
        extra[i] = max(0, need)
    return kernel, strides, dil, pads, extra


def _window_sum(t, kernel: list[int], strides: list[int], dil: list[int]):
    """Sum over each (dilated) pooling window: a ones kernel convolved per channel."""
    torch = _torch()
    F = torch.nn.functional
    nd = len(kernel)
    n, c = t.shape[:2]
    w = torch.ones((1, 1) + tuple(kernel), dtype=t.dtype)
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    out = conv(t.reshape((n * c, 1) + tuple(t.shape[2:])), w, stride=strides, dilation=dil)
    return out.reshape((n, c) + tuple(out.shape[2:]))


def _pool(node: Node, v: np.ndarray, kind: str, with_indices: bool = False):
    torch = _torch()
    F = torch.nn.functional
    nd = v.ndim - 2
    kernel, strides, dil, pads, extra = _pool_geometry(node, v)
    t = torch.from_numpy(np.ascontiguousarray(v))
    all_pads = pads[:nd] + [pads[nd + i] + extra[i] for i in range(nd)]
    if kind == "max":
        if not t.is_floating_point():   # int8/uint8 (quantized models): exact in float64, -inf padding
            t = t.double()
        if any(all_pads):
            t = F.pad(t, _torch_pad_arg(all_pads), value=-float("inf"))
        fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
        with torch.no_grad():
            if not with_indices:
                return fn(t, kernel, strides, 0, dil).numpy().astype(v.dtype, copy=False)
            out, idx = fn(t, kernel, strides, 0, dil, return_indices=True)
        # torch: flat index into the padded plane -> ONNX: flat index into the whole input tensor,
        # spatial dims row-major (storage_order 0) or column-major (1)
        padded = tuple(t.shape[2:])
        coords = np.unravel_index(idx.numpy().astype(np.int64), padded)
        coords = [coords[i] - pads[i] for i in range(nd)]
        sp = list(v.shape[2:])
        if int(_a(node, "storage_order", 0)):
            flat = np.ravel_multi_index(tuple(reversed(coords)), tuple(reversed(sp)))
        else:
            flat = np.ravel_multi_index(tuple(coords), tuple(sp))
        plane = int(np.prod(sp, dtype=np.int64))
        nc = np.arange(v.shape[0] * v.shape[1], dtype=np.int64).reshape(v.shape[:2] + (1,) * nd)
        return out.numpy().astype(v.dtype, copy=False), (flat + nc * plane).astype(np.int64)
    include = bool(_a(node, "count_include_pad", 0))
    mask = torch.ones((1, 1) + tuple(v.shape[2:]), dtype=t.dtype)
    if any(all_pads):
        t = F.pad(t, _torch_pad_arg(all_pads), value=0.0)
        if include:  # explicit pads count, the extra ceil-mode overhang does not
            mask = F.pad(mask, _torch_pad_arg(pads), value=1.0)
            mask = F.pad(mask, _torch_pad_arg([0] * nd + extra), value=0.0)
        else:
            mask = F.pad(mask, _torch_pad_arg(all_pads), value=0.0)
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nd]
    with torch.no_grad():
        if any(d != 1 for d in dil):
            s = _window_sum(t.double(), kernel, strides, dil)
            c = _window_sum(mask.double(), kernel, strides, dil)
        else:
            s = fn(t.double(), kernel, strides, 0)
            c = fn(mask.double(), kernel, strides, 0)
    return (s / c).to(t.dtype).numpy()


@register("MaxPool")
def _maxpool(node, x):
    if len(node.outputs) > 1 and node.outputs[1]:
        return list(_pool(node, x[0], "max", with_indices=True))
    return [_pool(node, x[0], "max")]


@register("AveragePool")
def _avgpool(node, x):
    return [_pool(node, x[0], "avg")]


@register("GlobalAveragePool")
def _gap(node, x):
    v = x[0]
    return [v.astype(np.float64).mean(axis=tuple(range(2, v.ndim)), keepdims=True).astype(v.dtype)]


@register("GlobalMaxPool")
def _gmp(node, x):
    v = x[0]
    return [v.max(axis=tuple(range(2, v.ndim)), keepdims=True)]


@register("Swish")
def _swish(node, x):
    a = float(_a(node, "alpha", 1.0))
    v = x[0]
    return [(v * _sigmoid(v * np.asarray(a, v.dtype))).astype(v.dtype)]


@register("CenterCropPad")
def _center_crop_pad(node, x):
    """Crop (centred, the extra element off the end) or zero-pad each axis to `shape`."""
    v = x[0]
    shape = _ints(x[1])
    axes = [int(a) % v.ndim for a in _a(node, "axes", list(range(v.ndim)))]
    if len(shape) != len(axes) or any(d < 0 for d in shape):
        raise _bad_value(node, f"shape {shape} must be {len(axes)} non-negative sizes")
    new = list(v.shape)
    crop = [slice(None)] * v.ndim
    put = [slice(None)] * v.ndim
    for a, sh in zip(axes, shape):
        dim = v.shape[a]
        new[a] = sh
        if sh < dim:
            crop[a] = slice((dim - sh) // 2, (dim - sh) // 2 + sh)
        elif sh > dim:
            put[a] = slice((sh - dim) // 2, (sh - dim) // 2 + dim)
    out = np.zeros(new, dtype=v.dtype)
    out[tuple(put)] = v[tuple(crop)]
    return [out]


def _nll_core(node: Node, logp: np.ndarray, target: np.ndarray, weight) -> np.ndarray:
    """NegativeLogLikelihoodLoss of log-probabilities [N, C, d...] and class ids [N, d...]."""
    red = _a(node, "reduction", "mean")
    red = red.decode() if isinstance(red, bytes) else red
    ign = _a(node, "ignore_index", None)
    n, c = logp.shape[:2]
    x3 = logp.astype(np.float64).reshape(n, c, -1)
    t2 = target.astype(np.int64).reshape(n, -1)
    keep = t2 != ign if ign is not None else np.ones(t2.shape, dtype=bool)
    ts = np.where(keep, t2, 0)
    if ts.size and (ts.min() < 0 or ts.max() >= c):
        raise TensorplanError(f"node '{node.name}' ({node.op}): a target class id is outside 0..{c - 1}")
    loss = np.where(keep, -np.take_along_axis(x3, ts[:, None, :], axis=1)[:, 0, :], 0.0)
    loss = loss.reshape(target.shape)
    w = None
    if weight is not None:
        w = np.where(keep, np.asarray(weight, np.float64)[ts], 0.0).reshape(target.shape)
    elif ign is not None:
        w = keep.astype(np.float64).reshape(target.shape)
    if w is not None:
        loss = loss * w
        if red == "mean":
            return np.asarray(loss.sum() / w.sum()).astype(logp.dtype)
    if red == "mean":
        loss = np.asarray(loss.mean())
    elif red == "sum":
        loss = np.asarray(loss.sum())
    return loss.astype(logp.dtype)


@register("NegativeLogLikelihoodLoss")
def _nll(node, x):
    return [_nll_core(node, x[0], x[1], _opt(x, 2))]


@register("SoftmaxCrossEntropyLoss")
def _sce(node, x):
    v = x[0].astype(np.float64)
    m = v.max(axis=1, keepdims=True)
    logp = (v - m - np.log(np.exp(v - m).sum(axis=1, keepdims=True))).astype(x[0].dtype)
    return [_nll_core(node, logp, x[1], _opt(x, 2)), logp]


@register("MaxUnpool")
def _maxunpool(node, x):
    """Scatter X into zeros at MaxPool's flat indices I (which address the unpooled shape); a larger
    `output_shape` pads that result at the end of each spatial axis, as the ONNX reference does."""
    v, idx = x[0], x[1]
    nd = v.ndim - 2
    kernel = _ints(_a(node, "kernel_shape"))
    strides = _ints(_a(node, "strides", [1] * nd))
    pads = _ints(_a(node, "pads", [0] * (2 * nd)))
    shape = list(v.shape[:2]) + [(v.shape[2 + i] - 1) * strides[i] - pads[i] - pads[i + nd] + kernel[i]
                                 for i in range(nd)]
    total = int(np.prod(shape, dtype=np.int64))
    flat = idx.reshape(-1).astype(np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= total):
        raise TensorplanError(f"node '{node.name}' (MaxUnpool): an index is outside the unpooled "
                              f"shape {tuple(shape)}")
    y = np.zeros(total, dtype=v.dtype)
    y[flat] = v.reshape(-1)
    y = y.reshape(shape)
    if _opt(x, 2) is not None:
        want = _ints(x[2])
        if len(want) != len(shape) or any(w < s for w, s in zip(want, shape)):
            raise TensorplanError(f"node '{node.name}' (MaxUnpool): output_shape {tuple(want)} is "
                                  f"smaller than the unpooled shape {tuple(shape)}")
        y = np.pad(y, [(0, w - s) for w, s in zip(want, shape)])
    return [y]


# ---------------------------------------------------------------- resize
def _resize_taps(mode: str, coord_mode: str, nearest_mode: str, in_size: int, out_size: int,
                 scale: float, cubic_a: float, exclude_outside: bool,
                 roi: tuple[float, float] | None, extrapolation: float, antialias: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Per-output (indices, weights) along one axis; weights rows sum to 1 (nearest: 1 tap)."""
    o = np.arange(out_size, dtype=np.float64)
    if coord_mode == "half_pixel":
        xo = (o + 0.5) / scale - 0.5
    elif coord_mode == "pytorch_half_pixel":
        xo = (o + 0.5) / scale - 0.5 if out_size > 1 else np.zeros_like(o)
    elif coord_mode == "align_corners":
        xo = o * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros_like(o)
    elif coord_mode == "asymmetric":
        xo = o / scale
    elif coord_mode == "tf_half_pixel_for_nn":
        xo = (o + 0.5) / scale
    elif coord_mode == "half_pixel_symmetric":
        adj = out_size / (scale * in_size)
        center = in_size / 2
        offset = center * (1 - adj)
        xo = offset + (o + 0.5) / scale - 0.5
    elif coord_mode == "tf_crop_and_resize":
        s, e = roi if roi is not None else (0.0, 1.0)
        if out_size > 1:
            xo = s * (in_size - 1) + o * (e - s) * (in_size - 1) / (out_size - 1)
        else:
            xo = np.full_like(o, 0.5 * (s + e) * (in_size - 1))
    else:
        raise TensorplanError(f"Resize: coordinate_transformation_mode '{coord_mode}' unsupported")
    outside = None
    if coord_mode == "tf_crop_and_resize":
        outside = (xo < 0) | (xo > in_size - 1)
    if mode == "nearest":
        if nearest_mode == "round_prefer_floor":
            idx = np.where(xo == np.floor(xo) + 0.5, np.floor(xo), np.round(xo))
        elif nearest_mode == "floor":
            idx = np.floor(xo)
        elif nearest_mode == "ceil":
            idx = np.ceil(xo)
        else:  # round_prefer_ceil
            idx = np.floor(xo + 0.5)
        idx = np.clip(idx, 0, in_size - 1).astype(np.int64)[:, None]
        return idx, np.ones_like(idx, dtype=np.float64), outside
    if antialias and mode in ("linear", "cubic") and scale < 1.0:
        return _antialias_taps(mode, xo, in_size, scale, cubic_a, exclude_outside) + (outside,)
    if mode == "linear":
        xc = np.clip(xo, 0, in_size - 1) if coord_mode != "tf_crop_and_resize" else xo
        x0 = np.floor(xc)
        frac = xc - x0
        i0 = np.clip(x0, 0, in_size - 1).astype(np.int64)
        i1 = np.clip(x0 + 1, 0, in_size - 1).astype(np.int64)
        return np.stack([i0, i1], 1), np.stack([1 - frac, frac], 1), outside
    if mode == "cubic":
        x0 = np.floor(xo)
        t = xo - x0
        a = cubic_a
        def k(d: np.ndarray) -> np.ndarray:
            d = np.abs(d)
            return np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1,
                            np.where(d < 2, ((d - 5) * d + 8) * d * a - 4 * a, 0.0))
        offs = np.array([-1, 0, 1, 2], dtype=np.float64)
        pos = x0[:, None] + offs[None, :]
        w = k(t[:, None] - offs[None, :])
        if exclude_outside:
            w = np.where((pos < 0) | (pos > in_size - 1), 0.0, w)
            w = w / w.sum(axis=1, keepdims=True)
        idx = np.clip(pos, 0, in_size - 1).astype(np.int64)
        return idx, w, outside
    raise TensorplanError(f"Resize: mode '{mode}' is not supported")


def _antialias_taps(mode: str, xo: np.ndarray, in_size: int, scale: float, cubic_a: float,
                    exclude_outside: bool) -> tuple[np.ndarray, np.ndarray]:
    """Downsampling taps with antialias: the linear / cubic kernel stretched by 1/scale (the ONNX
    reference's construction: footprint, neighbour choice and normalisation)."""
    xi = np.floor(xo)
    ratio = np.where(xo == xi, 1.0, xo - xi)
    if mode == "linear":
        start = int(np.floor(-1 / scale) + 1)
        n = 2 - 2 * start
        args = (np.arange(start, start + n)[None, :] - ratio[:, None]) * scale
        w = np.clip(1 - np.abs(args), 0, 1)
    else:
        start = int(np.floor(-2 / scale) + 1)
        n = (2 - start) - start
        d = np.abs(scale * (np.arange(start, start + n)[None, :] - ratio[:, None]))
        a = cubic_a
        w = np.where(d <= 1, (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1,
                     np.where(d < 2, a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a, 0.0))
    w = w / w.sum(axis=1, keepdims=True)
    pad = int(np.ceil(n / 2))
    xp = xo + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        off = np.where(frac <= 0.5, base, base + 1)
    idx = (p + off)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_size), 0.0, w)
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot == 0, 1.0, tot)
    return np.clip(idx, 0, in_size - 1).astype(np.int64), w


def resize_geometry(node: Node, in_shape: tuple[int, ...], scales, sizes, axes=None,
                    policy: str = "stretch") -> tuple[list[int], list[float], list[int]]:
    """(resized axes, per-axis scale, output shape) of a Resize, from its sizes or scales input."""
    r = len(in_shape)
    axes = [a % r for a in _ints(axes)] if axes is not None else list(range(r))
    full_scales = [1.0] * r
    out_shape = list(in_shape)
    if sizes is not None:
        sz = _ints(sizes)
        if len(sz) != len(axes) or any(d <= 0 for d in sz):
            raise _bad_value(node, f"sizes {sz} must be {len(axes)} positive sizes")
        if policy != "stretch":
            ratios = [sz[i] / in_shape[a] for i, a in enumerate(axes)]
            ratio = min(ratios) if policy == "not_larger" else max(ratios)
            for a in axes:
                full_scales[a] = ratio
                out_shape[a] = int(math.floor(ratio * in_shape[a] + 0.5))
        else:
            for i, a in enumerate(axes):
                out_shape[a] = sz[i]
                full_scales[a] = sz[i] / in_shape[a]
    elif scales is not None:
        sc = [float(f) for f in np.asarray(scales, dtype=np.float32).reshape(-1)]
        if len(sc) != len(axes) or any(not f > 0 for f in sc):
            raise _bad_value(node, f"scales {sc} must be {len(axes)} positive numbers")
        for i, a in enumerate(axes):
            full_scales[a] = sc[i]
            out_shape[a] = int(math.floor(in_shape[a] * sc[i]))
    else:
        raise TensorplanError(f"node '{node.name}' (Resize): neither scales nor sizes is given")
    return axes, full_scales, out_shape


@register("Resize")
def _resize(node, x):
    v = x[0]
    roi = _opt(x, 1)
    scales = _opt(x, 2)
    sizes = _opt(x, 3)
    if scales is not None and np.asarray(scales).size == 0:
        scales = None
    if sizes is not None and np.asarray(sizes).size == 0:
        sizes = None
    def s(name: str, default: Any) -> Any:
        val = _a(node, name, default)
        return val.decode() if isinstance(val, bytes) else val
    mode = s("mode", "nearest")
    coord = s("coordinate_transformation_mode", "half_pixel")
    nearest_mode = s("nearest_mode", "round_prefer_floor")
    cubic_a = float(s("cubic_coeff_a", -0.75))
    excl = bool(s("exclude_outside", 0))
    extrap = float(s("extrapolation_value", 0.0))
    axes = s("axes", None)
    policy = s("keep_aspect_ratio_policy", "stretch")
    antialias = bool(int(s("antialias", 0)))
    if antialias and mode == "nearest":
        raise TensorplanError(f"node '{node.name}' (Resize): antialias=1 with mode 'nearest' is not "
                              "defined; use mode 'linear' or 'cubic'")
    r = v.ndim
    axes, full_scales, out_shape = resize_geometry(node, tuple(v.shape), scales, sizes, axes, policy)
    roi_v = None if roi is None or np.asarray(roi).size == 0 else np.asarray(roi, np.float64).reshape(-1)
    out = v.astype(np.float64) if mode != "nearest" else v
    for a in range(r):
        if out_shape[a] == v.shape[a] and full_scales[a] == 1.0 and coord != "tf_crop_and_resize":
            continue
        ra = None
        if roi_v is not None and coord == "tf_crop_and_resize":
            k = axes.index(a) if a in axes else None
            if k is not None:
                ra = (roi_v[k], roi_v[k + len(axes)])
        idx, w, outside = _resize_taps(mode, coord, nearest_mode, v.shape[a], out_shape[a],
                                       full_scales[a], cubic_a, excl, ra, extrap, antialias)
        acc = None
        for tap in range(idx.shape[1]):
            part = np.take(out, idx[:, tap], axis=a)
            if mode != "nearest":
                shape = [1] * r
                shape[a] = -1
                part = part * w[:, tap].reshape(shape)
            acc = part if acc is None else acc + part
        if outside is not None and outside.any():
            shape = [1] * r
            shape[a] = -1
            acc = np.where(outside.reshape(shape), extrap, acc)
        out = acc
    return [np.asarray(out).astype(v.dtype)]


# ---------------------------------------------------------------- quantization (folded weights)
@register("DequantizeLinear")
def _dequant(node, x):
    v, s = x[0], x[1]
    zp = _opt(x, 2)
    axis = int(_a(node, "axis", 1))
    if s.ndim == 1 and s.size > 1:
        shape = [1] * v.ndim
        shape[axis % v.ndim] = -1
        s = s.reshape(shape)
        zp = zp.reshape(shape) if zp is not None else None
    out = (v.astype(np.float32) - (zp.astype(np.float32) if zp is not None else 0)) * s
    return [out.astype(s.dtype)]


# ---------------------------------------------------------------- driver
def run_node(node: Node, inputs: list) -> list:
    """Run one node; errors name the node and op. An op without a numpy rule (LSTM, a
    com.microsoft contrib op, ...) runs in ONNX Runtime when its CPU provider has a kernel."""
    fn = OPS.get(node.op)
    if fn is None or node.domain not in ("", "ai.onnx"):
        from tensorplan.ir.ort_node import ort_has_kernel, run_foreign
        opset, doms = _OPSET.get(), _DOMAIN_OPSETS.get()
        if not ort_has_kernel(node.op, node.domain, opset, doms):
            raise UnsupportedOperatorError([(node.name, node.op)])
        return run_foreign(node, inputs, opset, doms)
    try:
        return fn(node, inputs)
    except TensorplanError:
        raise
    except Exception as e:  # numpy/torch errors from bad shapes become one clear line
        shapes = [None if v is None else tuple(v.shape) for v in inputs]
        raise TensorplanError(
            f"reference executor failed on node '{node.name}' ({node.op}) with input shapes "
            f"{shapes}: {type(e).__name__}: {e}") from e


def is_foreign(node: Node) -> bool:
    """No numpy rule here: the node runs in ONNX Runtime (see `ort_node`)."""
    return node.op not in OPS or node.domain not in ("", "ai.onnx")


def unsupported_nodes(graph: Graph) -> list[tuple[str, str]]:
    """(name, op) of nodes neither the reference executor nor ONNX Runtime's CPU provider run."""
    from tensorplan.ir.ort_node import ort_has_kernel
    return [(n.name, n.op) for n in graph.nodes if is_foreign(n)
            and not ort_has_kernel(n.op, n.domain, graph.opset, graph.domain_opsets)]


def run_reference(graph: Graph, feeds: dict[str, np.ndarray],
                  keep_all: bool = False, check_shapes: bool = False) -> dict[str, np.ndarray]:
    """Execute `graph` on `feeds`; returns the graph outputs (all tensors if `keep_all`).

    Intermediate values are freed after their last use so big models fit in memory.
    `check_shapes`: every node output must have the static shape the graph declares; one that does
    not (its shape depended on an input's values after all) is a `ShapeValueError` naming it."""
    missing = [i for i in graph.inputs if i not in feeds]
    if missing:
        raise TensorplanError(f"run_reference: missing feeds for graph inputs {missing}")
    unsupported = unsupported_nodes(graph)
    if unsupported:
        raise UnsupportedOperatorError(unsupported)
    env: dict[str, np.ndarray] = {}
    for name, t in graph.tensors.items():
        if t.data is not None:
            env[name] = t.data
    for i in graph.inputs:
        env[i] = np.asarray(feeds[i])
    last_use: dict[str, int] = {}
    for k, n in enumerate(graph.nodes):
        for i in n.inputs:
            if i:
                last_use[i] = k
    keep = set(graph.outputs)
    token = _OPSET.set(graph.opset)
    dtoken = _DOMAIN_OPSETS.set(graph.domain_opsets)
    try:
        for k, n in enumerate(graph.nodes):
            ins = [env[i] if i else None for i in n.inputs]
            outs = run_node(n, ins)
            if any(isinstance(v, (list, tuple)) for v in outs):
                raise TensorplanError(
                    f"node '{n.name}' ({n.op}) produces a sequence; tensorplan supports tensor values "
                    "only (re-export without sequence operators)")
            for name, val in zip(n.outputs, outs):
                if name:
                    env[name] = val
                    t = graph.tensors.get(name) if check_shapes else None
                    if t is not None and val is not None and tuple(np.shape(val)) != tuple(t.shape):
                        raise ShapeValueError(
                            f"node '{n.name}' ({n.op}): output '{name}' has shape {tuple(np.shape(val))} "
                            f"on these inputs but {tuple(t.shape)} in the imported graph; its shape "
                            "depends on input values — make the shape-controlling inputs constants",
                            n.name, n.op)
            if not keep_all:
                for i in n.inputs:
                    if i and last_use.get(i) == k and i not in keep and \
                            graph.tensors.get(i) is not None and graph.tensors[i].data is None:
                        env.pop(i, None)
    finally:
        _OPSET.reset(token)
        _DOMAIN_OPSETS.reset(dtoken)
    if keep_all:
        return env
    return {o: env[o] for o in graph.outputs}


# Inputs whose name suggests token ids / masks get integers in a valid range.
_ID_HINTS = ("ids", "token", "position", "index", "indices")
_MASK_HINTS = ("mask",)


def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Valid random inputs for `graph`: floats ~ N(0,1); int inputs used as Gather
    indices get values in range of the table they index; masks get 0/1 (mostly 1)."""
    rng = np.random.default_rng(seed)
    cons = graph.consumers()
    feeds: dict[str, np.ndarray] = {}
    for name in graph.inputs:
        t = graph.tensors[name]
        dt = np.dtype(t.dtype) if t.dtype != "bfloat16" else np.dtype(np.float32)
        if np.issubdtype(dt, np.floating):
            feeds[name] = rng.standard_normal(t.shape).astype(dt)
        elif dt == np.bool_:
            feeds[name] = rng.random(t.shape) < 0.8
        else:
            hi = _index_bound(graph, name, cons)
            lname = name.lower()
            if hi is None and any(h in lname for h in _MASK_HINTS):
                hi = 2
            if hi is None:
                hi = 2 if "type" in lname or "segment" in lname else 16
            if any(h in lname for h in _MASK_HINTS):
                arr = np.ones(t.shape, dtype=dt)
                if arr.ndim >= 1 and arr.shape[-1] > 2:
                    arr[..., -max(1, arr.shape[-1] // 8):] = 0
                feeds[name] = arr
            else:
                feeds[name] = rng.integers(0, hi, size=t.shape).astype(dt)
    return feeds


def _index_bound(graph: Graph, name: str, cons: dict[str, list[Node]],
                 depth: int = 0) -> int | None:
    """Smallest table size among Gather/OneHot consumers reachable through casts/reshapes."""
    if depth > 6:
        return None
    best: int | None = None
    for n in cons.get(name, []):
        cand: int | None = None
        if n.op in ("Gather", "GatherElements") and len(n.inputs) > 1 and n.inputs[1] == name:
            table = graph.tensors.get(n.inputs[0])
            if table is not None and table.shape:
                axis = int(n.attrs.get("axis", 0)) % len(table.shape)
                cand = table.shape[axis]
        elif n.op in ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity",
                      "Expand", "Slice", "Transpose") and n.inputs and n.inputs[0] == name:
            cand = _index_bound(graph, n.outputs[0], cons, depth + 1)
        if cand is not None:
            best = cand if best is None else min(best, cand)
    return best
