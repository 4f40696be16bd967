"""Korch planning half on the zoo: fission, candidate counts, BLP solve times, ablations.

For each model: operators -> primitives (and, with --check, the primitive graph's max relative
error vs ONNX Runtime on the original model), candidate counts and unique canonical hashes at
size caps 4/8/16, enumeration time, and with roofline (AnalyticalCost) costs on this machine's
DeviceSpec: BLP solve time with and without the valid cuts, without the dominance presolve, without recomputation, and the
greedy-fusion / no-fusion baselines. Roofline latencies are only a planning signal; the
meaningful numbers here are the counts and the solver times.

    .venv/bin/python bench/korch_candidates.py [--models candy,bert-base] [--check] \
        [-o bench/results/korch_candidates.json] [--fresh]

Default: every zoo model. Resumable: models already in the output file (same name, opset and
caps) are kept and skipped, so a killed run loses nothing; `--fresh` measures the chosen models
again (replacing their records, keeping the other models').
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tensorplan.devices.detect import machine_info


def check_fission(name: str, opset: int, g, prim) -> float:
    import onnxruntime as ort
    from tensorplan import zoo
    from tensorplan.ir.reference import random_feeds, rel_error, run_reference
    feeds = random_feeds(g, 0)
    sess = ort.InferenceSession(str(zoo.export(name, opset)), providers=["CPUExecutionProvider"])
    want = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
    got = run_reference(prim, feeds)
    return max(rel_error(got[o], w) for o, w in zip(prim.outputs, want))


def timed_blp(prim, cands, costs, repeats: int, **kw):
    from tensorplan.korch.blp import solve_blp
    times, sel = [], None
    for _ in range(repeats):
        sel = solve_blp(prim, cands, costs, **kw)
        times.append(sel.solve_s)
    return sel, times


def run_model(name: str, opset: int, caps: list[int], check: bool, repeats: int, time_limit: float) -> dict:
    from tensorplan.cost import AnalyticalCost, cost_many
    from tensorplan.devices import resolve
    from tensorplan.zoo.specs import load_model
    from tensorplan.korch.fission import fission
    from tensorplan.korch.blp import greedy_fusion, no_fusion, recomputed_primitives
    from tensorplan.korch.candidates import EnumerationStats, enumerate_candidates

    t0 = time.perf_counter()
    g = load_model(name, opset=opset)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fr = fission(g)
    fission_s = time.perf_counter() - t0
    prim = fr.graph
    rec = {"model": name, "opset": opset, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "operators": len(g.nodes), "primitives": len(prim.nodes),
           "load_s": load_s, "fission_s": fission_s, "fission": fr.summary()}
    if check:
        rec["fission_max_rel_error_vs_ort"] = check_fission(name, opset, g, prim)
    cm = AnalyticalCost(resolve("local"))
    rec["cost_model"] = cm.describe()
    rec["caps"] = {}
    for cap in caps:
        st = EnumerationStats()
        cands = enumerate_candidates(prim, max_nodes=cap, opaque={n for n, _ in fr.opaque}, stats=st)
        row = {"enumeration": st.to_dict()}
        costs = cost_many(cm, prim, cands)
        sel, times = timed_blp(prim, cands, costs, repeats, cuts=True, time_limit=time_limit)
        row["blp"] = {**sel.to_dict(), "solve_s_all": times, "solve_s_median": statistics.median(times),
                      "recomputed_primitives": recomputed_primitives(cands, sel.chosen)}
        sel2, times2 = timed_blp(prim, cands, costs, 1, cuts=False, time_limit=time_limit)
        row["blp_no_cuts"] = {**sel2.to_dict(), "solve_s_all": times2, "solve_s_median": statistics.median(times2)}
        sel4, times4 = timed_blp(prim, cands, costs, 1, cuts=True, presolve=False, time_limit=time_limit)
        row["blp_no_presolve"] = {**sel4.to_dict(), "solve_s_median": statistics.median(times4)}
        sel3, times3 = timed_blp(prim, cands, costs, 1, cuts=True, recompute=False, time_limit=time_limit)
        row["blp_no_recompute"] = {**sel3.to_dict(), "solve_s_median": statistics.median(times3)}
        gr = greedy_fusion(prim, cands, costs)
        nf = no_fusion(prim, cands, costs)
        row["greedy"] = gr.to_dict()
        row["no_fusion"] = nf.to_dict()
        row["speedup_blp_vs_greedy_predicted"] = gr.objective_s / sel.objective_s
        row["speedup_blp_vs_nofusion_predicted"] = nf.objective_s / sel.objective_s
        rec["caps"][str(cap)] = row
        print(f"{name:16s} cap {cap:2d}: {st.candidates:6d} cands ({st.unique_hashes} unique, "
              f"{st.regions} regions, {st.seconds:.2f}s) | BLP {sel.status} {len(sel.chosen)} kernels "
              f"solve {statistics.median(times):.3f}s (no cuts {statistics.median(times2):.3f}s, "
              f"no presolve {times4[0]:.3f}s, no-recompute {times3[0]:.3f}s) | pred ms blp {sel.objective_s * 1e3:.3f} "
              f"greedy {gr.objective_s * 1e3:.3f} none {nf.objective_s * 1e3:.3f}", flush=True)
    return rec


def _default_models() -> str:
    from tensorplan import zoo
    return ",".join(e.name for e in zoo.list_models())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=None, help="comma-separated zoo names[:opset] (default: every zoo model)")
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--caps", default="4,8,16")
    ap.add_argument("--repeats", type=int, default=3, help="BLP solves per configuration (median)")
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--check", action="store_true", help="also check fission numerics vs ONNX Runtime")
    ap.add_argument("--fresh", action="store_true",
                    help="measure the chosen models again even if the output file has them (others are kept)")
    ap.add_argument("-o", "--output", default="bench/results/korch_candidates.json")
    a = ap.parse_args()
    caps = [int(c) for c in a.caps.split(",")]
    out_path = Path(a.output)
    kept = json.loads(out_path.read_text()).get("models", []) if out_path.exists() else []
    out = {"machine": machine_info(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "command": " ".join(sys.argv), "models": kept}
    for m in (a.models or _default_models()).split(","):
        name, _, ops = m.partition(":")
        opset = int(ops or a.opset)
        if not a.fresh and any(r["model"] == name and r["opset"] == opset and sorted(map(int, r["caps"])) == caps
                               for r in kept):
            print(f"{name:16s} already measured in {out_path}, skipped", flush=True)
            continue
        out["models"] = [r for r in out["models"] if not (r["model"] == name and r["opset"] == opset)]
        rec = run_model(name, opset, caps, a.check, a.repeats, a.time_limit)
        rec["command"] = out["command"]
        out["models"].append(rec)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(out, indent=1, default=str))
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
