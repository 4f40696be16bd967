"""Does a model of the kernel's scale beat the trees' own? One row per task instead of per program.

Why: on unseen networks about half of `xgboost-deep`'s error is the scale of whole kernels
(research/notes/cdmpp.md, "Scale or shape"). The trees see every program; a booster over one row per
training task and device domain (the mean and spread of its programs' features and the mean
hierarchy estimate; target: the mean log latency) sees only what a kernel's scale could depend on.
On the harness's held-out-network split this scores, per setting (depth x min_child_weight),
each held-out kernel's mean log latency from the task booster alone (w = 1) and averaged half and
half with the mean of the trees' log predictions (w = 0.5): its mean absolute log error on the
test and validation tasks, and the test / validation MAPE when the trees' programs keep their
spacing and take that scale. Writes one JSON document.

    .venv/bin/python research/cdmpp/cdmpp_task_scale.py
    .venv/bin/python research/cdmpp/cdmpp_task_scale.py --holdout segformer-b0,swin-tiny,candy,resnet-50
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import typer

SETTINGS = [(d, mcw) for d in (3, 4, 6) for mcw in (1, 5)]
WEIGHTS = (0.5, 1.0)


def task_rows(model, arr) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(group index per program, task rows [feature mean, feature std, mean offset], mean offset,
    mean log latency) per task and device domain."""
    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.task_relative import group_index, group_means

    g = group_index(arr)
    f = model._features(arr).astype(np.float64)
    fm, off = group_means(f, g), group_means(model._offset(arr), g)
    fs = np.sqrt(np.maximum(group_means(f * f, g) - fm * fm, 0.0))
    return g, np.hstack([fm, fs, off[:, None]]), off, group_means(np.log(arr.latency_s), g)


def main(holdout: str = typer.Option("", "--holdout", help="Held-out networks (default: the evaluation table's)."),
         out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_task_scale.json"), "--out"),
         time_scale: float = typer.Option(0.625, "--time-scale", help="The harness's budget scale."),
         threads: int = typer.Option(1, "--threads", help="XGBoost threads.")) -> None:
    import xgboost as xgb

    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import EvalData, machine_info, network_split
    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.harness import PUBLISHED_HOLDOUT, make_model
    from cdmpp_variants.task_relative import group_means

    held = [h for h in holdout.split(",") if h] or list(PUBLISHED_HOLDOUT)
    ds = load_dataset(None).only_devices(["local-1t", "local-2t"]).filter_stable(max_cov=0.01, metric="mad")
    tr, va, te = network_split(ds, held, 0, EvalData(ds))
    trees = make_model("xgboost-deep", time_scale=time_scale)
    trees.threads = threads
    t0 = time.perf_counter()
    trees.fit(tr, val=va)
    fit_s = time.perf_counter() - t0

    def mape(p, y):
        return float(100 * np.mean(np.abs(p - y) / y))

    (_, xtr, otr, ytr), parts = task_rows(trees, tr), {}
    for key, arr in (("test", te), ("val", va)):
        g, x, off, y = task_rows(trees, arr)
        lp = np.log(trees.predict(arr))
        parts[key] = dict(arr=arr, g=g, x=x, off=off, y=y, lp=lp, scale=group_means(lp, g))

    def scored(key, scale):
        p = parts[key]
        pred = np.exp(p["lp"] - p["scale"][p["g"]] + scale[p["g"]])
        return {f"{key}_scale_mae": float(np.mean(np.abs(scale - p["y"]))), f"{key}_mape_pct": mape(pred, p["arr"].latency_s)}

    res = {"trees' mean": {**scored("test", parts["test"]["scale"]), **scored("val", parts["val"]["scale"])}}
    with typer.progressbar(SETTINGS, label="task boosters") as bar:
        for depth, mcw in bar:
            params = dict(max_depth=depth, min_child_weight=mcw, eta=0.05, subsample=0.8, colsample_bytree=0.5,
                          objective="reg:squarederror", nthread=threads, verbosity=0, seed=0)
            dval = xgb.DMatrix(parts["val"]["x"], label=parts["val"]["y"] - parts["val"]["off"])
            b = xgb.train(params, xgb.DMatrix(xtr, label=ytr - otr), 3000, evals=[(dval, "val")],
                          early_stopping_rounds=200, verbose_eval=False)
            own = {k: b.predict(xgb.DMatrix(p["x"]), iteration_range=(0, b.best_iteration + 1)) + p["off"]
                   for k, p in parts.items()}
            for w in WEIGHTS:
                mix = {k: w * own[k] + (1 - w) * parts[k]["scale"] for k in parts}
                res[f"depth {depth}, mcw {mcw}, w {w}"] = {**scored("test", mix["test"]), **scored("val", mix["val"]),
                                                           "rounds": int(b.best_iteration + 1)}
    doc = {"bench": "cdmpp_task_scale", "holdout": held, "n_train_tasks": len(ytr),
           "n_val_tasks": len(parts["val"]["y"]), "n_test_tasks": len(parts["test"]["y"]), "trees_fit_s": fit_s,
           "results": res, "machine": machine_info(), "host": platform.node(), "created": time.time()}
    out.write_text(json.dumps(doc, indent=1))
    for k, v in res.items():
        print(f"{k:28s} test scale |log err| {v['test_scale_mae']:.3f}  MAPE {v['test_mape_pct']:6.2f}   "
              f"val {v['val_scale_mae']:.3f}  {v['val_mape_pct']:6.2f}")
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
