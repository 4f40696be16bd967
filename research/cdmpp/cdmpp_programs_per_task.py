"""Would more programs per task help on unseen networks? Held-out-network MAPE against the number
of training programs per task, on the same test records.

Why: the GPU domains hold ~4.6 programs per task and score ~45 % on held-out networks
(research/notes/cdmpp.md), and "more GPU programs per task" was named as the lever; the CPU domain local-1t
holds ~45 per task. The held-out-network split is built once; each arm trains on at most K programs
per (task, domain) -- the first K design-space draws, as if only K had been measured -- with the
validation tasks capped alike, and is scored on the same test records. Given several exports
(`--data A,B`), an arm "first export" trains on A's programs only (a second batch of programs of
the same tasks in B, e.g. timed on a later GPU session). Resumable: the JSON is rewritten after
every fit and a rerun skips the (model, arm, seed) entries it holds. Writes OUT.json and OUT.png.

    .venv/bin/python research/cdmpp/cdmpp_programs_per_task.py --data data/cdmpp-h100 --devices h100 \
        --holdout tiny-mlp,efficientvit-b1,vit-b16,resnet-50,retinaface --caps 1,2,3 \
        --models xgboost,xgboost-deep-mape,mlp,cdmpp --seeds 0,1,2 --out research/cdmpp/results/cdmpp_programs_per_task_h100.json
    .venv/bin/python research/cdmpp/cdmpp_programs_per_task.py --devices local-1t,local-2t --caps 2,4,8,16 \
        --models xgboost,xgboost-deep-mape,xgboost-deep-rel-mape --time-scale 0.625 \
        --out research/cdmpp/results/cdmpp_programs_per_task_cpu.json

CDMPP and the MLP train under a time budget, so run nothing beside it.
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import typer


def capped(records, idx: np.ndarray, k: int) -> np.ndarray:
    """The rows of `idx` that are among the first `k` draws (by design-space sample index) of
    their (task, domain)."""
    df = records.iloc[idx][["task_key", "device", "sample_index"]]
    rank = df.groupby(["task_key", "device"])["sample_index"].rank(method="first").to_numpy()
    return idx[rank <= k]


def plot(doc: dict, png: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    arms = [a for a in doc["arms"] if a.startswith("first ") and a[6:].isdigit()] + ["all"]
    x = [doc["arms"][a]["train_programs_per_task"] for a in arms]
    for name, by_arm in doc["results"].items():
        y = [np.median([e["mape_pct"] for e in by_arm[a]]) if a in by_arm else np.nan for a in arms]
        ax.plot(x, y, marker="o", label=name)
        if "first export" in by_arm:
            ax.scatter([doc["arms"]["first export"]["train_programs_per_task"]],
                       [np.median([e["mape_pct"] for e in by_arm["first export"]])], marker="x", color="k")
    ax.set_xscale("log")
    ax.set_xticks(x, [f"{v:.1f}" for v in x])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("training programs per (task, domain), mean")
    ax.set_ylabel("held-out-network MAPE %")
    ax.set_title(f"{','.join(doc['devices'])}: held out {', '.join(doc['holdout'])}", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(data: str = typer.Option("", "--data", help="Export(s), comma-separated (default: data/cdmpp/)."),
         devices: str = typer.Option("local-1t,local-2t", "--devices", help="Domains to train and test on."),
         holdout: str = typer.Option("", "--holdout", help="Held-out networks (default: the evaluation table's)."),
         caps: str = typer.Option("1,2,4,8,16", "--caps", help="Programs per (task, domain) of the capped arms."),
         models: str = typer.Option("xgboost,xgboost-deep-rel-mape", "--models"),
         seeds: str = typer.Option("0", "--seeds", help="Model seeds (comma-separated); the split uses seed 0."),
         time_scale: float = typer.Option(1.0, "--time-scale", help="The harness's budget scale."),
         out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_programs_per_task.json"), "--out")) -> None:
    import pyarrow.parquet as pq

    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import EvalData, machine_info, score_on_network_split, _val_split
    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.harness import PUBLISHED_HOLDOUT, VariantHarness

    parts = [p.strip() for p in data.split(",") if p.strip()]
    held = [h for h in holdout.split(",") if h] or list(PUBLISHED_HOLDOUT)
    devs = [d for d in devices.split(",") if d]
    ds = load_dataset(parts or None).only_devices(devs).filter_stable(max_cov=0.01, metric="mad")
    D = EvalData(ds)
    tr_ds, te_ds = ds.split(kind="network", holdout=held)
    tr_i, va_i = _val_split(D, D.idx(tr_ds), by_task=True, frac=0.1, seed=0)
    te_i = D.idx(te_ds)
    arms = {f"first {k}": (capped(ds.records, tr_i, k), capped(ds.records, va_i, k))
            for k in sorted(int(c) for c in caps.split(",") if c)}
    if len(parts) > 1:     # concat keeps the first export's prog_idx, offsets the others'
        first = ds.records["prog_idx"].to_numpy() < pq.read_metadata(Path(parts[0]) / "programs.parquet").num_rows
        arms["first export"] = (tr_i[first[tr_i]], va_i[first[va_i]])
    arms["all"] = (tr_i, va_i)

    def per_task(idx: np.ndarray) -> float:
        r = ds.records.iloc[idx]
        return float(len(idx) / max(1, r.groupby(["task_key", "device"]).ngroups))

    settings = {"data": parts or ["data/cdmpp"], "devices": devs, "holdout": held, "time_scale": time_scale}
    doc = json.loads(out.read_text()) if out.exists() else {}
    if any(doc.get(k) != v for k, v in settings.items()):
        doc = {}                                              # other settings: start afresh
    doc.update({"bench": "cdmpp_programs_per_task", **settings,
                "arms": {a: {"n_train": int(len(t)), "n_val": int(len(v)), "train_programs_per_task": per_task(t)}
                         for a, (t, v) in arms.items()},
                "n_test": int(len(te_i)), "test_programs_per_task": per_task(te_i),
                "n_test_tasks": int(ds.records.iloc[te_i]["task_key"].nunique())})
    res = doc.setdefault("results", {})
    test = D.arrays(te_i)
    for name in [m for m in models.split(",") if m]:
        for seed in [int(s) for s in seeds.split(",") if s]:
            for arm, (t, v) in arms.items():                  # arms back to back: same machine state
                if any(e["seed"] == seed for e in res.get(name, {}).get(arm, [])):
                    continue
                m = score_on_network_split(name, D, held, (D.arrays(t), D.arrays(v), test),
                                           time_scale=time_scale, seed=seed, harness=VariantHarness())
                keep = {k: m[k] for k in ("mape_pct", "median_ape_pct", "acc10_pct", "acc20_pct",
                                          "spearman_within_task", "train_time_s")}
                keep["per_task_floor_mape_pct"] = (m.get("scale_floors") or {}).get("per_task_factor_mape_pct")
                res.setdefault(name, {}).setdefault(arm, []).append({"seed": seed, **keep})
                doc.update(machine=machine_info(), host=platform.node(), created=time.time())
                out.write_text(json.dumps(doc, indent=1))
                print(f"{name:22s} seed {seed} {arm:12s} ({doc['arms'][arm]['train_programs_per_task']:5.1f}/task) "
                      f"MAPE {m['mape_pct']:6.2f}  median APE {m['median_ape_pct']:6.2f}  "
                      f"rank {m['spearman_within_task']:.3f}  ({m['train_time_s']:.0f} s)", flush=True)
    plot(doc, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    typer.run(main)
