"""`Plan`: the orchestrator's result as versioned JSON data, not code, and what a user does with it.

Why data: a plan can be saved, diffed, re-run on another machine and verified
independently of the solver that produced it (`verify`). Schema
`"tensorplan.korch/1"`:

```
{"schema": "tensorplan.korch/1",
 "source": {"model": spec, "opset": 17, "input_shapes": {...}, "fingerprint": <rewritten graph>,
            "prim_fingerprint": <primitive graph>, "num_primitives": N, "opaque": [[node, op], ...]},
 "device": {...DeviceSpec.to_dict()},
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

A plan keeps its model's graphs in memory: the pipeline that makes it hands over the model as
loaded, the rewritten graph and the primitive graph; a plan read from a file derives them once,
on first use, from `source` (refusing when the primitive graph's fingerprint no longer matches).
`plan.run(feeds)` compiles and runs it on this machine, `plan.export(path)` writes it as one ONNX
file for stock ONNX Runtime, `plan.save(path)` / `load_plan(path)` round-trip it as JSON.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tensorplan.errors import ModelImportError, PlanError
from tensorplan.ir.graph import Graph

if TYPE_CHECKING:
    import numpy as np

    from tensorplan.runtime.executor import RunResult
    from tensorplan.runtime.export import ExportResult

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
    # the model's graphs, in memory only (never saved): as loaded, rewritten, fissioned
    _model: Graph | None = field(default=None, init=False, repr=False, compare=False)
    _graph: Graph | None = field(default=None, init=False, repr=False, compare=False)
    _prim: Graph | None = field(default=None, init=False, repr=False, compare=False)

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

    # -- the model's graphs (cached) ---------------------------------------------------------
    def keep_graphs(self, model: Graph | None = None, graph: Graph | None = None, prim: Graph | None = None) -> None:
        """Hold the graphs the pipeline made this plan from, so nothing is loaded or derived again."""
        self._model = model if model is not None else self._model
        self._graph = graph if graph is not None else self._graph
        self._prim = prim if prim is not None else self._prim

    def model_graph(self) -> Graph:
        """The model as loaded (before rewrites): what ONNX Runtime runs as the reference."""
        if self._model is None:
            from tensorplan.zoo.specs import load
            src = self.source
            if "model" not in src:
                raise PlanError("plan has no source model to load")
            shapes = {k: tuple(v) for k, v in (src.get("input_shapes") or {}).items()} or None
            try:
                self._model = load(src["model"], input_shapes=shapes, opset=int(src.get("opset", 17)))
            except ModelImportError as e:
                if not src.get("in_memory"):
                    raise
                raise PlanError(f"plan for '{src['model']}' was made from a graph built in memory, which this "
                                f"process does not have ({e}); orchestrate a model file or spec to keep the plan "
                                "runnable elsewhere") from None
        return self._model

    def source_graph(self) -> Graph:
        """The model with the plan's rewrites applied (region kernels run its operators); fails if
        the rewrites no longer come out the same."""
        if self._graph is None:
            g = self.model_graph()
            src = self.source
            if src.get("rewrite"):
                from tensorplan.rewrite import WINOGRAD, rewrite
                want = [list(x) for x in src.get("rewrites") or []]
                rr = rewrite(g, winograd=[n for r, n in want if r == WINOGRAD])
                if [list(x) for x in rr.applied] != want:
                    raise PlanError(f"plan for '{src['model']}' was made with rewrites {want}, but the model now "
                                    f"gives {[list(x) for x in rr.applied]}; re-run `tensorplan orchestrate`")
                g = rr.graph
            self._graph = g
        return self._graph

    def primitive_graph(self) -> Graph:
        """The fissioned graph the kernels are made of; fails if it no longer matches the plan."""
        if self._prim is None:
            from tensorplan.korch.fission import fission
            src = self.source
            prim = fission(self.source_graph()).graph
            want = src.get("prim_fingerprint")
            if want and prim.fingerprint() != want:
                raise PlanError(f"plan for '{src.get('model')}' was made for primitive graph {want}, but the model "
                                f"now gives {prim.fingerprint()}; re-run `tensorplan orchestrate`")
            self._prim = prim
        return self._prim

    def copy(self) -> "Plan":
        """An independent copy of the plan's data that shares its (read-only) graphs: a variant to edit."""
        other = Plan.from_dict(json.loads(self.to_json()))
        other.keep_graphs(self._model, self._graph, self._prim)
        return other

    # -- using it ---------------------------------------------------------------------------
    def run_threads(self, threads: int | None = None) -> int:
        """Threads to run with: `threads`, else what the plan was made and raced with, at most this
        machine's usable cores."""
        from tensorplan.devices import usable_cores
        if threads:
            return int(threads)
        made = int(self.options.get("threads") or 0)
        return min(made, usable_cores()) if made > 0 else usable_cores()

    def run(self, feeds: dict[str, "np.ndarray"] | None = None, *, check: bool = True, repeats: int | None = None,
            threads: int | None = None, budget_s: float = 2.0, kernel_times: bool = False, tol: float | None = None,
            progress: bool = False) -> "RunResult":
        """Compile the kernels, run the plan on `feeds` (default: seeded random inputs), time it (median
        of `repeats` runs, or of ~`budget_s` seconds) and, with `check`, compare its outputs with ONNX
        Runtime on the original model (max relative error <= `tol`, default 1e-4 for fp32 outputs).
        Plans made for a GPU run as PyTorch kernels replayed as one CUDA graph."""
        from tensorplan.ir.reference import default_tolerance, random_feeds
        from tensorplan.runtime.torch_runner import is_torch_plan
        prim = self.primitive_graph()
        feeds = feeds if feeds is not None else random_feeds(prim, seed=0)
        tol = default_tolerance(prim) if tol is None else tol
        n = self.run_threads(threads)
        if is_torch_plan(self):
            from tensorplan.runtime.torch_runner import run_torch_plan
            return run_torch_plan(self, prim, feeds, check=check, repeats=repeats, budget_s=budget_s, tol=tol,
                                  threads=n)
        from tensorplan.runtime.executor import run_cpu_plan
        return run_cpu_plan(self, prim, feeds, check=check, repeats=repeats, threads=n, budget_s=budget_s,
                            kernel_times=kernel_times, tol=tol, progress=progress)

    def export(self, path: str | Path, *, threads: int | None = None, check: bool = True, tol: float | None = None,
               rounds: int = 15, spinning: bool | None = None,
               log: Callable[[str], None] | None = None) -> "ExportResult":
        """Write the plan as one ONNX file that stock ONNX Runtime runs (the rewritten model; the result
        says whether that is the plan itself), check it against ONNX Runtime on the original model and
        time both, interleaved, for `rounds` rounds (0: no timing)."""
        from tensorplan.runtime.export import export_plan
        return export_plan(self, path, threads=self.run_threads(threads), check=check, tol=tol, rounds=rounds,
                           spinning=spinning, log=log)

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
        """A plan saved with `save` (its graphs are derived again on first use)."""
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

    def summary(self) -> "PlanSummary":
        """The figures `tensorplan orchestrate` prints."""
        kinds: dict[str, int] = {}
        for k in self.kernels:
            kinds[k.kind] = kinds.get(k.kind, 0) + 1
        return PlanSummary(model=str(self.source.get("model")), device=str(self.device.get("name")),
                           kernels=len(self.kernels), kinds=kinds, predicted_s=self.predicted_s,
                           solver={k: self.solver.get(k) for k in ("method", "status", "mip_gap", "solve_s",
                                                                   "objective_s")},
                           opaque=list(self.source.get("opaque", [])), rewrites=list(self.source.get("rewrites", [])),
                           timing=dict(self.timing), recomputed_primitives=self.stats.get("recomputed_primitives"),
                           race=self.stats.get("race"), arena_bytes=int(sum(self.slots)))


def load_plan(path: str | Path) -> Plan:
    """A plan saved by `plan.save` / `tensorplan orchestrate -o`."""
    return Plan.load(path)


@dataclass
class PlanSummary:
    """A plan in a few figures (what the CLI prints, `to_dict` for --json)."""

    model: str
    device: str
    kernels: int
    kinds: dict[str, int]
    predicted_s: float
    solver: dict[str, Any]
    opaque: list
    rewrites: list
    timing: dict[str, float]
    recomputed_primitives: int | None
    race: dict[str, Any] | None
    arena_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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


__all__ = ["SCHEMA", "Plan", "PlanKernel", "PlanSummary", "kernel_io", "load_plan", "topo_order", "verify"]
