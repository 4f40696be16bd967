"""Does Winograd F(4x4, 3x3) built from ONNX operators pay on this CPU? (rewrite/passes.py)

For each model: ONNX Runtime (all optimisations, 2 threads) on the model after the default exact
rewrites, and on the same graph with every eligible 3x3 convolution as Winograd
(`rewrite(g, winograd=...)`), timed interleaved (tensorplan.measure.timer, bursts), medians and
the ratio; the outputs are checked against each other. Per model also the per-operator time of
both sessions (ORT's profiler), which shows where the Winograd form spends its time, and, for
the most frequent eligible convolution shape, that convolution alone vs its Winograd sub-graph.

Usage: python bench/winograd_probe.py [--models candy,resnet-50,yolov4] [--rounds 12]
Writes bench/results/winograd_probe.json (with the machine description).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def session(graph, threads: int):
    from tensorplan.ir.to_onnx import ort_session
    return ort_session(graph, threads=threads)


def per_op(graph, feeds, threads: int) -> dict[str, float]:
    import onnx
    from tensorplan.ir.to_onnx import graph_to_onnx
    from tensorplan.workflows.demo import ort_per_op_profile
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.onnx"
        onnx.save(graph_to_onnx(graph), str(path))
        return {o.op: round(o.total_ms, 3) for o in ort_per_op_profile(str(path), feeds, threads)}


def probe(name: str, rounds: int, threads: int, burst_s: float) -> dict:
    from tensorplan import zoo
    from tensorplan.ir.reference import random_feeds, rel_error
    from tensorplan.rewrite import rewrite, winograd_convs
    from tensorplan.measure.timer import interleaved, pinned_threads

    g = zoo.load(name)
    base = rewrite(g).graph
    convs = winograd_convs(base)
    res: dict = {"model": name, "eligible_convs": len(convs)}
    if not convs:
        return res
    wino = rewrite(g, winograd=[n.name for n in convs]).graph
    feeds = {k: v for k, v in zoo.numpy_inputs(name).items() if k in base.inputs}
    shape_of = Counter((tuple(base.tensors[n.inputs[0]].shape), tuple(base.tensors[n.inputs[1]].shape),
                        tuple(n.attrs.get("pads", [0, 0, 0, 0]))) for n in convs)
    res["conv_shapes"] = [{"x": list(x), "w": list(w), "pads": list(p), "count": c} for (x, w, p), c in
                          shape_of.most_common()]
    with pinned_threads(threads):
        s_base, s_wino = session(base, threads), session(wino, threads)
        want, got = s_base.run(None, feeds), s_wino.run(None, feeds)
        res["max_rel_error"] = float(max(rel_error(a, b) for a, b in zip(got, want)))
        times = interleaved({"direct": lambda: s_base.run(None, feeds), "winograd": lambda: s_wino.run(None, feeds)},
                            rounds, burst_s=burst_s)
        # the most frequent convolution shape alone, and as its Winograd sub-graph
        (xs, ws, ps), _ = shape_of.most_common(1)[0]
        node = next(n for n in convs if (tuple(base.tensors[n.inputs[0]].shape), tuple(base.tensors[n.inputs[1]].shape),
                                        tuple(n.attrs.get("pads", [0, 0, 0, 0]))) == (xs, ws, ps))
        c1 = base.subgraph([node.name])
        c1w = rewrite(c1, rules=(), winograd=[node.name]).graph
        x1 = random_feeds(c1, seed=0)
        k_base, k_wino = session(c1, threads), session(c1w, threads)
        one = interleaved({"direct": lambda: k_base.run(None, x1), "winograd": lambda: k_wino.run(None, x1)},
                          rounds, burst_s=burst_s)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    med1 = {k: statistics.median(v) * 1e3 for k, v in one.items()}
    res.update({"median_ms": med, "speedup": med["direct"] / med["winograd"],
                "top_conv_alone_ms": med1, "top_conv_alone_speedup": med1["direct"] / med1["winograd"],
                "per_op_ms": {"direct": per_op(base, feeds, threads), "winograd": per_op(wino, feeds, threads)}})
    print(f"{name}: {len(convs)} convs, model {med['direct']:.2f} -> {med['winograd']:.2f} ms "
          f"({res['speedup']:.2f}x); top conv alone {med1['direct']:.3f} -> {med1['winograd']:.3f} ms "
          f"({res['top_conv_alone_speedup']:.2f}x); max rel. error {res['max_rel_error']:.1e}", flush=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="candy,resnet-50,yolov4")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--burst-ms", type=float, default=30.0)
    ap.add_argument("--out", default=str(ROOT / "bench/results/winograd_probe.json"))
    a = ap.parse_args()
    t0 = time.time()
    results = [probe(m, a.rounds, a.threads, a.burst_ms / 1e3) for m in a.models.split(",")]
    report = {"bench": "winograd_probe", "rounds": a.rounds, "threads": a.threads, "burst_ms": a.burst_ms,
              "results": results, "seconds": time.time() - t0,
              "machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "cpus": os.cpu_count(), "loadavg_at_end": os.getloadavg()}}
    Path(a.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
