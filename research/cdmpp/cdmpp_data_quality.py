"""How clean is the CDMPP dataset, and how much can a model learn from it?

Prints (and writes as JSON) three things for one exported dataset directory:
  * label noise: records whose leaf features are identical within (task, device) should have the
    same latency; the mean APE of each record against its group's median is a floor no model beats;
  * XGBoost (TenSet parameters, depth 8, 1,000 rounds) on summed + max-pooled leaf features, a
    record-level 80/20 split: train and test MAPE, and test MAPE by record-id range (the order of
    collection), which exposes records measured while the machine was busy;
  * the same split with the stability filter the evaluation uses (MAD/median <= 1%).

Compare datasets by pointing --data at an older export (e.g. `git worktree add /tmp/old <commit>`).
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import typer


def main(data: Path = typer.Option(None, "--data", help="Exported dataset directory (default: data/cdmpp)."),
         out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_data_quality.json"), "--out", help="JSON output."),
         seed: int = typer.Option(0, "--seed")) -> None:
    import xgboost as xgb

    from tensorplan.cdmpp.arrays import as_arrays
    from tensorplan.cdmpp.dataset import load_dataset

    ds = load_dataset(data)
    ds = ds.subset((ds.records.mad_rel <= 0.01).to_numpy())
    r = ds.records
    fh = np.array([hashlib.md5(x.tobytes()).hexdigest() for x in ds.leaves])
    df = r.assign(fh=fh)
    grp = df.groupby(["task_key", "device", "fh"]).latency_s
    med, cnt = grp.transform("median").to_numpy(), grp.transform("count").to_numpy()
    lat = df.latency_s.to_numpy()
    dup = cnt > 1
    noise = {"records_in_identical_feature_groups": int(dup.sum()),
             "mean_ape_vs_group_median_pct": float(100 * np.mean(np.abs(lat[dup] - med[dup]) / lat[dup])),
             "median_ape_vs_group_median_pct": float(100 * np.median(np.abs(lat[dup] - med[dup]) / lat[dup]))}

    a = as_arrays(ds)
    n = a.n_leaves
    seg = np.repeat(np.arange(len(a)), n)
    S = np.zeros((len(a), a.leaf_data.shape[1]))
    np.add.at(S, seg, a.leaf_data)
    M = np.full_like(S, -1e9)
    np.maximum.at(M, seg, a.leaf_data)
    X = np.hstack([S, M, np.log(n)[:, None], a.device, np.log(a.flops + 1)[:, None]])
    y = np.log(a.latency_s)
    te = np.random.default_rng(seed).random(len(a)) < 0.2
    t0 = time.perf_counter()
    m = xgb.XGBRegressor(max_depth=8, n_estimators=1000, learning_rate=0.1, min_child_weight=2, gamma=0.003,
                         n_jobs=2, tree_method="hist", random_state=seed)
    m.fit(X[~te], y[~te])
    p = np.exp(m.predict(X))
    ape = np.abs(p - a.latency_s) / a.latency_s
    rid = r.record_id.to_numpy()
    edges = np.linspace(0, rid.max() + 1, 7).astype(int)
    by_range = [{"record_ids": [int(lo), int(hi)], "test_records": int((te & (rid >= lo) & (rid < hi)).sum()),
                 "test_mape_pct": float(100 * ape[te & (rid >= lo) & (rid < hi)].mean())}
                for lo, hi in zip(edges[:-1], edges[1:])]
    res = {"data": ds.path, "stable_records": len(a), "label_noise": noise,
           "xgboost_sample_split": {"train_mape_pct": float(100 * ape[~te].mean()),
                                    "test_mape_pct": float(100 * ape[te].mean()),
                                    "test_median_ape_pct": float(100 * np.median(ape[te])),
                                    "fit_s": time.perf_counter() - t0, "by_record_range": by_range}}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    typer.run(main)
