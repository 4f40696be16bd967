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
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class OpTiming:
    op: str
    count: int
    total_ms: float
    share: float


@dataclass
class DemoReport:
    model: str
    nodes: int
    params: int
    gflops: float
    import_s: float
    device: dict
    ort_median_ms: float
    ort_cov: float
    reference_ms: float
    max_rel_error: float
    agree: bool
    per_op: list[OpTiming] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def ort_per_op_profile(onnx_path: str, feeds: dict[str, np.ndarray], threads: int = 2,
                       runs: int = 10) -> list[OpTiming]:
    """Per-operator-type time from ONNX Runtime's own profiler (median run's node events)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(onnx_path, so, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            sess.run(None, feeds)
        prof = sess.end_profiling()
        with open(prof) as f:
            events = json.load(f)
    per_run: dict[str, float] = defaultdict(float)
    counts: dict[str, set] = defaultdict(set)
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e.get("args", {}).get("op_name", "?")
            per_run[op] += e["dur"] / 1e3 / runs
            counts[op].add(e["name"])
    total = sum(per_run.values()) or 1.0
    return sorted((OpTiming(op, len(counts[op]), ms, ms / total) for op, ms in per_run.items()),
                  key=lambda t: -t.total_ms)


def model_onnx_path(model: str, opset: int) -> str:
    """The original ONNX file behind a model spec (ORT is the reference, so it runs the
    original, not our re-export)."""
    if os.path.exists(model):
        return model
    from ..graph import zoo

    return str(zoo.export(model, opset=opset))


def run_demo(model: str = "candy", threads: int = 2, opset: int = 17) -> DemoReport:
    """Import `model` (zoo name or ONNX path), run it in ONNX Runtime and in the reference
    executor, compare, and profile per operator."""
    from ..devices import resolve
    from ..graph import load_model
    from ..graph.analysis import graph_flops
    from ..graph.reference import random_feeds, run_reference
    from ..measure.timer import measure, pinned_threads

    t0 = time.perf_counter()
    graph = load_model(model, opset=opset)
    import_s = time.perf_counter() - t0
    device = resolve("local")
    feeds = random_feeds(graph, seed=0)

    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        path = model_onnx_path(model, opset)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        with pinned_threads(threads):
            ort_out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
            ort_t = measure(lambda: sess.run(None, feeds), budget_s=2.0, max_repeats=50)
            t1 = time.perf_counter()
            ref_out = run_reference(graph, feeds)
            ref_s = time.perf_counter() - t1
        per_op = ort_per_op_profile(path, feeds, threads)

    err = 0.0
    for name, want in ort_out.items():
        got = ref_out[name]
        denom = max(float(np.max(np.abs(want))), 1e-12)
        err = max(err, float(np.max(np.abs(got.astype(np.float64) - want))) / denom)
    return DemoReport(
        model=model, nodes=len(graph.nodes), params=graph.num_parameters(),
        gflops=graph_flops(graph) / 1e9, import_s=import_s, device=device.to_dict(),
        ort_median_ms=ort_t.median_s * 1e3, ort_cov=ort_t.cov, reference_ms=ref_s * 1e3,
        max_rel_error=err, agree=err <= 1e-4, per_op=per_op)
