"""The graph IR: static-shape tensors and nodes in topological order.

Everything downstream (fission, candidates, plans, executors) works on this
plain data; it knows nothing of ONNX or TVM. Attributes are plain Python
values (int, float, str, list, numpy array).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from tensorplan.errors import TensorplanError

DTYPE_SIZES = {"float32": 4, "float16": 2, "float64": 8, "int64": 8, "int32": 4, "int8": 1,
               "uint8": 1, "bool": 1, "bfloat16": 2}


@dataclass
class Tensor:
    """A value in the graph: a static shape, a dtype and, for constants, its data."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    data: np.ndarray | None = None  # set for initializers and folded constants

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_SIZES.get(self.dtype, 4)


@dataclass
class Node:
    """One operator application: `outputs = op(inputs, **attrs)`.

    `inputs` may contain "" for an omitted optional ONNX input.
    """

    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    domain: str = ""


class Graph:
    """A DAG of `Node`s over named `Tensor`s with static shapes.

    Nodes are kept in topological order (`toposort()` restores it after edits).
    """

    def __init__(self, name: str = "graph", opset: int = 17):
        self.name = name
        self.opset = opset
        self.tensors: dict[str, Tensor] = {}
        self.nodes: list[Node] = []
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        # opset of each non-default operator domain the model imports (e.g. com.microsoft)
        self.domain_opsets: dict[str, int] = {}
        # the model spec it was loaded from (`tensorplan.load` sets it): a plan made from this
        # graph records it, so the plan can reload its model in another process
        self.source: str | None = None

    # -- construction ----------------------------------------------------
    def add_tensor(self, t: Tensor) -> Tensor:
        self.tensors[t.name] = t
        return t

    def add_node(self, node: Node) -> Node:
        self.nodes.append(node)
        return node

    # -- queries ---------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def constants(self) -> dict[str, Tensor]:
        return {k: t for k, t in self.tensors.items() if t.is_constant}

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def num_parameters(self) -> int:
        return sum(t.numel for t in self.constants().values() if t.dtype.startswith("float"))

    # -- transformation --------------------------------------------------
    def toposort(self) -> None:
        """Reorder nodes topologically (Kahn); raises on a cycle."""
        prod = self.producers()
        ready = set(self.inputs) | set(self.constants())
        indeg: dict[int, int] = {}
        users: dict[str, list[int]] = {}
        for idx, n in enumerate(self.nodes):
            deps = {i for i in n.inputs if i and i in prod}
            indeg[idx] = len(deps)
            for d in deps:
                users.setdefault(d, []).append(idx)
        queue = [i for i, d in indeg.items() if d == 0]
        order: list[int] = []
        while queue:
            idx = queue.pop(0)
            order.append(idx)
            for o in self.nodes[idx].outputs:
                for u in users.get(o, []):
                    indeg[u] -= 1
                    if indeg[u] == 0:
                        queue.append(u)
        if len(order) != len(self.nodes):
            stuck = [self.nodes[i].name for i, d in indeg.items() if d > 0][:5]
            raise TensorplanError(f"graph '{self.name}' has a cycle through nodes {stuck}")
        _ = ready
        self.nodes = [self.nodes[i] for i in order]

    def validate(self) -> None:
        """Check the graph is well formed: every input defined before use, shapes static,
        outputs produced, tensor names unique per producer."""
        defined = set(self.inputs) | set(self.constants())
        seen_out: set[str] = set()
        for n in self.nodes:
            for i in n.inputs:
                if i and i not in defined:
                    raise TensorplanError(
                        f"node '{n.name}' ({n.op}) reads '{i}', which is not defined before it")
            for o in n.outputs:
                if not o:
                    continue
                if o in seen_out or o in self.inputs:
                    raise TensorplanError(f"tensor '{o}' is produced twice (node '{n.name}')")
                if o not in self.tensors:
                    raise TensorplanError(f"node '{n.name}' output '{o}' has no shape")
                seen_out.add(o)
                defined.add(o)
        for o in self.outputs:
            if o not in defined:
                raise TensorplanError(f"graph output '{o}' is never produced")
        for t in self.tensors.values():
            if any((not isinstance(d, (int, np.integer))) or d < 0 for d in t.shape):
                raise TensorplanError(f"tensor '{t.name}' has a non-static shape {t.shape}")

    def live_tensors(self) -> set[str]:
        """Every tensor some graph output depends on (the outputs included)."""
        prod = self.producers()
        live: set[str] = set()
        stack = list(self.outputs)
        while stack:
            t = stack.pop()
            if t in live:
                continue
            live.add(t)
            n = prod.get(t)
            if n is not None:
                stack.extend(i for i in n.inputs if i)
        return live

    def prune(self) -> None:
        """Drop nodes and tensors that no graph output depends on."""
        live = self.live_tensors()
        self.nodes = [n for n in self.nodes if any(o in live for o in n.outputs if o)]
        used = live | set(self.inputs) | {o for n in self.nodes for o in n.outputs if o}
        self.tensors = {k: v for k, v in self.tensors.items() if k in used}

    def fingerprint(self) -> str:
        """A content hash of structure, shapes and attributes (not weights)."""
        h = hashlib.sha256()
        for n in self.nodes:
            h.update(n.op.encode())
            for i in n.inputs:
                t = self.tensors.get(i)
                h.update(repr(t.shape if t else None).encode())
            h.update(repr(sorted((k, _attr_repr(v)) for k, v in n.attrs.items())).encode())
        return h.hexdigest()[:16]

    def subgraph(self, node_names: Iterable[str], name: str | None = None) -> "Graph":
        """A standalone Graph of the given nodes: inputs are the tensors they read but do
        not produce (constants stay constants), outputs are the tensors they produce that
        are read outside the set or are graph outputs."""
        wanted = set(node_names)
        nodes = [n for n in self.nodes if n.name in wanted]
        if len(nodes) != len(wanted):
            missing = wanted - {n.name for n in nodes}
            raise TensorplanError(f"subgraph: unknown nodes {sorted(missing)[:5]}")
        produced = {o for n in nodes for o in n.outputs if o}
        g = Graph(name or f"{self.name}.sub", self.opset)
        g.domain_opsets = dict(self.domain_opsets)
        for n in nodes:
            for i in n.inputs:
                if i and i not in produced and i not in g.tensors:
                    t = self.tensors[i]
                    g.add_tensor(Tensor(t.name, t.shape, t.dtype, t.data))
                    if not t.is_constant:
                        g.inputs.append(i)
            for o in n.outputs:
                if o:
                    t = self.tensors[o]
                    g.add_tensor(Tensor(t.name, t.shape, t.dtype, t.data))
            g.add_node(Node(n.name, n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.domain))
        outside = {i for n in self.nodes if n.name not in wanted for i in n.inputs}
        g.outputs = [o for n in nodes for o in n.outputs
                     if o and (o in outside or o in self.outputs)]
        return g

    def copy(self) -> "Graph":
        g = Graph(self.name, self.opset)
        g.domain_opsets = dict(self.domain_opsets)
        g.source = self.source
        g.tensors = {k: Tensor(t.name, tuple(t.shape), t.dtype, t.data) for k, t in self.tensors.items()}
        g.nodes = [Node(n.name, n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.domain)
                   for n in self.nodes]
        g.inputs = list(self.inputs)
        g.outputs = list(self.outputs)
        return g

    def __repr__(self) -> str:
        return (f"Graph({self.name!r}, {len(self.nodes)} nodes, inputs={self.input_shapes()}, "
                f"outputs={[self.tensors[o].shape for o in self.outputs]})")

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        return {i: self.tensors[i].shape for i in self.inputs}


def _attr_repr(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return (v.shape, hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()[:8])
    return v


def unique_name(existing: Iterable[str], base: str) -> str:
    taken = set(existing)
    if base not in taken:
        return base
    k = 1
    while f"{base}_{k}" in taken:
        k += 1
    return f"{base}_{k}"
