"""Do seed ensembles (cdmpp/ensemble.py) help on unseen networks and on seen tasks?

For each split (the harness's held-out-network split and its sample split) and each model
(CDMPP with CMD, CDMPP without CMD, XGBoost with bagging), K members are trained with seeds
0..K-1 under the harness's budget (`--seconds` per CDMPP member; the same records, validation
and unlabelled target set as `tensorplan predictor evaluate`). Scored on the test set: member 0 alone (the
single model), the mean over members of their own scores, the ensemble's geometric mean
(shrink 0) and the ensemble's point estimate exp(mean log - shrink * var log) for shrink 1 (the
default) and 2. Members train two at a time in separate processes (one torch thread each).

Mixed ensembles (`blends` in the JSON) pool the members of two or three models (e.g. CDMPP without
CMD and XGBoost: different errors) and apply the same rule, exp(mean log - shrink * var log), to
the pooled members: no weight is fitted, so no test label is used. `--blends-only` recomputes them
from the saved .npz without training.

Usage: python research/cdmpp/cdmpp_ensemble.py [--members 3] [--seconds 150] [--splits network,sample] [--blends-only]
       python research/cdmpp/cdmpp_ensemble.py --models xgboost-hier --add   # train one more model, merge it in
Writes research/cdmpp/results/cdmpp_ensemble.json (with the machine description), the members' log
predictions as .npz and a predicted-vs-measured scatter coloured by the spread as .png.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import typer

HOLDOUT = "efficientvit-b1,tiny-mlp,mobilenet-v2"   # what `tensorplan predictor evaluate` holds out (research/notes/cdmpp.md)
DEVICES = "local-1t,local-2t"                        # the collection CPU's domains (what the runs used)
# CDMPP members: CDMPP(...) keyword arguments; XGBoost members (bagged rows and columns): TenSetXGB(...) ones
MODELS = {"cdmpp": {"cmd_alpha": 1.0}, "cdmpp-nocmd": {"cmd_alpha": 0.0}}
XGB_MODELS = {"xgboost": {}, "xgboost-hier": {"parts": True, "base": "hierarchy"}}


def _splits(names: list[str], holdout: str, devices: str = DEVICES):
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import network_split, sample_split

    ds = load_dataset(None).only_devices(devices.split(",")).filter_stable(max_cov=0.01, metric="mad")
    out = {}
    for s in names:
        tr, va, te = network_split(ds, holdout.split(","), 0) if s == "network" else sample_split(ds, 0)
        out[s] = (tr, va, te)
    return out


def _member(split: str, model: str, seed: int, seconds: float, holdout: str, devices: str = DEVICES) -> dict:
    """Train one member in this process; return its test predictions and training time."""
    from tensorplan.cdmpp.baselines import TenSetXGB
    from tensorplan.cdmpp.model import CDMPP

    tr, va, te = _splits([split], holdout, devices)[split]
    unl = None
    if split == "network":                       # CMD sees the held-out programs, never their latencies
        unl = te.subset(np.arange(len(te)))
        unl.latency_s = None
    if model in XGB_MODELS:
        m = TenSetXGB(seed=seed, subsample=0.7, colsample=0.7, **XGB_MODELS[model])
    else:
        m = CDMPP(epochs=4000, max_time_s=seconds, seed=seed, **MODELS[model])
    t0 = time.perf_counter()
    m.fit(tr, va, unl)
    return {"split": split, "model": model, "seed": seed, "train_s": time.perf_counter() - t0,
            "pred": m.predict(te).tolist()}


def _score(pred: np.ndarray, y: np.ndarray) -> dict:
    from tensorplan.cdmpp.metrics import regression_metrics

    m = regression_metrics(pred, y)
    return {k: m[k] for k in ("mape_pct", "median_ape_pct", "acc10_pct", "acc20_pct", "mean_abs_log_ratio")}


def _spread_vs_error(spread: np.ndarray, abs_log_err: np.ndarray) -> dict:
    """Does the members' disagreement flag the programs the ensemble gets wrong?"""
    from scipy.stats import spearmanr

    q = np.quantile(spread, [0.2, 0.8])
    return {"spearman": float(spearmanr(spread, abs_log_err).statistic),
            "mean_abs_log_err_low_quintile": float(abs_log_err[spread <= q[0]].mean()),
            "mean_abs_log_err_high_quintile": float(abs_log_err[spread >= q[1]].mean())}


def _plot(arrays: dict, splits: list[str], models: list[str], path: Path) -> None:
    """Predicted (ensemble geometric mean) vs measured, log-log, coloured by the members' spread."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(splits), len(models), figsize=(4.2 * len(models), 4 * len(splits)), squeeze=False)
    for i, s in enumerate(splits):
        y = arrays[f"{s}/latency_s"] * 1e6
        for j, m in enumerate(models):
            L = arrays[f"{s}/{m}"]
            pred, spread = np.exp(L.mean(0)) * 1e6, L.std(0, ddof=1)
            ax = axes[i, j]
            sc = ax.scatter(y, pred, c=spread, s=2, cmap="viridis", vmin=0, vmax=np.quantile(spread, 0.99))
            lo, hi = min(y.min(), pred.min()), max(y.max(), pred.max())
            ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            ax.set(xscale="log", yscale="log", xlabel="measured µs", ylabel="predicted µs", title=f"{s}: {m}")
            fig.colorbar(sc, ax=ax, label="spread (std of log)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


BLENDS = (("cdmpp", "xgboost"), ("cdmpp-nocmd", "xgboost"), ("cdmpp", "cdmpp-nocmd", "xgboost"),
          ("cdmpp-nocmd", "xgboost-hier"), ("cdmpp-nocmd", "xgboost", "xgboost-hier"))


def _blends(arrays: dict, split_names: list[str]) -> dict:
    """Mixed ensembles: the pooled members' log predictions of several models, shrink 0 and 1."""
    out: dict = {}
    for s in split_names:
        y = arrays[f"{s}/latency_s"]
        for combo in BLENDS:
            if not all(f"{s}/{m}" in arrays for m in combo):
                continue
            L = np.concatenate([np.asarray(arrays[f"{s}/{m}"], np.float64) for m in combo], 0)
            mu, var = L.mean(0), L.var(0, ddof=1)
            out.setdefault(s, {})["+".join(combo)] = {
                "members": int(L.shape[0]),
                **{f"ensemble_shrink{k:g}": _score(np.exp(mu - k * var), y) for k in (0.0, 1.0)}}
            b = out[s]["+".join(combo)]
            print(f"{s:8s} blend {'+'.join(combo):28s} shrink0 {b['ensemble_shrink0']['mape_pct']:.1f}  "
                  f"shrink1 {b['ensemble_shrink1']['mape_pct']:.1f} (median APE "
                  f"{b['ensemble_shrink1']['median_ape_pct']:.1f})", flush=True)
    return out


def main(members: int = typer.Option(3, "--members"),
         seconds: float = typer.Option(150.0, "--seconds", help="Training budget per CDMPP member."),
         splits: str = typer.Option("network,sample", "--splits"),
         models: str = typer.Option("cdmpp,cdmpp-nocmd,xgboost", "--models",
                                    help=f"Of {', '.join([*MODELS, *XGB_MODELS])}."),
         holdout: str = typer.Option(HOLDOUT, "--holdout"),
         devices: str = typer.Option(DEVICES, "--devices", help="Device domains whose records are used."),
         add: bool = typer.Option(False, "--add", help="Train only --models and merge them into the saved "
                                  "run (same splits; the other models' members are kept)."),
         workers: int = typer.Option(2, "--workers", help="Members trained at once (processes)."),
         out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_ensemble.json"), "--out"),
         blends_only: bool = typer.Option(False, "--blends-only", help="Only recompute the mixed ensembles "
                                          "from the saved .npz (no training).")) -> None:
    from rich.progress import track

    if blends_only:
        arrays = dict(np.load(out.with_suffix(".npz")))
        res = json.loads(out.read_text())
        res["blends"] = _blends(arrays, [s for s in res["splits"]])
        out.write_text(json.dumps(res, indent=1))
        print(f"wrote {out} (blends)")
        return

    from tensorplan.cdmpp.evaluate import machine_info

    split_names, model_names = splits.split(","), models.split(",")
    unknown = [m for m in model_names if m not in MODELS and m not in XGB_MODELS]
    if unknown:
        raise typer.BadParameter(f"unknown model(s) {unknown}; known: {[*MODELS, *XGB_MODELS]}")
    jobs = [(s, m, k) for s in split_names for m in model_names for k in range(members)]
    t_all = time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futs = [pool.submit(_member, s, m, k, seconds, holdout, devices) for s, m, k in jobs]
        done = [f.result() for f in track(futs, description="training members")]
    tests = {s: v[2] for s, v in _splits(split_names, holdout, devices).items()}
    command = (f"python research/cdmpp/cdmpp_ensemble.py --members {members} --seconds {seconds:g} --splits {splits} "
               f"--models {models} --devices {devices}" + (" --add" if add else ""))
    res: dict = {"command": command, "holdout": holdout, "devices": devices, "members": members,
                 "seconds_per_cdmpp_member": seconds, "splits": {}}
    arrays: dict[str, np.ndarray] = {}
    if add:   # the saved run's members stay; the new ones must have been scored on the same records
        arrays = dict(np.load(out.with_suffix(".npz")))
        prev = json.loads(out.read_text())
        res = {**prev, "splits": prev["splits"], "added": prev.get("added", []) + [{"command": command}]}
    for s in split_names:
        y = tests[s].latency_s
        if add and not np.array_equal(arrays[f"{s}/latency_s"], y):
            raise SystemExit(f"--add: the {s} split's test records differ from the saved run's; rerun without --add")
        arrays[f"{s}/latency_s"] = y
        res["splits"].setdefault(s, {"n_test": int(len(y)), "models": {}})
        for m in model_names:
            rows = sorted((d for d in done if d["split"] == s and d["model"] == m), key=lambda d: d["seed"])
            L = np.log(np.maximum(np.array([d["pred"] for d in rows]), 1e-12))
            mu, var = L.mean(0), L.var(0, ddof=1)
            singles = [_score(np.exp(l), y) for l in L]
            entry = {"train_s": [d["train_s"] for d in rows], "single_seed0": singles[0],
                     "single_mean_over_seeds": {k: float(np.mean([x[k] for x in singles])) for k in singles[0]},
                     "single_per_seed_mape_pct": [x["mape_pct"] for x in singles],
                     "mean_log_var": float(var.mean())}
            for shrink in (0.0, 1.0, 2.0):
                entry[f"ensemble_shrink{shrink:g}"] = _score(np.exp(mu - shrink * var), y)
            entry["spread_vs_error"] = _spread_vs_error(np.sqrt(var), np.abs(mu - np.log(y)))
            arrays[f"{s}/{m}"] = L.astype(np.float32)
            res["splits"][s]["models"][m] = entry
            print(f"{s:8s} {m:12s} seeds {[round(x['mape_pct'], 1) for x in singles]}  "
                  f"ens {entry['ensemble_shrink0']['mape_pct']:.1f}  shrink1 {entry['ensemble_shrink1']['mape_pct']:.1f} "
                  f"(median APE {entry['ensemble_shrink1']['median_ape_pct']:.1f})", flush=True)
    res["blends"] = _blends(arrays, split_names)
    if add:
        res["added"][-1].update(wall_s=time.perf_counter() - t_all, loadavg=list(os.getloadavg()))
        out.write_text(json.dumps(res, indent=1))
        np.savez_compressed(out.with_suffix(".npz"), **arrays)
        print(f"wrote {out}, {out.with_suffix('.npz')} (added {models})")
        return
    res["wall_s"] = time.perf_counter() - t_all
    res["loadavg"] = list(os.getloadavg())
    res["machine"] = machine_info()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    np.savez_compressed(out.with_suffix(".npz"), **arrays)   # members' log predictions + measured, per split
    _plot(arrays, split_names, model_names, out.with_suffix(".png"))
    print(f"wrote {out}, {out.with_suffix('.npz')}, {out.with_suffix('.png')}")


if __name__ == "__main__":
    typer.run(main)
