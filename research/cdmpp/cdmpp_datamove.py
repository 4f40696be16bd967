"""Does data-movement coverage help on unseen networks? The synthetic `datamove-grid` on one CPU.

Why: on held-out networks the predictors' largest errors are data-movement kernels (on the
harness split they are 12 % of `xgboost-hier`'s test records and 37 % of its summed APE, the worst
being small strided slices predicted 4-13x too slow; `--breakdown`, research/notes/cdmpp.md, *Data-movement
coverage*). The zoo networks hold few such kernels, at few sizes. `datamove-grid` (zoo/synthetic.py) is 144 of
them: nine layout patterns on sixteen shapes, none of them a kernel of the dataset's networks.

The grid's records must come from the CPU the test records come from, so this runs on a domain
measured on this very machine type. Records are collected under a prefix and exported as their
own dataset directory:

    tensorplan predictor dataset collect --networks datamove-grid --prefix zen4 --programs-per-task 8 \\
        --store ~/.cache/tensorplan/datamove-zen4.sqlite
    tensorplan predictor dataset export --store ~/.cache/tensorplan/datamove-zen4.sqlite --out data/cdmpp-datamove-zen4
    python research/cdmpp/cdmpp_datamove.py --extra data/cdmpp-datamove-zen4 --devices zen4-1t,zen4-2t

Each model and seed is trained twice on the held-out-network split of those domains (the harness's
three networks by default), once without and once with the grid's records, and scored on the same
test records: overall, on the test's data-movement kernels (tasks whose name holds no conv2d, matmul,
dense, softmax, norm, mean or pool) and on the rest. One JSON line per (model, seed, with/without);
`--summary` prints medians over seeds. `--also-train local-1t,local-2t --out ..._multi.jsonl` adds the
collection CPU's domains to training (tested on `--devices` still). `--breakdown --devices local-1t,local-2t --models
xgboost-hier` scores one model per test task on the collection CPU's domains (where the error is).
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import numpy as np
import typer

OUT = Path("research/cdmpp/results/cdmpp_datamove.jsonl")
HOLDOUT = "efficientvit-b1,tiny-mlp,mobilenet-v2"
COMPUTE = re.compile(r"conv2d|matmul|dense|softmax|norm|mean|pool|sum|max_pool|avg_pool|adaptive")


def is_data_movement(task_name: str) -> bool:
    """A kernel that only moves data: no convolution, product, reduction or normalisation in its name."""
    return not COMPUTE.search(task_name)


def _metrics(pred: np.ndarray, y: np.ndarray) -> dict:
    from tensorplan.cdmpp.metrics import regression_metrics
    if len(y) == 0:
        return {"n": 0}
    m = regression_metrics(pred, y)
    return {"n": int(len(y)), "mape_pct": m["mape_pct"], "median_ape_pct": m["median_ape_pct"],
            "acc20_pct": m["acc20_pct"]}


def run(extra: str, devices: list[str], holdout: list[str], models: list[str], seeds: list[int],
        time_scale: float, out: Path, also_train: list[str] | None = None) -> None:
    """`also_train`: more domains to train on (e.g. the collection CPU's), tested on `devices` only."""
    from tensorplan.cdmpp import evaluate as E
    from tensorplan.cdmpp.dataset import load_dataset

    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.harness import make_model

    also = [d for d in (also_train or []) if d not in devices]
    done = {(r["model"], r["seed"], r["with_grid"]) for r in _rows(out)}
    for with_grid in (False, True):
        raw = load_dataset(f"data/cdmpp,{extra}" if with_grid else None).only_devices(devices + also)
        ds = raw.filter_stable(max_cov=0.01, metric="mad")
        data = E.EvalData(ds)
        names = ds.tasks.set_index("task_key")["task_name"].to_dict()
        grid = {k for k, nets in zip(ds.tasks["task_key"], ds.tasks["networks"]) if any(n == "datamove-grid" for n, _ in nets)}
        for seed in seeds:
            tr, va, te = E.network_split(ds, holdout, seed, data)
            te = te.subset(np.flatnonzero(np.isin(np.asarray(te.device_name), devices)))
            dm = np.array([is_data_movement(names[k]) for k in te.task_key])
            grid_train = int(sum(k in grid for k in tr.task_key))
            for name in models:
                if (name, seed, with_grid) in done:
                    continue
                m = make_model(name, time_scale=time_scale, seed=seed)
                tt = E._fit(m, tr, va, None)
                pred = m.predict(te)
                row = {"model": name, "seed": seed, "with_grid": with_grid, "devices": devices, "also_train": also,
                       "holdout": holdout,
                       "n_train": len(tr), "n_train_grid": grid_train, "n_test": len(te), "train_s": tt,
                       "all": _metrics(pred, te.latency_s), "data_movement": _metrics(pred[dm], te.latency_s[dm]),
                       "compute": _metrics(pred[~dm], te.latency_s[~dm]),
                       "test_task_keys": int(len(set(te.task_key)))}
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{name} seed {seed} grid={with_grid}: MAPE {row['all']['mape_pct']:.1f} % "
                      f"(data movement {row['data_movement'].get('mape_pct', float('nan')):.1f} %, "
                      f"compute {row['compute'].get('mape_pct', float('nan')):.1f} %)", flush=True)


def breakdown(devices: list[str], holdout: list[str], model: str, out: Path, top: int = 8) -> dict:
    """Where the held-out-network error comes from: `model` trained on the harness split of
    `devices`, its summed APE per test task, the data-movement kernels' share, and the training
    programs nearest (summed log features) to the worst task's."""
    from tensorplan.cdmpp import evaluate as E
    from tensorplan.cdmpp.baselines import summed_features
    from tensorplan.cdmpp.dataset import load_dataset

    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.harness import make_model

    ds = load_dataset(None).only_devices(devices).filter_stable(max_cov=0.01, metric="mad")
    data = E.EvalData(ds)
    names = ds.tasks.set_index("task_key")["task_name"].to_dict()
    tr, va, te = E.network_split(ds, holdout, 0, data)
    m = make_model(model, seed=0)
    E._fit(m, tr, va, None)
    pred, y = m.predict(te), te.latency_s
    ape = np.abs(pred - y) / y
    keys = np.asarray(te.task_key)
    dm = np.array([is_data_movement(names[k]) for k in keys])
    tasks = []
    for k in np.unique(keys):
        sel = keys == k
        tasks.append({"task": names[k], "key": str(k), "records": int(sel.sum()), "ape_share_pct": float(100 * ape[sel].sum() / ape.sum()),
                      "mape_pct": float(100 * ape[sel].mean()), "measured_ms_median": float(1e3 * np.median(y[sel])),
                      "predicted_ms_median": float(1e3 * np.median(pred[sel])), "data_movement": bool(dm[sel][0])})
    tasks.sort(key=lambda t: -t["ape_share_pct"])
    worst = np.flatnonzero(keys == tasks[0]["key"])[0]
    xtr, xte = np.log1p(np.abs(summed_features(tr))), np.log1p(np.abs(summed_features(te)))
    d = np.linalg.norm(xtr - xte[worst], axis=1)
    near = np.argsort(d)[:5]
    res = {"devices": devices, "holdout": holdout, "model": model, "n_test": int(len(y)),
           "mape_pct": float(100 * ape.mean()), "data_movement_records_pct": float(100 * dm.mean()),
           "data_movement_ape_share_pct": float(100 * ape[dm].sum() / ape.sum()), "top_tasks": tasks[:top],
           "worst_task_nearest_training": [{"task": names[tr.task_key[i]], "measured_ms": float(1e3 * tr.latency_s[i]),
                                            "distance": float(d[i])} for i in near]}
    out.write_text(json.dumps(res, indent=1))
    return res


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def summarize(path: Path) -> dict:
    """Median over seeds per (model, with/without grid) of each subset's MAPE and median APE."""
    rows = _rows(path)
    out: dict = {}
    for r in rows:
        out.setdefault(r["model"], {}).setdefault("with" if r["with_grid"] else "without", []).append(r)
    summary = {}
    for model, by in out.items():
        summary[model] = {}
        for k, rs in by.items():
            summary[model][k] = {"seeds": sorted(r["seed"] for r in rs), "n_train": rs[0]["n_train"],
                                 "n_train_grid": rs[0]["n_train_grid"], "n_test": rs[0]["n_test"]}
            for part in ("all", "data_movement", "compute"):
                summary[model][k][part] = {
                    "n": rs[0][part]["n"],
                    **{m: statistics.median(r[part][m] for r in rs) for m in ("mape_pct", "median_ape_pct", "acc20_pct")
                       if rs[0][part].get("n")}}
    return summary


def main(extra: str = typer.Option("data/cdmpp-datamove-zen4", help="Exported grid records (dataset directory)."),
         devices: str = typer.Option("zen4-1t,zen4-2t", help="Domains to train and test on (the grid's)."),
         also_train: str = typer.Option("", help="More domains to train on, not tested (e.g. local-1t,local-2t)."),
         holdout: str = typer.Option(HOLDOUT, help="Held-out networks."),
         models: str = typer.Option("xgboost-hier,cdmpp-nocmd-parts", help="Harness models."),
         seeds: str = typer.Option("0,1,2", help="Seeds (split validation tasks and model init)."),
         time_scale: float = typer.Option(1.0, help="Multiply the models' training budgets."),
         out: Path = typer.Option(OUT, help="JSONL, one line per (model, seed, with/without); resumable."),
         summary: bool = typer.Option(False, "--summary", help="Print and write the summary JSON."),
         where: bool = typer.Option(False, "--breakdown", help="Instead: per-task error of one model on the harness "
                                    "split of --devices (e.g. local-1t,local-2t), -> cdmpp_datamove_breakdown.json.")) -> None:
    """Held-out-network error with and without the synthetic data-movement grid in training."""
    if where:
        r = breakdown([d for d in devices.split(",") if d], [h for h in holdout.split(",") if h],
                      models.split(",")[0], out.with_name("cdmpp_datamove_breakdown.json"))
        print(json.dumps({k: v for k, v in r.items() if k != "top_tasks"}, indent=1))
        for t in r["top_tasks"]:
            print(f"{t['ape_share_pct']:5.1f} % of APE  {t['records']:4d} rec  measured {t['measured_ms_median']:.3f} ms  "
                  f"predicted {t['predicted_ms_median']:.3f} ms  {t['task']}")
        return
    if summary:
        s = summarize(out)
        out.with_suffix(".json").write_text(json.dumps(s, indent=1))
        for model, by in s.items():
            for k in ("without", "with"):
                if k in by:
                    x = by[k]
                    cells = " | ".join(f"{x[p]['mape_pct']:.1f} ({x[p]['median_ape_pct']:.1f})" if "mape_pct" in x[p] else "–"
                                       for p in ("all", "data_movement", "compute"))
                    print(f"| {model} | {k} | {x['n_train']:,} ({x['n_train_grid']:,}) | {cells} |")
        return
    run(extra, [d for d in devices.split(",") if d], [h for h in holdout.split(",") if h],
        [m for m in models.split(",") if m], [int(s) for s in seeds.split(",") if s], time_scale, out,
        [d for d in also_train.split(",") if d])


if __name__ == "__main__":
    typer.run(main)
