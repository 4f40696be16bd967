"""`tensorplan predict MODEL --device h100` (or `h200`) against what that GPU measured, without a GPU.

Why: a GPU prediction is made on a machine without one, so `predict --measure` cannot check it.
But each kernel's GPU program is draw `sample` of its task's CUDA design space with the dataset
sampler's seeds, and `data/cdmpp-h100/` holds the H100's timings of those very draws (task key +
draw index) wherever the GPU session measured them. This script predicts each network as a user
would and looks every kernel's program up there: per-kernel error, and the whole network where
every kernel's program was timed. `--device h200`: the same programs as the H200 ran them (it
re-timed the H100's; TVM schedules the H200 with the H100's tag), predicted by the H100 model.

Two predictors per network:
  shipped   the shipped H100 model (trained on every stable H100 record: the network's own
            kernels included, so this is its fit, not a test);
  held-out  a CDMPP trained here on the H100 records of every task the network does *not* have
            (the strict split: every kernel is unseen), `--members` seeds x `--max-time` s.

One JSON line per (network, predictor) in the JSONL, appended when done (a killed run resumes);
`--summary` writes the table (JSON).

    python research/cdmpp/cdmpp_gpu_predict_check.py --networks resnet-50,bert-base --holdout
    python research/cdmpp/cdmpp_gpu_predict_check.py --device h200
    python research/cdmpp/cdmpp_gpu_predict_check.py --summary
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import typer

DATA = "data/cdmpp-h100"
OUT = Path("research/cdmpp/results/cdmpp_gpu_predict_check.jsonl")


def measured_programs(data: str = DATA, device: str = "h100") -> dict[tuple[str, int], dict]:
    """(task key, draw index) -> `device`'s median latency of that program and whether it is stable."""
    import pandas as pd

    from tensorplan.cdmpp.dataset import load_dataset
    ds = load_dataset(data)
    progs = pd.read_parquet(Path(data) / "programs.parquet")[["prog_idx", "index"]]
    r = ds.records[ds.records["device"] == device].merge(progs, on="prog_idx")
    return {(k, int(i)): {"us": 1e6 * float(s), "stable": bool(m <= 0.01)}
            for k, i, s, m in zip(r.task_key, r["index"], r.latency_s, r.mad_rel)}


def check(pred, timed: dict) -> dict:
    """Attach the GPU timing of each predicted kernel's program (`pred`: a `NetworkPrediction`);
    summarise the kernels found."""
    from tensorplan.cdmpp.predict import measured_summary
    ks = []
    for k in pred.kernels:
        hit = timed.get((k.key, k.default.sample)) if k.default.sample is not None else None
        if hit is None:
            k.default.measure_error = "program not timed on this GPU"
        else:
            k.default.measured_s = 1e-6 * hit["us"]
        d = k.to_dict()
        if hit is not None:
            d["measured_us"], d["stable"] = hit["us"], hit["stable"]
        ks.append(d)
    s = measured_summary(pred.kernels).to_dict()
    s["kernels"] = len(ks)
    s["whole_network"] = s["kernels_measured"] == len(ks)
    s["predicted_ms_all"] = 1e3 * pred.total_s
    return {"summary": s, "kernels": ks}


def holdout_model(net: str, members: int, max_time: float, data: str = DATA) -> tuple[str, dict]:
    """A CDMPP trained on the H100 records of tasks `net` does not have (saved to a temp file)."""
    from tensorplan.cdmpp.model import train
    from tensorplan.cdmpp.dataset import load_dataset
    ds = load_dataset(data)
    mine = {k for k, nets in zip(ds.records.task_key, ds.records.networks) if any(n == net for n, _ in nets)}
    sub = ds.subset(np.flatnonzero(~ds.records.task_key.isin(mine).to_numpy()))
    path = Path(tempfile.mkdtemp()) / f"h100-without-{net}.pt"
    _, info = train(sub, devices=["h100"], out=path, members=members, epochs=400, max_time_s=max_time)
    info["held_out_tasks"] = len(mine)
    return str(path), info


def _done(out: Path) -> set:
    if not out.exists():
        return set()
    return {(r["network"], r["predictor"], r.get("device", "h100")) for r in map(json.loads, out.read_text().splitlines()) if r}


def run(networks: list[str], holdout: bool, members: int, max_time: float, out: Path, device: str = "h100") -> None:
    import torch

    from tensorplan.cdmpp.evaluate import machine_info
    from tensorplan.cdmpp.predict import predict
    torch.set_num_threads(2)
    timed = measured_programs(device=device)
    done = _done(out)
    for net in networks:
        for who in ["shipped"] + (["held-out"] if holdout else []):
            if (net, who, device) in done:
                continue
            t0 = time.time()
            weights, train_info = None, None
            if who == "held-out":
                weights, train_info = holdout_model(net, members, max_time)
            pred = predict(net, device=device, tuned=0, weights=weights)
            res = check(pred, timed)
            rec = {"network": net, "predictor": who, "device": device, "weights": weights or pred.weights,
                   "train": train_info, **res, "cpu": machine_info().get("cpu", ""),
                   "loadavg": list(os.getloadavg()), "wall_s": time.time() - t0, "created": time.time()}
            with out.open("a") as f:
                f.write(json.dumps(rec, default=float) + "\n")
            s = res["summary"]
            tot = (f"network {s['predicted_ms']:.3f} ms predicted / {s['measured_ms']:.3f} ms measured"
                   if s["whole_network"] else f"{s['kernels_measured']}/{s['kernels']} kernels timed")
            print(f"{net:20s} {device:5s} {who:9s} per-kernel MAPE {s['per_kernel']['mape_pct']:6.1f}%  {tot}", flush=True)


def summary(out: Path) -> dict:
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    table = []
    for r in rows:
        s = r["summary"]
        table.append({"network": r["network"], "predictor": r["predictor"], "device": r.get("device", "h100"),
                      "kernels": s["kernels"],
                      "kernels_timed": s["kernels_measured"], "per_kernel_mape_pct": s["per_kernel"]["mape_pct"],
                      "per_kernel_median_ape_pct": s["per_kernel"].get("median_ape_pct"),
                      "spearman": s.get("spearman_across_kernels"),
                      "predicted_ms": s["predicted_ms"], "measured_ms": s["measured_ms"],
                      "total_ratio": s["total_ratio"], "whole_network": s["whole_network"]})
    res = {"bench": "cdmpp_gpu_predict_check", "data": DATA, "rows": table, "created": time.time()}
    p = out.with_suffix(".json")
    p.write_text(json.dumps(res, indent=1, default=float))
    for t in table:
        print(f"{t['network']:20s} {t['device']:5s} {t['predictor']:9s} kernels {t['kernels_timed']:3d}/{t['kernels']:3d}  "
              f"MAPE {t['per_kernel_mape_pct']:6.1f}%  pred/meas (timed kernels) {t['total_ratio']:.2f}"
              + ("  whole network" if t["whole_network"] else ""))
    return res


def main(networks: str = typer.Option("resnet-50,bert-base,yolox-nano,segformer-b0,candy,mobilenet-v2",
                                      help="Comma-separated zoo networks."),
         holdout: bool = typer.Option(False, "--holdout", help="Also train a model without each network's tasks."),
         members: int = typer.Option(1, help="Seeds of the held-out model."),
         max_time: float = typer.Option(180.0, help="Training budget per seed (s)."),
         device: str = typer.Option("h100", help="GPU domain whose timings to check against: h100 or h200."),
         out: Path = typer.Option(OUT, help="JSONL of results (appended)."),
         do_summary: bool = typer.Option(False, "--summary", help="Only write the summary of the JSONL.")) -> None:
    if not do_summary:
        run([n for n in networks.split(",") if n], holdout, members, max_time, out, device)
    summary(out)


if __name__ == "__main__":
    typer.run(main)
