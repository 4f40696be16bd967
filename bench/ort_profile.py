"""Where ONNX Runtime spends its time on a zoo model, per operator type and per node, before and
after tensorplan's exact rewrites (rewrite/passes.py).

Why: every rewrite rule in rewrite/passes.py started from this question (ORT's Softplus is a
scalar loop; it pads a 3-channel convolution output to 16 channels; SegFormer moves 128-channel
tensors between token and image layout). It is also what says why a model stays far from the
roofline bound: the share of convolution time that no regrouping of the graph removes.

Per model it also reports
- every convolution class (depthwise, 1x1, KxK) with its time and the GFLOP/s it reaches under the
  profiler, against the GEMM peak the roofline bound assumes for every multiply-add;
- the what-if probe (on unless `--no-what-if`): the rewritten graph timed, interleaved and
  without the profiler, as it is and with every SiLU or HardSwish on a convolution's output
  replaced by Relu. ORT cannot fuse SiLU into the convolution (it runs a separate QuickGelu
  pass); it does fuse HardSwish, but its epilogue is slower than Relu's. The second graph
  computes something else: it is only a timing probe for "what if the activation were free", the
  most any exact rewrite of that activation could gain. (ORT 1.31's CPU convolution fuses Relu,
  LeakyRelu, Sigmoid, Tanh, Clip, HardSigmoid and HardSwish, checked in its optimised graph.)
  The same interleaved run times the graph under ORT's inter-operator parallel executor; and for
  a model with SiLU it times one pass over its largest SiLU input as Relu, QuickGelu and
  Sigmoid -> Mul, scaled to all its SiLU values: how much of SiLU's cost is the separate pass
  (memory traffic) and how much the sigmoid.

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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def profile(name: str, rewritten: bool, runs: int, threads: int, top: int) -> dict:
    import onnxruntime as ort

    from tensorplan import zoo
    from tensorplan.zoo.specs import load_model
    from tensorplan.rewrite import rewrite
    from tensorplan.ir.to_onnx import graph_to_onnx

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
    shapes, out_shapes = {}, {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op, node = e["args"]["op_name"], e["name"][: -len("_kernel_time")]
            by_op[op] += e["dur"]
            by_node[(node, op)] += e["dur"]
            shapes[node] = e["args"].get("input_type_shape")
            out_shapes[node] = e["args"].get("output_type_shape")
    n_calls = runs + 3  # the profiler also saw the warm-up calls
    total = sum(by_op.values()) / n_calls / 1e3
    return {"model": name, "rewritten": rewritten, "rewrites": applied, "wall_ms_profiled": wall,
            "kernel_ms": total,
            "by_op_ms": {op: d / n_calls / 1e3 for op, d in by_op.most_common()},
            "share": {op: d / n_calls / 1e3 / total for op, d in by_op.most_common()},
            "conv_classes": conv_classes(by_node, shapes, out_shapes, n_calls),
            "top_nodes": [{"node": nd, "op": op, "ms": d / n_calls / 1e3, "inputs": shapes[nd]}
                          for (nd, op), d in by_node.most_common(top)]}


def _dims(shape_list: list | None, i: int) -> list[int] | None:
    """Dimensions of the i-th tensor in an ORT profiler shape list ([{"float": [...]}, ...])."""
    if not shape_list or len(shape_list) <= i:
        return None
    return list(next(iter(shape_list[i].values())))


def conv_classes(by_node, shapes: dict, out_shapes: dict, n_calls: int) -> dict:
    """Convolution time and GFLOP/s by kind: depthwise (one input channel per group), 1x1, KxK.
    GFLOP/s are under the profiler (its per-node overhead included), so a lower bound."""
    out: dict[str, dict] = {}
    for (node, op), dur in by_node.items():
        if op not in ("Conv", "FusedConv"):
            continue
        x, w, y = _dims(shapes.get(node), 0), _dims(shapes.get(node), 1), _dims(out_shapes.get(node), 0)
        if not (x and w and y) or len(w) != 4:
            continue
        kind = "depthwise" if w[1] == 1 and x[1] > 1 else ("1x1" if w[2] == w[3] == 1 else "KxK")
        flops = 2.0 * float(np.prod(y)) * float(np.prod(w[1:]))
        c = out.setdefault(kind, {"nodes": 0, "ms": 0.0, "gflop": 0.0})
        c["nodes"] += 1
        c["ms"] += dur / n_calls / 1e3
        c["gflop"] += flops / 1e9
    for c in out.values():
        c["gflops_per_s"] = c["gflop"] / (c["ms"] / 1e3) if c["ms"] else 0.0
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))


def relu_for_activations(g):
    """Timing probe, not an equivalent graph: every SiLU (x * Sigmoid(x)) or HardSwish on a
    convolution's output becomes Relu, which ONNX Runtime fuses into the convolution at no cost.
    Returns (graph, {"silu": n, "hardswish": n})."""
    from tensorplan.ir.graph import Node
    g = g.copy()
    prod = g.producers()
    n_swapped = {"silu": 0, "hardswish": 0}
    for i, n in enumerate(g.nodes):
        if n.op == "HardSwish" and getattr(prod.get(n.inputs[0]), "op", None) == "Conv":
            g.nodes[i] = Node(n.name, "Relu", [n.inputs[0]], list(n.outputs))
            n_swapped["hardswish"] += 1
            continue
        if n.op != "Mul" or len(n.inputs) != 2:
            continue
        for x, s in (n.inputs, n.inputs[::-1]):
            p = prod.get(s)
            src = prod.get(x)
            if p is not None and p.op == "Sigmoid" and p.inputs[0] == x and src is not None and src.op == "Conv":
                g.nodes[i] = Node(n.name, "Relu", [x], list(n.outputs))
                n_swapped["silu"] += 1
                break
    g.prune()
    return g, n_swapped


def silu_shapes(g) -> list[tuple[int, ...]]:
    """Input shape of every SiLU activation (x * Sigmoid(x)) in the graph."""
    prod = g.producers()
    shapes = []
    for n in g.nodes:
        if n.op == "Mul" and len(n.inputs) == 2:
            for x, s in (n.inputs, n.inputs[::-1]):
                p = prod.get(s)
                if p is not None and p.op == "Sigmoid" and p.inputs[0] == x:
                    shapes.append(tuple(g.tensors[x].shape))
                    break
    return shapes


def activation_passes(shape: tuple, threads: int, rounds: int) -> dict:
    """Throughput (Gvalues/s) of one activation pass over a `shape` tensor in ONNX Runtime, each a
    one-operator session with bound buffers, interleaved: Relu (a pure copy-like pass: the memory
    cost any separate pass pays) against QuickGelu (what ORT runs for SiLU) and Sigmoid -> Mul.
    Why: it splits SiLU's cost into the pass itself and the sigmoid arithmetic, i.e. says whether
    a faster SiLU operator could help or only fusing the activation into the convolution can."""
    import statistics

    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from tensorplan.measure.timer import interleaved
    graphs = {"relu": [helper.make_node("Relu", ["x"], ["y"])],
              "quickgelu": [helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft", alpha=1.0)],
              "sigmoid_mul": [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])]}
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    keep, runners = [], {}
    for key, nodes in graphs.items():
        vi = [helper.make_tensor_value_info(t, TensorProto.FLOAT, list(shape)) for t in ("x", "y")]
        m = helper.make_model(helper.make_graph(nodes, key, vi[:1], vi[1:]), ir_version=8,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
        onnx.checker.check_model(m)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        y = np.empty_like(x)
        b = sess.io_binding()
        b.bind_cpu_input("x", x)
        b.bind_output("y", "cpu", 0, np.float32, list(shape), y.ctypes.data)
        keep.append((sess, b, y))     # the bound buffers must outlive the runs
        runners[key] = (lambda s=sess, b=b: s.run_with_iobinding(b))
    t = interleaved(runners, rounds=rounds, burst_s=0.1)
    return {k: float(np.prod(shape)) / statistics.median(v) / 1e9 for k, v in t.items()}


def what_if(name: str, threads: int, rounds: int) -> dict:
    """Interleaved medians (ms, no profiler) of the rewritten graph, of its activation->Relu probe and
    of the graph under ORT's parallel (inter-operator) executor; SiLU pass throughputs."""
    import statistics

    import onnxruntime as ort

    from tensorplan import zoo
    from tensorplan.zoo.specs import load_model
    from tensorplan.rewrite import rewrite
    from tensorplan.ir.to_onnx import graph_to_onnx, ort_session
    from tensorplan.measure.timer import interleaved

    g = rewrite(load_model(name)).graph
    probe, swapped = relu_for_activations(g)
    if not sum(swapped.values()):
        return {"swapped": swapped}
    feeds = zoo.numpy_inputs(name)
    runners = {}
    for key, gg in (("as_is", g), ("activations_as_relu", probe)):
        m = graph_to_onnx(gg)
        m.ir_version = 8
        sess = ort_session(m, threads=threads)
        runners[key] = (lambda s=sess: s.run(None, feeds))
    # independent branches (detection heads, CSP halves) on separate cores instead of splitting
    # each small operator over both
    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    so.inter_op_num_threads, so.intra_op_num_threads = threads, 1
    m = graph_to_onnx(g)
    m.ir_version = 8
    par = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    runners["as_is_inter_op_parallel"] = lambda: par.run(None, feeds)
    t = interleaved(runners, rounds=rounds, burst_s=0.2)
    med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
    out = {"swapped": swapped, "median_ms": med, "ratio": med["activations_as_relu"] / med["as_is"], "rounds": rounds}
    shapes = silu_shapes(g)
    if shapes:
        n_silu = sum(int(np.prod(s)) for s in shapes)
        big = max(shapes, key=lambda s: int(np.prod(s)))
        rate = activation_passes(big, threads, rounds)
        out["silu"] = {"values": n_silu, "probe_shape": list(big), "gvalues_per_s": rate,
                       "ms_at": {k: n_silu / r / 1e6 for k, r in rate.items()}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="efficientvit-b1,yolox-nano", help="comma-separated zoo names")
    ap.add_argument("--raw", action="store_true", help="profile the model as given, without the rewrites")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=15, help="nodes to list per model")
    ap.add_argument("--no-what-if", dest="what_if", action="store_false",
                    help="skip the interleaved SiLU->Relu timing probe")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the what-if probe")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ort_profile.json"))
    a = ap.parse_args()
    from tensorplan.devices.detect import machine_info

    rows = []
    for name in a.models.split(","):
        r = profile(name, not a.raw, a.runs, a.threads, a.top)
        if a.what_if and not a.raw:
            r["what_if"] = what_if(name, a.threads, a.rounds)
        rows.append(r)
        ops = ", ".join(f"{op} {ms:.2f}" for op, ms in list(r["by_op_ms"].items())[:6])
        print(f"{name}: {r['kernel_ms']:.2f} ms in kernels ({ops})", flush=True)
        for kind, c in r["conv_classes"].items():
            print(f"  {kind:9s} convolutions: {c['nodes']:3d} nodes {c['ms']:6.2f} ms {c['gflops_per_s']:6.1f} GFLOP/s")
        wi = r.get("what_if") or {}
        if wi.get("median_ms"):
            print(f"  activations as Relu (timing probe, {wi['swapped']}): {wi['median_ms']['as_is']:.2f} -> "
                  f"{wi['median_ms']['activations_as_relu']:.2f} ms ({wi['ratio']:.2f}x); inter-operator "
                  f"parallel executor {wi['median_ms']['as_is_inter_op_parallel']:.2f} ms", flush=True)
        if wi.get("silu"):
            si = wi["silu"]
            print(f"  SiLU: {si['values'] / 1e6:.2f} M values per inference; one separate pass over them costs "
                  + ", ".join(f"{k} {ms:.2f} ms ({si['gvalues_per_s'][k]:.1f} Gvalues/s)" for k, ms in si["ms_at"].items())
                  + f" (single-operator sessions on {si['probe_shape']})", flush=True)
    out = {"machine": machine_info(threads=a.threads), "command": " ".join(sys.argv), "models": rows}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
