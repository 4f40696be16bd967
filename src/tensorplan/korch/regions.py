"""Region candidates: stretches of the *original* model that one ONNX Runtime session runs.

Why: Korch takes, per kernel, the minimum over its profilers. On this CPU the strongest
profiler for convolution and attention chains is ONNX Runtime running several operators
together: inside one session it keeps activations in its blocked NCHWc layout, folds
BatchNorm/bias/activation into the convolution and fuses attention / LayerNorm patterns.
Our single-linear-primitive kernels lose exactly that (each one-Conv session reorders its
input and output), so the BLP also gets multi-operator *region* candidates and picks,
per part of the model, whether ORT's region or the fine-grained fused kernels are faster.

A region is a contiguous interval of the original graph's topological order, so it is
convex by construction (a path leaving and re-entering an interval would have to go
backwards in the order). Intervals are cut at linear operators (`segments`): every region
is a run of `1..max_segments` consecutive segments, plus dyadic runs (2^k aligned
segments) up to the whole model, so long regions exist without O(segments^2) profiling.

The candidate covers the primitives that fission made of its operators (so the BLP's
coverage and dependency constraints are unchanged); its inputs and outputs are tensors
of the primitive graph (fission keeps every original output name). A region whose
boundary tensors do not exist in the primitive graph (e.g. it reads an Expand that
fission removed) is skipped. `Candidate.source` holds the original operators, which
are what is compiled and timed.
"""
from __future__ import annotations

from tensorplan.korch.fission import FissionResult, category
from tensorplan.ir.graph import Graph
from tensorplan.korch.candidates import Candidate, canonical_hash

KIND = "region"


#: Operators that start a segment of their own when a linear operator precedes them in the
#: segment: normalisations and softmax are where our fused TVM kernels beat ONNX Runtime's
#: (bench/korch_kernels.py), so a region may stop right before one and leave it to them.
NORM_OPS = frozenset({"InstanceNormalization", "LayerNormalization", "GroupNormalization", "Softmax",
                      "LogSoftmax"})

#: Quantized (int8) convolutions and matrix products: opaque to fission (ONNX Runtime runs them one
#: by one), but linear operators for cutting regions, so a quantized model gets region candidates
#: (ONNX Runtime fuses their QuantizeLinear/DequantizeLinear neighbours inside a session).
QUANTIZED_LINEAR_OPS = frozenset({"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "QGemm",
                                  "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "QAttention",
                                  "DynamicQuantizeLSTM"})


def is_linear(op: str) -> bool:
    """Whether `op` cuts segments: fission's linear category or a quantized linear operator."""
    return category(op) == "linear" or op in QUANTIZED_LINEAR_OPS


def segments(orig: Graph) -> list[list[str]]:
    """Original node names in topological order, cut before every linear operator and before
    a normalisation/softmax that follows one (`NORM_OPS`); nodes before the first linear
    operator join the first segment."""
    segs: list[list[str]] = []
    cur: list[str] = []
    has_linear = has_norm = False
    for n in orig.nodes:
        lin = is_linear(n.op)
        norm = n.op in NORM_OPS
        if (lin and (has_linear or has_norm)) or (norm and has_linear):
            segs.append(cur)
            cur = []
            has_linear = has_norm = False
        has_linear, has_norm = has_linear or lin, has_norm or norm
        cur.append(n.name)
    if cur:
        segs.append(cur)
    return segs


def intervals(n_segments: int, max_segments: int = 8) -> list[tuple[int, int]]:
    """[start, end) segment intervals: every run of 1..max_segments segments, the dyadic runs
    (length 2^k, aligned to 2^k) beyond that, and the whole model."""
    out: set[tuple[int, int]] = set()
    for s in range(n_segments):
        for ln in range(1, max_segments + 1):
            if s + ln <= n_segments:
                out.add((s, s + ln))
    size = 1
    while size < n_segments:
        size *= 2
        for s in range(0, n_segments, size):
            out.add((s, min(s + size, n_segments)))
    out.add((0, n_segments))
    return sorted(out, key=lambda ab: (ab[1] - ab[0], ab[0]))


def enumerate_regions(orig: Graph, fr: FissionResult, start_id: int, max_segments: int = 8,
                      min_linear: int = 1) -> list[Candidate]:
    """Region candidates (kind "region") for the BLP, ids from `start_id` on (see module docstring).

    Only regions with at least `min_linear` linear operators and more than one primitive are
    emitted: others add nothing the fine-grained candidates lack."""
    prim = fr.graph
    oby = {n.name: n for n in orig.nodes}
    pby = {n.name: n for n in prim.nodes}
    by_origin: dict[str, list[str]] = {}
    for p, o in fr.origin.items():
        by_origin.setdefault(o, []).append(p)
    ppos = {n.name: k for k, n in enumerate(prim.nodes)}
    pconsumers = prim.consumers()
    pconst = prim.constants()
    p_out = set(prim.outputs)
    segs = segments(orig)
    out: list[Candidate] = []
    seen: set[frozenset] = set()
    for a, b in intervals(len(segs), max_segments):
        onodes = [x for s in segs[a:b] for x in s]
        if sum(1 for x in onodes if is_linear(oby[x].op)) < min_linear:
            continue
        pnodes = sorted({p for x in onodes for p in by_origin.get(x, ())}, key=ppos.__getitem__)
        key = frozenset(pnodes)
        if len(pnodes) < 2 or key in seen:
            continue
        seen.add(key)
        cand = _region(orig, pby, onodes, pnodes, pconsumers, pconst, p_out, start_id + len(out), (a, b))
        if cand is not None:
            out.append(cand)
    return out


def _region(orig: Graph, pby: dict, onodes: list[str], pnodes: list[str], pconsumers, pconst, p_out: set,
            cid: int, span: tuple[int, int]) -> Candidate | None:
    inside = set(pnodes)
    produced = {o for p in pnodes for o in pby[p].outputs if o}
    ins: list[str] = []
    for p in pnodes:
        for i in pby[p].inputs:
            if i and i not in produced and i not in pconst and i not in ins:
                ins.append(i)
    outs = [o for p in pnodes for o in pby[p].outputs
            if o and (o in p_out or any(c.name not in inside for c in pconsumers.get(o, ())))]
    if not outs:
        return None
    src = orig.subgraph(onodes, name=f"{orig.name}.r{span[0]}_{span[1]}")
    # the original operators must read and write exactly the tensors the primitives do
    if sorted(src.inputs) != sorted(ins) or not set(outs) <= set(src.tensors):
        return None
    src.inputs = list(ins)
    src.outputs = list(outs)
    h = "region:" + canonical_hash(orig, onodes, tuple(outs))
    return Candidate(cid, tuple(pnodes), tuple(ins), outs[0], KIND, h, tuple(outs), (), -1,
                     source=src, span=span)


__all__ = ["KIND", "segments", "intervals", "enumerate_regions"]
