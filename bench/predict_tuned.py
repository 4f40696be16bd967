"""`tensorplan predict MODEL --device local --measure` with its default, tuned picks: how close the
predicted latency gets to this CPU, and to what users deploy.

Why: `predict` reports by default the predicted-fastest of each kernel's first N sampled schedules
(none timed). This runs it with `--measure` on the seven benchmark models and on zoo models the
CDMPP dataset (data/cdmpp/) never held, and records per model: the tuned and untuned predicted
totals, the picks compiled and timed here (per-kernel MAPE on the picks, whole-network
predicted/measured ratio), the default schedules the same way, and ONNX Runtime's latency of the
same ONNX file timed in the same run (the benchmarks' interleaved protocol, `workflows.peers`), so a reader sees
how far the tuned prediction is from what a user deploys. Kernels are timed one by one (the sum
leaves out what runs between kernels); ONNX Runtime runs the whole model.

    python bench/predict_tuned.py                               # all ten models (about an hour on 2 cores)
    python bench/predict_tuned.py --models resnet-50,tiny-style # some; rows merge into the JSON by model

Writes bench/results/predict_tuned.json (with the machine description).
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import typer

OUT = Path("bench/results/predict_tuned.json")
BENCHMARK_MODELS = ("candy", "segformer-b0", "efficientvit-b1", "yolox-nano", "yolov4", "resnet-50", "bert-base")
# zoo models whose kernels the CPU dataset (data/cdmpp/) never held; datamove-grid is only in the
# separate Zen 4 data-movement set (data/cdmpp-datamove-zen4/)
OUTSIDE_DATASET = ("tiny-style", "tiny-linear-attention", "datamove-grid")


def dataset_networks() -> set[str]:
    """The networks of the CPU dataset the shipped predictor learnt (data/cdmpp/meta.json)."""
    from tensorplan.cdmpp.dataset import default_data_dir

    return set(json.loads((default_data_dir() / "meta.json").read_text())["networks"])


def ort_median(model: str, threads: int, rounds: int) -> dict:
    """ONNX Runtime on the model's ONNX file (the file `predict` lowered), as the benchmarks build
    and time it (`workflows.peers`: default options at `threads` intra-op threads, interleaved
    rounds, flagged noisy when the rounds spread or the machine is loaded)."""
    from tensorplan.ir.onnx_import import import_onnx
    from tensorplan.ir.reference import random_feeds
    from tensorplan.workflows.peers import ort_peer, runners_of, time_interleaved
    from tensorplan.zoo.specs import resolve_model

    path, _ = resolve_model(model)
    peer, _ = ort_peer(str(path), random_feeds(import_onnx(path), seed=0), threads)
    t = time_interleaved(runners_of([peer]), rounds, peers=[peer])
    r = t.runners[peer.name]
    return {"median_ms": r.median_ms, "cov": r.cov, "method": t.method, "noisy": t.noise_reason}


def row(model: str, tuned: int, rounds: int, in_dataset: bool, device: str = "local") -> dict:
    """One model: predict with the tuned default and measure, then ONNX Runtime at the same threads."""
    from tensorplan.cdmpp.predict import local_threads, predict, usable_cores

    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    p = predict(model, device, tuned=tuned, measure=True, progress=True)
    wall = time.perf_counter() - t0
    load_after = os.getloadavg()[0]
    m = p.measured
    t = m.tuned if m is not None else None
    ort = ort_median(model, local_threads(device), rounds)
    out = {"model": model, "in_dataset": in_dataset, "device": device, "domain": p.domain, "predictor": p.predictor,
           "weights": Path(p.weights).name, "zero_shot": p.zero_shot, "kernels": len(p.kernels),
           "not_predicted": p.not_predicted, "tuned": p.tuned, "total_is": p.total_is, "predicted": p.what,
           "tuned_predicted_ms": 1e3 * p.total_s, "untuned_predicted_ms": 1e3 * p.untuned_total_s,
           "kernels_changed": sum(k.tuned.sample != k.default.sample for k in p.kernels),
           "ort_ms": ort["median_ms"], "ort_cov": ort["cov"], "ort_method": ort["method"], "ort_noisy": ort["noisy"],
           "sample_featurize_s": p.featurize_s, "predict_s": p.predict_s, "measure_s": m.measure_s if m else None,
           "predict_wall_s": wall, "measured": m.to_dict() if m else None,
           # kernels are timed at every usable core: on a machine busier than that, TVM's pool waits
           # for descheduled workers at every parallel loop and the timings mean little
           "load_1m_before": load_before, "load_1m_after": load_after,
           "noisy": max(load_before, load_after) > usable_cores(), "threads": local_threads(device)}
    if t is not None:
        out.update(kernels_timed=t.kernels, tuned_measured_ms=1e3 * t.measured_s,
                   tuned_pred_over_meas=t.total_ratio, tuned_kernel_mape_pct=t.per_kernel["mape_pct"],
                   tuned_kernel_median_ape_pct=t.per_kernel["median_ape_pct"],
                   tuned_spearman=t.spearman_across_kernels,
                   untuned_measured_ms=1e3 * t.default_measured_s, untuned_pred_over_meas=m.total_ratio,
                   untuned_kernel_mape_pct=m.per_kernel["mape_pct"], measured_speedup=t.measured_speedup,
                   kernels_slower=t.kernels_slower,
                   tuned_predicted_over_ort=p.total_s / (ort["median_ms"] / 1e3),
                   tuned_measured_over_ort=t.measured_s / (ort["median_ms"] / 1e3))
    return out


def main(models: str = typer.Option(",".join(BENCHMARK_MODELS + OUTSIDE_DATASET), "--models",
                                    help="Comma-separated models."),
         tuned: int = typer.Option(0, "--tuned", min=0, help="Schedules ranked per kernel (0: predict's default)."),
         rounds: int = typer.Option(15, "--rounds", min=1, help="Interleaved rounds for ONNX Runtime."),
         device: str = typer.Option("local", "--device", help="This CPU: 'local' (every usable core) or 'local-<N>t'."),
         out: Path = typer.Option(OUT, "--out", help="Result JSON; rows of other models already there are kept.")):
    from tensorplan.cdmpp.predict import DEFAULT_TUNED
    from tensorplan.devices.detect import machine_info
    from tensorplan.devices import resolve

    n = tuned or DEFAULT_TUNED
    known = dataset_networks()
    res = json.loads(out.read_text()) if out.exists() else {}
    # one row per (model, device, N); rows of other runs stay
    rows = {(r["model"], r.get("device", "local"), r["tuned"]): r for r in res.get("rows", [])}
    for model in [x for x in models.split(",") if x]:
        print(f"== {model}", file=sys.stderr, flush=True)
        r = rows[(model, device, n)] = row(model, n, rounds, model in known, device)
        print(f"{model}: tuned {r['tuned_predicted_ms']:.2f} ms predicted, {r.get('tuned_measured_ms', 0):.2f} ms "
              f"measured ({r.get('tuned_pred_over_meas', float('nan')):.2f}x), per-kernel MAPE "
              f"{r.get('tuned_kernel_mape_pct', float('nan')):.0f}%; untuned {r['untuned_predicted_ms']:.2f} ms "
              f"predicted; ONNX Runtime {r['ort_ms']:.2f} ms", file=sys.stderr, flush=True)
        order = list(BENCHMARK_MODELS + OUTSIDE_DATASET)
        res = {"bench": "predict_tuned", "command": "python bench/predict_tuned.py " + " ".join(sys.argv[1:]),
               "device": resolve("local").to_dict(), "machine": machine_info(),
               "dataset_networks": sorted(known),
               "rows": sorted(rows.values(), key=lambda x: (order.index(x["model"]) if x["model"] in order else 99,
                                                           x.get("device", "local"), x["tuned"]))}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=1, default=float) + "\n")


if __name__ == "__main__":
    typer.run(main)
