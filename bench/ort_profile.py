"""Where ONNX Runtime spends its time on a zoo model, per operator type and per node, before and
after tensorplan's exact rewrites (graph/rewrite.py).

Why: every rewrite rule in graph/rewrite.py started from this question (ORT's Softplus is a
scalar loop; it pads a 3-channel convolution output to 16 channels; SegFormer moves 128-channel
tensors between token and image layout). It is also what says why a model stays far from the
roofline bound: the share of convolution time that no regrouping of the graph removes.

Usage: python bench/ort_profile.py --models efficientvit-b1,yolox-nano [--raw] [--top 15]
Writes bench/results/ort_profile.json (per model: ms per operator type and the top nodes, from
ORT's own profiler, 2 threads, after warm-up), with the machine description.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def profile(name: str, rewritten: bool, runs: int, threads: int, top: int) -> dict:
    import onnxruntime as ort

    from tensorplan.graph import zoo
    from tensorplan.graph.load import load_model
    from tensorplan.graph.rewrite import rewrite
    from tensorplan.graph.to_onnx import graph_to_onnx

    g = load_model(name)
    applied = {}
    if rewritten:
        rr = rewrite(g)
        g, applied = rr.graph, rr.counts
    m = graph_to_onnx(g)
    m.ir_version = 8  # this ONNX Runtime reads IR <= 10; the graph uses nothing newer
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    feeds = zoo.numpy_inputs(name)
    with tempfile.TemporaryDirectory() as tmp:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, "ort")
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for _ in range(3):
            sess.run(None, feeds)
        t0 = time.perf_counter()
        for _ in range(runs):
            sess.run(None, feeds)
        wall = (time.perf_counter() - t0) / runs * 1e3
        events = json.loads(Path(sess.end_profiling()).read_text())
    by_op: collections.Counter = collections.Counter()
    by_node: collections.Counter = collections.Counter()
    shapes = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op, node = e["args"]["op_name"], e["name"][: -len("_kernel_time")]
            by_op[op] += e["dur"]
            by_node[(node, op)] += e["dur"]
            shapes[node] = e["args"].get("input_type_shape")
    n_calls = runs + 3  # the profiler also saw the warm-up calls
    total = sum(by_op.values()) / n_calls / 1e3
    return {"model": name, "rewritten": rewritten, "rewrites": applied, "wall_ms_profiled": wall,
            "kernel_ms": total,
            "by_op_ms": {op: d / n_calls / 1e3 for op, d in by_op.most_common()},
            "share": {op: d / n_calls / 1e3 / total for op, d in by_op.most_common()},
            "top_nodes": [{"node": nd, "op": op, "ms": d / n_calls / 1e3, "inputs": shapes[nd]}
                          for (nd, op), d in by_node.most_common(top)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="efficientvit-b1,yolox-nano", help="comma-separated zoo names")
    ap.add_argument("--raw", action="store_true", help="profile the model as given, without the rewrites")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=15, help="nodes to list per model")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ort_profile.json"))
    a = ap.parse_args()
    from tensorplan.devices.detect import machine_info

    rows = []
    for name in a.models.split(","):
        r = profile(name, not a.raw, a.runs, a.threads, a.top)
        rows.append(r)
        ops = ", ".join(f"{op} {ms:.2f}" for op, ms in list(r["by_op_ms"].items())[:6])
        print(f"{name}: {r['kernel_ms']:.2f} ms in kernels ({ops})", flush=True)
    out = {"machine": machine_info(threads=a.threads), "command": " ".join(sys.argv), "models": rows}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
