"""`Plan`: the orchestrator's result as versioned JSON data, not code.

Why data: a plan can be saved, diffed, re-run on another machine and verified
independently of the solver that produced it (`verify`). Schema
`"tensorplan.korch/1"`:

```
{"schema": "tensorplan.korch/1",
 "source": {"model": spec, "opset": 17, "input_shapes": {...}, "fingerprint": <original graph>,
            "prim_fingerprint": <primitive graph>, "num_primitives": N, "opaque": [[node, op], ...]},
 "device": {...DeviceSpec.to_dict() or {"name": ...}},
 "kernels": [{"id": "k0", "candidate": 17, "nodes": [...], "inputs": [...], "outputs": [...],
              "kind": "memory"|"linear"|"opaque"|"region", "backend": "tvm"|"torch"|"ort"|"reference"|"",
              "schedule": {...},                  # region kernels: {"operators": [original nodes], ...} "predicted_s": 1.2e-5, "canonical_hash": "..."}],
 "order": ["k3", "k0", ...],                        # execution order (topological)
 "buffers": [{"tensor", "bytes", "first_use", "last_use", "slot"}],  # indices into order
 "slots": [bytes, ...],                             # reusable arena slots
 "solver": {"method", "status", "objective_s", "mip_gap", "solve_s", "variables", "constraints", ...},
 "timing": {"load_s", "fission_s", "enumerate_s", "profile_s", "solve_s", "total_s"},
 "stats": {...}, "options": {...}}
```

The executor (runtime/) re-derives the primitive graph with `Plan.primitive_graph()`, which
refuses to run a plan whose primitive graph fingerprint no longer matches.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorplan.errors import PlanError
from tensorplan.ir.graph import Graph

SCHEMA = "tensorplan.korch/1"


@dataclass
class PlanKernel:
    """One kernel of a plan: primitive nodes fused into one launch."""

    id: str
    nodes: list[str]
    inputs: list[str]
    outputs: list[str]
    kind: str
    predicted_s: float = 0.0
    backend: str = ""
    schedule: dict[str, Any] = field(default_factory=dict)
    canonical_hash: str = ""
    candidate: int = -1

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "candidate": self.candidate, "nodes": list(self.nodes),
                "inputs": list(self.inputs), "outputs": list(self.outputs), "kind": self.kind,
                "backend": self.backend, "schedule": dict(self.schedule),
                "predicted_s": float(self.predicted_s), "canonical_hash": self.canonical_hash}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PlanKernel":
        try:
            return cls(id=str(d["id"]), nodes=list(d["nodes"]), inputs=list(d["inputs"]),
                       outputs=list(d["outputs"]), kind=str(d["kind"]),
                       predicted_s=float(d.get("predicted_s", 0.0)), backend=str(d.get("backend", "")),
                       schedule=dict(d.get("schedule") or {}), canonical_hash=str(d.get("canonical_hash", "")),
                       candidate=int(d.get("candidate", -1)))
        except KeyError as e:
            raise PlanError(f"plan kernel {d.get('id', '?')} lacks field {e}") from None


@dataclass
class Plan:
    """A verified kernel orchestration of one model on one device."""

    source: dict[str, Any]
    device: dict[str, Any]
    kernels: list[PlanKernel]
    order: list[str]
    buffers: list[dict[str, Any]] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    solver: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    schema: str = SCHEMA

    # -- queries --------------------------------------------------------------------------
    @property
    def predicted_s(self) -> float:
        """Sum of the kernels' predicted latencies (Korch's additive objective)."""
        return float(sum(k.predicted_s for k in self.kernels))

    def kernel(self, kid: str) -> PlanKernel:
        for k in self.kernels:
            if k.id == kid:
                return k
        raise PlanError(f"plan has no kernel '{kid}'")

    def ordered_kernels(self) -> list[PlanKernel]:
        by = {k.id: k for k in self.kernels}
        return [by[k] for k in self.order]

    def source_graph(self) -> Graph:
        """Reload the model from `source` with the plan's rewrites re-applied (region kernels run
        its operators); fails if the rewrites no longer come out the same."""
        from tensorplan.zoo.specs import load_model  # type: ignore[attr-defined]
        src = self.source
        shapes = {k: tuple(v) for k, v in (src.get("input_shapes") or {}).items()} or None
        g = load_model(src["model"], input_shapes=shapes, opset=int(src.get("opset", 17)))
        if not src.get("rewrite"):
            return g
        from tensorplan.rewrite.rules import WINOGRAD, rewrite
        rr = rewrite(g, winograd=[n for r, n in src.get("rewrites") or [] if r == WINOGRAD])
        if [list(x) for x in rr.applied] != [list(x) for x in src.get("rewrites") or []]:
            raise PlanError(f"plan for '{src['model']}' was made with rewrites {src.get('rewrites')}, but the model "
                            f"now gives {[list(x) for x in rr.applied]}; re-run `tensorplan orchestrate`")
        return rr.graph

    def primitive_graph(self) -> Graph:
        """Reload the model from `source` and re-run fission; fails if it no longer matches."""
        from tensorplan.korch import fission as _f
        src = self.source
        prim = _f.fission(self.source_graph()).graph
        want = src.get("prim_fingerprint")
        if want and prim.fingerprint() != want:
            raise PlanError(f"plan for '{src['model']}' was made for primitive graph {want}, but the model "
                            f"now gives {prim.fingerprint()}; re-run `tensorplan orchestrate`")
        return prim

    # -- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "source": self.source, "device": self.device,
                "kernels": [k.to_dict() for k in self.kernels], "order": list(self.order),
                "buffers": list(self.buffers), "slots": list(self.slots), "solver": self.solver,
                "timing": self.timing, "stats": self.stats, "options": self.options}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Plan":
        schema = d.get("schema")
        if schema != SCHEMA:
            raise PlanError(f"unsupported plan schema {schema!r} (this tensorplan reads {SCHEMA!r}); "
                            "re-create the plan with this version")
        try:
            return cls(source=dict(d["source"]), device=dict(d.get("device") or {}),
                       kernels=[PlanKernel.from_dict(k) for k in d["kernels"]], order=list(d["order"]),
                       buffers=list(d.get("buffers") or []), slots=list(d.get("slots") or []),
                       solver=dict(d.get("solver") or {}), timing=dict(d.get("timing") or {}),
                       stats=dict(d.get("stats") or {}), options=dict(d.get("options") or {}))
        except KeyError as e:
            raise PlanError(f"plan lacks field {e}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=_json_default)

    def save(self, path: str | Path) -> Path:
        """Write atomically (temp file + rename), so a crash never leaves half a plan."""
        from tensorplan.paths import atomic_write
        path = Path(path)
        atomic_write(path, self.to_json().encode())
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Plan":
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise PlanError(f"plan file '{path}' does not exist") from None
        except json.JSONDecodeError as e:
            raise PlanError(f"plan file '{path}' is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise PlanError(f"plan file '{path}' does not hold a JSON object")
        return cls.from_dict(d)

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for k in self.kernels:
            kinds[k.kind] = kinds.get(k.kind, 0) + 1
        return {"model": self.source.get("model"), "device": self.device.get("name"),
                "kernels": len(self.kernels), "kinds": kinds, "predicted_s": self.predicted_s,
                "solver": {k: self.solver.get(k) for k in ("method", "status", "mip_gap", "solve_s", "objective_s")},
                "opaque": self.source.get("opaque", []), "rewrites": self.source.get("rewrites", []),
                "timing": self.timing,
                "recomputed_primitives": self.stats.get("recomputed_primitives"),
                "race": self.stats.get("race"),
                "arena_bytes": sum(self.slots)}


def _json_default(o: Any):
    import numpy as np
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# ---------------------------------------------------------------------------------------------
# verification, ordering and buffer planning
# ---------------------------------------------------------------------------------------------

def kernel_io(prim: Graph, nodes: list[str]) -> tuple[list[str], list[str]]:
    """(non-constant external inputs, sink outputs) of a node set, as candidates define them."""
    byname = {n.name: n for n in prim.nodes}
    missing = [x for x in nodes if x not in byname]
    if missing:
        raise PlanError(f"kernel refers to unknown primitive node(s) {missing[:3]}")
    ns = [byname[x] for x in nodes]
    inside = {o for n in ns for o in n.outputs if o}
    consts = prim.constants()
    ins: list[str] = []
    for n in ns:
        for i in n.inputs:
            if i and i not in inside and i not in consts and i not in ins:
                ins.append(i)
    used_inside = {i for n in ns for i in n.inputs if i}
    outs = [o for o in inside if o not in used_inside]
    return ins, outs


def topo_order(kernels: list[PlanKernel], available: set[str]) -> list[str]:
    """A topological order of kernels by tensor dependencies (Kahn, stable); PlanError if none."""
    producer: dict[str, str] = {}
    for k in kernels:
        for o in k.outputs:
            producer.setdefault(o, k.id)
    done = set(available)
    order: list[str] = []
    pending = list(kernels)
    while pending:
        progressed = False
        rest = []
        for k in pending:
            if all(i in done for i in k.inputs):
                order.append(k.id)
                done.update(k.outputs)
                progressed = True
            else:
                rest.append(k)
        if not progressed:
            k = rest[0]
            miss = [i for i in k.inputs if i not in done]
            why = "produced by no kernel" if all(i not in producer for i in miss) else "part of a cycle"
            raise PlanError(f"kernel '{k.id}' needs tensor(s) {miss[:3]} that are {why}")
        pending = rest
    return order


def verify(plan: Plan, prim: Graph) -> None:
    """Check a plan against its primitive graph; raise PlanError naming the first problem.

    Checks: kernel ids unique; nodes exist; each kernel's declared inputs/outputs match its
    node set (convex single-output semantics); kernels are convex; `order` is a permutation
    of the kernels in which every input is available (graph input or earlier output) when
    the kernel runs; every graph output is produced."""
    ids = [k.id for k in plan.kernels]
    if len(set(ids)) != len(ids):
        raise PlanError("plan has duplicate kernel ids")
    if sorted(plan.order) != sorted(ids):
        raise PlanError("plan order is not a permutation of its kernels")
    byname = {n.name: n for n in prim.nodes}
    pos = {n.name: k for k, n in enumerate(prim.nodes)}
    for k in plan.kernels:
        if not k.nodes:
            raise PlanError(f"kernel '{k.id}' has no nodes")
        ins, outs = kernel_io(prim, k.nodes)
        if set(ins) != set(k.inputs):
            raise PlanError(f"kernel '{k.id}' declares inputs {sorted(k.inputs)[:4]} but its nodes read "
                            f"{sorted(ins)[:4]}")
        if not set(k.outputs) <= set(o for x in k.nodes for o in byname[x].outputs if o) or \
                not set(outs) <= set(k.outputs) | _dead(prim, outs):
            raise PlanError(f"kernel '{k.id}' declares outputs {k.outputs} but its sink outputs are {outs}")
        _check_convex(prim, k, pos)
    avail = set(prim.inputs) | set(prim.constants())
    for kid in plan.order:
        k = plan.kernel(kid)
        miss = [i for i in k.inputs if i not in avail]
        if miss:
            raise PlanError(f"kernel '{kid}' runs before its input(s) {miss[:3]} are produced")
        avail.update(k.outputs)
    miss = [o for o in prim.outputs if o not in avail]
    if miss:
        raise PlanError(f"plan never produces graph output(s) {miss[:3]}")


def _dead(prim: Graph, outs: list[str]) -> set[str]:
    used = {i for n in prim.nodes for i in n.inputs if i} | set(prim.outputs)
    return {o for o in outs if o not in used}


def _check_convex(prim: Graph, k: PlanKernel, pos: dict[str, int]) -> None:
    """No path may leave the kernel and come back into it."""
    members = set(k.nodes)
    if len(members) <= 1:
        return
    cons = prim.consumers()
    byname = {n.name: n for n in prim.nodes}
    hi = max(pos[x] for x in members)
    seen: set[str] = set()
    stack = []
    for x in members:
        for o in byname[x].outputs:
            for c in cons.get(o, []) if o else []:
                if c.name not in members:
                    stack.append(c.name)
    while stack:
        y = stack.pop()
        if y in seen or pos[y] > hi:
            continue
        seen.add(y)
        for o in byname[y].outputs:
            for c in cons.get(o, []) if o else []:
                if c.name in members:
                    raise PlanError(f"kernel '{k.id}' is not convex: a path leaves it through '{y}' and "
                                    f"re-enters at '{c.name}'")
                stack.append(c.name)


def plan_buffers(plan: Plan, prim: Graph) -> None:
    """Fill `plan.buffers` and `plan.slots`: lifetimes of every kernel-produced tensor in
    `order`, and slots from a greedy interval-colouring allocator (best fit by size; graph
    outputs live to the end). Graph inputs and constants are owned by the caller."""
    order = plan.order
    pos = {kid: i for i, kid in enumerate(order)}
    last: dict[str, int] = {}
    first: dict[str, int] = {}
    for kid in order:
        k = plan.kernel(kid)
        for o in k.outputs:
            first.setdefault(o, pos[kid])
        for i in k.inputs:
            last[i] = max(last.get(i, -1), pos[kid])
    end = len(order)
    bufs = []
    for t, f in first.items():
        lu = end if t in prim.outputs else last.get(t, f)
        bufs.append({"tensor": t, "bytes": int(prim.tensors[t].nbytes), "first_use": f, "last_use": lu})
    bufs.sort(key=lambda b: (b["first_use"], -b["bytes"]))
    slots: list[int] = []
    free_at: list[int] = []  # step after which the slot is free
    for b in bufs:
        cands = [s for s in range(len(slots)) if free_at[s] < b["first_use"]]
        fit = [s for s in cands if slots[s] >= b["bytes"]]
        if fit:
            s = min(fit, key=lambda s: slots[s])
        elif cands:
            s = max(cands, key=lambda s: slots[s])
            slots[s] = b["bytes"]
        else:
            slots.append(b["bytes"])
            free_at.append(-1)
            s = len(slots) - 1
        b["slot"] = s
        free_at[s] = b["last_use"]
    plan.buffers = bufs
    plan.slots = slots
