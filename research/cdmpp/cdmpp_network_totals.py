"""Whole-network totals: do they come out closer when each kernel's prediction is made a mean?

Why: a kernel's prediction is median-like (log-space fit, CDMPP's MAPE term, the ensemble's shrink),
and a network's latency is a sum, which wants each kernel's mean. `cdmpp/totals.py` measures the
factor between the two on a model's validation records (Duan's smearing: the mean of measured /
predicted) and `predict` multiplies the total by it. This bench checks that on data no model saw:

  lono     leave one network out on the collection CPU (`cdmpp_by_network.py --out
           research/cdmpp/results/cdmpp_by_network_totals.jsonl`; each fold's factor comes from the harness's
           validation tasks, which are not the held-out network's): each network's total of its
           kernels' first design-space samples (what `predict` sums), predicted vs measured, as the
           kernels' sum and times the factor
  check    a saved model (`--weights`, default: the shipped one) on the kernels that
           `cdmpp_predict_check.py` timed on this host, with this host's device vector

    python research/cdmpp/cdmpp_by_network.py --models xgboost-hier,cdmpp-nocmd-parts --shard 0/2 \\
        --out research/cdmpp/results/cdmpp_by_network_totals.jsonl &     # and --shard 1/2; ~30 min on 2 cores
    python research/cdmpp/cdmpp_network_totals.py          # -> research/cdmpp/results/cdmpp_network_totals.{json,png}
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer

from cdmpp_bigkernels import CHECK, _rows, checked_kernels, network_arrays, score

LONO = Path("research/cdmpp/results/cdmpp_by_network_totals.jsonl")
OUT = Path("research/cdmpp/results/cdmpp_network_totals.json")


def _stats(raw: np.ndarray, expected: np.ndarray) -> dict:
    """Predicted / measured totals of several networks, as summed and times the factor."""
    def one(r: np.ndarray) -> dict:
        return {"mean_ape_pct": float(100 * np.mean(np.abs(r - 1))), "median_ratio": float(np.median(r)),
                "mean_abs_log_ratio": float(np.mean(np.abs(np.log(r)))), "within_20pct": int((np.abs(r - 1) <= 0.2).sum()),
                "under": int((r < 1).sum())}
    return {"n": int(len(raw)), "sum": one(raw), "expected": one(expected),
            "closer": int((np.abs(np.log(expected)) < np.abs(np.log(raw))).sum())}


def lono(path: Path, min_ms: float) -> dict:
    """Per model: every (network, domain) total of the first samples, and the pooled figures."""
    out = {}
    for r in _rows(path):
        m = r["metrics"]
        f = m.get("total_factor")
        if f is None:
            continue
        e = out.setdefault(r["model"], {"folds": [], "factors": []})
        e["factors"].append(f)
        for k, v in m["network_latency"]["first"].items():
            if not k.startswith("_"):
                e["folds"].append({"network": k, "factor": f, "measured_ms": v["measured_ms"],
                                   "ratio": v["predicted_ms"] / v["measured_ms"],
                                   "expected_ratio": v["expected_ms"] / v["measured_ms"]})
    for model, e in out.items():
        big = [x for x in e["folds"] if x["measured_ms"] >= min_ms]
        e["all"] = _stats(np.array([x["ratio"] for x in e["folds"]]), np.array([x["expected_ratio"] for x in e["folds"]]))
        e[f"over_{min_ms:g}ms"] = _stats(np.array([x["ratio"] for x in big]), np.array([x["expected_ratio"] for x in big]))
        e["factor_median"] = float(np.median(e["factors"]))
        e["factor_range"] = [float(min(e["factors"])), float(max(e["factors"]))]
    return out


def shipped_factor(weights: Path | None, data: str) -> tuple[object, dict]:
    """(model, {factor, median and mean of measured / predicted, records}): the saved model's `totals.mean_factor` on the validation
    records `tensorplan predictor train` held out when it trained it (seed 0: 5 % of the stable records of its
    domains in `data`; the shipped model's were its training command's --data)."""
    from tensorplan.cdmpp.arrays import as_arrays
    from tensorplan.cdmpp.base import load_estimator
    from tensorplan.cdmpp.model import SHIPPED_MODEL
    from tensorplan.cdmpp.dataset import load_dataset
    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.totals import mean_factor

    est = load_estimator(weights or SHIPPED_MODEL)
    arr = as_arrays(load_dataset(data).only_devices(est.domains_).filter_stable(max_cov=0.01, metric="mad"))
    val = arr.subset(np.flatnonzero(np.random.default_rng(0).random(len(arr)) < 0.05))   # as cdmpp.train
    r = val.latency_s / est.predict(val)
    return est, {"factor": mean_factor(est.predict(val), val.latency_s), "val_records": len(val), "train_records": len(arr),
                 "val_median_ratio": float(np.median(r)), "val_mean_ratio": float(np.mean(r))}


def check(weights: Path | None, data: str, host: str) -> dict:
    """The saved model on the check's kernels: each network's total as summed and times its factor."""
    est, fit = shipped_factor(weights, data)
    f = fit["factor"]
    measured = checked_kernels(CHECK, host)
    nets = {}
    for net, (keys, calls, arr) in network_arrays(list(measured), "local-2t", None).items():
        s = score(np.asarray(est.predict(arr)), keys, calls, measured[net])
        nets[net] = {"measured_ms": s["measured_ms"], "ratio": s["total_ratio"], "expected_ratio": s["total_ratio"] * f}
    return {"weights": str(weights or "shipped"), "data": data, "host": host, **fit,
            "networks": nets,
            "pooled": _stats(np.array([v["ratio"] for v in nets.values()]), np.array([v["expected_ratio"] for v in nets.values()]))}


def plot(doc: dict, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(m, e["folds"]) for m, e in doc["lono"].items()]
    if doc.get("check"):
        panels.append((f"shipped model, Zen 4 check (factor {doc['check']['factor']:.2f})",
                       [{"network": n, **v} for n, v in doc["check"]["networks"].items()]))
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 3.6 * len(panels)), squeeze=False)
    for ax, (title, folds) in zip(axes[:, 0], panels):
        folds = sorted(folds, key=lambda x: x["network"])
        x = np.arange(len(folds))
        ax.bar(x - 0.2, [f["ratio"] for f in folds], 0.4, label="kernels' sum")
        ax.bar(x + 0.2, [f["expected_ratio"] for f in folds], 0.4, label="× factor (expected sum)")
        ax.axhline(1, color="k", lw=1)
        ax.set_yscale("log")
        ax.set_xticks(x, [f["network"] for f in folds], rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("predicted / measured total")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(lono_path: Path = typer.Option(LONO, "--lono", help="JSONL of cdmpp_by_network.py folds run with totals."),
         weights: Path = typer.Option(None, "--weights", help="Saved model for the check (default: shipped)."),
         data: str = typer.Option("data/cdmpp,data/cdmpp-big-zen4,data/cdmpp-datamove-zen4", "--data",
                                  help="The datasets that model trained on (its validation records give the factor)."),
         host: str = typer.Option("", "--host", help="Host whose check kernels to use (default: this CPU; "
                                  "the check is skipped when this CPU has none)."),
         min_ms: float = typer.Option(1.0, "--min-ms", help="Also pool the networks whose total is at least this."),
         out: Path = typer.Option(OUT, "--out")) -> None:
    from tensorplan.devices.detect import cpu_info

    here = host or cpu_info()["model"]
    doc = {"lono": lono(lono_path, min_ms), "check": None}
    if any(r["host"] == here for r in _rows(CHECK)):
        doc["check"] = check(weights, data, here)
    out.write_text(json.dumps(doc, indent=1))
    plot(doc, out.with_suffix(".png"))
    for m, e in doc["lono"].items():
        for sub in ("all", f"over_{min_ms:g}ms"):
            s = e[sub]
            print(f"{m:18s} {sub:9s} n={s['n']:2d}  sum: MAPE {s['sum']['mean_ape_pct']:5.1f}% median {s['sum']['median_ratio']:.2f}x "
                  f"|log| {s['sum']['mean_abs_log_ratio']:.3f} ±20% {s['sum']['within_20pct']:2d}  -> expected: MAPE "
                  f"{s['expected']['mean_ape_pct']:5.1f}% median {s['expected']['median_ratio']:.2f}x |log| "
                  f"{s['expected']['mean_abs_log_ratio']:.3f} ±20% {s['expected']['within_20pct']:2d}; closer {s['closer']}")
        print(f"{'':18s} factor median {e['factor_median']:.3f}, range {e['factor_range'][0]:.3f}-{e['factor_range'][1]:.3f}")
    if doc["check"]:
        c = doc["check"]
        print(f"check on {c['host']} (factor {c['factor']:.3f}; {c['val_records']} validation records: measured / predicted "
              f"median {c['val_median_ratio']:.3f}, mean {c['val_mean_ratio']:.3f}): " + ", ".join(
            f"{n} {v['ratio']:.2f}->{v['expected_ratio']:.2f}x" for n, v in c["networks"].items()))
        s = c["pooled"]
        print(f"  sum: MAPE {s['sum']['mean_ape_pct']:.1f}% median {s['sum']['median_ratio']:.2f}x; expected: MAPE "
              f"{s['expected']['mean_ape_pct']:.1f}% median {s['expected']['median_ratio']:.2f}x; closer {s['closer']}/{s['n']}")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    typer.run(main)
