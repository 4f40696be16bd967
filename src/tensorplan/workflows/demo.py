"""The main job on a bundled model: import, check the reference executor against
ONNX Runtime, and show where the time goes per operator on this device; then plan
the model and race the plan against every peer runtime (workflows/peers.py).

Why: a newcomer's first run should prove the pieces agree on real numbers before
any plan is trusted, and its speed-up is over the best runtime they could use instead.
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
from tensorplan.workflows.peers import (TORCH_COMPILE, PeerTimings, ort_cpu_session, ort_run, peer_runners,
                                        runners_of, time_interleaved)


@dataclass
class OpTiming:
    """ONNX Runtime's time for one operator type, per inference."""

    op: str
    count: int
    total_ms: float
    share: float


@dataclass
class TorchCompileRace:
    """`torch.compile` of the model's PyTorch module in the same rounds, or why it was not raced
    (the torch.compile row of `DemoPlan.peers`, kept flat for scripts that read it)."""

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
    """The orchestrated plan raced against every peer (ONNX Runtime, OpenVINO fp32 and its default
    precision, torch.compile) in one interleaved run on the same inputs. `speedup_vs_best` is the
    headline: over the fastest fp32 peer (`best_peer`); `noisy` flags a run not to trust."""

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
    peers: PeerTimings
    best_peer: str | None
    best_peer_median_ms: float | None
    speedup_vs_best: float | None
    peer_medians_ms: dict[str, float]
    noisy: bool
    noise_reason: str | None
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


def ort_per_op_profile(model: str | bytes, feeds: dict[str, np.ndarray], threads: int | None = None,
                       runs: int = 10) -> list[OpTiming]:
    """Per-operator-type time from ONNX Runtime's own profiler (median run's node events)."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = ort_cpu_session(model, int(threads or usable_cores()), os.path.join(tmp, "ort"))
        for _ in range(runs):
            ort_run(sess, feeds)
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


def run_demo(model: str | Graph = "candy", threads: int | None = None, opset: int = 17, orchestrate: bool = True,
             progress: bool = False, log=None, vs_torch_compile: bool = True,
             save_plan: str | None = None, rounds: int = 15) -> DemoReport:
    """Load `model` once (a `Graph`, zoo name, ONNX path or PyTorch factory), run it in ONNX Runtime
    and in the reference executor, compare, and profile per operator; then (`orchestrate`) plan its
    kernels with measured costs (`tensorplan.orchestrate`, race included), run the plan, check it
    against ONNX Runtime and time it interleaved against every peer on the original model
    (`workflows.peers`: ONNX Runtime, OpenVINO fp32 and its default precision, `torch.compile` of
    the model's PyTorch module where one exists; `vs_torch_compile=False` leaves it out), on the same
    inputs, `rounds` interleaved rounds. Every runtime gets `threads` threads (default every usable
    core). `save_plan` writes the plan JSON there (for `tensorplan run` / `tensorplan export`)."""
    from tensorplan import devices
    from tensorplan.ir.analysis import graph_flops
    from tensorplan.ir.reference import default_tolerance, random_feeds, rel_error, run_reference
    from tensorplan.measure.timer import measure, pinned_threads
    from tensorplan.zoo.specs import as_graph, onnx_bytes

    if rounds < 1:
        raise TensorplanError(f"run_demo: rounds must be >= 1, got {rounds}")
    threads = int(threads or usable_cores())
    device = devices.local_cpu(None if threads == usable_cores() else threads)
    t0 = time.perf_counter()
    graph = as_graph(model, opset=opset)
    import_s = time.perf_counter() - t0
    feeds = random_feeds(graph, seed=0)
    original = onnx_bytes(graph, opset)    # ONNX Runtime is the reference: it runs the original file
    sess = ort_cpu_session(original, threads)
    with pinned_threads(threads):
        ort_out = dict(zip([o.name for o in sess.get_outputs()], ort_run(sess, feeds)))
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
                                             vs_torch_compile=vs_torch_compile, opset=opset, save_plan=save_plan,
                                             rounds=rounds)
    return DemoReport(
        model=graph.source or graph.name, nodes=len(graph.nodes), params=graph.num_parameters(),
        gflops=graph_flops(graph) / 1e9, import_s=import_s, device=device,
        ort_median_ms=ort_t.median_s * 1e3, ort_cov=ort_t.cov, reference_ms=ref_s * 1e3,
        max_rel_error=err, agree=err <= tol, tolerance=tol, per_op=per_op, plan=plan_summary)


def _orchestrate_and_race(graph: Graph, device: DeviceSpec, threads: int, sess, feeds, progress, log,
                          vs_torch_compile: bool, opset: int, save_plan: str | None = None,
                          rounds: int = 15) -> DemoPlan:
    """Korch pipeline with measured kernel costs (cached in the store), then the plan against every
    peer on the original model, interleaved in one run."""
    from tensorplan.ir.reference import default_tolerance, rel_error
    from tensorplan.measure.timer import pinned_threads
    from tensorplan.runtime.executor import PlanExecutor
    from tensorplan.workflows.orchestrate import orchestrate

    plan = orchestrate(graph, device=device, cost="measured", threads=threads, feeds=feeds, progress=progress,
                       log=log)
    saved = str(plan.save(save_plan)) if save_plan else None
    prim = plan.check()          # verified against the model before it runs
    with pinned_threads(threads):
        peers = peer_runners(graph, feeds, threads, opset, torch_compile=vs_torch_compile, log=log)
        for p in peers:
            if p.skipped and log:
                log(f"{p.label}: not raced: {p.skipped}")
        ex = PlanExecutor(plan, prim, threads=threads)
        outs = ex.run(feeds)
        ref = dict(zip([o.name for o in sess.get_outputs()], ort_run(sess, feeds)))
        timings = time_interleaved({"tensorplan": ex.run_bound, **runners_of(peers)}, rounds, peers=peers,
                                   labels={"tensorplan": "tensorplan plan"}, cores=usable_cores())
    err = max(rel_error(outs[o], ref[o]) for o in prim.outputs if o in ref)
    tol = default_tolerance(prim)
    t_ort, t_plan = timings.runners["onnxruntime"], timings.runners["tensorplan"]
    op_of = {n.name: n.op for n in prim.nodes}
    kernel_list = []
    for s in ex.slots:
        ops = Counter(op_of.get(n, "?") for n in s.kernel.nodes)
        kernel_list.append(DemoKernel(id=s.kernel.id, backend=s.backend, kind=s.kernel.kind,
                                      primitives=len(s.kernel.nodes), predicted_us=s.kernel.predicted_s * 1e6,
                                      ops=", ".join(f"{o}×{c}" if c > 1 else o for o, c in ops.most_common(4))
                                      + (" …" if len(ops) > 4 else "")))
    t_tc = timings.runners.get(TORCH_COMPILE)
    if t_tc is not None:
        tc = TorchCompileRace(median_ms=t_tc.median_ms, cov=t_tc.cov, compile_s=t_tc.build_s,
                              speedup=t_tc.median_ms / t_plan.median_ms)
    else:
        tc = TorchCompileRace(skipped=timings.skipped.get(TORCH_COMPILE))
    best = timings.best_peer()
    return DemoPlan(kernels=len(plan.kernels), primitives=int(plan.source.get("num_primitives") or 0),
                    solver=str(plan.solver.get("status")), predicted_ms=plan.predicted_s * 1e3,
                    optimise_s=float(plan.timing.get("total_s") or 0.0), backends=ex.backend_counts(),
                    plan_median_ms=t_plan.median_ms, plan_cov=t_plan.cov,
                    ort_median_ms=t_ort.median_ms, ort_cov=t_ort.cov,
                    speedup_vs_ort=t_ort.median_ms / t_plan.median_ms, torch_compile=tc, peers=timings,
                    best_peer=best, best_peer_median_ms=timings.runners[best].median_ms if best else None,
                    speedup_vs_best=timings.speedup_over_best("tensorplan") if best else None,
                    peer_medians_ms={n: t.median_ms for n, t in timings.runners.items() if t.peer},
                    noisy=timings.noisy, noise_reason=timings.noise_reason,
                    max_rel_error=float(err), agree=bool(err <= tol), tolerance=tol,
                    rounds_ms={n: list(t.rounds_ms) for n, t in timings.runners.items()},
                    rewrites=dict(Counter(r for r, _ in plan.source.get("rewrites", []))),
                    race=plan.stats.get("race"), saved=saved, kernel_list=kernel_list)


__all__ = ["DemoKernel", "DemoPlan", "DemoReport", "OpTiming", "TorchCompileRace", "ort_per_op_profile",
           "run_demo"]
