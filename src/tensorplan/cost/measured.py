"""`MeasuredCost`: compile every candidate kernel and time it on this machine (Korch's profiler).

Per candidate kind:
- memory (elementwise/reduce/layout): TVM with the default schedule (and serial, for
  mid-sized outputs); a single primitive TVM cannot lower runs through ONNX Runtime (so
  singletons are always finite); for singletons ONNX Runtime is also timed;
- linear: ONNX Runtime (MLAS); PyTorch (oneDNN/MKL) when `linear_backends` includes
  "torch". Not by default: timed alone, torch convolutions sometimes win, but inside a
  plan that alternates backends their OpenMP pool must be woken for every call, and
  measured end to end on the shared 2-core machine the torch kernels cost 5-7x their
  solo time (ResNet-50: 26 torch convs, plan 0.18x of ORT; bench/results/);
- opaque: ONNX Runtime;
- region (several original operators, korch/regions.py): one ONNX Runtime session over them, and
  the same operators compiled by OpenVINO (`region_backends`; kernels/openvino.py).
With `tvm_schedules` (e.g. `TunedCost.top_schedules`), each memory candidate is also timed
with every TVM schedule it returns (sampled meta_schedule schedules), and the store key then
includes a digest of those schedules, so records of different schedule sets never mix.
ONNX Runtime is timed at full threads and at one thread. The fastest variant wins
(Korch's min over profilers) and is recorded as the plan kernel's backend + schedule.

Costs are cached in the measurement `Store` keyed by the candidate's canonical hash
(+ the kind and thread count) and the device key, and written as soon as each is
measured: a killed profiling job resumes where it stopped, and repeated blocks (12
BERT layers) are measured once. `kernel_info` tells the planner which backend won,
so the plan's executor rebuilds exactly the kernel that was timed.

Statistic: the cost is the *minimum* over repeats (each repeat averages >= 0.2 ms of
back-to-back calls) by default, not the median: on a shared 2-core machine other jobs'
bursts inflate whole timing windows, and the minimum is what the kernel costs when it
has the cores (pass `statistic="median"` for Korch's mean-like figure). Memory-bound
kernels whose time per byte is far above their peers' are timed once more.

Where: each kernel is one pure job (`KernelJob` -> `KernelOutcome`, `time_kernel`), run through a
`measure.cluster` runner: here, in order (default), or with `ray_address` on the Ray workers that
offer this device; either way the outcome is recorded in this process's store. A job the cluster
could not finish (worker lost on every retry, timed out) costs inf for this run and is not stored,
so the next run times it again.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tensorplan.cost import node_index
from tensorplan.errors import CompileError, TensorplanError
from tensorplan.ir.graph import Graph

if TYPE_CHECKING:
    from tensorplan.korch.candidates import Candidate
    from tensorplan.measure.cluster import ClusterJob

PROGRAM_KIND = "korch_kernel"
COST_VERSION = 4  # bump when the kernels/schedules change so old timings are not reused


class MeasuredCost:
    """Korch-style profiling cost model (see module docstring). `device` is a name or a `DeviceSpec`
    of this machine; kernels are timed at `threads` threads (default: the device's own count, every
    usable core for 'local')."""

    name = "measured"
    supports_regions = True  # region candidates can only be timed, not estimated

    def __init__(self, store: Any = None, device: Any = "local", threads: int | None = None, budget_s: float = 0.05,
                 linear_backends: tuple[str, ...] = ("ort",), singleton_ort: bool = True,
                 tag: str = "", remeasure: bool = False, statistic: str = "min", outlier_factor: float = 4.0,
                 region_backends: tuple[str, ...] = ("ort", "openvino"),
                 tvm_schedules: "Callable[[Graph, Candidate], list[dict]] | None" = None,
                 ray_address: str | None = None):
        from tensorplan import devices
        from tensorplan.measure.cluster import job_runner
        from tensorplan.measure.store import Store
        self.store = store if isinstance(store, Store) else Store(store)
        self.spec = devices.device(device)
        self.dev_key = self.store.put_device(self.spec)
        self.threads = int(threads or devices.default_threads(self.spec))
        self.budget_s = float(budget_s)
        self.linear_backends = tuple(linear_backends)
        from tensorplan.kernels.openvino import available
        self.region_backends = tuple(b for b in region_backends if b != "openvino" or available())
        self.singleton_ort = singleton_ort
        self.tag = tag
        self.remeasure = remeasure
        if statistic not in ("min", "median"):
            raise TensorplanError(f"MeasuredCost: statistic must be 'min' or 'median', not '{statistic}'")
        self.statistic = statistic
        self.outlier_factor = float(outlier_factor)
        self.tvm_schedules = tvm_schedules
        self._extra: dict[str, list[dict]] = {}   # canonical hash -> extra TVM schedules to time
        self._info: dict[str, dict] = {}   # canonical hash -> {"backend", "schedule", ...}
        self.stats = {"measured": 0, "cached": 0, "failed": 0, "remeasured": 0, "compile_s": 0.0, "measure_s": 0.0,
                      "lost": 0}
        self.runner = job_runner(ray_address)     # where the jobs run (`measure.cluster`)
        self.lost: dict[str, str] = {}            # candidate id -> why the cluster returned no timing

    # -- protocol -------------------------------------------------------------------------
    def cost(self, prim: Graph, cand: "Candidate") -> float:
        return self.cost_many(prim, [cand])[0]

    def cost_many(self, prim: Graph, cands: list["Candidate"], progress: bool = False) -> list[float]:
        out: list[float] = []
        todo: list[tuple[int, Any, str]] = []
        for k, c in enumerate(cands):
            pk = self._prog_key(prim, c)
            hit = None if self.remeasure else self.store.get_measurement(pk, self.dev_key, self.tag)
            if hit is not None:
                out.append(self._from_record(c, hit))
                self.stats["cached"] += 1
            else:
                out.append(math.nan)
                todo.append((k, c, pk))
        if not todo:
            return out
        bar = _progress(progress, len(todo), f"profiling {len(todo)} kernels ({len(cands) - len(todo)} cached)")
        try:
            jobs = [self._job(prim, c) for _, c, _ in todo]
            for r in self.runner.run(jobs):
                k, c, pk = todo[r.index]
                out[k] = self._record(c, pk, r, jobs[r.index].args[0])
                if bar is not None:
                    bar[0].advance(bar[1])
        finally:
            if bar is not None:
                bar[0].stop()
        if self.outlier_factor > 0:
            self._remeasure_outliers(prim, [(k, c, pk) for k, c, pk in todo], out)
        return out

    def _remeasure_outliers(self, prim: Graph, items: list, out: list[float]) -> None:
        """Time again the kernels whose latency per byte is `outlier_factor` x above the median of
        their kind: on a shared machine one timing window can fall into another job's burst."""
        from tensorplan.cost import kernel_work
        ratios = {}
        for k, c, pk in items:
            if math.isfinite(out[k]) and c.kind == "memory":
                _, nbytes = kernel_work(prim, c)
                if nbytes > 0:
                    ratios[k] = out[k] / nbytes
        if len(ratios) < 8:
            return
        med = sorted(ratios.values())[len(ratios) // 2]
        for k, c, pk in items:
            if k in ratios and ratios[k] > self.outlier_factor * med and out[k] > 2e-5:
                again = self._measure_one(prim, c, pk, keep_best_of=out[k])
                self.stats["remeasured"] += 1
                out[k] = min(out[k], again)

    def kernel_info(self, prim: Graph, cand: "Candidate") -> dict:
        """Backend and schedule of the kernel that was timed (for the plan)."""
        info = self._info.get(cand.canonical_hash)
        if info is None:
            self.cost(prim, cand)
            info = self._info.get(cand.canonical_hash, {})
        return {"backend": info.get("backend", ""), "schedule": dict(info.get("schedule") or {})}

    def cached(self, prim: Graph, cand: "Candidate") -> float | None:
        """The candidate's cost as the store already holds it with these settings (math.inf for a kernel
        that failed to build), or None when it was never timed: what a second run reuses untimed."""
        hit = None if self.remeasure else self.store.get_measurement(self._prog_key(prim, cand), self.dev_key, self.tag)
        if hit is None:
            return None
        self.stats["cached"] += 1
        return self._from_record(cand, hit)

    def describe(self) -> dict:
        return {"name": self.name, "device": self.spec.name, "threads": self.threads, "budget_s": self.budget_s,
                "linear_backends": list(self.linear_backends), "region_backends": list(self.region_backends),
                "store": str(self.store.path), **self.stats, **self.runner.describe()}

    # -- internals ------------------------------------------------------------------------
    def _prog_key(self, prim: Graph, c: "Candidate") -> str:
        byname = node_index(prim)
        payload = {"canonical_hash": c.canonical_hash, "kind": c.kind, "threads": self.threads,
                   "version": COST_VERSION, "ops": [byname[n].op for n in c.nodes],
                   "linear_backends": sorted(self.linear_backends) if c.kind == "linear" else []}
        if c.kind == "region" and self.region_backends != ("ort",):   # the key of ORT-only regions is unchanged
            payload["region_backends"] = sorted(self.region_backends)
        extra = self._extra_schedules(prim, c)
        if extra:                          # without extra schedules the key is unchanged
            payload["tvm_schedules"] = schedules_digest(extra)
        return self.store.put_program(PROGRAM_KIND, payload)

    def _extra_schedules(self, prim: Graph, c: "Candidate") -> list[dict]:
        """The memory candidate's extra TVM schedules (`tvm_schedules`), those the default variants
        already time left out; cached per canonical hash."""
        if self.tvm_schedules is None or c.kind != "memory":
            return []
        got = self._extra.get(c.canonical_hash)
        if got is None:
            base = [{"name": "default"}, {"name": "default", "parallel": False}]
            got = []
            for sch in self.tvm_schedules(prim, c) or []:
                if not isinstance(sch, dict) or "name" not in sch:
                    raise TensorplanError(f"MeasuredCost: tvm_schedules returned {type(sch).__name__} {sch!r:.80} "
                                          f"for candidate {c.id}; it must return schedule dicts with a 'name'")
                if sch not in base and sch not in got:
                    got.append(dict(sch))
            self._extra[c.canonical_hash] = got
        return got

    def _from_record(self, c: "Candidate", rec: dict) -> float:
        ex = rec.get("extra") or {}
        self._info[c.canonical_hash] = {"backend": ex.get("backend", ""), "schedule": ex.get("schedule") or {}}
        if ex.get("failed"):
            return math.inf
        return float(rec["min_s"] if self.statistic == "min" else rec["median_s"])

    def _job(self, prim: Graph, c: "Candidate") -> "ClusterJob":
        """The picklable job that compiles and times every variant of candidate `c` on this device."""
        from tensorplan.measure.cluster import ClusterJob
        sub = c.graph(prim)
        extra_scheds = self._extra_schedules(prim, c)
        variants = self._backends_for(c, sub) + [f"tvm:s{j}" for j in range(len(extra_scheds))]
        job = KernelJob(sub, list(c.outputs), variants, extra_scheds, self.threads, self.budget_s)
        return ClusterJob(time_kernel, (job,), label=f"kernel {c.id} ({c.kind}: {', '.join(c.nodes)[:120]})",
                          device=self.spec)

    def _measure_one(self, prim: Graph, c: "Candidate", pk: str, keep_best_of: float | None = None) -> float:
        job = self._job(prim, c)
        return self._record(c, pk, self.runner.map([job])[0], job.args[0], keep_best_of)

    def _record(self, c: "Candidate", pk: str, result: Any, job: "KernelJob",
                keep_best_of: float | None = None) -> float:
        """Store what the job for `c` returned (the fastest variant, or that none built) and return
        its cost; a job the runner could not finish costs inf here and is not stored."""
        from tensorplan.measure.timer import Timing
        if not result.ok:
            import logging
            self.stats["lost"] += 1
            self.lost[c.id] = f"{result.label}: {result.error}"
            logging.getLogger("tensorplan.measure").warning(
                "%s: no timing (%s); it costs inf in this run and is not stored, so the next run times it again",
                result.label, result.error)
            return keep_best_of if keep_best_of is not None else math.inf
        oc: KernelOutcome = result.value
        self.stats["measure_s"] += oc.measure_s
        self.stats["compile_s"] += oc.compile_s
        times = {b: (tm.min_s if self.statistic == "min" else tm.median_s) for b, tm in oc.timings.items()}
        timings, errors = oc.timings, oc.errors
        backends, extra_scheds = job.variants, job.extra
        worker = {} if result.worker == "in-process" else {"worker": result.worker}   # which machine timed it
        if not times and keep_best_of is not None:
            return keep_best_of
        if not times:
            self.stats["failed"] += 1
            extra = {"failed": True, "errors": errors, "backend": "", "backends": backends, **worker}
            self.store.put_measurement(pk, self.dev_key, Timing.from_repeats([1e9], method="failed"), self.tag,
                                       extra)
            self._info[c.canonical_hash] = {"backend": "", "schedule": {}}
            return math.inf
        best = min(times, key=times.get)
        if keep_best_of is not None and keep_best_of <= times[best]:
            return keep_best_of  # the first timing stands (already in the store)
        backend, sched = self._variant(best, extra_scheds)
        extra = {"backend": backend, "variant": best, "schedule": sched, "times": times, "errors": errors or None,
                 "statistic": self.statistic, **worker}
        self.store.put_measurement(pk, self.dev_key, timings[best], self.tag, extra)
        self.stats["measured"] += 1
        self._info[c.canonical_hash] = {"backend": backend, "schedule": sched}
        return times[best]

    def _backends_for(self, c: "Candidate", sub: Graph | None = None) -> list[str]:
        """Variants to time, as "backend[:variant]": ORT at full and at one thread (a kernel
        too small to split pays more for waking a worker than it gains), TVM with its default
        (parallel) schedule and, for mid-sized outputs, serial."""
        ort = ["ort", "ort:1t"] if self.threads > 1 else ["ort"]
        if c.kind == "linear":
            out = []
            for b in self.linear_backends:
                out += ort if b == "ort" else [b]
            return out
        if c.kind == "region":
            return ort + [b for b in self.region_backends if b != "ort"]
        if c.kind == "opaque":
            return ort
        tvm = ["tvm"]
        if sub is not None and self.threads > 1:
            n = sum(sub.tensors[o].numel for o in c.outputs)
            if 4096 <= n <= (1 << 19):
                tvm.append("tvm:serial")
        if len(c.nodes) == 1 and self.singleton_ort:
            return tvm + ort
        return tvm

    @staticmethod
    def _variant(name: str, extra: list[dict] | None = None) -> tuple[str, dict]:
        """"ort:1t" -> ("ort", {"threads": 1, "spinning": False}), "tvm:serial" -> TVM, no parallel,
        "tvm:s<j>" -> TVM with the j-th extra schedule."""
        if name.startswith("tvm:s") and name[5:].isdigit():
            return "tvm", dict((extra or [])[int(name[5:])])
        if name == "ort":
            return "ort", {"spinning": False}
        if name == "ort:1t":
            return "ort", {"threads": 1, "spinning": False}
        if name == "tvm":
            return "tvm", {"name": "default"}
        if name == "tvm:serial":
            return "tvm", {"name": "default", "parallel": False}
        if name == "openvino":
            return "openvino", {}
        return name, {}



@dataclass(frozen=True)
class KernelJob:
    """Compile and time one candidate kernel: its sub-graph, outputs, the variants to time
    ("backend[:variant]", `MeasuredCost._backends_for`), extra TVM schedules, threads, time budget."""

    sub: Graph
    outputs: list[str]
    variants: list[str]
    extra: list[dict] = field(default_factory=list)
    threads: int = 1
    budget_s: float = 0.05


@dataclass
class KernelOutcome:
    """Timing of every variant that built and ran, the error of every one that did not, and the
    seconds spent compiling and measuring."""

    timings: dict[str, Any]
    errors: dict[str, str]
    compile_s: float = 0.0
    measure_s: float = 0.0


def time_kernel(job: KernelJob) -> KernelOutcome:
    """Compile and time every variant of `job` at its thread count (a pure job: where it runs does
    not change what it computes). A variant that does not build or run is an error, not a failure."""
    from tensorplan.measure.timer import pinned_threads
    t0 = time.perf_counter()
    out = KernelOutcome({}, {})
    ref: tuple[str, dict[str, np.ndarray]] | None = None   # the first variant that ran: what the others must compute
    with pinned_threads(job.threads):
        for b in job.variants:
            try:
                tm, compile_s, got = _time_variant(job, b, ref)
                ref = ref or (b, got)
            except (CompileError, TensorplanError) as e:
                out.errors[b] = str(e)[:300]
                continue
            except Exception as e:  # noqa: BLE001 - a crashing kernel is unavailable, not fatal
                out.errors[b] = f"{type(e).__name__}: {str(e)[:300]}"
                continue
            out.timings[b] = tm
            out.compile_s += compile_s
    out.measure_s = time.perf_counter() - t0
    return out


#: A variant whose outputs differ from the first variant's by more than this share of their largest
#: magnitude computes something else (fp32 reordering and exp approximations stay below 1e-5).
WRONG_RESULT = 1e-3


def _as_numpy(t: Any) -> np.ndarray:
    return np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t.numpy() if hasattr(t, "numpy") else t)


def _mismatch(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> str | None:
    """Why `got` is not what `want` holds (outputs by name), or None when it is (within WRONG_RESULT).
    The normalised max error of `precision.accuracy.compare`, but NaN/inf allowed where the reference
    has them: a kernel on random inputs may rightly produce them (Log, Div), which `compare` refuses."""
    for i, b in want.items():
        a = got.get(i)
        if a is None:
            return f"output {i} is missing"
        if a.shape != b.shape:
            return f"output {i} has shape {a.shape}, not {b.shape}"
        if not np.issubdtype(b.dtype, np.floating):
            if not np.array_equal(a, b):
                return f"output {i} differs in {int(np.count_nonzero(a != b))} of {b.size} elements"
            continue
        if not np.array_equal(np.isfinite(a), np.isfinite(b)):
            return f"output {i} is not finite where the reference is (or the other way round)"
        fin = np.isfinite(b)
        if not fin.any():
            continue
        err = float(np.abs(a[fin].astype(np.float64) - b[fin]).max())
        scale = max(float(np.abs(b[fin]).max()), 1e-6)
        if err > WRONG_RESULT * scale:
            return f"output {i}: max |out - ref| {err:.3g} = {err / scale:.2g} of its largest magnitude"
    return None


def _time_variant(job: KernelJob, variant: str, ref: tuple[str, dict[str, np.ndarray]] | None):
    """(Timing, compile seconds, outputs) of one variant of the job's kernel. Its outputs on the
    shared random inputs must be the reference variant's (`ref`: the first that ran), else it raises
    CompileError and is not timed: a meta_schedule draw can compile to a kernel that computes
    something else (e.g. a reduction computed inside its consumer's reduction loop, summed again
    on every iteration), and a wrong kernel must never win on speed."""
    from tensorplan.measure.timer import measure
    from tensorplan.kernels.vendor import make_kernel, random_inputs
    t0 = time.perf_counter()
    backend, sched = MeasuredCost._variant(variant, job.extra)
    k = make_kernel(job.sub, job.outputs, backend, threads=job.threads, schedule=sched or None)
    compile_s = time.perf_counter() - t0
    ins = random_inputs(job.sub, list(k.input_names))
    outs = k.alloc_outputs()
    fn = k.bind(ins, outs)
    fn()
    got = {n: _as_numpy(o).copy() for n, o in zip(k.output_names, outs)}
    if ref is not None:
        why = _mismatch(got, ref[1])
        if why is not None:
            raise CompileError(f"wrong result against variant '{ref[0]}' on the same inputs ({why}); not timed, "
                               "never used")
    return measure(fn, warmup=2, min_repeats=5, max_repeats=200, budget_s=job.budget_s, number=None,
                   min_repeat_s=2e-4), compile_s, got


def schedules_digest(schedules: list[dict]) -> str:
    """Content digest of a list of schedule dicts (part of a store key)."""
    import hashlib
    from tensorplan.measure.store import canonical_json
    return hashlib.sha256(canonical_json(schedules).encode()).hexdigest()[:24]



def _progress(enabled: bool, total: int, desc: str):
    if not enabled:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   transient=True)
    bar.start()
    return bar, bar.add_task(desc, total=total)


__all__ = ["MeasuredCost", "PROGRAM_KIND", "COST_VERSION", "schedules_digest", "KernelJob", "KernelOutcome",
           "time_kernel"]
