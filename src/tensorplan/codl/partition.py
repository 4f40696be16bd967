"""CoDL co-execution planning: partition geometry, per-operator split, operator chains.

Each partitionable operator (Conv2d, pooling, fully connected) is split between a
"GPU" side (the processor that owns the tensors' home layout) and a "CPU" side,
along the output height (H, with a halo of K−S input rows) or the output channels
(OC, rounded to the processor's channel block), with GPU share ρ ∈ {0, 0.1, …, 1}.
Consecutive H-split operators can form a *chain*: one ρ for all, data shared only at
the head (in) and tail (out), halos propagated backwards.

Searches: per-op grid (2 × 11), the paper's greedy chain search with a correct chain
cost, dynamic programming over chain boundaries (optimal for additive segment costs)
and a literal exhaustive enumeration for ≤ 12 operators (the oracle).
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from tensorplan.errors import PlanError, TensorplanError
from tensorplan.ir.graph import Graph, Node
from tensorplan.codl.predictor import OpShape, SharingModel

RATIOS = tuple(i / 10 for i in range(11))
DIMS = ("H", "OC")
MAX_CHAIN = 30          # CoDL's kMaxChainLength
EXHAUSTIVE_MAX_OPS = 12

# --------------------------------------------------------------------------------------
# Geometry
# --------------------------------------------------------------------------------------


def gpu_rows(oh: int, ratio: float) -> int:
    """GPU output rows ``ceil(OH·ρ)`` with ρ on the 0.1 grid (CoDL's integer ×10 trick)."""
    r10 = int(round(ratio * 10))
    if not 0 <= r10 <= 10:
        raise TensorplanError(f"GPU ratio {ratio} is outside [0, 1]")
    return -(-oh * r10 // 10)


@dataclass(frozen=True)
class RowRange:
    """Output rows [o0, o1) of one side and the unpadded input rows [r0, r1) they need,
    with the zero/-inf rows to add on top and bottom (the original pads that fall inside)."""

    o0: int
    o1: int
    r0: int
    r1: int
    pad_top: int
    pad_bot: int

    @property
    def out_rows(self) -> int:
        return self.o1 - self.o0

    @property
    def in_rows(self) -> int:
        return self.r1 - self.r0


def input_rows(op: OpShape, o0: int, o1: int) -> RowRange:
    """Input rows needed for output rows [o0, o1): padded rows [o0·S, (o1−1)·S + K)."""
    if not 0 <= o0 < o1 <= op.oh:
        raise PlanError(f"output rows [{o0}, {o1}) outside 0..{op.oh} for {op.short()}")
    lo = o0 * op.s - op.pt
    hi = (o1 - 1) * op.s + op.k - op.pt
    r0, r1 = max(lo, 0), min(hi, op.ih)
    if r1 <= r0:
        raise PlanError(f"output rows [{o0}, {o1}) of {op.short()} read only padding")
    return RowRange(o0, o1, r0, r1, r0 - lo, hi - r1)


def part_shape(op: OpShape, rr: RowRange) -> OpShape:
    """The operator one side actually runs for `rr` (its rows, its pads; W pads kept)."""
    return op.replace(ih=rr.in_rows, pt=rr.pad_top, pb=rr.pad_bot)


def codl_input_height_ok(h: int, k: int, s: int) -> bool:
    """CoDL's `CheckInputHeight` on a padded input part: ``h ≥ K`` and ``(h − K) % S == 0``."""
    return h >= k and (h - k) % s == 0


@dataclass
class Split:
    """One operator split at (dim, ρ): the two parts (None when a side is empty)."""

    op: OpShape
    dim: str
    ratio: float
    gpu: OpShape | None
    cpu: OpShape | None
    gpu_rows: RowRange | None = None
    cpu_rows: RowRange | None = None
    oc_gpu: int = 0  # OC split: output channels [0, oc_gpu) on the GPU side

    @property
    def cpu_in_bytes(self) -> int:
        if self.cpu is None:
            return 0
        return 4 * (self.cpu.ih * self.cpu.iw * self.cpu.ic if self.op.kind != "fc" else self.cpu.ic)

    @property
    def cpu_out_bytes(self) -> int:
        return 0 if self.cpu is None else self.cpu.out_bytes if self.cpu.kind != "fc" else 4 * self.cpu.oc

    def codl_legal(self) -> bool:
        """Whether CoDL's stricter runtime would accept this H split (padded-part heights)."""
        if self.dim != "H" or self.cpu is None or self.gpu is None:
            return True
        hp = self.op.ih + self.op.pt + self.op.pb
        g = self.gpu_rows.o1
        return (codl_input_height_ok((g - 1) * self.op.s + self.op.k, self.op.k, self.op.s)
                and codl_input_height_ok(hp - g * self.op.s, self.op.k, self.op.s))


def h_split(op: OpShape, ratio: float) -> Split:
    """Split along output height: GPU rows [0, g), CPU rows [g, OH); inputs overlap by K−S."""
    if op.kind == "fc":
        raise PlanError(f"{op.short()}: fully connected layers split only along OC")
    g = gpu_rows(op.oh, ratio)
    gr = input_rows(op, 0, g) if g > 0 else None
    cr = input_rows(op, g, op.oh) if g < op.oh else None
    return Split(op, "H", ratio, part_shape(op, gr) if gr else None, part_shape(op, cr) if cr else None,
                 gr, cr)


def oc_split(op: OpShape, ratio: float, cblk: int = 4) -> Split:
    """Split along output channels: GPU gets ``roundup(OC·ρ, cblk)`` (GPU-only if that
    reaches OC), both sides read the whole input; weights are pre-sliced per side."""
    r10 = int(round(ratio * 10))
    want = -(-op.oc * r10 // 10)
    ocg = min(-(-want // cblk) * cblk, op.oc) if want > 0 else 0
    def part(c: int) -> OpShape:
        if op.per_channel:  # pooling / depthwise: each side reads only its channels
            return op.replace(oc=c, ic=c, g=c if op.g > 1 else 1)
        return op.replace(oc=c)
    gpu = part(ocg) if ocg > 0 else None
    cpu = part(op.oc - ocg) if ocg < op.oc else None
    return Split(op, "OC", ratio, gpu, cpu, oc_gpu=ocg)


def split(op: OpShape, dim: str, ratio: float, cblk: int = 4) -> Split:
    if dim == "H":
        return h_split(op, ratio)
    if dim == "OC":
        return oc_split(op, ratio, cblk)
    raise TensorplanError(f"partition dimension must be 'H' or 'OC', got {dim!r}")


def dims_for(op: OpShape) -> tuple[str, ...]:
    return ("OC",) if op.kind == "fc" else DIMS


def chain_rows(ops: Sequence[OpShape], ratio: float) -> tuple[list[RowRange | None], list[RowRange | None]]:
    """Per-op row ranges of a chain split at the tail's ``ceil(OH·ρ)``, propagated backwards:
    each op's output rows are the next op's input rows (halos grow towards the head)."""
    for a, b in zip(ops, ops[1:]):
        if a.oh != b.ih or a.ow != b.iw or a.oc != b.ic:
            raise PlanError(f"chain break: {a.short()} output {a.oh}x{a.ow}x{a.oc} != {b.short()} input")
    tail = ops[-1]
    g = gpu_rows(tail.oh, ratio)
    sides = []
    for o0, o1 in ((0, g), (g, tail.oh)):
        if o1 <= o0:
            sides.append([None] * len(ops))
            continue
        rr: list[RowRange | None] = [None] * len(ops)
        for i in range(len(ops) - 1, -1, -1):
            rr[i] = input_rows(ops[i], o0, o1)
            o0, o1 = rr[i].r0, rr[i].r1
        sides.append(rr)
    return sides[0], sides[1]


def halo_rows(ops: Sequence[OpShape], ratio: float) -> int:
    """Extra input rows both sides read at the chain head (recomputed overlap)."""
    g, c = chain_rows(ops, ratio)
    if g[0] is None or c[0] is None:
        return 0
    return g[0].r1 - c[0].r0


# --------------------------------------------------------------------------------------
# Extraction of partitionable operators from a Graph
# --------------------------------------------------------------------------------------

EPILOGUE_UNARY = {"Relu", "LeakyRelu", "Sigmoid", "Clip", "HardSigmoid", "HardSwish", "Tanh", "Elu",
                  "Selu", "Softplus", "Identity", "BatchNormalization", "PRelu"}
EPILOGUE_BINARY = {"Add", "Mul", "Sub", "Div"}


@dataclass
class CoOp:
    """A partitionable operator in the graph with the elementwise epilogue fused into it."""

    index: int
    node: Node
    shape: OpShape
    input: str
    output: str                       # tensor after the epilogue
    epilogue: list[Node] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.node.name


def _const(graph: Graph, name: str) -> np.ndarray | None:
    t = graph.tensors.get(name)
    return None if t is None else t.data


def _is_rowlocal_epilogue(graph: Graph, n: Node, x: str) -> bool:
    """An elementwise op whose other operands are constants broadcast per channel."""
    if n.op in EPILOGUE_UNARY:
        return all(i == x or not i or _const(graph, i) is not None for i in n.inputs)
    if n.op in EPILOGUE_BINARY and len(n.inputs) == 2:
        other = n.inputs[1] if n.inputs[0] == x else n.inputs[0]
        c = _const(graph, other)
        if c is None:
            return False
        shp = tuple(c.shape)
        return c.size == 1 or (len(shp) >= 3 and shp[-1] == 1 and shp[-2] == 1)
    return False


def _op_shape(graph: Graph, n: Node) -> OpShape | None:
    a = n.attrs
    x = graph.tensors.get(n.inputs[0]) if n.inputs else None
    if x is None or len(x.shape) not in (2, 4) or x.shape[0] != 1:
        return None
    if n.op in ("Conv", "MaxPool", "AveragePool"):
        if len(x.shape) != 4 or a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", "VALID"):
            return None
        _, c, h, w = x.shape
        ks = list(a.get("kernel_shape") or [])
        if n.op == "Conv":
            wt = graph.tensors.get(n.inputs[1])
            if wt is None or wt.data is None:
                return None
            ks = ks or list(wt.shape[2:])
            grp = int(a.get("group", 1))
            if (grp != 1 and not (grp == c == wt.shape[0])) or any(int(d) != 1 for d in a.get("dilations", [1, 1])):
                return None
        st = list(a.get("strides") or [1, 1])
        pads = list(a.get("pads") or [0, 0, 0, 0])
        if len(ks) != 2 or ks[0] != ks[1] or st[0] != st[1]:
            return None
        if n.op != "Conv" and int(a.get("ceil_mode", 0)) == 1:
            return None
        if n.op == "AveragePool" and any(pads) and not int(a.get("count_include_pad", 0)):
            return None
        oc = graph.tensors[n.inputs[1]].shape[0] if n.op == "Conv" else c
        try:
            return OpShape("conv" if n.op == "Conv" else "pool", h, w, c, oc, int(ks[0]), int(st[0]),
                           int(pads[0]), int(pads[2]), int(pads[1]), int(pads[3]),
                           "max" if n.op == "MaxPool" else "avg", grp if n.op == "Conv" else 1)
        except TensorplanError:
            return None
    if n.op in ("Gemm", "MatMul") and len(x.shape) == 2 and len(n.inputs) >= 2:
        wt = graph.tensors.get(n.inputs[1])
        if wt is None or wt.data is None or wt.data.ndim != 2:
            return None
        if n.op == "Gemm" and (float(a.get("alpha", 1.0)) != 1.0 or float(a.get("beta", 1.0)) != 1.0
                               or int(a.get("transA", 0))):
            return None
        trans_b = int(a.get("transB", 0)) if n.op == "Gemm" else 0
        oc = wt.shape[0] if trans_b else wt.shape[1]
        return OpShape("fc", 1, 1, x.shape[1], int(oc))
    return None


def extract_ops(graph: Graph) -> list[CoOp]:
    """Partitionable operators in dataflow order, each with its fused row-local epilogue."""
    cons = graph.consumers()
    ops: list[CoOp] = []
    for n in graph.nodes:
        shp = _op_shape(graph, n)
        if shp is None:
            continue
        out, epi = n.outputs[0], []
        while out not in graph.outputs and len(cons.get(out, [])) == 1:
            nxt = cons[out][0]
            if not _is_rowlocal_epilogue(graph, nxt, out):
                break
            epi.append(nxt)
            out = nxt.outputs[0]
        ops.append(CoOp(len(ops), n, shp, n.inputs[0], out, epi))
    return ops


def chain_links(graph: Graph, ops: Sequence[CoOp]) -> list[bool]:
    """links[i]: ops[i] and ops[i+1] may share a chain."""
    cons = graph.consumers()

    def ok(a: CoOp, b: CoOp) -> bool:
        if a.shape.kind == "fc" or b.shape.kind == "fc":
            return False
        c = cons.get(a.output, [])
        return (b.input == a.output and len(c) == 1 and c[0] is b.node and a.output not in graph.outputs
                and a.shape.oh == b.shape.ih and a.shape.ow == b.shape.iw and a.shape.oc == b.shape.ic)
    return [ok(a, b) for a, b in zip(ops, ops[1:])]


# --------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------


class KernelPredictor(Protocol):
    def kernel_time(self, op: OpShape, proc: str) -> float: ...


@dataclass
class Breakdown:
    """Predicted components of one segment (op or chain), seconds."""

    share_in: float = 0.0
    share_out: float = 0.0
    sync: float = 0.0
    cpu: float = 0.0
    gpu: float = 0.0
    total: float = 0.0
    cpu_ops: list[float] = field(default_factory=list)
    gpu_ops: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("share_in", "share_out", "sync", "cpu", "gpu", "total")}


class CoexecCost:
    """Co-execution latency of a split op or chain from a kernel predictor and a sharing model.

    composition:
      * "overlap" — our executors: the GPU side starts at once; the CPU side maps and
        transforms its slice, computes, transforms and maps back; one sync.
        ``T = sync + max(gpu, share_in + cpu + share_out)``; in chains each side runs its
        ops back to back: max of sums.
      * "codl" — the paper (sharing on the GPU queue before both sides start):
        ``T = share_in + sync + max(cpu, gpu) + share_out``; chains: head pays share_in + sync,
        tail pays share_out, each op adds max(cpu_i, gpu_i).
    """

    def __init__(self, predictor: KernelPredictor, sharing: SharingModel, cpu: str = "cpu",
                 gpu: str = "cpu2", cblk: int = 16, composition: str = "overlap"):
        if composition not in ("overlap", "codl"):
            raise TensorplanError(f"composition must be 'overlap' or 'codl', got {composition!r}")
        self.predictor, self.sharing = predictor, sharing
        self.cpu, self.gpu, self.cblk, self.composition = cpu, gpu, cblk, composition
        self._cache: dict[Any, Breakdown] = {}
        self.calls = 0

    def _kt(self, op: OpShape | None, proc: str) -> float:
        if op is None:
            return 0.0
        key = (op, proc)
        hit = self._cache.get(key)
        if hit is None:
            self.calls += 1
            hit = self.predictor.kernel_time(op, proc)
            self._cache[key] = hit
        return hit

    def _share(self, in_bytes: int, out_bytes: int) -> tuple[float, float]:
        s = self.sharing
        return (s.time("map_in", in_bytes) + s.time("trans_in", in_bytes),
                s.time("trans_out", out_bytes) + s.time("map_out", out_bytes))

    def _compose(self, b: Breakdown, has_cpu: bool, has_gpu: bool, per_op_max: float | None = None) -> Breakdown:
        if self.composition == "overlap":
            b.sync = self.sharing.sync_s if has_gpu else 0.0
            b.total = b.sync + max(b.gpu, b.share_in + b.cpu + b.share_out)
        else:
            b.sync = self.sharing.sync_s if has_cpu else 0.0
            body = per_op_max if per_op_max is not None else max(b.cpu, b.gpu)
            b.total = b.share_in + b.sync + body + b.share_out
        return b

    def op_cost(self, op: OpShape, dim: str, ratio: float) -> Breakdown:
        sp = split(op, dim, ratio, self.cblk)
        b = Breakdown()
        b.cpu, b.gpu = self._kt(sp.cpu, self.cpu), self._kt(sp.gpu, self.gpu)
        b.cpu_ops, b.gpu_ops = [b.cpu], [b.gpu]
        if sp.cpu is not None:
            b.share_in, b.share_out = self._share(sp.cpu_in_bytes, sp.cpu_out_bytes)
        return self._compose(b, sp.cpu is not None, sp.gpu is not None)

    def chain_cost(self, ops: Sequence[OpShape], ratio: float) -> Breakdown:
        if len(ops) == 1:
            return self.op_cost(ops[0], "H", ratio)
        g, c = chain_rows(ops, ratio)
        b = Breakdown()
        b.gpu_ops = [self._kt(part_shape(o, r), self.gpu) if r else 0.0 for o, r in zip(ops, g)]
        b.cpu_ops = [self._kt(part_shape(o, r), self.cpu) if r else 0.0 for o, r in zip(ops, c)]
        b.cpu, b.gpu = sum(b.cpu_ops), sum(b.gpu_ops)
        has_cpu = c[0] is not None
        if has_cpu:
            head, tail = ops[0], ops[-1]
            b.share_in, b.share_out = self._share(4 * c[0].in_rows * head.iw * head.ic,
                                                  4 * c[-1].out_rows * tail.ow * tail.oc)
        per_op = sum(max(x, y) for x, y in zip(b.cpu_ops, b.gpu_ops))
        return self._compose(b, has_cpu, g[0] is not None, per_op)

    def best_op(self, op: OpShape, dims: Sequence[str] | None = None) -> tuple[str, float, Breakdown]:
        """The (dim, ρ) with the lowest predicted latency over the 2 × 11 grid; (OC, 1) → (H, 1)."""
        best = None
        for dim in dims or dims_for(op):
            if dim not in dims_for(op):
                continue
            for r in RATIOS:
                b = self.op_cost(op, dim, r)
                if best is None or b.total < best[2].total - 1e-12:
                    best = (dim, r, b)
        if best is None:
            raise PlanError(f"{op.short()}: no legal partition among dims {dims}")
        dim, r, b = best
        if r == 1.0 and op.kind != "fc":
            dim = "H"
        return dim, r, b


# --------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------


@dataclass
class Segment:
    """Ops [start, end) run as one unit: a single op (any dim) or an H chain with one ρ."""

    start: int
    end: int
    dim: str
    ratio: float
    cost: Breakdown

    @property
    def length(self) -> int:
        return self.end - self.start

    def to_dict(self) -> dict:
        return {"ops": [self.start, self.end], "dim": self.dim, "ratio": self.ratio,
                "predicted": self.cost.to_dict()}


@dataclass
class CoexecPlan:
    segments: list[Segment]
    method: str
    search_s: float = 0.0
    predictor_calls: int = 0

    @property
    def total(self) -> float:
        return sum(s.cost.total for s in self.segments)

    def chained_ops(self) -> int:
        return sum(s.length for s in self.segments if s.length > 1)

    def to_dict(self) -> dict:
        dims = [s.dim for s in self.segments for _ in range(s.length)]
        return {"schema": 1, "method": self.method, "predicted_total_s": self.total,
                "search_s": self.search_s, "predictor_calls": self.predictor_calls,
                "n_ops": sum(s.length for s in self.segments), "chained_ops": self.chained_ops(),
                "dim_share": {d: dims.count(d) / max(len(dims), 1) for d in DIMS},
                "segments": [s.to_dict() for s in self.segments]}


def _singles(shapes: Sequence[OpShape], cost: CoexecCost, dims: Sequence[str] | None) -> list[Segment]:
    out = []
    for i, op in enumerate(shapes):
        d, r, b = cost.best_op(op, dims)
        out.append(Segment(i, i + 1, d, r, b))
    return out


def _best_chain(shapes, cost: CoexecCost, i: int, j: int, ratios=RATIOS) -> Segment:
    best = None
    for r in ratios:
        b = cost.chain_cost(shapes[i:j], r)
        if best is None or b.total < best.cost.total - 1e-12:
            best = Segment(i, j, "H", r, b)
    return best


def _fixed(shapes, cost, dims, fixed_ratio) -> list[Segment]:
    return [Segment(i, i + 1, dims[0] if op.kind != "fc" else "OC", fixed_ratio,
                    cost.op_cost(op, dims[0] if op.kind != "fc" else "OC", fixed_ratio))
            for i, op in enumerate(shapes)]


def plan_ops(shapes: Sequence[OpShape], cost: CoexecCost, links: Sequence[bool] | None = None,
             method: str = "greedy", dims: Sequence[str] | None = None, delta: float = 0.3) -> CoexecPlan:
    """Plan a sequence of partitionable ops.

    method: "none" (per-op best split), "greedy" (paper Algorithm 1 with a correct chain
    cost), "dp" (optimal chain boundaries), "exhaustive" (literal enumeration, ≤ 12 ops),
    "cpu" / "gpu" (single processor)."""
    shapes = list(shapes)
    links = list(links) if links is not None else [True] * max(len(shapes) - 1, 0)
    if len(links) != max(len(shapes) - 1, 0):
        raise PlanError(f"links has {len(links)} entries for {len(shapes)} ops")
    for k, (a, b) in enumerate(zip(shapes, shapes[1:])):
        if links[k] and (a.kind == "fc" or b.kind == "fc" or a.oh != b.ih or a.oc != b.ic):
            links[k] = False
    calls0 = cost.calls
    t0 = time.perf_counter()
    if method == "cpu":
        segs = _fixed(shapes, cost, ("H",), 0.0)
    elif method == "gpu":
        segs = _fixed(shapes, cost, ("H",), 1.0)
    elif method == "none":
        segs = _singles(shapes, cost, dims)
    elif method == "greedy":
        segs = _greedy(shapes, cost, links, dims, delta)
    elif method == "dp":
        segs = _dp(shapes, cost, links, dims)
    elif method == "exhaustive":
        segs = _exhaustive(shapes, cost, links, dims)
    else:
        raise TensorplanError(f"unknown chain search method {method!r}; use none|greedy|dp|exhaustive|cpu|gpu")
    return CoexecPlan(segs, method, time.perf_counter() - t0, cost.calls - calls0)


def _greedy(shapes, cost, links, dims, delta) -> list[Segment]:
    """Paper Algorithm 1: from each head, try ρ in [ρ_h − δ, ρ_h + δ], extend the chain
    while the gain over the per-op plan stays ≥ 0 (and ≤ 30 ops); keep the max-gain chain."""
    singles = _singles(shapes, cost, dims)
    segs: list[Segment] = []
    i, n = 0, len(shapes)
    while i < n:
        head = singles[i]
        best: Segment | None = None
        best_gain = 0.0
        lo, hi = head.ratio - delta - 1e-9, head.ratio + delta + 1e-9
        for r in [x for x in RATIOS if lo <= x <= hi]:
            j, no_chain = i + 1, head.cost.total
            while j < n and links[j - 1] and j - i < MAX_CHAIN:
                no_chain += singles[j].cost.total
                b = cost.chain_cost(shapes[i:j + 1], r)
                gain = no_chain - b.total
                if gain < 0:
                    break
                j += 1
                if gain > best_gain + 1e-12 or (best is not None and abs(gain - best_gain) <= 1e-12
                                                 and j - i > best.length):
                    best, best_gain = Segment(i, j, "H", r, b), gain
        if best is None:
            segs.append(head)
            i += 1
        else:
            segs.append(best)
            i = best.end
    return segs


def _segment_options(shapes, cost, links, dims, i, j, singles) -> Segment | None:
    if j - i == 1:
        return singles[i]
    if not all(links[i:j - 1]) or j - i > MAX_CHAIN:
        return None
    return _best_chain(shapes, cost, i, j)


def _dp(shapes, cost, links, dims) -> list[Segment]:
    singles = _singles(shapes, cost, dims)
    n = len(shapes)
    best = [0.0] + [math.inf] * n
    back: list[Segment | None] = [None] * (n + 1)
    for j in range(1, n + 1):
        for i in range(max(0, j - MAX_CHAIN), j):
            if best[i] == math.inf:
                continue
            seg = _segment_options(shapes, cost, links, dims, i, j, singles)
            if seg is not None and best[i] + seg.cost.total < best[j] - 1e-12:
                best[j], back[j] = best[i] + seg.cost.total, seg
    segs, j = [], n
    while j > 0:
        segs.append(back[j])
        j = back[j].start
    return segs[::-1]


def _exhaustive(shapes, cost, links, dims) -> list[Segment]:
    """Every composition of the op sequence into consecutive segments (2^(N−1)), each chain
    at every ρ and each singleton at every (dim, ρ): the ground-truth oracle."""
    n = len(shapes)
    if n > EXHAUSTIVE_MAX_OPS:
        raise PlanError(f"exhaustive chain search is limited to {EXHAUSTIVE_MAX_OPS} ops, got {n}; "
                        "use method='dp' (same optimum) or 'greedy'")
    singles = _singles(shapes, cost, dims)
    seg_cache: dict[tuple[int, int], Segment | None] = {}
    best_total, best_segs = math.inf, None
    for cuts in itertools.product((False, True), repeat=max(n - 1, 0)):
        bounds = [0] + [k + 1 for k, c in enumerate(cuts) if c] + [n]
        segs, total = [], 0.0
        for a, b in zip(bounds, bounds[1:]):
            if (a, b) not in seg_cache:
                seg_cache[(a, b)] = _segment_options(shapes, cost, links, dims, a, b, singles)
            s = seg_cache[(a, b)]
            if s is None:
                break
            segs.append(s)
            total += s.cost.total
        else:
            if total < best_total - 1e-12:
                best_total, best_segs = total, segs
    return best_segs


def plan_graph(graph: Graph, cost: CoexecCost, method: str = "greedy", dims: Sequence[str] | None = None
               ) -> tuple[list[CoOp], CoexecPlan]:
    """Extract the partitionable ops of `graph` and plan them."""
    ops = extract_ops(graph)
    if not ops:
        raise PlanError(f"graph '{graph.name}' has no partitionable Conv/Pool/FC operator at batch 1")
    return ops, plan_ops([o.shape for o in ops], cost, chain_links(graph, ops), method, dims)


def regret(plan: CoexecPlan, oracle: CoexecPlan) -> float:
    """Relative excess predicted latency of `plan` over `oracle` (0 = optimal)."""
    return plan.total / oracle.total - 1.0


# --------------------------------------------------------------------------------------
# Training sweep (what CoDL measures per op shape)
# --------------------------------------------------------------------------------------


def model_shapes(models: Sequence[str]) -> list[tuple[str, OpShape]]:
    """Unique partitionable op shapes of the models (the first model that has it names it)."""
    from tensorplan.zoo.specs import load_model

    seen: dict[OpShape, str] = {}
    for m in models:
        for op in extract_ops(load_model(m)):
            seen.setdefault(op.shape, m)
    return [(m, s) for s, m in seen.items()]


def sweep_parts(op: OpShape, cblk: int = 16, gpu: str = "cpu2", cpu: str = "cpu"
                ) -> list[tuple[str, str, float, OpShape]]:
    """(proc, dim, ρ, part): the GPU part at ρ ∈ 0.1..1 and the CPU part at ρ ∈ 0..0.9 for
    each dim, each run alone (CoDL's sweep); duplicate (proc, part) pairs removed."""
    out, seen = [], set()
    for dim in dims_for(op):
        for r in RATIOS:
            sp = split(op, dim, r, cblk)
            for proc, part in ((gpu, sp.gpu), (cpu, sp.cpu)):
                if part is not None and (proc, part) not in seen:
                    seen.add((proc, part))
                    out.append((proc, dim, r, part))
    return out


def sweep_items(models: Sequence[str], cblk: int = 16) -> list[tuple[str, OpShape, str, str, float, OpShape]]:
    """(model, full op, proc, dim, ρ, part) for every op shape of the models."""
    return [(m, op, proc, dim, r, part) for m, op in model_shapes(models)
            for proc, dim, r, part in sweep_parts(op, cblk)]
