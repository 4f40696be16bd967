"""Co-executor components vs the predictor's terms on the two-process stand-in (cpu + cpu2).

For a few YOLOv2/VGG-16 op shapes at the planner's chosen split: measured map/transform
in and out, compute per side, sync (min over repeats: interference on the shared machine only
adds time) next to the CoDL-style predictor's terms; memory overhead; energy counters.
Then the five CoDL models end to end (`workflows.coexec.coexec`): planned segments predicted vs measured,
and the whole model (other operators on the CPU alone) against ONNX Runtime at 1 and 2
threads, interleaved in the same rounds.

    python bench/codl_coexec.py [--repeats 15] [--models yolov2,...]  -> bench/results/codl_coexec.json
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "codl_coexec.json"


def main() -> None:
    from tensorplan.zoo.specs import load_model
    from tensorplan.codl.partition import extract_ops
    from tensorplan.codl.coexecutor import CoexecJob, ProcessPair, epilogue_specs, fit_local_cost, memory_overhead, op_weights, reference_output

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--models", default="yolov2,vgg-16,posenet,retinaface,candy",
                    help="models to run end to end ('' for none)")
    ap.add_argument("--model-repeats", type=int, default=7)
    args = ap.parse_args()
    picks = [("yolov2", i) for i in (2, 6, 12, 20)] + [("vgg-16", i) for i in (3, 9)]
    rows = []
    with ProcessPair() as pair:
        cost = fit_local_cost(None, pair)
        sync = pair.measure_sync(200)
        for m, i in picks:
            g = load_model(m)
            co = extract_ops(g)[i]
            for dim, r in (("H", 0.5), ("OC", 0.5), (None, None)):
                if dim is None:
                    dim, r, _ = cost.best_op(co.shape)
                job = CoexecJob([co.shape], [op_weights(g, co)], dim, r,
                                [epilogue_specs(g, co.epilogue, co.node.outputs[0])])
                x = np.random.default_rng(0).standard_normal((1, co.shape.ic, co.shape.ih, co.shape.iw)).astype(np.float32)
                pj = pair.prepare(job)
                pair.load_input(pj, x)
                pair.run(pj)
                runs = [pair.run(pj) for _ in range(args.repeats)]
                out = pair.output(pj)
                err = float(np.abs(out - reference_output(job, x)).max())
                pair.free(pj)
                comp = {k: float(np.min([getattr(t, k) for t in runs])) for k in
                        ("total", "map_in", "trans_in", "cpu", "trans_out", "map_out", "gpu", "sync", "start_latency")}
                pred = cost.op_cost(co.shape, dim, r).to_dict()
                rows.append({"model": m, "op": co.shape.short(), "dim": dim, "ratio": r, "measured_min": comp,
                             "measured_median_total": float(np.median([t.total for t in runs])),
                             "predicted": pred, "total_rel_err": pred["total"] / comp["total"] - 1,
                             "max_abs_err": err, "memory": memory_overhead(job)})
                print(f"{m}[{i}] {co.shape.short():34s} {dim} {r:.1f} pred {pred['total']*1e3:7.3f} ms "
                      f"meas(min) {comp['total']*1e3:7.3f} ms  share in {comp['map_in']*1e3+comp['trans_in']*1e3:.3f}/"
                      f"{pred['share_in']*1e3:.3f}  err {err:.1e}", flush=True)
    from tensorplan.workflows.coexec import coexec

    models = {}
    for m in [x for x in args.models.split(",") if x]:
        r = coexec(m, "cpu,cpu2", method="greedy", repeats=args.model_repeats).to_dict()
        w = r["whole_model"]
        models[m] = {"segments_predicted_s": r["predicted_s"], "segments_measured_min_s": r["measured_min_s"],
                     "segments_measured_median_s": r["measured_median_s"], "segments_rel_err": r["relative_error"],
                     "plan": {k: v for k, v in r["plan"].items() if k != "segments"},
                     "segment_dims": [(s["dim"], s["ratio"]) for s in r["segments"]],
                     "max_abs_err_segments": max(s["max_abs_err"] for s in r["segments"]),
                     "whole_model": {"ort_median_s": w["ort_median_s"],
                                     "plans": {k: {kk: vv for kk, vv in v.items() if kk != "rounds"}
                                               for k, v in w["plans"].items()}}}
        o, p = w["ort_median_s"], w["plans"]
        print(f"{m:11s} segments pred {r['predicted_s']*1e3:7.2f} ms meas(min) {r['measured_min_s']*1e3:7.2f} ms | whole: "
              + " ".join(f"{k} {v['median_s']['total']*1e3:7.2f}" for k, v in p.items())
              + f" | ORT 1t {o['ort_1t']*1e3:7.2f} 2t {o['ort_2t']*1e3:7.2f} ms | codl handoff "
              f"{p['codl']['median_s']['handoff']*1e3:.2f} cpu-ops {p['codl']['median_s']['cpu_ops']*1e3:.2f} "
              f"err {max(v['max_rel_err_vs_ort'] for v in p.values()):.1e}", flush=True)
    energy = {"rapl": os.path.isdir("/sys/class/powercap"), "nvml": False}
    try:
        import pynvml  # noqa: F401
        energy["nvml"] = True
    except ImportError:
        pass
    res = {"sync_round_trip_s": {"median": float(np.median(sync)), "p90": float(np.percentile(sync, 90))},
           "rows": rows, "models": models, "energy_counters": energy, "load_avg": os.getloadavg(),
           "note": "rows: min over repeats; models: medians of interleaved rounds; see load_avg"}
    errs = [abs(r["total_rel_err"]) for r in rows]
    res["median_abs_total_rel_err"] = float(np.median(errs))
    res["within_10pct"] = float(np.mean([e <= 0.1 for e in errs]))
    OUT.write_text(json.dumps(res, indent=1))
    print(f"median |pred/meas-1| = {res['median_abs_total_rel_err']:.2f}, within ±10%: {res['within_10pct']:.0%}, "
          f"load avg {res['load_avg']}")


if __name__ == "__main__":
    main()
