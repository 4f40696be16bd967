"""Static cost numbers of a Graph: FLOPs, bytes moved, parameters, roofline time.

These feed the analytical cost model and `tensorplan inspect`. FLOPs count a
multiply-add as 2 for Conv/ConvTranspose/MatMul/Gemm/Einsum; elementwise ops
count one per output element (times a small per-op factor for composite ops
such as Softmax or LayerNormalization); reductions count one per input element;
pure data movement (Transpose, Reshape, Gather, ...) counts 0.
"""
from __future__ import annotations

import string

import numpy as np

from tensorplan.ir.graph import Graph, Node

LAYOUT_OPS = {
    "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
    "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements", "Pad", "DepthToSpace",
    "SpaceToDepth", "Tile", "Shape", "Size", "ConstantOfShape", "Range", "Identity", "Expand",
    "Constant", "Dropout", "Cast", "CastLike", "Trilu", "OneHot",
}
REDUCE_OPS = {
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin",
    "GlobalAveragePool", "GlobalMaxPool", "CumSum", "TopK",
}
# FLOPs per output element of composite elementwise/normalisation ops.
_FACTOR = {
    "Softmax": 5, "LogSoftmax": 5, "Hardmax": 2, "LayerNormalization": 8,
    "InstanceNormalization": 8, "GroupNormalization": 8, "BatchNormalization": 2, "Gelu": 8,
    "Mish": 5, "HardSwish": 4, "HardSigmoid": 3, "Softplus": 3, "Elu": 3, "Selu": 4, "Erf": 4,
    "Sigmoid": 4, "Tanh": 4, "LRN": 6, "Clip": 2, "Where": 1, "PRelu": 2, "LeakyRelu": 2,
}


def _shape(graph: Graph, name: str) -> tuple[int, ...]:
    t = graph.tensors.get(name)
    return tuple(t.shape) if t is not None else ()


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if shape else 1


def node_flops(graph: Graph, node: Node) -> int:
    """Floating-point operations of one node (2 per multiply-add for linear ops)."""
    op = node.op
    ins = [_shape(graph, i) if i else None for i in node.inputs]
    outs = [_shape(graph, o) for o in node.outputs if o]
    out_n = _numel(outs[0]) if outs else 0
    if op == "Conv":
        w = ins[1]
        macs = out_n * _numel(w[1:])  # each output: Cin/group * prod(kernel) MACs
        bias = out_n if len(ins) > 2 and ins[2] is not None else 0
        return int(2 * macs + bias)
    if op == "ConvTranspose":
        x, w = ins[0], ins[1]
        macs = _numel(x) * w[1] * _numel(w[2:])  # w: (Cin, Cout/group, k...)
        bias = out_n if len(ins) > 2 and ins[2] is not None else 0
        return int(2 * macs + bias)
    if op == "MatMul":
        a, b = ins[0], ins[1]
        k = a[-1] if a else 1
        return int(2 * out_n * k)
    if op == "Gemm":
        a = ins[0]
        k = a[0] if node.attrs.get("transA", 0) else a[-1]
        extra = out_n if len(ins) > 2 and ins[2] is not None else 0
        return int(2 * out_n * k + extra)
    if op == "Einsum":
        return _einsum_flops(node, [s for s in ins if s is not None])
    if op in ("MaxPool", "AveragePool", "LpPool"):
        k = _numel(tuple(node.attrs.get("kernel_shape", [1])))
        return int(out_n * k)
    if op == "Resize":
        mode = node.attrs.get("mode", "nearest")
        nd = sum(1 for a, b in zip(ins[0], outs[0]) if a != b) if ins[0] else 0
        taps = {"nearest": 0, "linear": 2, "cubic": 4}.get(mode, 2)
        return int(out_n * (taps ** nd) * 2 if taps else 0)
    if op in LAYOUT_OPS:
        return 0
    if op in REDUCE_OPS:
        return int(_numel(ins[0])) if ins and ins[0] is not None else 0
    return int(out_n * _FACTOR.get(op, 1))


def _einsum_flops(node: Node, ins: list[tuple[int, ...]]) -> int:
    eq = str(node.attrs.get("equation", "")).replace(" ", "")
    lhs = eq.split("->")[0]
    sizes: dict[str, int] = {}
    for term, shape in zip(lhs.split(","), ins):
        letters = [c for c in term if c in string.ascii_letters]
        if "..." in term:
            return 0
        for c, d in zip(letters, shape):
            sizes[c] = max(sizes.get(c, 1), int(d))
    return int(2 * _numel(tuple(sizes.values())))


def graph_flops(graph: Graph) -> int:
    return int(sum(node_flops(graph, n) for n in graph.nodes))


def node_bytes(graph: Graph, node: Node) -> int:
    """Bytes a standalone kernel for this node moves: all inputs read + outputs written."""
    total = 0
    for name in list(node.inputs) + list(node.outputs):
        if name and name in graph.tensors:
            total += graph.tensors[name].nbytes
    return int(total)


def min_bytes(graph: Graph) -> int:
    """Lower bound on memory traffic: weights, graph inputs and outputs, each once."""
    used = {i for n in graph.nodes for i in n.inputs if i}
    names = {k for k, t in graph.tensors.items() if t.is_constant and k in used}
    names |= set(graph.inputs) | set(graph.outputs)
    return int(sum(graph.tensors[k].nbytes for k in names if k in graph.tensors))


def param_count(graph: Graph) -> int:
    """Floating-point constant elements (weights) the graph's nodes read."""
    used = {i for n in graph.nodes for i in n.inputs if i}
    return int(sum(t.numel for k, t in graph.tensors.items()
                   if t.is_constant and k in used and t.dtype.startswith(("float", "bfloat"))))


def roofline_ms(flops: float, bytes_moved: float, peak_gflops: float, bw_gbs: float) -> float:
    """max(compute time, memory time) in milliseconds: the roofline lower bound."""
    if peak_gflops <= 0 or bw_gbs <= 0:
        raise ValueError("roofline_ms: peak_gflops and bw_gbs must be positive")
    return max(flops / (peak_gflops * 1e9), bytes_moved / (bw_gbs * 1e9)) * 1e3


def op_summary(graph: Graph) -> dict[str, dict[str, int]]:
    """Per op type: node count, FLOPs and bytes moved, heaviest (by FLOPs) first."""
    out: dict[str, dict[str, int]] = {}
    for n in graph.nodes:
        row = out.setdefault(n.op, {"count": 0, "flops": 0, "bytes": 0})
        row["count"] += 1
        row["flops"] += node_flops(graph, n)
        row["bytes"] += node_bytes(graph, n)
    return dict(sorted(out.items(), key=lambda kv: (-kv[1]["flops"], -kv[1]["count"], kv[0])))


def check_against_ort(graph: Graph, onnx_model=None, seed: int = 0, threads: int | None = None,
                      tol: float | None = None) -> dict:
    """Run the reference executor and ONNX Runtime on the same random inputs.

    `onnx_model` (path or ModelProto) is the original file; without it the graph
    is exported with `graph_to_onnx`. Returns per-output relative errors
    (max|ref-ort| / max(max|ort|, eps)) and `passed` at `tol` (default: `default_tolerance`).
    ONNX Runtime gets `threads` threads (default every usable core)."""
    import onnx

    from tensorplan.forkmap import default_workers

    from tensorplan.ir.reference import default_tolerance, random_feeds, rel_error, run_reference
    from tensorplan.ir.to_onnx import run_onnxruntime

    tol = default_tolerance(graph) if tol is None else tol
    feeds = random_feeds(graph, seed)
    ref = run_reference(graph, feeds)
    model = onnx_model if onnx_model is not None else graph
    if not isinstance(model, (Graph, onnx.ModelProto)):
        model = onnx.load(str(model))
    ort_out = run_onnxruntime(model, feeds, threads=int(threads or default_workers()))
    errors = {o: rel_error(ref[o], ort_out[o]) for o in graph.outputs}
    worst = max(errors.values()) if errors else 0.0
    return {"rel_errors": errors, "max_rel_error": worst, "tolerance": tol,
            "passed": bool(worst <= tol), "seed": seed}
