"""Kernel-level numbers behind the Korch plans: default-schedule bandwidth, linear backends,
per-call overheads and the executor's overhead per kernel.

1. Default TVM schedules on large memory-bound kernels (64M-float elementwise, 16384x4096 row
   reduction, softmax, layernorm, column reduction) as a fraction of this machine's memory
   bandwidth (STREAM copy from `tensorplan.devices`, and a copy measured interleaved), vs the
   naive loop nest and vs ONNX Runtime running the same sub-graph.
2. Linear backends (ONNX Runtime / PyTorch / TVM) on representative MatMul and Conv shapes, in
   GFLOP/s.
3. Per-call overhead of each backend on a 16-element kernel, and the executor's overhead per
   kernel: a plan of N trivial kernels run end to end vs the sum of the kernels timed alone.

    .venv/bin/python bench/korch_kernels.py [--quick]   # -> bench/results/korch_kernels.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent


def med_time(fn, rounds: int) -> float:
    fn()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def mem_kernels():
    """(name, graph, bytes moved) for the bandwidth table."""
    from tensorplan.ir.graph import Graph, Node, Tensor
    out = []
    n = 64 * 1024 * 1024

    g = Graph("axpy", 17)
    for t in ("a", "b", "t", "y"):
        g.add_tensor(Tensor(t, (n,)))
    g.add_tensor(Tensor("two", (), "float32", np.array(2.0, np.float32)))
    g.inputs, g.outputs = ["a", "b"], ["y"]
    g.add_node(Node("m", "Mul", ["a", "two"], ["t"]))
    g.add_node(Node("s", "Add", ["t", "b"], ["y"]))
    out.append(("elementwise 2a+b, 64M", g, 12 * n))

    R, C = 16384, 4096
    g = Graph("rowsum", 17)
    g.add_tensor(Tensor("x", (R, C)))
    g.add_tensor(Tensor("y", (R, 1)))
    g.add_tensor(Tensor("ax", (1,), "int64", np.array([1])))
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_node(Node("r", "ReduceSum", ["x", "ax"], ["y"], {"keepdims": 1}))
    out.append(("row sum 16384x4096", g, 4 * R * C))

    g = Graph("colsum", 17)
    g.add_tensor(Tensor("x", (C, R)))
    g.add_tensor(Tensor("y", (1, R)))
    g.add_tensor(Tensor("ax", (1,), "int64", np.array([0])))
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_node(Node("r", "ReduceSum", ["x", "ax"], ["y"], {"keepdims": 1}))
    out.append(("column sum 4096x16384", g, 4 * R * C))

    g = Graph("softmax", 17)
    for t, s in (("x", (R, C)), ("m", (R, 1)), ("d", (R, C)), ("e", (R, C)), ("s", (R, 1)), ("y", (R, C))):
        g.add_tensor(Tensor(t, s))
    g.add_tensor(Tensor("ax", (1,), "int64", np.array([-1])))
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_node(Node("n1", "ReduceMax", ["x"], ["m"], {"axes": [-1], "keepdims": 1}))
    g.add_node(Node("n2", "Sub", ["x", "m"], ["d"]))
    g.add_node(Node("n3", "Exp", ["d"], ["e"]))
    g.add_node(Node("n4", "ReduceSum", ["e", "ax"], ["s"], {"keepdims": 1}))
    g.add_node(Node("n5", "Div", ["e", "s"], ["y"]))
    out.append(("softmax rows 16384x4096", g, 8 * R * C))

    g = Graph("layernorm", 17)
    for t, s in (("x", (R, C)), ("mu", (R, 1)), ("d", (R, C)), ("q", (R, C)), ("var", (R, 1)), ("ve", (R, 1)),
                 ("sd", (R, 1)), ("nn", (R, C)), ("s", (R, C)), ("y", (R, C))):
        g.add_tensor(Tensor(t, s))
    for k, v in (("eps", np.array(1e-5, np.float32)), ("gamma", np.ones(C, np.float32)),
                 ("beta", np.zeros(C, np.float32))):
        g.add_tensor(Tensor(k, v.shape, "float32", v))
    g.inputs, g.outputs = ["x"], ["y"]
    for j, (op, ins, o, at) in enumerate([
            ("ReduceMean", ["x"], "mu", {"axes": [-1], "keepdims": 1}), ("Sub", ["x", "mu"], "d", {}),
            ("Mul", ["d", "d"], "q", {}), ("ReduceMean", ["q"], "var", {"axes": [-1], "keepdims": 1}),
            ("Add", ["var", "eps"], "ve", {}), ("Sqrt", ["ve"], "sd", {}), ("Div", ["d", "sd"], "nn", {}),
            ("Mul", ["nn", "gamma"], "s", {}), ("Add", ["s", "beta"], "y", {})]):
        g.add_node(Node(f"l{j}", op, ins, [o], at))
    out.append(("layernorm rows 16384x4096", g, 8 * R * C))
    return out


def bench_schedules(rounds: int) -> list[dict]:
    import torch

    from tensorplan.kernels.build import compile_kernel
    from tensorplan.kernels.vendor import make_kernel, random_inputs
    rows = []
    for name, g, nbytes in mem_kernels():
        kd = compile_kernel(g, g.outputs, schedule={"name": "default"})
        ins = random_inputs(g, kd.input_names, cache=False)
        fd = kd.bind(ins, kd.alloc_outputs())
        fo = None
        try:
            ko = make_kernel(g, g.outputs, "ort")
            fo = ko.bind(ins, ko.alloc_outputs())
        except Exception:  # noqa: BLE001
            pass
        a = torch.empty(nbytes // 8, dtype=torch.float32).normal_()
        b = torch.empty_like(a)
        tc, td, to = [], [], []
        for _ in range(rounds):
            tc.append(med_time(lambda: b.copy_(a), 1))
            td.append(med_time(fd, 1))
            if fo is not None:
                to.append(med_time(fo, 1))
        naive = None
        if nbytes <= 4 * 16384 * 4096 and "softmax" not in name and "layernorm" not in name:
            kn = compile_kernel(g, g.outputs, schedule={"name": "naive"})
            fnv = kn.bind(ins, kn.alloc_outputs())
            naive = med_time(fnv, 2)
        copy_gbs = nbytes / statistics.median(tc) / 1e9
        row = {"kernel": name, "bytes": nbytes, "tvm_default_ms": statistics.median(td) * 1e3,
               "tvm_default_gbs": nbytes / statistics.median(td) / 1e9, "copy_same_bytes_gbs": copy_gbs,
               "ort_ms": statistics.median(to) * 1e3 if to else None,
               "naive_ms": naive * 1e3 if naive else None}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_linear(budget: float) -> list[dict]:
    from tensorplan.ir.graph import Graph, Node, Tensor
    from tensorplan.kernels.vendor import best_kernel
    rng = np.random.default_rng(0)
    cases = []
    for M, K, N in ((256, 768, 3072), (128, 768, 768), (1024, 1024, 1024)):
        g = Graph(f"mm{M}x{K}x{N}", 17)
        g.add_tensor(Tensor("a", (M, K)))
        g.add_tensor(Tensor("w", (K, N), "float32", rng.standard_normal((K, N)).astype(np.float32)))
        g.add_tensor(Tensor("y", (M, N)))
        g.inputs, g.outputs = ["a"], ["y"]
        g.add_node(Node("m", "MatMul", ["a", "w"], ["y"]))
        cases.append((g, 2 * M * K * N))
    for C, H, O, k, grp in ((64, 56, 64, 3, 1), (256, 14, 256, 1, 1), (128, 56, 128, 3, 1), (96, 28, 96, 3, 96),
                            (32, 224, 3, 9, 1)):
        g = Graph(f"conv{C}x{H}->{O}k{k}g{grp}", 17)
        g.add_tensor(Tensor("x", (1, C, H, H)))
        g.add_tensor(Tensor("w", (O, C // grp, k, k), "float32",
                            rng.standard_normal((O, C // grp, k, k)).astype(np.float32)))
        g.add_tensor(Tensor("y", (1, O, H, H)))
        g.inputs, g.outputs = ["x"], ["y"]
        g.add_node(Node("c", "Conv", ["x", "w"], ["y"], {"kernel_shape": [k, k], "pads": [k // 2] * 4,
                                                        "group": grp}))
        cases.append((g, 2 * O * (C // grp) * k * k * H * H))
    rows = []
    for g, flops in cases:
        r = best_kernel(g, ["y"], backends=("ort", "torch", "tvm"), budget_s=budget)
        row = {"kernel": g.name, "gflop": flops / 1e9, "best": r.backend,
               "ms": {b: t * 1e3 for b, t in r.times.items()},
               "gflops": {b: flops / t / 1e9 for b, t in r.times.items()},
               "unavailable": sorted(r.errors)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_overhead(n: int = 200) -> dict:
    from tensorplan.ir.graph import Graph, Node, Tensor
    from tensorplan.measure.timer import measure
    from tensorplan.runtime.buffers import plan_buffers
    from tensorplan.runtime.plan import Plan, PlanKernel, topo_order
    from tensorplan.kernels.vendor import call_overheads
    from tensorplan.runtime.executor import PlanExecutor
    out = {"call_overhead_us": {k: v * 1e6 for k, v in call_overheads(2).items()}}
    for backend in ("tvm", "ort"):
        g = Graph("chain", 17)
        g.add_tensor(Tensor("t0", (16,)))
        g.inputs = ["t0"]
        ks = []
        for i in range(n):
            g.add_tensor(Tensor(f"t{i + 1}", (16,)))
            g.add_node(Node(f"n{i}", "Neg", [f"t{i}"], [f"t{i + 1}"]))
            ks.append(PlanKernel(id=f"k{i}", nodes=[f"n{i}"], inputs=[f"t{i}"], outputs=[f"t{i + 1}"],
                                 kind="memory", backend=backend))
        g.outputs = [f"t{n}"]
        plan = Plan(source={"model": "chain"}, device={}, kernels=ks, order=topo_order(ks, {"t0"}))
        plan_buffers(plan, g)
        ex = PlanExecutor(plan, g)
        e2e = measure(ex.run_bound, warmup=5, min_repeats=20, budget_s=0.5).median_s
        ksum = sum(ex.kernel_times(budget_s=0.005))
        out[backend] = {"kernels": n, "e2e_us_per_kernel": e2e / n * 1e6, "alone_us_per_kernel": ksum / n * 1e6,
                        "executor_overhead_us_per_kernel": (e2e - ksum) / n * 1e6}
    print(json.dumps(out), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "results" / "korch_kernels.json"))
    args = ap.parse_args(argv)
    import torch

    from tensorplan.devices import resolve
    from tensorplan.measure.timer import pinned_threads
    torch.set_num_threads(2)
    spec = resolve("local")
    res = {"machine": {"cpu": spec.name, "device": spec.to_dict(), "loadavg_start": list(os.getloadavg())}}
    with pinned_threads(2):
        res["schedules"] = bench_schedules(3 if args.quick else 9)
        for r in res["schedules"]:
            r["fraction_of_device_bw"] = r["tvm_default_gbs"] / spec.mem_bw_gbs
            r["fraction_of_copy_now"] = r["tvm_default_gbs"] / r["copy_same_bytes_gbs"]
        res["linear"] = bench_linear(0.05 if args.quick else 0.2)
        res["overhead"] = bench_overhead(100 if args.quick else 300)
    res["machine"]["loadavg_end"] = list(os.getloadavg())
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1, default=float))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
