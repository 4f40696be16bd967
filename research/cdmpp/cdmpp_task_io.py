"""Does knowing the kernel's buffer sizes help a latency model on unseen networks?

The per-store features under-report the bytes of some fused kernels (div/mod-indexed slices, see
research/notes/cdmpp.md), so a natural fix is to hand the model the sizes of the kernel's buffers
(`tasks.task_io_vector`: log2 element counts of the output and the inputs, exact and
schedule-independent). This script tests that cheaply before anyone changes the 164-d leaf
layout: TenSet's XGBoost (same parameters as the harness) on summed per-store features, with and
without the task-io columns, on the harness's held-out-network split and the sample split.

Usage: python research/cdmpp/cdmpp_task_io.py [--holdout efficientvit-b1,tiny-mlp,mobilenet-v2]
Writes research/cdmpp/results/cdmpp_task_io.json.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import typer


def _score(pred: np.ndarray, y: np.ndarray) -> dict:
    ape = np.abs(pred - y) / y
    return {"mape_pct": float(100 * ape.mean()), "median_ape_pct": float(100 * np.median(ape)),
            "mean_abs_log_ratio": float(np.mean(np.abs(np.log(pred / y))))}


def main(holdout: str = typer.Option("efficientvit-b1,tiny-mlp,mobilenet-v2", "--holdout"),
         out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_task_io.json"), "--out"),
         seed: int = typer.Option(0, "--seed")) -> None:
    import xgboost as xgb

    from tensorplan.cdmpp.baselines import TenSetXGB, summed_features
    from tensorplan.cdmpp.arrays import as_arrays
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import network_split

    ds = load_dataset().filter_stable(0.01, metric="mad")
    splits = {"network": network_split(ds, holdout.split(","), seed=seed)}
    tr_ds, te_ds = ds.split("sample")
    splits["sample"] = (as_arrays(tr_ds), None, as_arrays(te_ds))
    params = TenSetXGB(seed=seed)._params()
    res: dict = {"command": "python research/cdmpp/cdmpp_task_io.py", "holdout": holdout, "splits": {},
                 "loadavg": list(os.getloadavg())}
    for split, (tr, va, te) in splits.items():
        res["splits"][split] = {"n_train": len(tr), "n_test": len(te)}
        for variant in ("summed", "summed+task_io"):
            def X(a):
                f = summed_features(a)
                return np.hstack([f, a.task_io]) if variant != "summed" else f
            t0 = time.perf_counter()
            evals, kw = [], {}
            if va is not None:
                evals, kw = [(xgb.DMatrix(X(va), label=np.log(va.latency_s)), "val")], {"early_stopping_rounds": 100}
            b = xgb.train(params, xgb.DMatrix(X(tr), label=np.log(tr.latency_s)), num_boost_round=400,
                          evals=evals, verbose_eval=False, **kw)
            rng = {"iteration_range": (0, b.best_iteration + 1)} if va is not None else {}
            pred = np.exp(b.predict(xgb.DMatrix(X(te)), **rng).astype(np.float64))
            s = _score(pred, te.latency_s)
            s["train_s"] = time.perf_counter() - t0
            res["splits"][split][variant] = s
            print(f"{split:8s} {variant:15s} MAPE {s['mape_pct']:6.1f}%  median APE {s['median_ape_pct']:5.1f}%  "
                  f"mean |log ratio| {s['mean_abs_log_ratio']:.3f}", flush=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
