"""Candidate kernels: convex, single-output sub-graphs of the primitive graph (Korch §2).

Why convex + single output: a kernel then depends on all of its inputs through its
one output, so any set of chosen kernels is automatically acyclic and the BLP needs
no ordering constraints. Internal tensors that other kernels also need are *not*
outputs: some other chosen kernel must produce them (that is recomputation).

Enumeration (output-sensitive, no O(states^2) pair loop): for every sink `v`,
the candidates with sink `v` are the up-sets of `anc*(v)` that contain `v`.
They are grown backwards from `{v}`: a predecessor `p` may join once every
consumer of `p` inside `anc*(v)` is already in the set. Sets are deduplicated by
node set, capped in size (`max_nodes`) and in reductions (`max_reduces`).

Linear primitives (MatMul, Conv, ...) and opaque nodes never join memory-bound
kernels (Korch's rule), so the graph splits automatically into independent
memory-bound regions between them — no manual cut points. With
`linear_epilogue=True`, a linear primitive may additionally take a chain of
elementwise consumers (bias add, activation, residual add) as one kernel.

`Candidate.canonical_hash` identifies the *computation* (ops, attributes, shapes,
internal wiring, small constant values) independently of tensor/node names, so the
12 identical BERT layers share one measurement.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.korch.fission import category
from tensorplan.ir.graph import Graph

#: Integer constants with at most this many elements (shapes, axes, indices, pads) and float
#: scalars (eps, exponents) are hashed by value; float tensors (weights, biases, LayerNorm
#: scales) only by shape/dtype, since latency does not depend on their values. So equal hashes
#: mean equal *latency*, not equal constants: a compiled-kernel cache keyed by the hash must
#: pass float constants as arguments (or add their values to the key).
SMALL_CONST = 64


@dataclass(frozen=True)
class Candidate:
    """One candidate kernel over the primitive graph.

    - `id`: index in the list returned by `enumerate_candidates` (stable for a given graph+options).
    - `nodes`: primitive node names, in the primitive graph's topological order.
    - `inputs`: non-constant tensors it reads that it does not produce (graph inputs or other
      kernels' outputs), in order of first use. Constants (weights) are not listed.
    - `output`: the single output tensor (the sink's output). `outputs` equals `(output,)`
      except for an opaque multi-output primitive, which produces all its live outputs.
    - `kind`: "memory" (elementwise/reduce/layout only), "linear" (contains one linear
      primitive, alone or with an elementwise epilogue), "opaque" (one opaque primitive) or
      "region" (a stretch of original operators run by one ONNX Runtime session; regions.py).
    - `canonical_hash`: name-independent structural hash; equal hashes = same computation up to
      the values of float weight tensors (so equal latency; see SMALL_CONST).
    """

    id: int
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    output: str
    kind: str
    canonical_hash: str
    outputs: tuple[str, ...] = ()
    const_inputs: tuple[str, ...] = ()
    region: int = -1
    #: kind "region" only (korch/regions.py): the original operators ONNX Runtime runs, and the
    #: [start, end) segment interval they span.
    source: Graph | None = field(default=None, compare=False, repr=False)
    span: tuple[int, int] | None = None

    def __post_init__(self):
        if not self.outputs:
            object.__setattr__(self, "outputs", (self.output,))

    @property
    def size(self) -> int:
        return len(self.nodes)

    def graph(self, prim: Graph) -> Graph:
        """The candidate as a standalone Graph (inputs = `inputs`, outputs = `outputs`), ready for
        `graph_to_onnx`, lowering or the reference executor. A region candidate gives its
        original operators (a copy of `source`), which is what runs."""
        if self.source is not None:
            return self.source.copy()
        g = prim.subgraph(self.nodes, name=f"{prim.name}.k{self.id}")
        g.inputs = list(self.inputs)
        g.outputs = list(self.outputs)
        return g

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "nodes": list(self.nodes), "inputs": list(self.inputs),
                "output": self.output, "outputs": list(self.outputs), "kind": self.kind,
                "canonical_hash": self.canonical_hash, "const_inputs": list(self.const_inputs),
                "region": self.region, **({"span": list(self.span)} if self.span else {})}


@dataclass
class EnumerationStats:
    """Counts reported by `enumerate_candidates` (filled in place when passed)."""

    primitives: int = 0
    linear: int = 0
    opaque: int = 0
    regions: int = 0
    largest_region: int = 0
    candidates: int = 0
    unique_hashes: int = 0
    truncated_sinks: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ---------------------------------------------------------------------------------------------
# canonical hashing
# ---------------------------------------------------------------------------------------------

def _val(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        if v.size <= SMALL_CONST:
            return ["nd", str(v.dtype), list(v.shape), v.ravel().tolist()]
        return ["nd", str(v.dtype), list(v.shape), hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()[:12]]
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (list, tuple)):
        return [_val(x) for x in v]
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


def canonical_hash(prim: Graph, nodes: list[str] | tuple[str, ...], outputs: tuple[str, ...] | None = None) -> str:
    """Hash of the computation of `nodes` with tensors renamed canonically.

    Covers: op types and attributes in topological order, the internal wiring, input shapes
    and dtypes, which inputs are constants (and the values of small constants), the outputs."""
    byname = {n.name: n for n in prim.nodes}
    ns = [byname[x] for x in nodes]
    names: dict[str, str] = {}
    produced = {o for n in ns for o in n.outputs if o}
    parts: list[Any] = []
    for n in ns:
        ins = []
        for i in n.inputs:
            if not i:
                ins.append(None)
                continue
            if i not in names:
                t = prim.tensors[i]
                if i in produced:
                    raise TensorplanError(f"canonical_hash: '{i}' used before it is produced (nodes not in topological order)")
                if t.is_constant:
                    d = np.asarray(t.data)
                    by_value = d.size <= 1 or (d.dtype.kind in "iub" and d.size <= SMALL_CONST)
                    names[i] = json.dumps(["const", _val(d) if by_value else [str(d.dtype), list(d.shape)]])
                else:
                    names[i] = f"in{sum(1 for v in names.values() if v.startswith('in'))}:{t.dtype}{list(t.shape)}"
            ins.append(names[i])
        outs = []
        for o in n.outputs:
            if o:
                t = prim.tensors[o]
                names[o] = f"t{len(parts)}.{len(outs)}"
                outs.append([t.dtype, list(t.shape)])
            else:
                outs.append(None)
        parts.append([n.op, n.domain, sorted((k, _val(v)) for k, v in n.attrs.items()), ins, outs])
    outs = outputs if outputs is not None else (ns[-1].outputs[0],)
    parts.append(["out", [names.get(o) for o in outs]])
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:20]


# ---------------------------------------------------------------------------------------------
# enumeration
# ---------------------------------------------------------------------------------------------

def _regions(prim: Graph, is_mem: list[bool], preds: list[list[int]]) -> list[int]:
    """Connected components of (graph minus linear/opaque nodes); -1 for non-memory nodes."""
    n = len(prim.nodes)
    parent = list(range(n))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a
    for v in range(n):
        if is_mem[v]:
            for p in preds[v]:
                if is_mem[p]:
                    parent[find(p)] = find(v)
    roots: dict[int, int] = {}
    out = []
    for v in range(n):
        if not is_mem[v]:
            out.append(-1)
            continue
        out.append(roots.setdefault(find(v), len(roots)))
    return out


def enumerate_candidates(prim: Graph, max_nodes: int = 8, *, max_reduces: int | None = 2,
                         linear_epilogue: bool = False, max_epilogue: int = 3,
                         max_per_sink: int = 5000, opaque: set[str] | None = None,
                         stats: EnumerationStats | None = None) -> list[Candidate]:
    """All candidate kernels of the primitive graph (see module docstring).

    - `max_nodes`: size cap per memory-bound candidate (korch.md suggests 8–16).
    - `max_reduces`: at most this many reduce-category primitives per kernel (None: no cap);
      Relay/TVM-style codegen does not fuse across many reductions anyway.
    - `linear_epilogue`: also emit linear primitive + up to `max_epilogue` elementwise consumers.
    - `max_per_sink`: safety valve against exponential blow-up on very branchy regions; sinks
      that hit it are listed in `stats.truncated_sinks` (the singletons are always present).
    - `opaque`: node names to treat as opaque even if their op has a category (from fission).
    """
    import time
    t0 = time.perf_counter()
    nodes = prim.nodes
    N = len(nodes)
    idx = {n.name: k for k, n in enumerate(nodes)}
    prod: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for o in n.outputs:
            if o:
                prod[o] = k
    preds: list[list[int]] = [sorted({prod[i] for i in n.inputs if i in prod}) for n in nodes]
    succs: list[list[int]] = [[] for _ in range(N)]
    for v in range(N):
        for p in preds[v]:
            if p > v:
                raise TensorplanError(f"enumerate_candidates: graph '{prim.name}' is not topologically sorted "
                                      f"(node '{nodes[v].name}')")
            succs[p].append(v)
    opaque = set(opaque or ())
    cat = []
    for n in nodes:
        c = category(n.op)
        live = [o for o in n.outputs if o]
        if n.name in opaque or len(live) > 1 or n.domain not in ("", "ai.onnx"):
            c = "opaque"
        cat.append(c)
    is_mem = [c in ("elementwise", "reduce", "layout") for c in cat]
    is_red = [c == "reduce" for c in cat]
    region = _regions(prim, is_mem, preds)

    # ancestors (incl. self) and consumer masks as Python-int bitsets
    anc = [0] * N
    for v in range(N):
        m = 1 << v
        for p in preds[v]:
            m |= anc[p]
        anc[v] = m
    cons_mask = [0] * N
    for v in range(N):
        m = 0
        for s in succs[v]:
            m |= 1 << s
        cons_mask[v] = m

    constants = prim.constants()
    seen_sets: set[frozenset[int]] = set()
    result: list[Candidate] = []
    hashes: dict[tuple, str] = {}
    st = stats if stats is not None else EnumerationStats()

    def emit(members: list[int], kind: str, reg: int) -> None:
        members = sorted(members)
        fs = frozenset(members)
        if fs in seen_sets:
            return
        seen_sets.add(fs)
        names = tuple(nodes[k].name for k in members)
        inside = {o for k in members for o in nodes[k].outputs if o}
        ins: list[str] = []
        cins: list[str] = []
        for k in members:
            for i in nodes[k].inputs:
                if not i or i in inside:
                    continue
                if i in constants:
                    if i not in cins:
                        cins.append(i)
                elif i not in ins:
                    ins.append(i)
        sink = members[-1]
        outs = tuple(o for o in nodes[sink].outputs if o)
        h = canonical_hash(prim, names, outs)
        result.append(Candidate(len(result), names, tuple(ins), outs[0], kind, h, outs, tuple(cins), reg))

    for v in range(N):
        if not is_mem[v]:
            emit([v], "linear" if cat[v] == "linear" else "opaque", -1)
            if cat[v] == "linear" and linear_epilogue:
                _epilogues(v, nodes, succs, preds, cat, max_epilogue, prod, prim, emit)
            continue
        # memory sink: grow up-sets of anc*(v) backwards
        av = anc[v]
        start = 1 << v
        stack = [(start, 1, int(is_red[v]))]
        local: set[int] = {start}
        count = 0
        while stack:
            mask, size, nred = stack.pop()
            members = [k for k in _bits(mask)]
            emit(members, "memory", region[v])
            count += 1
            if count >= max_per_sink:
                st.truncated_sinks.append(nodes[v].name)
                break
            if size >= max_nodes:
                continue
            # frontier: memory predecessors of members, all of whose consumers in anc*(v) are in mask
            frontier = set()
            for k in members:
                for p in preds[k]:
                    if not (mask >> p) & 1 and is_mem[p]:
                        frontier.add(p)
            for p in frontier:
                if cons_mask[p] & av & ~mask:
                    continue
                r = nred + int(is_red[p])
                if max_reduces is not None and r > max_reduces:
                    continue
                m2 = mask | (1 << p)
                if m2 in local:
                    continue
                local.add(m2)
                stack.append((m2, size + 1, r))

    st.primitives = N
    st.linear = sum(1 for c in cat if c == "linear")
    st.opaque = sum(1 for c in cat if c == "opaque")
    regs = [r for r in region if r >= 0]
    st.regions = len(set(regs))
    st.largest_region = max((regs.count(r) for r in set(regs)), default=0)
    st.candidates = len(result)
    st.unique_hashes = len({c.canonical_hash for c in result})
    st.seconds = time.perf_counter() - t0
    return result


def _bits(mask: int):
    k = 0
    while mask:
        if mask & 1:
            yield k
        mask >>= 1
        k += 1


def _epilogues(v, nodes, succs, preds, cat, max_epilogue, prod, prim, emit) -> None:
    """Linear primitive `v` followed by a chain of elementwise consumers (each the sole consumer
    of the previous tensor, so the set stays convex and single-output)."""
    chain = [v]
    cur = v
    for _ in range(max_epilogue):
        out = [o for o in nodes[cur].outputs if o][0]
        if out in prim.outputs or len(succs[cur]) != 1:
            return
        nxt = succs[cur][0]
        if cat[nxt] != "elementwise":
            return
        # the other operands must not depend on the chain (convexity): they are produced
        # before `v` or are constants/graph inputs; single consumer guarantees no re-entry
        chain.append(nxt)
        emit(list(chain), "linear", -1)
        cur = nxt


def candidate_counts(cands: list[Candidate]) -> dict[str, int]:
    """Counts by kind and unique hashes (for reports)."""
    out: dict[str, int] = {"total": len(cands), "unique": len({c.canonical_hash for c in cands})}
    for c in cands:
        out[c.kind] = out.get(c.kind, 0) + 1
    return out
