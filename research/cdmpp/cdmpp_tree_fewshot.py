"""Ways to let a new device's few samples weigh more in `xgboost-deep`, on the harness's device split.

Why: the harness refits the trees on source + the few target samples, where ~200 samples among
~30,000 source records barely move them (Zen 4: 18.8 % zero-shot, 18.9 % few-shot). Two ways to
give the samples more say: the samples weighted w times in the refit (early stopping on the source
validation records), and boosting on: the source model's trees kept, a few shallow trees added on
the samples alone (the trees' analogue of fine-tuning a head). Yardsticks: the zero-shot model, and
the test programs' *measured* source latency times the samples' MAPE-optimal ratio (a perfect
source model plus one factor; `research/cdmpp/cdmpp_domain_ratio.py` gives the oracle floors). One JSON
document per run.

    .venv/bin/python research/cdmpp/cdmpp_tree_fewshot.py --source local-1t --target zen4-1t \\
        --out research/cdmpp/results/cdmpp_tree_fewshot_zen4.json
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

WEIGHTS = (1.0, 10.0, 50.0)
BOOST_ON = ((0.05, 50), (0.02, 200), (0.05, 200))   # (eta, rounds) of depth-3 trees on the samples


def main(source: str = typer.Option("local-1t", "--source", help="Source domain(s), comma-separated."),
         target: str = typer.Option("zen4-1t", "--target", help="The held-out device domain."),
         out: Path = typer.Option(..., "--out", help="JSON document to write."),
         threads: Optional[int] = typer.Option(None, "--threads", help="XGBoost threads per fit (default: "
                                                "every core this process may use).")) -> None:
    threads = threads or len(os.sched_getaffinity(0))
    import xgboost as xgb

    from tensorplan.cdmpp.arrays import ProgramArrays
    from tensorplan.cdmpp.metrics import regression_metrics
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import EvalData, device_split, machine_info
    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.harness import make_model
    from cdmpp_variants.mape_point import mape_optimal_factor

    raw = load_dataset(None)
    ds = raw.filter_stable(max_cov=0.01, metric="mad")
    R = raw.records
    prog_of = dict(zip(R["record_id"], R["prog_idx"]))
    if "," not in source:   # the source domain's measured latency of the same program (any stability)
        on_src = R[R["device"] == source].set_index("prog_idx")["latency_s"]
        src_lat = lambda a: np.array([on_src.get(prog_of[int(r)], np.nan) for r in a.record_id])  # noqa: E731
    sp = device_split(ds, source, target, 8, 0, data=EvalData(ds))
    tr, va, pool, te = sp["train"], sp["val"], sp["pool"], sp["test"]
    m = make_model("xgboost-deep")
    m.threads = threads
    t = time.perf_counter()
    m.fit(tr, va)
    doc = {"source": source, "target": target, "n_train": len(tr), "n_test": len(te),
           "fit_s": time.perf_counter() - t, "zero_shot": regression_metrics(m.predict(te), te.latency_s),
           "few_shot": {}, "machine": machine_info(), "host": platform.node(), "created": time.time()}
    print(f"zero-shot MAPE {doc['zero_shot']['mape_pct']:.2f}", flush=True)
    Xte, off_te = xgb.DMatrix(m._features(te)), m._offset(te)
    dva = xgb.DMatrix(m._features(va), label=np.log(va.latency_s) - m._offset(va))
    best = int(m.booster.attr("best_iteration")) + 1
    for method in ("kmeans", "random"):
        ft = pool.subset(sp["selections"][method][0])
        rows = doc["few_shot"][method] = {"samples": len(ft), "variants": []}
        if "," not in source:
            s_ft, s_te = src_lat(ft), src_lat(te)
            ok = np.isfinite(s_ft)
            g = mape_optimal_factor(s_ft[ok], ft.latency_s[ok])
            have = np.isfinite(s_te)
            rows["measured_source_x_samples_factor"] = {
                "factor": g, "test_with_source_label": int(have.sum()),
                "test": regression_metrics(g * s_te[have], te.latency_s[have])}
            print(f"{method}: measured {source} x {g:.3f}: "
                  f"{rows['measured_source_x_samples_factor']['test']['mape_pct']:.2f}", flush=True)
        both = ProgramArrays.concat([tr, ft])
        X, y = m._features(both), np.log(both.latency_s) - m._offset(both)
        for w in WEIGHTS:
            t = time.perf_counter()
            wt = np.r_[np.ones(len(tr)), np.full(len(ft), w)]
            b = xgb.train(m._params(), xgb.DMatrix(X, label=y, weight=wt), num_boost_round=m.n_rounds,
                          evals=[(dva, "val")], early_stopping_rounds=m.early_stop, verbose_eval=False)
            z = b.predict(Xte, iteration_range=(0, b.best_iteration + 1))
            rows["variants"].append({"variant": f"refit, samples weighted {w:g}x", "fit_s": time.perf_counter() - t,
                                     "test": regression_metrics(np.exp(z + off_te), te.latency_s)})
            print(f"{method} {rows['variants'][-1]['variant']}: {rows['variants'][-1]['test']['mape_pct']:.2f}",
                  flush=True)
        dft = xgb.DMatrix(m._features(ft), label=np.log(ft.latency_s) - m._offset(ft))
        for eta, rounds in BOOST_ON:
            p = {**m._params(), "eta": eta, "max_depth": 3, "subsample": 1.0, "colsample_bytree": 1.0}
            b = xgb.train(p, dft, num_boost_round=rounds, xgb_model=m.booster[:best])
            rows["variants"].append({"variant": f"boost on: {rounds} depth-3 trees, eta {eta:g}",
                                     "test": regression_metrics(np.exp(b.predict(Xte) + off_te), te.latency_s)})
            print(f"{method} {rows['variants'][-1]['variant']}: {rows['variants'][-1]['test']['mape_pct']:.2f}",
                  flush=True)
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    typer.run(main)
