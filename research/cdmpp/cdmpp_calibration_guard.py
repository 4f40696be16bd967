"""Does `tensorplan calibrate`'s held-out check install the correction where it helps, and only there?

Why: `calibrate` fits a boosted-tree correction of log(here / collection-CPU prediction) on ~160
programs timed on the user's CPU. It always fits its own samples better, yet on the collection
CPU's own type (a Zen 5 VM, 2026-11-29) it made the predict check's kernels worse: 28.9 -> 35.6 %
MAPE (research/notes/cdmpp.md). So `calibrate_here` now checks the correction on tasks it was not fitted on
(`local_calibration.held_out_check`, 5 task folds) against the model as `predict` uses it there
(this CPU's device vector) and installs it only where it wins.

This script replays that decision on every CPU domain of the dataset, without timing anything: the
domain's stable records stand in for the programs `calibrate` would time there (KMeans-selected
tasks, 4 programs each, as `calibrate_here` selects them). Then it scores both models on the
domain's records of every other task: was the decision right?
- learnt domains (the shipped model trained on them: local-1t/2t, zen4-1t/2t): the check should
  decline;
- unlearnt CPUs (zen3-1t/2t, the 16-core Xeon's gpuhost-1t): it should install where it helps.

    python research/cdmpp/cdmpp_calibration_guard.py            # ~2 min; -> research/cdmpp/results/cdmpp_calibration_guard.json
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import typer

OUT = Path("research/cdmpp/results/cdmpp_calibration_guard.json")
DOMAINS = ["local-1t", "local-2t", "zen4-1t", "zen4-2t", "zen3-1t", "zen3-2t", "gpuhost-1t"]


def one(ds, est, dom: str, seed: int, n_tasks: int, per_task: int) -> dict:
    """The guard's decision for domain `dom` with selection seed `seed`, and whether it was right."""
    from tensorplan.cdmpp.calibrate import Calibrated
    from tensorplan.cdmpp.arrays import as_arrays, device_features
    from tensorplan.cdmpp.metrics import regression_metrics
    from tensorplan.cdmpp.finetune import programs_of_tasks, select_tasks_kmeans
    from tensorplan.cdmpp.local_calibration import held_out_check

    threads = int(dom.split("-")[1][:-1])
    source = f"local-{threads}t"
    arr = as_arrays(ds.device(dom))                  # labels of `dom`, its own device vector
    tasks = select_tasks_kmeans(arr, min(n_tasks, len(np.unique(arr.task_key))), seed=seed)
    idx = programs_of_tasks(arr, tasks, per_task, seed)
    samples = arr.subset(idx)
    src = device_features(source, ds.devices).tolist()

    def make() -> Calibrated:
        return Calibrated(est, source=source, seed=seed, source_features=src)

    check = held_out_check(make, samples, est.predict(samples)).to_dict()
    cal = make().fit(samples)
    test = arr.subset(np.flatnonzero(~np.isin(arr.task_key, tasks)))
    here, calibrated = est.predict(test), cal.predict(test)
    m_here, m_cal = regression_metrics(here, test.latency_s), regression_metrics(calibrated, test.latency_s)
    helps = m_cal["mape_pct"] < m_here["mape_pct"]
    return {"domain": dom, "seed": seed, "samples": len(idx), "test_records": len(test),
            "check": {k: (v["mape_pct"] if isinstance(v, dict) else v) for k, v in check.items()},
            "installed": check["calibration_better"], "test_mape_uncalibrated": m_here["mape_pct"],
            "test_mape_calibrated": m_cal["mape_pct"], "calibration_helps": helps,
            "decision_right": check["calibration_better"] == helps,
            "test_mape_with_guard": m_cal["mape_pct"] if check["calibration_better"] else m_here["mape_pct"]}


def main(domains: str = typer.Option(",".join(DOMAINS), help="Dataset CPU domains to replay."),
         seeds: str = typer.Option("0,1,2", help="KMeans selection seeds."),
         n_tasks: int = typer.Option(40, help="Tasks selected (calibrate's --tasks)."),
         per_task: int = typer.Option(4, help="Programs per task (calibrate's --per-task)."),
         out: Path = typer.Option(OUT, help="Result JSON.")) -> None:
    """Replay calibrate's held-out check on the dataset's CPU domains; score its decisions."""
    from tensorplan.cdmpp.model import load_shipped
    from tensorplan.cdmpp.dataset import load_dataset

    ds = load_dataset(None).filter_stable(max_cov=0.01, metric="mad")
    est = load_shipped()
    learnt = set(getattr(est, "domains_", None) or [])
    rows = []
    for dom in [d for d in domains.split(",") if d]:
        for seed in [int(s) for s in seeds.split(",")]:
            r = one(ds, est, dom, seed, n_tasks, per_task)
            r["learnt_by_shipped_model"] = dom in learnt
            rows.append(r)
            print(f"{dom} seed {seed}: held-out check {r['check'].get('model_here', float('nan')):.1f} -> "
                  f"{r['check'].get('calibrated', float('nan')):.1f} % ({'install' if r['installed'] else 'decline'}); "
                  f"other tasks {r['test_mape_uncalibrated']:.1f} -> {r['test_mape_calibrated']:.1f} % "
                  f"({'right' if r['decision_right'] else 'WRONG'})", flush=True)
    med = lambda xs: float(statistics.median(xs))
    summary = {d: {"learnt_by_shipped_model": rs[0]["learnt_by_shipped_model"],
                   "installed": sum(r["installed"] for r in rs), "runs": len(rs),
                   "decisions_right": sum(r["decision_right"] for r in rs),
                   "test_mape_uncalibrated": med(r["test_mape_uncalibrated"] for r in rs),
                   "test_mape_calibrated": med(r["test_mape_calibrated"] for r in rs),
                   "test_mape_with_guard": med(r["test_mape_with_guard"] for r in rs)}
               for d in dict.fromkeys(r["domain"] for r in rows) for rs in [[r for r in rows if r["domain"] == d]]}
    out.write_text(json.dumps({"command": "python research/cdmpp/cdmpp_calibration_guard.py", "n_tasks": n_tasks,
                               "per_task": per_task, "summary": summary, "runs": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    typer.run(main)
