"""`tensorplan predict --measure` over several networks: the shipped predictor against this CPU.

Why: the harness scores models on the dataset's labels, all timed on the collection CPU. A user
runs `tensorplan predict MODEL --device local` on *their* machine. This script does exactly that
for each network (the shipped model, every kernel's default schedule), then compiles and times
those same programs here, so the whole-network and per-kernel errors are the ones a user gets.

Each kernel's default schedule is the dataset's program `index` 0 of its task (same sampler, same
seed), so where the collection CPU timed it, its label there is looked up too (`dataset_us`). That
splits the error in two: the model against the CPU it learnt from (its fit), and that CPU
against this one (the device shift a zero-shot prediction has to bridge). Networks absent from the
dataset (yolov4, tiny-style, tiny-linear-attention) are the unseen ones.

`--calibrate` first runs `tensorplan calibrate` here (`local_calibration.calibrate_here`) with the
checked networks' tasks excluded, so the calibration never timed a checked kernel's task, and
predicts every kernel with both models against the same measurement.

One JSON line per (network, host CPU) in the JSONL, appended when done, so a killed run resumes
and a second CPU adds its own lines; `--summary` writes the table (JSON, pooled per host) and a
scatter (PNG, one row of panels per host).

    python research/cdmpp/cdmpp_predict_check.py --calibrate     # about 15 min on a 2-core VM
    python research/cdmpp/cdmpp_predict_check.py --summary
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer

OUT = Path("research/cdmpp/results/cdmpp_predict_check.jsonl")
NETWORKS = ["tiny-cnn", "resnet-50", "mobilenet-v2", "bert-base", "efficientvit-b1", "segformer-b0",
            "tiny-style", "tiny-linear-attention", "yolov4"]


def _rows(path: Path) -> list[dict]:
    """The JSONL's lines (none if it does not exist yet)."""
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _done(path: Path) -> set:
    return {(r["model"], r["host"]) for r in _rows(path)}


def _collection_labels(data, threads: int) -> tuple[dict, set]:
    """{(task_key, index): median latency s} on the collection CPU at `threads`, and its networks."""
    import pandas as pd

    from tensorplan.cdmpp.dataset import load_dataset

    ds = load_dataset(data)
    index = pd.read_parquet(Path(ds.path) / "programs.parquet", columns=["prog_idx", "index"])
    r = ds.records[ds.records["device"] == f"local-{threads}t"].merge(index, on="prog_idx")
    lab = {(t, int(i)): float(v) for t, i, v in zip(r["task_key"], r["index"], r["latency_s"])}
    return lab, {k for v in ds.tasks["networks"] for k, _ in v}


def run(networks: list[str], out: Path, calibrated: Path | None, data=None, device: str = "local") -> None:
    """Per network not yet in the JSONL for this host: measure every kernel once, predict it with the
    shipped model and (if given) the model calibrated here, so both face the same measurements."""
    from tensorplan.devices.detect import cpu_info, machine_info
    from tensorplan.cdmpp.predict import predict

    host = cpu_info()["model"]
    done = _done(out)
    labels = None
    for net in networks:
        if (net, host) in done:
            print(f"{net}: done on {host}")
            continue
        p = predict(net, device=device, tuned=0, measure=True, progress=True, calibrated=False)
        r = p.to_dict()
        if calibrated is not None:
            pc = predict(net, device=device, tuned=0, weights=calibrated, calibrated=False)
            for k, kc in zip(r["kernels"], pc.kernels):
                assert k["key"] == kc.key
                k["calibrated_us"] = 1e6 * kc.predicted_s
        if labels is None:
            labels, seen = _collection_labels(data, p.measured.threads)
        for k in r["kernels"]:
            lab = labels.get((k["key"], k["sample"])) if k["sample"] is not None else None
            k["dataset_us"] = 1e6 * lab if lab else None
        r.update(host=host, seen_in_dataset=net in seen, machine=machine_info(),
                 calibrated_weights=str(calibrated) if calibrated else None)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write(json.dumps(r) + "\n")
        print(f"{net}: measured {p.measured.measured_s * 1e3:.2f} ms, shipped predicts "
              f"{p.measured.predicted_s * 1e3:.2f} ms", flush=True)


def _errors(pred: np.ndarray, meas: np.ndarray, calls: np.ndarray) -> dict:
    """Per-kernel metrics and the call-weighted whole-network ratio (seconds in)."""
    from scipy.stats import spearmanr

    from tensorplan.cdmpp.metrics import regression_metrics

    m = regression_metrics(pred, meas)
    return {"mape_pct": m["mape_pct"], "median_ape_pct": m["median_ape_pct"], "acc20_pct": m["acc20_pct"],
            "spearman": float(spearmanr(pred, meas).statistic) if len(pred) > 2 else float("nan"),
            "predicted_ms": float(calls @ pred * 1e3), "total_ratio": float((calls @ pred) / (calls @ meas))}


def _ratio(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.median(a / b)) if len(a) else float("nan")


def summarize(path: Path) -> dict:
    """Per (network, host): the measured total, and for each predictor its per-kernel errors and
    whole-network ratio, pooled over each host's kernels; the split of the shipped model's error
    into its fit on the collection CPU (prediction / that CPU's label) and the device shift (this
    CPU / the collection CPU)."""
    rows, pooled = [], {}
    for r in _rows(path):
        ks = [k for k in r["kernels"] if k.get("measured_us")]
        meas = np.array([k["measured_us"] for k in ks]) * 1e-6
        calls = np.array([k["calls"] for k in ks], np.float64)
        preds = {"shipped": np.array([k["predicted_us"] for k in ks]) * 1e-6}
        if all("calibrated_us" in k for k in ks):
            preds["calibrated-here"] = np.array([k["calibrated_us"] for k in ks]) * 1e-6
        lab_m = np.array([bool(k.get("dataset_us")) for k in ks], bool)
        lab = np.array([k["dataset_us"] or np.nan for k in ks]) * 1e-6
        row = {"network": r["model"], "host": r["host"], "seen_in_dataset": r["seen_in_dataset"],
               "kernels": r["n_kernels"], "kernels_measured": len(ks), "measured_ms": float(calls @ meas * 1e3),
               "kernels_cov_over_5pct": int(sum(k["measured_cov"] > 0.05 for k in ks)),
               "shipped_over_collection_cpu_label": _ratio(preds["shipped"][lab_m], lab[lab_m]),
               "here_over_collection_cpu": _ratio(meas[lab_m], lab[lab_m]), "kernels_with_label": int(lab_m.sum())}
        for name, p in preds.items():
            row[name] = _errors(p, meas, calls)
            q = pooled.setdefault(r["host"], {}).setdefault(name, {"pred": [], "meas": []})
            q["pred"] += list(p)
            q["meas"] += list(meas)
        rows.append(row)
    from tensorplan.cdmpp.metrics import regression_metrics
    pool = {h: {n: {**regression_metrics(np.array(v["pred"]), np.array(v["meas"])),
                    "median_ratio": _ratio(np.array(v["pred"]), np.array(v["meas"])),
                    "median_network_ratio": float(np.median([x[n]["total_ratio"] for x in rows
                                                             if n in x and x["host"] == h]))}
                for n, v in by_name.items()}
            for h, by_name in pooled.items()}
    return {"rows": rows, "pooled_kernels": pool}


def plot(path: Path, png: Path) -> None:
    """One row per host. Left: every kernel's prediction (shipped, calibrated here) vs its time
    there. Right: the same programs there vs on the collection CPU (the device shift)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = _rows(path)
    hosts = list(dict.fromkeys(r["host"] for r in lines))
    fig, axes = plt.subplots(len(hosts), 2, figsize=(11, 5 * len(hosts)), squeeze=False)
    for ax, host in zip(axes, hosts):
        pts: dict[str, tuple[list, list]] = {}
        for r in (r for r in lines if r["host"] == host):
            ks = [k for k in r["kernels"] if k.get("measured_us")]
            for name, key in (("shipped", "predicted_us"), ("calibrated here", "calibrated_us")):
                if all(key in k for k in ks):
                    xs, ys = pts.setdefault(name, ([], []))
                    xs += [k["measured_us"] for k in ks]
                    ys += [k[key] for k in ks]
            kl = [k for k in ks if k.get("dataset_us")]
            ax[1].scatter([k["dataset_us"] for k in kl], [k["measured_us"] for k in kl], s=14, alpha=0.7,
                          label=r["model"])
        for name, (xs, ys) in pts.items():
            ax[0].scatter(xs, ys, s=12, alpha=0.6, label=name)
        for a, (x, y) in zip(ax, [("measured on this host, µs", "predicted, µs"),
                                  ("collection CPU (dataset label), µs", "measured on this host, µs")]):
            a.set_xscale("log")
            a.set_yscale("log")
            lo, hi = a.get_xlim()
            a.plot([lo, hi], [lo, hi], "k--", lw=0.8)
            a.set_xlabel(x)
            a.set_ylabel(y)
        ax[0].set_title(f"{host}: prediction vs measured", fontsize=10)
        ax[1].set_title(f"{host}: vs the collection CPU", fontsize=10)
        ax[0].legend(fontsize=8, loc="upper left")
        ax[1].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(png, dpi=100)


def main(models: str = typer.Option(",".join(NETWORKS), help="Comma-separated zoo names or ONNX paths."),
         out: Path = typer.Option(OUT, help="JSONL, one line per (network, host, predictor); resumable."),
         device: str = typer.Option("local", help="'local' or 'local-<N>t'."),
         calibrate: bool = typer.Option(False, "--calibrate", help="First run `tensorplan calibrate` here "
                                        "without the checked networks' tasks, then check the calibrated model."),
         summary: bool = typer.Option(False, "--summary", help="Write the summary JSON + PNG from the JSONL.")) -> None:
    """CDMPP's whole-network predictions (shipped, or calibrated here) checked against kernels timed on this CPU."""
    if summary:
        s = summarize(out)
        out.with_suffix(".json").write_text(json.dumps(s, indent=1))
        plot(out, out.with_suffix(".png"))
        print(json.dumps(s["pooled_kernels"], indent=1))
        for x in s["rows"]:
            line = (f"{x['host'][:32]:>32} {x['network']:>22} seen={x['seen_in_dataset']!s:5} "
                    f"measured {x['measured_ms']:9.2f} ms")
            for n in ("shipped", "calibrated-here"):
                if n in x:
                    e = x[n]
                    line += (f" | {n}: {e['total_ratio']:.2f}x, kernel MAPE {e['mape_pct']:5.1f}% "
                             f"(median {e['median_ape_pct']:5.1f}%)")
            print(line + f" | here/collection {x['here_over_collection_cpu']:.2f}x")
        return
    nets = [m for m in models.split(",") if m]
    weights = None
    if calibrate:
        from tensorplan.paths import cache_dir
        from tensorplan.cdmpp.local_calibration import calibrate_here, host_id
        from tensorplan.cdmpp.predict import local_threads

        weights = cache_dir() / "bench" / f"cdmpp-calibrated-heldout-{host_id()}.pt"
        if not weights.exists():
            # MAD <= 1 %: the dataset's own filter (the published run kept 42 of 160 programs with it)
            info = calibrate_here(local_threads(device), exclude_networks=nets, out=weights,
                                  max_mad=0.01, force=True, log=print)   # checked either way; the JSON says
                                                                         # whether `calibrate` would install it
            out.with_name(f"{out.stem}_calibration_{host_id()}.json").write_text(json.dumps(info.to_dict(), indent=1))
    run(nets, out, weights, device=device)


if __name__ == "__main__":
    typer.run(main)
