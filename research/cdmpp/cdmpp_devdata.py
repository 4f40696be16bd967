"""Small *real* development dataset for the CDMPP model code, independent of cdmpp/dataset.py.

Samples meta-schedule schedules of a few TE workloads, measures each at 1 and 2 TVM threads
(time_evaluator) and stores TVM's own PerStoreFeature rows (the same 164-d Ansor features) as
leaves. Used only while the real dataset (data/cdmpp/) is being collected.

    python research/cdmpp/cdmpp_devdata.py --out /tmp/cdmpp_dev.npz --per-task 40
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def workloads():
    from tvm import te, topi

    def mm(M, N, K, relu=False):
        A = te.placeholder((M, K), name="A"); B = te.placeholder((K, N), name="B")
        k = te.reduce_axis((0, K), name="k")
        C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
        if relu:
            D = te.compute((M, N), lambda i, j: te.max(C[i, j], 0.0), name="D")
            return [A, B, D], 2 * M * N * K
        return [A, B, C], 2 * M * N * K

    def conv(N, C, H, W, F, KS):
        X = te.placeholder((N, C, H, W), name="X"); Wt = te.placeholder((F, C, KS, KS), name="W")
        Y = topi.nn.conv2d_nchw(X, Wt, 1, KS // 2, 1)
        return [X, Wt, Y], 2 * N * F * H * W * C * KS * KS

    def softmax(M, N):
        A = te.placeholder((M, N), name="A")
        return [A, topi.nn.softmax(A)], 5 * M * N

    def add_relu(M, N):
        A = te.placeholder((M, N), name="A"); B = te.placeholder((M, N), name="B")
        C = te.compute((M, N), lambda i, j: te.max(A[i, j] + B[i, j], 0.0), name="C")
        return [A, B, C], 2 * M * N

    return {
        "mm_128_128_128": mm(128, 128, 128), "mm_256_64_256_relu": mm(256, 64, 256, True),
        "mm_64_512_128": mm(64, 512, 128), "mm_384_384_64_relu": mm(384, 384, 64, True),
        "conv_1_32_28_28_32_3": conv(1, 32, 28, 28, 32, 3), "conv_1_16_56_56_32_1": conv(1, 16, 56, 56, 32, 1),
        "mm_512_256_32": mm(512, 256, 32), "mm_32_1024_256_relu": mm(32, 1024, 256, True),
        "conv_1_64_14_14_64_3": conv(1, 64, 14, 14, 64, 3), "conv_1_8_112_112_16_3": conv(1, 8, 112, 112, 16, 3),
        "softmax_256_512": softmax(256, 512), "softmax_64_2048": softmax(64, 2048), "add_relu_1024_512": add_relu(1024, 512),
    }


def to_py(o):
    """Trace JSON from TVM (ffi Arrays, IntImm, String) -> plain Python."""
    import tvm
    if isinstance(o, (bool, int, float, str)) or o is None:
        return o
    if isinstance(o, tvm.tirx.IntImm):
        return int(o.value)
    if isinstance(o, tvm.tirx.FloatImm):
        return float(o.value)
    if hasattr(o, "items"):
        return {str(k): to_py(v) for k, v in o.items()}
    try:
        return [to_py(x) for x in o]
    except TypeError:
        return str(o)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/cdmpp_dev.npz")
    ap.add_argument("--per-task", type=int, default=40)
    a = ap.parse_args()
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    cfg = tvm.get_global_func("runtime.config_threadpool")
    fe = ms.feature_extractor.PerStoreFeature()
    rows = []
    for tname, (tensors, flops) in workloads().items():
        mod = tvm.IRModule({"main": te.create_prim_func(tensors)})
        ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                             search_strategy="replay-trace", num_threads=2)
        spaces = ctx.generate_design_space()
        args = [tvm.runtime.tensor(np.random.rand(*[int(s) for s in t.shape]).astype("float32")) for t in tensors]
        t0 = time.time(); seen = set()
        for s in range(a.per_task * 3):
            if len([r for r in rows if r["task"] == tname]) >= a.per_task:
                break
            sch = Schedule(mod, seed=s + 1)
            try:
                spaces[s % len(spaces)].trace.apply_to_schedule(sch, remove_postproc=True,
                                                                decision_provider=lambda *x: None)
                ok = all(p.apply(sch) for p in ctx.space_generator.postprocs)
                if not ok:
                    continue
                h = sch.mod.script()
                if h in seen:
                    continue
                seen.add(h)
                lib = tvm.compile(sch.mod, target=target).jit()
                f = fe.extract_from(ctx, [ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"]))])[0].numpy()
                lat = {}
                for nt in (1, 2):
                    cfg(1, nt)
                    r = lib.time_evaluator("main", tvm.cpu(), number=3, repeat=5, min_repeat_ms=20)(*args)
                    res = np.array(r.results)
                    lat[nt] = (float(np.median(res)), float(res.std() / res.mean()))
                rows.append(dict(task=tname, flops=flops, leaves=f.astype(np.float32),
                                 trace=json.dumps(to_py(sch.trace.as_json())), lat1=lat[1], lat2=lat[2]))
            except Exception as e:  # invalid sampled schedule
                print("skip", tname, s, type(e).__name__, str(e)[:80])
        print(tname, len([r for r in rows if r["task"] == tname]), f"{time.time()-t0:.1f}s", flush=True)
    n = np.array([len(r["leaves"]) for r in rows])
    np.savez(a.out, leaf_data=np.concatenate([r["leaves"] for r in rows]), offsets=np.concatenate([[0], np.cumsum(n)]),
             task=np.array([r["task"] for r in rows]), flops=np.array([r["flops"] for r in rows], float),
             lat1=np.array([r["lat1"][0] for r in rows]), cov1=np.array([r["lat1"][1] for r in rows]),
             lat2=np.array([r["lat2"][0] for r in rows]), cov2=np.array([r["lat2"][1] for r in rows]),
             trace=np.array([r["trace"] for r in rows]))
    print("wrote", a.out, len(rows))


if __name__ == "__main__":
    main()
