"""Run a `Plan`: every kernel compiled once, buffers preallocated and reused, checked against ORT.

Why this shape: the plan's latency should be the sum of its kernels, so the
executor adds as little as possible between them. Setup compiles each kernel
(TVM for memory-bound ones, ONNX Runtime / PyTorch for linear and opaque ones, as
the plan says), carves every intermediate tensor out of the plan's reusable arena
slots (torch tensors, 64-byte aligned), and *binds* each kernel to its buffers:
TVM gets the torch tensors via DLPack, ONNX Runtime an I/O binding on their raw
pointers, so nothing is copied between backends. `run()` is then a loop over
zero-argument callables (~0.3 us per TVM kernel, ~2 us per ORT kernel).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tensorplan.devices import usable_cores
from tensorplan.errors import CompileError, PlanError, TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.runtime.buffers import plan_buffers

if TYPE_CHECKING:  # the plan module runs this one (Plan.run), not the other way round
    from tensorplan.runtime.plan import Plan, PlanKernel

DEFAULT_BACKEND = {"memory": "tvm", "linear": "ort", "opaque": "ort"}
FALLBACKS = {"tvm": ["ort", "reference"], "ort": ["reference"], "openvino": ["ort", "reference"], "torch": ["ort", "reference"],
             "torch-inductor": ["ort", "reference"], "reference": []}


def _torch():
    import torch
    return torch


def _tdtype(d: str):
    torch = _torch()
    return {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64, "int64": torch.int64,
            "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}[d]


def reference_kernel(sub: Graph, name: str):
    """Last resort for an op no backend builds: the numpy reference executor + a copy."""
    from tensorplan.ir.reference import run_reference
    from tensorplan.kernels.base import VendorKernel
    torch = _torch()
    ins = [i for i in sub.inputs if not sub.tensors[i].is_constant]
    outs = list(sub.outputs)

    def bind(inputs, outputs):
        def call():
            res = run_reference(sub, {n: t.numpy() for n, t in zip(ins, inputs)})
            for o, t in zip(outs, outputs):
                t.copy_(torch.from_numpy(np.asarray(res[o], order="C")))
        return call
    return VendorKernel(name=name, backend="reference", input_names=ins, output_names=outs,
                        output_shapes=[tuple(sub.tensors[o].shape) for o in outs],
                        output_dtypes=[sub.tensors[o].dtype for o in outs], _bind=bind)


def inductor_kernel(sub: Graph, name: str, precision: str = "fp32"):
    """A kernel compiled by PyTorch Inductor on the CPU (kernels.vendor.inductor_kernel), at fp32 or,
    by autocast, bf16/fp16."""
    from tensorplan.kernels.vendor import inductor_kernel as build
    return build(sub, name, precision=precision)


def kernel_graph(prim: Graph, k: "PlanKernel", source: Graph | None = None) -> Graph:
    """What a plan kernel computes, as a standalone Graph: its primitives, or for a region kernel
    the original operators it names (`schedule["operators"]`, taken from `source`)."""
    if k.kind == "region":
        ops = list(k.schedule.get("operators") or ())
        if source is None or not ops:
            raise PlanError(f"region kernel '{k.id}' needs the original model and its operator list")
        sub = source.subgraph(ops, name=k.id)
    else:
        sub = prim.subgraph(k.nodes, name=k.id)
    sub.inputs = list(k.inputs)
    sub.outputs = list(k.outputs)
    return sub


def build_kernel(prim: Graph, k: "PlanKernel", threads: int | None = None, source: Graph | None = None,
                 calibration: list[dict] | None = None, quantized: Any = None) -> tuple[Any, str, list[str]]:
    """Build a plan kernel on its backend at its precision (`threads`: default every usable core),
    falling back (tvm -> ort -> reference) with reasons. A kernel at bf16, fp16 or int8 falls back
    only to a backend that builds it at the same precision, never to fp32: CompileError naming the
    kernel and the precision when none can. An int8 kernel runs `quantized` (its stored quantized
    model, `Plan.quantized_model`) or is quantized on `calibration` (feeds for its inputs)."""
    from tensorplan.kernels.vendor import BACKEND_PRECISIONS, make_kernel
    sub = kernel_graph(prim, k, source)
    backend = k.backend or DEFAULT_BACKEND.get(k.kind, "ort")
    precision = k.precision
    notes: list[str] = []
    tries = [backend] + FALLBACKS.get(backend, ["ort", "reference"])
    if precision != "fp32":
        tries = [backend] + [b for b in tries[1:] if precision in BACKEND_PRECISIONS.get(b, ())]
    for b in tries:
        try:
            if b == "reference":
                return reference_kernel(sub, k.id), b, notes
            sched = {x: v for x, v in k.schedule.items() if x not in ("operators", "quantized")} \
                if b == backend else None
            return make_kernel(sub, list(k.outputs), b, threads=threads, schedule=sched or None, precision=precision,
                               calibration=calibration, quantized=quantized if b == backend else None), b, notes
        except CompileError as e:
            notes.append(f"{b}: {e}")
    if precision != "fp32":
        raise CompileError(f"kernel '{k.id}' cannot be built at {precision} (plan field precision; it is never "
                           f"run at fp32 instead): {'; '.join(notes)}")
    raise CompileError(f"kernel '{k.id}': no backend could build it: {'; '.join(notes)}")


@dataclass
class KernelSlot:
    """One compiled kernel of a running plan, bound to its buffers."""

    kernel: "PlanKernel"
    compiled: Any
    backend: str
    call: Callable[[], Any]
    notes: list[str] = field(default_factory=list)


class PlanExecutor:
    """Compile a plan's kernels once and run them in order on preallocated, reused buffers."""

    def __init__(self, plan: "Plan", prim: Graph | None = None, threads: int | None = None, progress: bool = False,
                 source: Graph | None = None, calibration: dict[str, list[dict]] | None = None):
        """`calibration` maps an int8 kernel's id to feeds for its inputs (`capture`): needed only for
        an int8 kernel with no quantized model yet; the model made is kept on the plan's kernel
        (`PlanKernel.quantized`), so `plan.save` stores it and the plan then runs without it."""
        torch = _torch()
        prim = prim if prim is not None else plan.primitive_graph()
        if source is None and any(k.kind == "region" for k in plan.kernels):
            source = plan.source_graph()
        self.plan = plan
        self.prim = prim
        self.source = source
        self._fp32: PlanExecutor | None = None
        self.threads = int(threads or usable_cores())
        t0 = time.perf_counter()
        if not plan.buffers:
            plan_buffers(plan, prim)
        # -- buffers ---------------------------------------------------------------------
        self.arenas = [torch.empty(max(int(b), 1), dtype=torch.uint8) for b in plan.slots]
        self.tensors: dict[str, Any] = {}
        for b in plan.buffers:
            t = prim.tensors[b["tensor"]]
            self.tensors[b["tensor"]] = self._view(self.arenas[int(b["slot"])], t.shape, t.dtype)
        for name in prim.inputs:
            t = prim.tensors[name]
            self.tensors[name] = torch.empty(t.shape, dtype=_tdtype(t.dtype))
        for name in prim.outputs:  # a graph output no kernel writes (e.g. an input passed through)
            if name not in self.tensors:
                t = prim.tensors[name]
                self.tensors[name] = torch.empty(t.shape, dtype=_tdtype(t.dtype))
        # -- kernels ---------------------------------------------------------------------
        self.slots: list[KernelSlot] = []
        order = plan.ordered_kernels()
        it = order
        bar = None
        if progress:
            from rich.progress import Progress
            bar = Progress(transient=True)
            bar.start()
            task = bar.add_task(f"compiling {len(order)} kernels", total=len(order))
        try:
            for k in it:
                quantized = plan.quantized_model(k.id) if k.precision == "int8" else None
                compiled, backend, notes = build_kernel(prim, k, self.threads, source,
                                                        calibration=(calibration or {}).get(k.id),
                                                        quantized=quantized)
                made = getattr(compiled, "quantized", None)
                if made is not None and quantized is None and \
                        backend == (k.backend or DEFAULT_BACKEND.get(k.kind, "ort")):
                    k.quantized = made     # quantized here: kept for plan.save
                missing = [i for i in k.inputs if i not in self.tensors]
                if missing:
                    raise PlanError(f"kernel '{k.id}' reads {missing[:3]}, which no earlier kernel or input holds")
                ins = [self.tensors[i] for i in compiled.input_names]
                outs = [self.tensors[o] for o in compiled.output_names]
                call = compiled.bind(ins, outs)
                self.slots.append(KernelSlot(k, compiled, backend, call, notes))
                if bar is not None:
                    bar.advance(task)
        finally:
            if bar is not None:
                bar.stop()
        self.calls = [s.call for s in self.slots]
        self.compile_s = time.perf_counter() - t0

    @staticmethod
    def _view(arena, shape, dtype: str):
        torch = _torch()
        td = _tdtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
        nbytes = n * torch.empty((), dtype=td).element_size()
        return arena[:nbytes].view(td).view(tuple(shape))

    # -- running --------------------------------------------------------------------------
    def set_inputs(self, feeds: dict[str, Any]) -> None:
        torch = _torch()
        for name in self.prim.inputs:
            if name not in feeds:
                raise TensorplanError(f"missing feed for graph input '{name}' "
                                      f"(shape {self.prim.tensors[name].shape})")
            v = feeds[name]
            src = torch.from_numpy(np.asarray(v, order="C")) if isinstance(v, np.ndarray) else v
            dst = self.tensors[name]
            if tuple(src.shape) != tuple(dst.shape):
                raise TensorplanError(f"feed '{name}' has shape {tuple(src.shape)}, the plan expects "
                                      f"{tuple(dst.shape)}")
            dst.copy_(src)

    def run_bound(self) -> None:
        """Run every kernel once on the current input buffers (the timed loop)."""
        for c in self.calls:
            c()

    def run(self, feeds: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        if feeds is not None:
            self.set_inputs(feeds)
        self.run_bound()
        return {o: self.tensors[o].numpy().copy() for o in self.prim.outputs}

    def capture(self, feeds: list[dict[str, Any]], kernel_ids: list[str]) -> dict[str, list[dict[str, np.ndarray]]]:
        """Run the fp32 plan on each feed and return each named kernel's input feeds, as the plan
        hands them to it (its non-constant inputs, copied right before it runs): the calibration
        data of a kernel inside a plan. A plan with reduced-precision kernels is captured on an fp32
        copy of itself, compiled once."""
        ids = list(dict.fromkeys(kernel_ids))
        if not ids:
            return {}
        known = {s.kernel.id for s in self.slots}
        missing = [k for k in ids if k not in known]
        if missing:
            raise PlanError(f"capture: the plan has no kernel(s) {missing[:3]} (its kernels: "
                            f"{sorted(known)[:6]}{' ...' if len(known) > 6 else ''})")
        ex = self
        if any(s.kernel.precision != "fp32" for s in self.slots):
            if self._fp32 is None:
                fp32 = self.plan.copy()
                for k in fp32.kernels:
                    k.precision, k.quantized = "fp32", None
                    k.schedule.pop("quantized", None)
                self._fp32 = PlanExecutor(fp32, self.prim, threads=self.threads, source=self.source)
            ex = self._fp32
        want = set(ids)
        last = max(j for j, s in enumerate(ex.slots) if s.kernel.id in want)
        out: dict[str, list[dict[str, np.ndarray]]] = {k: [] for k in ids}
        for feed in feeds:
            ex.set_inputs(feed)
            for s in ex.slots[:last + 1]:
                if s.kernel.id in want:
                    out[s.kernel.id].append({n: ex.tensors[n].numpy().copy() for n in s.compiled.input_names})
                s.call()
        return out

    def precision_counts(self) -> dict[str, int]:
        """Kernels per precision, as built."""
        out: dict[str, int] = {}
        for s in self.slots:
            out[s.kernel.precision] = out.get(s.kernel.precision, 0) + 1
        return out

    def kernel_times(self, budget_s: float = 0.02) -> list[float]:
        """Median time of each kernel alone (bound to the same buffers)."""
        from tensorplan.measure.timer import measure
        return [measure(c, warmup=1, min_repeats=3, max_repeats=50, budget_s=budget_s).median_s
                for c in self.calls]

    def backend_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.slots:
            out[s.backend] = out.get(s.backend, 0) + 1
        return out

    @property
    def arena_bytes(self) -> int:
        return int(sum(a.numel() for a in self.arenas))


@dataclass
class RunResult:
    """What `Plan.run` measured: latency, fidelity to the plan's prediction, correctness; the run's
    outputs in `outputs`."""

    model: str
    kernels: int
    median_s: float
    timing: dict
    predicted_s: float
    max_rel_err: float | None
    ok: bool | None
    backends: dict[str, int]
    compile_s: float
    arena_bytes: int
    fallbacks: list[str]
    outputs: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    kernel_sum_s: float | None = None
    errors: dict[str, float] = field(default_factory=dict)
    tol: float | None = None
    reference: str | None = None     # the model ONNX Runtime ran as the reference: the file as given
    precisions: dict[str, int] = field(default_factory=dict)   # kernels per precision

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "outputs"}
        return d


def ort_reference(plan: "Plan", feeds: dict[str, np.ndarray], threads: int | None = None) -> dict[str, np.ndarray]:
    """Outputs of ONNX Runtime on the plan's *original* model file, as given (not tensorplan's import
    of it, nor the primitive graph): an import error shows up as a disagreement. The file it ran is
    `plan.reference_model()[1]`."""
    return run_original(*plan.reference_model(), feeds, threads=threads)


def run_original(data: bytes, where: str, feeds: dict[str, np.ndarray], threads: int | None = None
                 ) -> dict[str, np.ndarray]:
    """ONNX Runtime (CPU, all optimisations) on an ONNX model's bytes; TensorplanError naming `where`
    when ONNX Runtime refuses or fails to run it."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(threads or usable_cores())
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own exception types
        raise TensorplanError(f"ONNX Runtime refused the reference model {where}: {str(e).strip()[:300]}") from None
    names = [o.name for o in sess.get_outputs()]
    ins = {i.name for i in sess.get_inputs()}
    try:
        return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in ins})))
    except Exception as e:  # noqa: BLE001
        raise TensorplanError(f"ONNX Runtime failed running the reference model {where}: "
                              f"{str(e).strip()[:300]}") from None


def run_cpu_plan(plan: "Plan", prim: Graph, feeds: dict[str, np.ndarray], *, check: bool = True,
                 repeats: int | None = None, threads: int | None = None, budget_s: float = 2.0,
                 kernel_times: bool = False, tol: float = 1e-4, progress: bool = False) -> RunResult:
    """`Plan.run` for plans on this CPU: compile with `PlanExecutor`, time the median run (`repeats`
    runs, or ~`budget_s` seconds), and with `check` compare with ONNX Runtime (max rel. error <= `tol`)."""
    from tensorplan.ir.reference import rel_error
    from tensorplan.measure.timer import measure, pinned_threads
    threads = int(threads or usable_cores())
    with pinned_threads(threads):
        ex = PlanExecutor(plan, prim, threads=threads, progress=progress)
        outs = ex.run(feeds)
        if repeats:
            tm = measure(ex.run_bound, warmup=2, min_repeats=repeats, max_repeats=repeats, budget_s=0.0)
        else:
            tm = measure(ex.run_bound, warmup=2, min_repeats=5, max_repeats=200, budget_s=budget_s)
        ksum = float(sum(ex.kernel_times())) if kernel_times else None
    errors: dict[str, float] = {}
    max_err = None
    ok = None
    reference = None
    if check:
        data, reference = plan.reference_model()
        ref = run_original(data, reference, feeds, threads=threads)
        for o in prim.outputs:
            if o in ref:
                errors[o] = float(rel_error(np.atleast_1d(outs[o]), np.atleast_1d(ref[o])))
        max_err = max(errors.values()) if errors else None
        ok = max_err is not None and max_err <= tol
    fallbacks = [f"{s.kernel.id}: {n}" for s in ex.slots for n in s.notes]
    return RunResult(model=str(plan.source.get("model")), kernels=len(ex.slots), median_s=tm.median_s,
                     timing=tm.to_dict(), predicted_s=plan.predicted_s, max_rel_err=max_err, ok=ok, tol=tol,
                     backends=ex.backend_counts(), compile_s=ex.compile_s, arena_bytes=ex.arena_bytes,
                     fallbacks=fallbacks, outputs=outs, kernel_sum_s=ksum, errors=errors, reference=reference,
                     precisions=ex.precision_counts())


__all__ = ["PlanExecutor", "RunResult", "build_kernel", "kernel_graph", "ort_reference", "run_cpu_plan", "run_original"]
