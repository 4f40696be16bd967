"""How much of a model's error a per-kernel scale would remove: its MAPE, and after the best factor.

Why: on unseen networks every model is 40-60 % off, against the paper's 14 %. If the error were a
scale per kernel (an unseen kind of kernel predicted 2x too slow across its schedules), one
measured program per kernel would fix it; if it is within the kernel (its schedules ranked and
spaced wrongly), no scale does. Per (split, model), on the harness's splits (collection CPU's two
domains, the evaluation table's three held-out networks):

- the plain test MAPE;
- after the MAPE-optimal factor, one for all and one per task and device domain
  (`mape_point.factor_floors`: fitted on the test labels, so optimistic: what is left is
  within-task error);
- after a factor from k measured programs per task (k = 1, 2, 4; the median of their log ratio,
  scored on the task's other programs, mean of 5 draws), against the plain MAPE of the same records.

One JSONL line per (split, model), appended when done, so a killed run resumes.

    .venv/bin/python research/cdmpp/cdmpp_error_parts.py --models xgboost-deep,cdmpp-nocmd-parts
    .venv/bin/python research/cdmpp/cdmpp_error_parts.py --models xgboost-deep,xgboost-deep-rel --splits network \
        --holdout segformer-b0,swin-tiny,candy,resnet-50
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Optional

import numpy as np
import typer

MEASURED_PER_TASK = (1, 2, 4)
DRAWS = 5


def measured_per_task(pred: np.ndarray, true: np.ndarray, task: np.ndarray, k: int, seed: int = 0) -> dict:
    """Each task's predictions times the median ratio of k of its programs (drawn at random), scored
    on the task's other programs; tasks with <= k programs are left out. Mean over DRAWS draws."""
    from tensorplan.cdmpp.metrics import regression_metrics

    rng = np.random.default_rng(seed)
    fixed, plain, n = [], [], 0
    for _ in range(DRAWS):
        scaled, keep = pred.copy(), np.zeros(len(pred), bool)
        for t in np.unique(task):
            idx = np.flatnonzero(task == t)
            if len(idx) <= k:
                continue
            pick = rng.choice(idx, k, replace=False)
            rest = np.setdiff1d(idx, pick)
            scaled[rest] = pred[rest] * np.exp(np.median(np.log(true[pick] / pred[pick])))
            keep[rest] = True
        fixed.append(regression_metrics(scaled[keep], true[keep])["mape_pct"])
        plain.append(regression_metrics(pred[keep], true[keep])["mape_pct"])
        n = int(keep.sum())
    return {"k": k, "scored_records": n, "mape_pct": float(np.mean(fixed)), "plain_mape_pct": float(np.mean(plain))}


def main(models: str = typer.Option("xgboost-deep,cdmpp-nocmd-parts", "--models", help="Harness model names."),
         splits: str = typer.Option("network,sample", "--splits", help="Comma-separated: network, sample."),
         holdout: str = typer.Option("", "--holdout", help="Held-out networks, comma-separated "
                                     "(default: the evaluation table's)."),
         out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_error_parts.jsonl"), "--out"),
         time_scale: float = typer.Option(0.625, "--time-scale", help="The harness's budget scale (CDMPP 150 s)."),
         threads: Optional[int] = typer.Option(None, "--threads", help="XGBoost threads per fit (default: "
                                                "every core this process may use).")) -> None:
    threads = threads or len(os.sched_getaffinity(0))
    from tensorplan.cdmpp.metrics import regression_metrics
    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.wrapped import validation_choices, wrapped_layers
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import EvalData, machine_info, network_split, sample_split
    from cdmpp_variants.harness import PUBLISHED_HOLDOUT, make_model
    from cdmpp_variants.mape_point import factor_floors

    held = [h for h in holdout.split(",") if h] or list(PUBLISHED_HOLDOUT)
    done = {(r["split"], r["model"], ",".join(r.get("holdout") or PUBLISHED_HOLDOUT))
            for r in map(json.loads, out.read_text().splitlines())} if out.exists() else set()
    ds = load_dataset(None).only_devices(["local-1t", "local-2t"]).filter_stable(max_cov=0.01, metric="mad")
    data = EvalData(ds)
    for split in [s for s in splits.split(",") if s]:
        tr, va, te = sample_split(ds, 0, data) if split == "sample" else network_split(ds, held, 0, data)
        for name in [m for m in models.split(",") if m]:
            key_holdout = ",".join(held) if split == "network" else ",".join(PUBLISHED_HOLDOUT)
            if (split, name, key_holdout) in done:
                continue
            m = make_model(name, time_scale=time_scale)
            for layer in wrapped_layers(m):
                if hasattr(layer, "threads"):
                    layer.threads = threads
            t = time.perf_counter()
            m.fit(tr, va)
            fit_s = time.perf_counter() - t
            pred, true = m.predict(te), np.asarray(te.latency_s, np.float64)
            task = te.task_domains()
            line = {"split": split, "model": name, "holdout": held if split == "network" else None,
                    "n_train": len(tr), "n_test": len(te),
                    "task_domains": int(len(np.unique(task))), "fit_s": fit_s, "test": regression_metrics(pred, true),
                    "floors": factor_floors(pred, true, task),
                    # what the wrapper models chose on validation (task_relative's mix, mape_point's s^2)
                    "fitted": validation_choices(m),
                    "measured_per_task": [measured_per_task(pred, true, task, k) for k in MEASURED_PER_TASK],
                    "machine": machine_info(), "host": platform.node(), "created": time.time()}
            with out.open("a") as f:
                f.write(json.dumps(line) + "\n")
            fl = line["floors"]
            print(f"{split:8s} {name:20s} MAPE {line['test']['mape_pct']:6.2f}  one factor "
                  f"{fl['one_factor_mape_pct']:6.2f}  per task {fl['per_task_factor_mape_pct']:6.2f}  "
                  + "  ".join(f"{r['k']} measured {r['mape_pct']:.2f} (plain {r['plain_mape_pct']:.2f})"
                              for r in line["measured_per_task"]), flush=True)


if __name__ == "__main__":
    typer.run(main)
