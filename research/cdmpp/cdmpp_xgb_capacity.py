"""How much more the trees get from capacity: xgboost-hier against `xgboost-deep` and the steps between.

Why: TenSet's XGBoost settings (depth 6, eta 0.2, 400 rounds, sum over stores) leave accuracy on the
table on this dataset. Each row adds one thing: the max and last store rows beside the sum
(`baselines.store_stat_features`), deeper and more trees, row/column sampling (= `xgboost-deep`),
and a 3-seed ensemble of it; then depth 10, 5 seeds, the min / first store rows (`--rows 5,6,7`) and the
MAPE-optimal point of `mape_point.MapePoint` (`--rows 8`).
Splits are the harness's (`evaluate.sample_split`, `network_split` with its three held-out networks)
on the collection CPU's two domains; one line per (split, row) is appended to the JSONL as it
finishes, so a killed run resumes.

    .venv/bin/python research/cdmpp/cdmpp_xgb_capacity.py --out research/cdmpp/results/cdmpp_xgb_capacity.jsonl
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Optional

import typer

# row -> a harness model name, or TenSetXGB keyword arguments on top of xgboost-hier's (parts,
# hierarchy base); `deep=True` starts from xgboost-deep's (evaluate.XGB_DEEP, <=4000 rounds) instead
ROWS = {
    "xgboost-hier": {},
    "+ max/last store rows": dict(stats=("sum", "max", "last")),
    "+ depth 8, eta 0.1, <=4000 rounds": dict(deep=True, subsample=1.0, colsample=1.0),
    "+ row/col sampling (xgboost-deep)": "xgboost-deep",
    "xgboost-deep, 3 seeds (xgboost-deep-ens3)": "xgboost-deep-ens3",
    "xgboost-deep at depth 10": dict(deep=True, max_depth=10),
    "xgboost-deep, 5 seeds (xgboost-deep-ens5)": "xgboost-deep-ens5",
    "xgboost-deep + min over stores and first store's row": dict(deep=True, stats=("sum", "max", "last", "min", "first")),
    "xgboost-deep, MAPE-optimal point (xgboost-deep-mape)": "xgboost-deep-mape",
    "xgboost-deep + the task's buffer sizes (task_io)": dict(deep=True, task_io=True),
}


def main(out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_xgb_capacity.jsonl"), "--out"),
         splits: str = typer.Option("sample,network", "--splits", help="Comma-separated: sample, network."),
         rows: str = typer.Option("", "--rows", help="Comma-separated row numbers (0-based); default all."),
         threads: Optional[int] = typer.Option(None, "--threads", help="XGBoost threads per fit (default: "
                                                "every core this process may use).")) -> None:
    threads = threads or len(os.sched_getaffinity(0))
    from tensorplan.cdmpp.baselines import TenSetXGB
    from tensorplan.cdmpp.metrics import regression_metrics, within_task_spearman
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.ensemble import Ensemble
    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.mape_point import MapePoint
    from tensorplan.cdmpp.evaluate import EvalData, machine_info, network_split, sample_split
    from cdmpp_variants.harness import PUBLISHED_HOLDOUT, XGB_DEEP, make_model

    done = set()
    if out.exists():
        done = {(r["split"], r["row"]) for r in map(json.loads, out.read_text().splitlines())}
    ds = load_dataset(None).only_devices(["local-1t", "local-2t"]).filter_stable(max_cov=0.01, metric="mad")
    data = EvalData(ds)
    names = list(ROWS)
    pick = [names[int(i)] for i in rows.split(",")] if rows else names
    for split in [s for s in splits.split(",") if s]:
        tr, va, te = sample_split(ds, 0, data) if split == "sample" else network_split(ds, PUBLISHED_HOLDOUT, 0, data)
        for row in pick:
            if (split, row) in done:
                continue
            spec = ROWS[row]
            if isinstance(spec, str):
                m = make_model(spec)
            elif spec.get("deep"):
                m = TenSetXGB(n_rounds=4000, **{**XGB_DEEP, **{k: v for k, v in spec.items() if k != "deep"}})
            else:
                m = TenSetXGB(parts=True, base="hierarchy", **spec)
            inner = m.base if isinstance(m, MapePoint) else m
            members = inner.members if isinstance(inner, Ensemble) else [inner]
            for mem in members:
                mem.threads = threads
            t = time.perf_counter()
            m.fit(tr, va)
            fit_s = time.perf_counter() - t
            pred = m.predict(te)
            line = {"split": split, "row": row, "n_train": len(tr), "n_test": len(te), "fit_s": fit_s,
                    "rounds": [int(x.booster.attr("best_iteration") or x.booster.num_boosted_rounds()) + 1
                               for x in members],
                    "test": regression_metrics(pred, te.latency_s),
                    "within_task_rho": within_task_spearman(pred, te.latency_s, te.task_key),
                    "threads": threads, "machine": machine_info(), "host": platform.node(), "created": time.time()}
            if isinstance(m, MapePoint):
                line["log_var"] = m.log_var      # s^2 of the validation log error
            with out.open("a") as f:
                f.write(json.dumps(line) + "\n")
            r = line["test"]
            print(f"{split:8s} {row:45s} MAPE {r['mape_pct']:6.2f}  median APE {r['median_ape_pct']:6.2f}  "
                  f"fit {fit_s:6.0f} s", flush=True)


if __name__ == "__main__":
    typer.run(main)
