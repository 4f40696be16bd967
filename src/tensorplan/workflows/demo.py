"""The main job on a bundled model: import, check the reference executor against
ONNX Runtime, and show where the time goes per operator on this device.

Why: a newcomer's first run should prove the pieces agree on real numbers before
any plan is trusted.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np

from tensorplan.devices import DeviceSpec, usable_cores
from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph


@dataclass
class OpTiming:
    """ONNX Runtime's time for one operator type, per inference."""

    op: str
    count: int
    total_ms: float
    share: float


@dataclass
class TorchCompileRace:
    """`torch.compile` of the model's PyTorch module in the same rounds, or why it was not raced."""

    median_ms: float | None = None
    cov: float | None = None
    compile_s: float | None = None
    speedup: float | None = None     # torch.compile's median / the plan's
    skipped: str | None = None


@dataclass
class DemoKernel:
    """One kernel of the plan as the report lists it."""

    id: str
    backend: str
    kind: str
    primitives: int
    predicted_us: float
    ops: str


@dataclass
class DemoPlan:
    """The orchestrated plan raced against ONNX Runtime (and torch.compile) on the same inputs."""

    kernels: int
    primitives: int
    solver: str
    predicted_ms: float
    optimise_s: float
    backends: dict[str, int]
    plan_median_ms: float
    plan_cov: float
    ort_median_ms: float
    ort_cov: float
    speedup_vs_ort: float
    torch_compile: TorchCompileRace
    max_rel_error: float
    agree: bool
    tolerance: float
    rounds_ms: dict[str, list[float]]
    rewrites: dict[str, int]
    race: dict | None
    saved: str | None
    kernel_list: list[DemoKernel] = field(default_factory=list)


@dataclass
class DemoReport:
    """What `tensorplan demo` shows: the model, this device, reference vs ONNX Runtime, per-operator
    time and (with `orchestrate`) the plan's race."""

    model: str
    nodes: int
    params: int
    gflops: float
    import_s: float
    device: DeviceSpec
    ort_median_ms: float
    ort_cov: float
    reference_ms: float
    max_rel_error: float
    agree: bool
    tolerance: float = 1e-4      # ir.reference.default_tolerance: wider for fp16/bf16 outputs
    per_op: list[OpTiming] = field(default_factory=list)
    plan: DemoPlan | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _ort_session(model: str | bytes, threads: int, profile_prefix: str | None = None):
    """A CPU session on `model` (a path or the file's bytes) at `threads` intra-op threads."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own exception types
        where = f" {model}" if isinstance(model, str) else ""
        raise TensorplanError(f"ONNX Runtime refused the model{where}: {str(e).strip()[:300]}") from None


def _ort_run(sess, feeds: dict[str, np.ndarray]) -> list:
    """`sess.run(None, feeds)`, ONNX Runtime's run-time failures as one clear TensorplanError."""
    try:
        return sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001
        raise TensorplanError(f"ONNX Runtime failed running the model: {str(e).strip()[:300]}") from None


def ort_per_op_profile(model: str | bytes, feeds: dict[str, np.ndarray], threads: int | None = None,
                       runs: int = 10) -> list[OpTiming]:
    """Per-operator-type time from ONNX Runtime's own profiler (median run's node events)."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = _ort_session(model, int(threads or usable_cores()), os.path.join(tmp, "ort"))
        for _ in range(runs):
            _ort_run(sess, feeds)
        prof = sess.end_profiling()
        with open(prof) as f:
            events = json.load(f)
    # median per node over the runs (the first run includes one-off allocation), summed per op type
    per_node: dict[tuple[str, str], list[float]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            per_node[(e.get("args", {}).get("op_name", "?"), e["name"])].append(e["dur"] / 1e3)
    per_run: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for (op, _), durs in per_node.items():
        per_run[op] += float(np.median(durs))
        counts[op] += 1
    total = sum(per_run.values()) or 1.0
    return sorted((OpTiming(op, counts[op], ms, ms / total) for op, ms in per_run.items()),
                  key=lambda t: -t.total_ms)


def interleaved_medians(fns: dict[str, callable], rounds: int = 15, burst_s: float = 0.03) -> dict:
    """Median latency of each callable, timed as the benchmarks do (`measure.timer.interleaved`):
    a fresh random order every round, a 50 ms pause before each contender so the previous one's
    spinning thread pool parks, then one untimed call and a ~`burst_s` burst whose median is kept.
    Why the pause: without it, the contender timed right after an ONNX Runtime session may run while
    that session's workers still spin on the same cores; the demo measures exactly as the
    benchmarks it is compared with. Returns {name: Timing}."""
    from tensorplan.measure.timer import Timing, interleaved

    samples = interleaved(fns, rounds, burst_s=burst_s)
    return {n: Timing.from_repeats(v, warmup=1, method=f"interleaved: {rounds} rounds, random order, 50 ms "
                                   f"pause, untimed call + ~{burst_s * 1e3:.0f} ms burst, median of burst "
                                   "medians") for n, v in samples.items()}


def run_demo(model: str | Graph = "candy", threads: int | None = None, opset: int = 17, orchestrate: bool = True,
             progress: bool = False, log=None, vs_torch_compile: bool = True,
             save_plan: str | None = None) -> DemoReport:
    """Load `model` once (a `Graph`, zoo name, ONNX path or PyTorch factory), run it in ONNX Runtime
    and in the reference executor, compare, and profile per operator; then (`orchestrate`) plan its
    kernels with measured costs (`tensorplan.orchestrate`, race included), run the plan, check it
    against ONNX Runtime and time both interleaved, with `torch.compile` of the model's PyTorch
    module (zoo models and factories have one; `vs_torch_compile=False` skips it) as a third
    contender on the same inputs. Every runtime gets `threads` threads (default every usable core).
    `save_plan` writes the plan JSON there (for `tensorplan run` / `tensorplan export`)."""
    from tensorplan import devices
    from tensorplan.ir.analysis import graph_flops
    from tensorplan.ir.reference import default_tolerance, random_feeds, rel_error, run_reference
    from tensorplan.measure.timer import measure, pinned_threads
    from tensorplan.zoo.specs import as_graph, onnx_bytes

    threads = int(threads or usable_cores())
    device = devices.local_cpu(None if threads == usable_cores() else threads)
    t0 = time.perf_counter()
    graph = as_graph(model, opset=opset)
    import_s = time.perf_counter() - t0
    feeds = random_feeds(graph, seed=0)
    original = onnx_bytes(graph, opset)    # ONNX Runtime is the reference: it runs the original file
    sess = _ort_session(original, threads)
    with pinned_threads(threads):
        ort_out = dict(zip([o.name for o in sess.get_outputs()], _ort_run(sess, feeds)))
        ort_t = measure(lambda: sess.run(None, feeds), budget_s=2.0, max_repeats=50)
        t1 = time.perf_counter()
        ref_out = run_reference(graph, feeds)
        ref_s = time.perf_counter() - t1
    per_op = ort_per_op_profile(original, feeds, threads)
    err = max(rel_error(ref_out[name], want) for name, want in ort_out.items())
    tol = default_tolerance(graph)
    plan_summary = None
    if orchestrate:
        plan_summary = _orchestrate_and_race(graph, device, threads, sess, feeds=feeds, progress=progress, log=log,
                                             vs_torch_compile=vs_torch_compile, opset=opset, save_plan=save_plan)
    return DemoReport(
        model=graph.source or graph.name, nodes=len(graph.nodes), params=graph.num_parameters(),
        gflops=graph_flops(graph) / 1e9, import_s=import_s, device=device,
        ort_median_ms=ort_t.median_s * 1e3, ort_cov=ort_t.cov, reference_ms=ref_s * 1e3,
        max_rel_error=err, agree=err <= tol, tolerance=tol, per_op=per_op, plan=plan_summary)


def _torch_compiled(graph: Graph, opset: int, args: list[np.ndarray], log) -> tuple:
    """(runner, compile seconds, None) for `torch.compile` of the model's module on `args` (the
    same values ONNX Runtime gets), or (None, None, why) when there is no module or it fails."""
    from tensorplan.zoo.specs import torch_source

    src = torch_source(graph, opset)
    if src is None:
        return None, None, ("no PyTorch module behind an ONNX file" if graph.source else
                            "no PyTorch module behind a graph built in memory")
    import torch

    module = src[0].eval()
    targs = [torch.from_numpy(np.ascontiguousarray(a)) for a in args]
    try:
        cm = torch.compile(module)
        t0 = time.perf_counter()
        with torch.inference_mode():
            cm(*targs)
        compile_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - a baseline that does not compile is reported, not fatal
        return None, None, f"torch.compile failed: {type(e).__name__}: {str(e)[:200]}"
    if log:
        log(f"torch.compile: compiled in {compile_s:.1f} s")

    def run():
        with torch.inference_mode():
            return cm(*targs)
    return run, compile_s, None


def _orchestrate_and_race(graph: Graph, device: DeviceSpec, threads: int, sess, feeds, progress, log,
                          vs_torch_compile: bool, opset: int, save_plan: str | None = None) -> DemoPlan:
    """Korch pipeline with measured kernel costs (cached in the store), then the plan against
    ONNX Runtime on the original model, interleaved."""
    from tensorplan.ir.reference import default_tolerance, rel_error
    from tensorplan.measure.timer import pinned_threads
    from tensorplan.runtime.executor import PlanExecutor
    from tensorplan.workflows.orchestrate import orchestrate

    plan = orchestrate(graph, device=device, cost="measured", threads=threads, feeds=feeds, progress=progress,
                       log=log)
    saved = str(plan.save(save_plan)) if save_plan else None
    prim = plan.check()          # verified against the model before it runs
    tc_run, tc_s, tc_why = (None, None, "skipped (vs_torch_compile=False)")
    with pinned_threads(threads):
        if vs_torch_compile:
            tc_run, tc_s, tc_why = _torch_compiled(graph, opset, [feeds[n] for n in graph.inputs], log)
        ex = PlanExecutor(plan, prim, threads=threads)
        outs = ex.run(feeds)
        ref = dict(zip([o.name for o in sess.get_outputs()], _ort_run(sess, feeds)))
        runners = {"onnxruntime": lambda: sess.run(None, feeds), "tensorplan": ex.run_bound}
        if tc_run is not None:
            runners["torch.compile"] = tc_run
        timings = interleaved_medians(runners)
    err = max(rel_error(outs[o], ref[o]) for o in prim.outputs if o in ref)
    tol = default_tolerance(prim)
    t_ort, t_plan = timings["onnxruntime"], timings["tensorplan"]
    op_of = {n.name: n.op for n in prim.nodes}
    kernel_list = []
    for s in ex.slots:
        ops = Counter(op_of.get(n, "?") for n in s.kernel.nodes)
        kernel_list.append(DemoKernel(id=s.kernel.id, backend=s.backend, kind=s.kernel.kind,
                                      primitives=len(s.kernel.nodes), predicted_us=s.kernel.predicted_s * 1e6,
                                      ops=", ".join(f"{o}×{c}" if c > 1 else o for o, c in ops.most_common(4))
                                      + (" …" if len(ops) > 4 else "")))
    if tc_run is not None:
        t_tc = timings["torch.compile"]
        tc = TorchCompileRace(median_ms=t_tc.median_s * 1e3, cov=t_tc.cov, compile_s=tc_s,
                              speedup=t_tc.median_s / t_plan.median_s)
    else:
        tc = TorchCompileRace(skipped=tc_why)
    return DemoPlan(kernels=len(plan.kernels), primitives=int(plan.source.get("num_primitives") or 0),
                    solver=str(plan.solver.get("status")), predicted_ms=plan.predicted_s * 1e3,
                    optimise_s=float(plan.timing.get("total_s") or 0.0), backends=ex.backend_counts(),
                    plan_median_ms=t_plan.median_s * 1e3, plan_cov=t_plan.cov,
                    ort_median_ms=t_ort.median_s * 1e3, ort_cov=t_ort.cov,
                    speedup_vs_ort=t_ort.median_s / t_plan.median_s, torch_compile=tc,
                    max_rel_error=float(err), agree=bool(err <= tol), tolerance=tol,
                    rounds_ms={n: [v * 1e3 for v in t.repeats] for n, t in timings.items()},
                    rewrites=dict(Counter(r for r, _ in plan.source.get("rewrites", []))),
                    race=plan.stats.get("race"), saved=saved, kernel_list=kernel_list)


__all__ = ["DemoKernel", "DemoPlan", "DemoReport", "OpTiming", "TorchCompileRace", "interleaved_medians",
           "ort_per_op_profile", "run_demo"]
