"""`Plan`: the orchestrator's result as versioned JSON data, not code, and what a user does with it.

Why data: a plan can be saved, diffed, re-run on another machine and verified
independently of the solver that produced it (`verify`). Schema
`"tensorplan.korch/1"`:

```
{"schema": "tensorplan.korch/1",
 "source": {"model": ONNX path | zoo name, "onnx": <absolute path>, "onnx_sha256": <content hash>,
            "made_from": <factory spec, information only>, "opset": 17, "input_shapes": {...},
            "fingerprint": <rewritten graph>, "prim_fingerprint": <primitive graph>, "num_primitives": N,
            "opaque": [[node, op], ...]},
 "device": {...DeviceSpec.to_dict()},
 "kernels": [{"id": "k0", "candidate": 17, "nodes": [...], "inputs": [...], "outputs": [...],
              "kind": "memory"|"linear"|"opaque"|"region", "backend": "tvm"|"torch"|"ort"|"reference"|"",
              "precision": "fp32"|"bf16"|"fp16"|"int8",   # absent in older plans: fp32
              "schedule": {...},                  # region kernels: {"operators": [original nodes], ...} "predicted_s": 1.2e-5, "canonical_hash": "..."}],
 "order": ["k3", "k0", ...],                        # execution order (topological)
 "buffers": [{"tensor", "bytes", "first_use", "last_use", "slot"}],  # indices into order
 "slots": [bytes, ...],                             # reusable arena slots
 "solver": {"method", "status", "objective_s", "mip_gap", "solve_s", "variables", "constraints", ...},
 "timing": {"load_s", "fission_s", "enumerate_s", "profile_s", "solve_s", "total_s"},
 "stats": {...}, "options": {...}}
```

A plan is data and never names code: a PyTorch factory (`file.py:factory`) is resolved when the
plan is made, and the plan keeps the exported ONNX file's path and content hash; a plan naming a
factory, or whose ONNX file's hash differs, is refused unrun. Every field is type- and
range-checked when read (`from_dict`: one PlanError naming the field and kernel), and every command
that uses a plan verifies it against its model first (`check`: fingerprints, node names, kernel
cover, no kernel twice, buffers; `load_plan` does it on reading).

Each kernel runs at its own precision (`PlanKernel.precision`; kernels take and return fp32
tensors, so precisions mix freely). An int8 kernel's quantized model is data the plan needs but
JSON cannot hold: `save` writes it beside plan.json (`<plan>.<kernel>.int8.onnx` for ONNX Runtime,
`.xml` + `.bin` OpenVINO IR for OpenVINO) and the kernel's `schedule["quantized"]` names the
file(s) and their sha256, so `tensorplan run plan.json` rebuilds the kernel without calibration
data; a file that is missing or changed is refused.

A plan keeps its model's graphs in memory: the pipeline that makes it hands over the model as
loaded, the rewritten graph and the primitive graph; a plan read from a file derives them once,
on first use, from `source` (refusing when a fingerprint no longer matches). ONNX Runtime's
reference runs the model file as given (`reference_model`), never tensorplan's import of it.
`plan.run(feeds)` compiles and runs it on this machine, `plan.export(path)` writes it as one ONNX
file for stock ONNX Runtime, `plan.save(path)` / `load_plan(path)` round-trip it as JSON.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from tensorplan.errors import ModelImportError, PlanError
from tensorplan.ir.graph import Graph

if TYPE_CHECKING:
    import numpy as np

    from tensorplan.kernels.vendor import QuantizedModel
    from tensorplan.runtime.executor import RunResult
    from tensorplan.runtime.export import ExportResult

SCHEMA = "tensorplan.korch/1"
KINDS = ("memory", "linear", "opaque", "region")
BACKENDS = ("tvm", "ort", "openvino", "torch", "torch-inductor", "reference")   # runtime.executor.FALLBACKS
#: The accuracy budget a plan with reduced-precision kernels is checked against when none is recorded
#: (options["tolerance"]): normalised max error (tensorplan.ir.reference.rel_error) vs fp32.
REDUCED_PRECISION_TOLERANCE = 0.02
_QUANTIZED_FORMATS = ("onnx", "openvino")
_MAX_BYTES = 1 << 40          # no tensor or arena slot of a plan this tensorplan runs is a TiB
_MAX_THREADS = 4096
_MAX_DIM = 1 << 31
_MAX_ELEMENTS = 1 << 34
# a PyTorch factory (`pkg.mod:factory`, `file.py:factory`): code, which a plan never names
_FACTORY = re.compile(r"^(?:[A-Za-z_][\w.]*|[^:]+\.py):[A-Za-z_]\w*$")


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
    precision: str = "fp32"
    # an int8 kernel's quantized model, in memory until `Plan.save` writes it (never in the JSON)
    quantized: "QuantizedModel | None" = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "candidate": self.candidate, "nodes": list(self.nodes),
                "inputs": list(self.inputs), "outputs": list(self.outputs), "kind": self.kind,
                "backend": self.backend, "precision": self.precision, "schedule": dict(self.schedule),
                "predicted_s": float(self.predicted_s), "canonical_hash": self.canonical_hash}

    @classmethod
    def from_dict(cls, d: Any, index: int = 0) -> "PlanKernel":
        """A kernel read from a plan file: every field checked for its type and range (PlanError
        naming the field and the kernel, never a KeyError or a TypeError)."""
        if not isinstance(d, dict):
            raise PlanError(f"plan field kernels[{index}] must be an object, got {_tname(d)}")
        kid = d.get("id")
        where = f"kernels[{index}]" + (f" (kernel '{kid}')" if isinstance(kid, str) and kid else "")
        f = _Fields(d, where)
        kid = f.name("id")
        nodes = f.names("nodes", nonempty=True)
        if len(set(nodes)) != len(nodes):
            dup = next(x for x in nodes if nodes.count(x) > 1)
            raise PlanError(f"plan field {where}.nodes lists primitive '{dup}' twice")
        inputs = f.names("inputs")
        outputs = f.names("outputs", nonempty=True)
        kind = f.str("kind")
        if kind not in KINDS:
            raise PlanError(f"plan field {where}.kind is {kind!r}; a kernel is one of {', '.join(KINDS)}")
        backend = f.str("backend", default="")
        if backend and backend not in BACKENDS:
            raise PlanError(f"plan field {where}.backend is {backend!r}, which this tensorplan does not know "
                            f"({', '.join(BACKENDS)})")
        precision = f.str("precision", default="fp32")
        if precision != "fp32" and precision not in _precisions():
            raise PlanError(f"plan field {where}.precision is {precision!r}; a kernel runs at one of "
                            f"{', '.join(_precisions())}")
        schedule = f.dict("schedule")
        _check_schedule(schedule, f"{where}.schedule", kind)
        if "quantized" in schedule and precision != "int8":
            raise PlanError(f"plan field {where}.schedule.quantized names a quantized model, but the kernel's "
                            f"precision is {precision}, not int8")
        return cls(id=kid, nodes=nodes, inputs=inputs, outputs=outputs, kind=kind,
                   predicted_s=f.seconds("predicted_s"), backend=backend, schedule=schedule,
                   canonical_hash=f.str("canonical_hash", default=""), candidate=f.int("candidate", default=-1,
                                                                                      lo=-1),
                   precision=precision)


def _precisions() -> tuple[str, ...]:
    from tensorplan.precision.native import PRECISIONS
    return tuple(PRECISIONS)


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
    _checked: bool = field(default=False, init=False, repr=False, compare=False)
    # the folder of the plan file it was read from or saved to: where its int8 models are
    _dir: Path | None = field(default=None, init=False, repr=False, compare=False)

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
        """The model as loaded (before rewrites): what the plan's graphs are derived from. A plan read
        from a file loads it from data only: an ONNX file whose content hash the plan recorded, or a
        bundled zoo model; never a PyTorch factory (code), see `check_source`."""
        if self._model is None:
            from tensorplan.zoo.specs import load
            src = self.source
            check_source(src)
            model = src["model"]
            shapes = {k: tuple(v) for k, v in (src.get("input_shapes") or {}).items()} or None
            opset = int(src.get("opset", 17))
            if src.get("in_memory"):
                raise PlanError(f"plan for '{model}' was made from a graph built in memory, which this process "
                                "does not have; orchestrate a model file or spec to keep the plan runnable "
                                "elsewhere")
            if _is_file_source(src):
                path = self.model_file()
                try:
                    g = load(str(path), input_shapes=shapes, opset=opset)
                except ModelImportError as e:
                    raise PlanError(f"plan's model file '{path}' no longer imports: {e}") from None
                g.source = str(path)
            else:
                _zoo_file(model, opset)
                try:
                    g = load(model, input_shapes=shapes, opset=opset)
                except ModelImportError as e:
                    raise PlanError(f"plan's model '{model}' does not load: {e}") from None
            self._model = g
        return self._model

    def model_file(self) -> Path:
        """The ONNX file a plan made from a file names, checked against the content hash it recorded
        (PlanError when it is missing or changed)."""
        src = self.source
        check_source(src)
        path = Path(str(src.get("onnx") or src["model"]))
        if not path.is_file():
            raise PlanError(f"plan's model file '{path}' does not exist (plan field source.onnx); pass the plan "
                            "where its ONNX file is, or re-run `tensorplan orchestrate MODEL.onnx -o PLAN`")
        want = src.get("onnx_sha256")
        if not want:
            raise PlanError(f"plan for '{src['model']}' does not record its ONNX file's content hash (plan field "
                            "source.onnx_sha256); re-run `tensorplan orchestrate` with this version")
        got = file_sha256(path)
        if got != want:
            raise PlanError(f"plan's model file '{path}' changed since the plan was made (sha256 {got[:16]}..., "
                            f"the plan recorded {str(want)[:16]}...); re-run `tensorplan orchestrate` on it")
        return path

    def reference_model(self) -> tuple[bytes, str]:
        """(ONNX bytes, where they come from) of the model as given: what ONNX Runtime runs as the
        reference. The original file (its hash checked again) for a plan made from a file, the zoo's
        export for a zoo model; a graph built in memory has no file and is exported."""
        src = self.source
        if src.get("in_memory"):
            from tensorplan.ir.to_onnx import graph_to_onnx
            return graph_to_onnx(self.model_graph()).SerializeToString(), "the in-memory graph, exported"
        check_source(src)
        if _is_file_source(src):
            path = self.model_file()
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() != src["onnx_sha256"]:
                raise PlanError(f"plan's model file '{path}' changed while it was read; run again")
            return data, str(path)
        path = _zoo_file(src["model"], int(src.get("opset", 17)))
        return Path(path).read_bytes(), str(path)

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
            want_fp = src.get("fingerprint")
            if want_fp and g.fingerprint() != want_fp:
                raise PlanError(f"plan for '{src.get('model')}' was made for graph {want_fp} (plan field "
                                f"source.fingerprint), but the model now gives {g.fingerprint()}; re-run "
                                "`tensorplan orchestrate`")
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

    def check(self) -> Graph:
        """Verify the plan against its model before anything uses it (`verify`: node names, kernel
        cover, no kernel twice, buffers) and return its primitive graph. Every command that reads a
        plan calls this first; done once per plan object."""
        prim = self.primitive_graph()
        if not self._checked:
            source = self.source_graph() if any(k.kind == "region" for k in self.kernels) else None
            verify(self, prim, source=source)
            self._checked = True
        return prim

    def copy(self) -> "Plan":
        """An independent copy of the plan's data that shares its (read-only) graphs and its kernels'
        quantized models: a variant to edit."""
        other = Plan.from_dict(json.loads(self.to_json()))
        other.keep_graphs(self._model, self._graph, self._prim)
        other._dir = self._dir
        for k, mine in zip(other.kernels, self.kernels):
            k.quantized = mine.quantized
        return other

    # -- precision --------------------------------------------------------------------------
    def with_precision(self, kernel_id: str, precision: str, backend: str | None = None, *,
                       calibration: list[dict] | None = None, quantized: "QuantizedModel | None" = None) -> "Plan":
        """A copy of the plan with one kernel at `precision` (and on `backend`, when given; its
        schedule is then reset to what that backend needs). PlanError when the kernel does not
        exist, the precision is unknown, or the backend builds no kernel at that precision. An int8
        kernel needs its quantized model before it runs or is saved: `quantized` (an
        `Int8Kernel.quantized` made while measuring it) or `calibration` (feeds for its inputs,
        `PlanExecutor.capture`), quantized here; otherwise `PlanExecutor(..., calibration=)` makes
        it. Its predicted_s is left as it was."""
        from tensorplan.kernels.vendor import BACKEND_PRECISIONS, quantize_kernel
        from tensorplan.runtime.executor import DEFAULT_BACKEND, kernel_graph
        if precision not in _precisions():
            raise PlanError(f"precision {precision!r} for kernel '{kernel_id}': a kernel runs at one of "
                            f"{', '.join(_precisions())}")
        if backend is not None and backend not in BACKENDS:
            raise PlanError(f"backend {backend!r} for kernel '{kernel_id}' is not one of {', '.join(BACKENDS)}")
        other = self.copy()
        k = other.kernel(kernel_id)
        runs_on = backend or k.backend or DEFAULT_BACKEND.get(k.kind, "ort")
        if precision not in BACKEND_PRECISIONS.get(runs_on, ("fp32",)):
            able = [b for b, ps in BACKEND_PRECISIONS.items() if precision in ps]
            raise PlanError(f"kernel '{kernel_id}' runs on {runs_on}, which has no {precision} kernels; pass a "
                            f"backend that has ({', '.join(able)})")
        moved = backend is not None and backend != k.backend
        if moved:
            k.backend = backend
            k.schedule = {x: v for x, v in k.schedule.items() if x == "operators"}
        if precision != k.precision or moved or quantized is not None or calibration is not None:
            k.schedule.pop("quantized", None)
            k.quantized = None
        k.precision = precision
        if precision == "int8" and quantized is not None:
            k.quantized = quantized
        elif precision == "int8" and calibration is not None:
            sub = kernel_graph(other.check(), k, other.source_graph() if k.kind == "region" else None)
            k.quantized = quantize_kernel(sub, list(k.outputs), runs_on, calibration, k.id)
        elif precision != "int8" and (quantized is not None or calibration is not None):
            raise PlanError(f"kernel '{kernel_id}' at {precision}: quantized models and calibration feeds are for "
                            "int8 kernels only")
        return other

    def precisions(self) -> dict[str, int]:
        """Kernels per precision."""
        out: dict[str, int] = {}
        for k in self.kernels:
            out[k.precision] = out.get(k.precision, 0) + 1
        return out

    def accuracy_tolerance(self) -> float | None:
        """The error budget the plan's outputs are checked against when it has reduced-precision
        kernels: the tolerance it was made with (options["tolerance"]), else
        REDUCED_PRECISION_TOLERANCE; None for an all-fp32 plan (checked at fp32 tolerances)."""
        if all(k.precision == "fp32" for k in self.kernels):
            return None
        tol = self.options.get("tolerance")
        return float(tol) if isinstance(tol, (int, float)) and not isinstance(tol, bool) and tol > 0 \
            else REDUCED_PRECISION_TOLERANCE

    def quantized_model(self, kernel_id: str) -> "QuantizedModel | None":
        """An int8 kernel's quantized model: held in memory, else read from the file(s) its
        `schedule["quantized"]` names beside the plan file (their sha256 checked; PlanError when
        missing or changed); None when it has none yet."""
        from tensorplan.kernels.vendor import QuantizedModel
        k = self.kernel(kernel_id)
        if k.quantized is not None or "quantized" not in k.schedule:
            return k.quantized
        q = k.schedule["quantized"]
        if self._dir is None:
            raise PlanError(f"kernel '{k.id}' keeps its int8 model in '{q['file']}' beside its plan file, but this "
                            "plan was not read from a file; load it with Plan.load(PATH)")
        parts = []
        for key in ("file", "weights"):
            if key not in q:
                parts.append(b"")
                continue
            path = self._dir / q[key]
            if not path.is_file():
                raise PlanError(f"kernel '{k.id}' is int8 and its quantized model '{path}' does not exist (plan field "
                                f"schedule.quantized.{key}); keep the files `plan.save` wrote beside the plan")
            data = path.read_bytes()
            want = q["sha256" if key == "file" else "weights_sha256"]
            if hashlib.sha256(data).hexdigest() != want:
                raise PlanError(f"kernel '{k.id}': its quantized model '{path}' changed since the plan was saved "
                                f"(sha256 differs from schedule.quantized); save the plan again")
            parts.append(data)
        k.quantized = QuantizedModel(q["format"], parts[0], parts[1])
        return k.quantized

    def _save_quantized(self, path: Path) -> None:
        """Write each int8 kernel's quantized model beside the plan file `path` and name it in the
        kernel's schedule (PlanError for an int8 kernel that has none)."""
        from tensorplan.paths import atomic_write
        for k in self.kernels:
            if k.precision != "int8":
                k.schedule.pop("quantized", None)
                continue
            q = self.quantized_model(k.id)
            if q is None:
                raise PlanError(f"kernel '{k.id}' is int8 but has no quantized model, so the saved plan could not "
                                "run: quantize it first (Plan.with_precision(..., calibration=FEEDS), or run it "
                                "once with PlanExecutor(plan, calibration={kernel: FEEDS}))")
            stem = f"{path.name.removesuffix('.json')}.{re.sub(r'[^A-Za-z0-9_-]', '_', k.id)}.int8"
            ext = ".onnx" if q.format == "onnx" else ".xml"
            entry = {"format": q.format, "file": stem + ext, "sha256": hashlib.sha256(q.model).hexdigest()}
            atomic_write(path.parent / entry["file"], q.model)
            if q.format == "openvino":
                entry.update(weights=stem + ".bin", weights_sha256=hashlib.sha256(q.weights).hexdigest())
                atomic_write(path.parent / entry["weights"], q.weights)
            k.schedule["quantized"] = entry

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
        Runtime on the original model (max relative error <= `tol`, default 1e-4 for fp32 outputs;
        for a plan with reduced-precision kernels, `accuracy_tolerance()`).
        Plans made for a GPU run as PyTorch kernels replayed as one CUDA graph."""
        from tensorplan.ir.reference import default_tolerance, random_feeds
        from tensorplan.runtime.torch_runner import is_torch_plan
        prim = self.check()
        feeds = feeds if feeds is not None else random_feeds(prim, seed=0)
        if tol is None:
            tol = max(default_tolerance(prim), self.accuracy_tolerance() or 0.0)
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
        self.check()
        return export_plan(self, path, threads=self.run_threads(threads), check=check, tol=tol, rounds=rounds,
                           spinning=spinning, log=log)

    # -- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "source": self.source, "device": self.device,
                "kernels": [k.to_dict() for k in self.kernels], "order": list(self.order),
                "buffers": list(self.buffers), "slots": list(self.slots), "solver": self.solver,
                "timing": self.timing, "stats": self.stats, "options": self.options}

    @classmethod
    def from_dict(cls, d: Any) -> "Plan":
        """A plan read from JSON: the schema and every field's type and range checked (one PlanError
        naming the field), the source checked to name data only (`check_source`). Checking it against
        its model is `check()`, which every command that runs or exports a plan calls first."""
        if not isinstance(d, dict):
            raise PlanError(f"a plan is a JSON object, got {_tname(d)}")
        schema = d.get("schema")
        if schema != SCHEMA:
            raise PlanError(f"unsupported plan schema {schema!r} (this tensorplan reads {SCHEMA!r}); "
                            "re-create the plan with this version")
        f = _Fields(d, "")
        source = f.dict("source", required=True)
        check_source(source)
        raw = f.list("kernels", required=True)
        if not raw:
            raise PlanError("plan field kernels is empty: a plan has at least one kernel")
        kernels = [PlanKernel.from_dict(k, j) for j, k in enumerate(raw)]
        order = f.names("order", nonempty=True)
        buffers = f.list("buffers")
        for j, b in enumerate(buffers):
            _check_buffer(b, j)
        slots = f.list("slots")
        for j, v in enumerate(slots):
            if not _is_int(v) or v < 0 or v > _MAX_BYTES:
                raise PlanError(f"plan field slots[{j}] must be a byte count (0..{_MAX_BYTES}), got {v!r}")
        options = f.dict("options")
        if "threads" in options and options["threads"] is not None and (
                not _is_int(options["threads"]) or not 0 <= options["threads"] <= _MAX_THREADS):
            raise PlanError(f"plan field options.threads must be a thread count (0..{_MAX_THREADS}), got "
                            f"{options['threads']!r}")
        return cls(source=source, device=f.dict("device"), kernels=kernels, order=order, buffers=buffers,
                   slots=slots, solver=f.dict("solver"), timing=f.dict("timing"), stats=f.dict("stats"),
                   options=options)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=_json_default)

    def save(self, path: str | Path) -> Path:
        """Write atomically (temp file + rename), so a crash never leaves half a plan; an int8
        kernel's quantized model goes into a file beside it (module docstring)."""
        from tensorplan.paths import atomic_write
        path = Path(path)
        self._save_quantized(path)
        atomic_write(path, self.to_json().encode())
        self._dir = path.resolve().parent
        return path

    @classmethod
    def load(cls, path: str | Path, *, check: bool = False) -> "Plan":
        """A plan saved with `save`: the file read and every field type-checked (`from_dict`); with
        `check`, also verified against its model (`check()`: its graphs derived again from the
        model's ONNX file, whose hash the plan recorded), as `load_plan` does. Without it the plan
        is verified when it first runs or is exported."""
        path = Path(path)
        if path.is_dir():
            raise PlanError(f"plan file '{path}' is a directory")
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise PlanError(f"plan file '{path}' does not exist") from None
        except (OSError, UnicodeDecodeError) as e:
            raise PlanError(f"plan file '{path}' cannot be read: {e}") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise PlanError(f"plan file '{path}' is not valid JSON: {e}") from None
        except RecursionError:
            raise PlanError(f"plan file '{path}' nests too deeply to be a plan") from None
        if not isinstance(d, dict):
            raise PlanError(f"plan file '{path}' does not hold a JSON object")
        try:
            plan = cls.from_dict(d)
            plan._dir = path.resolve().parent
            if check:
                plan.check()
        except PlanError as e:
            raise PlanError(f"plan file '{path}': {e}") from None
        return plan

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
                           race=self.stats.get("race"), arena_bytes=int(sum(self.slots)),
                           precisions=self.precisions())


# ---------------------------------------------------------------------------------------------
# what a plan file may hold: field types and ranges, and a source that names data only
# ---------------------------------------------------------------------------------------------

def _tname(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(v), type(v).__name__)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Fields:
    """Typed reads of one JSON object of a plan; each failure is a PlanError naming the field."""

    def __init__(self, d: dict, where: str):
        self.d, self.where = d, where

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _get(self, key: str, required: bool) -> Any:
        if key not in self.d:
            if required:
                raise PlanError(f"plan field {self._name(key)} is missing")
            return None
        return self.d[key]

    def _bad(self, key: str, what: str, v: Any) -> PlanError:
        shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
        return PlanError(f"plan field {self._name(key)} must be {what}, got {_tname(v)} {shown}")

    def str(self, key: str, default: str | None = None) -> str:
        v = self._get(key, default is None)
        if v is None:
            return default or ""
        if not isinstance(v, str) or len(v) > 4096:
            raise self._bad(key, "a string", v)
        return v

    def name(self, key: str) -> str:
        v = self.str(key)
        if not v:
            raise PlanError(f"plan field {self._name(key)} is empty")
        return v

    def names(self, key: str, nonempty: bool = False) -> list[str]:
        v = self._get(key, True)
        if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
            raise self._bad(key, "a list of names (non-empty strings)", v)
        if nonempty and not v:
            raise PlanError(f"plan field {self._name(key)} is empty")
        return list(v)

    def int(self, key: str, default: int, lo: int = 0, hi: int = 1 << 62) -> int:
        v = self._get(key, False)
        if v is None:
            return default
        if not _is_int(v) or not lo <= v <= hi:
            raise self._bad(key, f"an integer in {lo}..{hi}", v)
        return int(v)

    def seconds(self, key: str) -> float:
        v = self._get(key, False)
        if v is None:
            return 0.0
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise self._bad(key, "a finite number of seconds >= 0", v)
        return float(v)

    def dict(self, key: str, required: bool = False) -> dict[str, Any]:
        v = self._get(key, required)
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise self._bad(key, "an object", v)
        return dict(v)

    def list(self, key: str, required: bool = False) -> list:
        v = self._get(key, required)
        if v is None:
            return []
        if not isinstance(v, list):
            raise self._bad(key, "a list", v)
        return list(v)


def _check_schedule(sched: dict[str, Any], where: str, kind: str) -> None:
    """The schedule keys the executor reads: thread counts, spinning, a region's operators."""
    f = _Fields(sched, where)
    if "threads" in sched:
        f.int("threads", 0, lo=1, hi=_MAX_THREADS)
    if "spinning" in sched and not isinstance(sched["spinning"], bool):
        raise f._bad("spinning", "true or false", sched["spinning"])
    if "device" in sched:
        dev = f.str("device")
        if dev.split(":")[0] not in ("cpu", "cuda"):
            raise f._bad("device", "'cpu' or 'cuda'", dev)
    if kind == "region" or "operators" in sched:
        f.names("operators", nonempty=True)
    if "quantized" in sched:
        _check_quantized(_Fields(sched, where).dict("quantized"), f"{where}.quantized")
    if sched.get("name") == "sampled" or "trace" in sched:
        # a sampled TVM schedule: its meta_schedule trace, replayed when the kernel is rebuilt
        trace = sched.get("trace")
        if sched.get("name") != "sampled":
            raise f._bad("name", "'sampled' (only a sampled schedule carries a trace)", sched.get("name"))
        if not isinstance(trace, list) or not trace or not all(isinstance(x, (list, dict)) for x in trace):
            raise f._bad("trace", "a non-empty list (a meta_schedule trace as JSON, from TunedCost)", trace)


def _check_quantized(q: dict[str, Any], where: str) -> None:
    """An int8 kernel's stored quantized model: its format, and plain file names beside the plan (no
    folders: a plan never reads files elsewhere) with their sha256."""
    f = _Fields(q, where)
    fmt = f.str("format")
    if fmt not in _QUANTIZED_FORMATS:
        raise f._bad("format", f"one of {', '.join(_QUANTIZED_FORMATS)}", fmt)
    for key, digest in (("file", "sha256"), ("weights", "weights_sha256")):
        if key == "weights" and fmt != "openvino":
            continue
        name = f.name(key)
        if name != Path(name).name or name in (".", "..") or "\\" in name:
            raise f._bad(key, "a file name beside the plan (no folders)", name)
        if not re.fullmatch(r"[0-9a-f]{64}", f.str(digest)):
            raise f._bad(digest, "a sha256 hex digest (64 hex digits)", q.get(digest))


def _check_buffer(b: Any, j: int) -> None:
    where = f"buffers[{j}]"
    if not isinstance(b, dict):
        raise PlanError(f"plan field {where} must be an object, got {_tname(b)}")
    f = _Fields(b, where)
    f.name("tensor")
    for key in ("bytes", "first_use", "last_use", "slot"):
        if key not in b:
            raise PlanError(f"plan field {where}.{key} is missing")
        f.int(key, 0, hi=_MAX_BYTES)


def is_factory_spec(model: str) -> bool:
    """Does `model` name Python code (a `file.py` or a `pkg.mod:factory` / `file.py:factory` spec)?"""
    return bool(_FACTORY.match(model)) or model.endswith(".py") or ".py:" in model


def check_source(src: Any) -> None:
    """A plan's `source` names data only: an ONNX file (with its content hash) or a bundled zoo model.
    A PyTorch factory is code, and loading a plan never runs code: the factory is resolved when the
    plan is made, and the plan keeps the exported ONNX file's path and hash."""
    if not isinstance(src, dict):
        raise PlanError(f"plan field source must be an object, got {_tname(src)}")
    f = _Fields(src, "source")
    model = f.name("model")
    for key, val in (("model", model), ("onnx", src.get("onnx"))):
        if isinstance(val, str) and is_factory_spec(val):
            raise PlanError(f"plan field source.{key} names Python code ('{val}'), and a plan is data: loading "
                            "one never imports or runs code, so this plan is refused unrun. Make the plan from the "
                            "model's ONNX file instead (`tensorplan orchestrate MODEL.onnx -o PLAN`; a plan "
                            "orchestrated from a factory names the ONNX file it exported)")
    if "onnx" in src:
        f.name("onnx")
    if "onnx_sha256" in src:
        h = f.str("onnx_sha256")
        if not re.fullmatch(r"[0-9a-f]{64}", h):
            raise f._bad("onnx_sha256", "a sha256 hex digest (64 hex digits)", h)
    if "opset" in src:
        f.int("opset", 17, lo=1, hi=999)
    for key in ("fingerprint", "prim_fingerprint", "made_from"):
        if key in src:
            f.str(key)
    for key in ("rewrite", "in_memory"):
        if key in src and not isinstance(src[key], bool):
            raise f._bad(key, "true or false", src[key])
    rw = f.list("rewrites")
    if not all(isinstance(x, list) and len(x) == 2 and all(isinstance(y, str) for y in x) for x in rw):
        raise f._bad("rewrites", "a list of [rule, node] pairs", rw)
    for name, dims in f.dict("input_shapes").items():
        key = f"input_shapes.{name}"
        if not isinstance(dims, list) or not all(_is_int(x) and 1 <= x <= _MAX_DIM for x in dims):
            raise f._bad(key, f"a list of dimensions (1..{_MAX_DIM})", dims)
        if math.prod(dims) > _MAX_ELEMENTS:
            raise PlanError(f"plan field source.{key} is {dims}: {math.prod(dims):.3g} elements, more than any "
                            f"input this tensorplan runs ({_MAX_ELEMENTS:.3g})")


def _is_file_source(src: dict[str, Any]) -> bool:
    model = str(src.get("model", ""))
    return bool(src.get("onnx")) or model.endswith(".onnx") or "/" in model or os.sep in model


def _zoo_file(name: str, opset: int) -> Path:
    """The zoo's ONNX export of a bundled model a plan names (tensorplan's own code builds it)."""
    from tensorplan.errors import TensorplanError
    if Path(name).exists():
        raise PlanError(f"plan field source.model '{name}' is a file but records no content hash (source.onnx, "
                        "source.onnx_sha256); re-run `tensorplan orchestrate` on it")
    try:
        from tensorplan import zoo
        zoo.get_entry(name)
        return Path(zoo.export(name, opset))
    except ImportError as e:
        raise PlanError(f"plan's model '{name}' is a zoo model and the model zoo is unavailable ({e})") from None
    except TensorplanError as e:
        raise PlanError(f"plan field source.model '{name}' names neither an ONNX file nor a bundled zoo model: "
                        f"{e}") from None


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_origin(graph: Graph) -> dict[str, Any]:
    """What a plan records about the model it is made from, so that reading it runs no code: an ONNX
    file's absolute path and content hash (for a PyTorch factory, the ONNX file it was exported to,
    the factory kept as `made_from` for information only); a zoo model by its name; a graph built
    in memory as such."""
    from tensorplan.zoo.from_torch import is_torch_spec
    from tensorplan.zoo.specs import resolve_model_path
    spec = graph.source
    if not spec:
        return {"model": graph.name, "in_memory": True}
    if is_torch_spec(spec) or _is_file_source({"model": spec}) or Path(spec).is_file():
        path = Path(resolve_model_path(spec, int(graph.opset))).resolve()
        out = {"model": str(path) if is_torch_spec(spec) else spec, "onnx": str(path),
               "onnx_sha256": file_sha256(path)}
        if is_torch_spec(spec):
            out["made_from"] = spec
        return out
    return {"model": spec}


def load_plan(path: str | Path) -> Plan:
    """A plan saved by `plan.save` / `tensorplan orchestrate -o`, verified against its model
    (`Plan.load`): PlanError naming the field or kernel at fault otherwise."""
    return Plan.load(path, check=True)


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
    precisions: dict[str, int] = field(default_factory=dict)   # kernels per precision

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

def kernel_io(prim: Graph, nodes: list[str], kid: str | None = None, what: str = "primitive"
              ) -> tuple[list[str], list[str]]:
    """(non-constant external inputs, sink outputs) of a node set, as candidates define them."""
    byname = {n.name: n for n in prim.nodes}
    missing = [x for x in nodes if x not in byname]
    if missing:
        who = f"kernel '{kid}'" if kid else "kernel"
        raise PlanError(f"{who} refers to unknown {what} node(s) {missing[:3]}")
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


def verify(plan: Plan, prim: Graph, source: Graph | None = None) -> None:
    """Check a plan against its primitive graph (and, for region kernels, the rewritten model
    `source`); raise PlanError naming the first problem.

    Checks: kernel ids unique; nodes exist; each kernel's declared inputs/outputs match its node
    set (convex single-output semantics); kernels are convex; a region kernel's operators compute
    its outputs from its inputs; no kernel twice (the same primitives, or only tensors another
    kernel produces); `order` is a permutation of the kernels in which every input is available
    (graph input or earlier output) when the kernel runs; every graph output is produced; the
    buffers hold every kernel output at its size for its whole lifetime, without two live tensors
    in one slot, and the arena fits this machine."""
    ids = [k.id for k in plan.kernels]
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise PlanError(f"plan has duplicate kernel ids ('{dup}' twice)")
    if sorted(plan.order) != sorted(ids):
        raise PlanError("plan order is not a permutation of its kernels")
    byname = {n.name: n for n in prim.nodes}
    pos = {n.name: k for k, n in enumerate(prim.nodes)}
    for k in plan.kernels:
        if not k.nodes:
            raise PlanError(f"kernel '{k.id}' has no nodes")
        ins, outs = kernel_io(prim, k.nodes, k.id)
        if set(ins) != set(k.inputs):
            raise PlanError(f"kernel '{k.id}' declares inputs {sorted(k.inputs)[:4]} but its nodes read "
                            f"{sorted(ins)[:4]}")
        if not set(k.outputs) <= set(o for x in k.nodes for o in byname[x].outputs if o) or \
                not set(outs) <= set(k.outputs) | _dead(prim, outs):
            raise PlanError(f"kernel '{k.id}' declares outputs {k.outputs} but its sink outputs are {outs}")
        _check_convex(prim, k, pos)
        if k.kind == "region" and source is not None:
            _check_region(source, k)
    _check_no_kernel_twice(plan)
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
    if plan.buffers or plan.slots:
        _check_buffers(plan, prim)


def _check_region(source: Graph, k: PlanKernel) -> None:
    """A region kernel runs the original operators its schedule names: they must exist and compute
    the kernel's outputs from its inputs (and constants)."""
    ops = list(k.schedule.get("operators") or ())
    if not ops:
        raise PlanError(f"region kernel '{k.id}' names no operators (plan field schedule.operators)")
    ins, _ = kernel_io(source, ops, k.id, what="operator")
    members, declared = set(ops), set(k.inputs)
    produced = {o for n in source.nodes if n.name in members for o in n.outputs if o}
    extra = [i for i in ins if i not in declared]
    missing = [o for o in k.outputs if o not in produced]
    if extra or missing:
        raise PlanError(f"region kernel '{k.id}': its operators (plan field schedule.operators) "
                        + (f"read {extra[:3]}, which are not its inputs" if extra else
                           f"do not produce its output(s) {missing[:3]}"))


def _check_no_kernel_twice(plan: Plan) -> None:
    """A kernel listed twice (the same primitives, or only tensors other kernels already produce)
    would run twice and double its time: refused."""
    seen: dict[frozenset, str] = {}
    producers: dict[str, list[str]] = {}
    for k in plan.kernels:
        if len(set(k.outputs)) != len(k.outputs):
            raise PlanError(f"kernel '{k.id}' lists an output twice ({k.outputs[:4]})")
        key = frozenset(k.nodes)
        if key in seen:
            raise PlanError(f"kernels '{seen[key]}' and '{k.id}' compute the same primitives: a kernel listed "
                            "twice would run twice")
        seen[key] = k.id
        for o in k.outputs:
            producers.setdefault(o, []).append(k.id)
    for k in plan.kernels:
        others = {p for o in k.outputs for p in producers[o] if p != k.id}
        if all(len(producers[o]) > 1 for o in k.outputs):
            raise PlanError(f"kernel '{k.id}' produces only tensors that kernel(s) {sorted(others)[:3]} also "
                            f"produce ({k.outputs[:3]}): a kernel listed twice would run twice")


def _check_buffers(plan: Plan, prim: Graph) -> None:
    """Buffers and slots as the executor allocates them: no slot larger than its largest tensor (no
    10^15-byte allocation), every kernel output held at its size from its first write to its last
    read, no two live tensors in one slot, and the arena within this machine's memory."""
    n = len(plan.order)
    pos = {kid: i for i, kid in enumerate(plan.order)}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for kid in plan.order:
        k = plan.kernel(kid)
        for o in k.outputs:
            first.setdefault(o, pos[kid])
        for i in k.inputs:
            last[i] = max(last.get(i, -1), pos[kid])
    by_tensor: dict[str, dict] = {}
    for j, b in enumerate(plan.buffers):
        t = b["tensor"]
        where = f"plan field buffers[{j}] (tensor '{t}')"
        if t not in first:
            raise PlanError(f"{where}: no kernel produces that tensor")
        if t in by_tensor:
            raise PlanError(f"{where}: the tensor has two buffers")
        by_tensor[t] = b
        want = int(prim.tensors[t].nbytes)
        if b["bytes"] != want:
            raise PlanError(f"{where}: bytes is {b['bytes']}, the tensor holds {want}")
        if not 0 <= b["slot"] < len(plan.slots):
            raise PlanError(f"{where}: slot {b['slot']} is not one of the plan's {len(plan.slots)} slots")
        if plan.slots[b["slot"]] < want:
            raise PlanError(f"{where}: slot {b['slot']} has {plan.slots[b['slot']]} bytes, the tensor needs {want}")
        end = n if t in prim.outputs else last.get(t, first[t])
        if b["first_use"] > first[t] or b["last_use"] < end or b["last_use"] > n:
            raise PlanError(f"{where}: lifetime {b['first_use']}..{b['last_use']} does not cover its use, "
                            f"{first[t]}..{end}")
    miss = [t for t in first if t not in by_tensor]
    if miss:
        raise PlanError(f"plan field buffers has no buffer for kernel output(s) {miss[:3]}")
    per_slot: dict[int, list[dict]] = {}
    for b in plan.buffers:
        per_slot.setdefault(b["slot"], []).append(b)
    for s, size in enumerate(plan.slots):
        bs = sorted(per_slot.get(s, []), key=lambda b: b["first_use"])
        top = max((b["bytes"] for b in bs), default=0)
        if size > top:
            raise PlanError(f"plan field slots[{s}] is {size} bytes, but its largest tensor needs {top}")
        for a, b in zip(bs, bs[1:]):
            if b["first_use"] <= a["last_use"]:
                raise PlanError(f"plan field buffers: tensors '{a['tensor']}' and '{b['tensor']}' share slot {s} "
                                "while both are live")
    total = sum(plan.slots)
    mem = _physical_memory()
    if mem and total > mem:
        raise PlanError(f"plan's buffers need {total / 2**30:.1f} GiB (plan field slots), more than this "
                        f"machine's {mem / 2**30:.1f} GiB")


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


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


__all__ = ["BACKENDS", "KINDS", "REDUCED_PRECISION_TOLERANCE", "SCHEMA", "Plan", "PlanKernel", "PlanSummary",
           "check_source", "file_sha256", "is_factory_spec", "kernel_io", "load_plan", "model_origin", "topo_order",
           "verify"]
