"""Leave-one-network-out: how well does each model predict the kernels of a network it never saw?

Why: the harness's held-out-network split is one draw of three networks, and its MAPE moves by
10-30 points with the seed and with which networks are held out. Holding out every network in
turn (the harness's strict split: test = the network's own kernels; kernels it shares with other
networks leave training too, so every test kernel is unseen) shows which kinds of network are
predictable when new and gives a pooled figure over all of them.

Each (network, model, seed) fold is one line of the JSONL, appended as soon as it is done, so a
killed run resumes where it stopped; `--shard I/N` runs every N-th network from the I-th, so two
processes (one torch thread each) share a 2-core machine. `--summary` reads the JSONL and writes
the per-network table (JSON + PNG).

    python research/cdmpp/cdmpp_by_network.py --models xgboost,cdmpp --time-scale 0.625 --shard 0/2 &
    python research/cdmpp/cdmpp_by_network.py --models xgboost,cdmpp --time-scale 0.625 --shard 1/2
    python research/cdmpp/cdmpp_by_network.py --summary
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import typer

OUT = Path("research/cdmpp/results/cdmpp_by_network.jsonl")


def _key(r: dict) -> tuple:
    return (r["network"], r["model"], r["seed"], r["time_scale"], tuple(r["devices"]))


def _done(path: Path) -> set:
    if not path.exists():
        return set()
    return {_key(json.loads(line)) for line in path.read_text().splitlines() if line.strip()}


def run(models: list[str], seed: int, time_scale: float, devices: list[str], shard: str,
        networks: list[str], out: Path, data=None, quick: bool = False) -> None:
    """Train and score every (network, model) fold of this shard that the JSONL does not hold yet.

    `data`: a dataset directory or a loaded Dataset (default: the committed data/cdmpp);
    `quick`: the harness's tiny budgets (tests)."""
    import torch

    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import EvalData, machine_info, network_error, network_split, score_on_network_split

    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.harness import VariantHarness

    torch.set_num_threads(1)
    raw = data if data is not None and not isinstance(data, (str, Path)) else load_dataset(data)
    ds = raw.only_devices(devices).filter_stable(max_cov=0.01, metric="mad")
    D = EvalData(ds)
    nets = sorted({k for v in ds.records["networks"] for k, _ in v})
    if networks:
        nets = [n for n in nets if n in networks]
    i, n = (int(x) for x in shard.split("/"))
    nets = nets[i::n]
    done = _done(out)
    cpu = machine_info().get("cpu", "")
    for net in nets:
        split = network_split(ds, [net], seed, D)
        if len(split[2]) == 0:
            print(f"{net:20s} skipped: every kernel it has also occurs in another network", flush=True)
            continue
        for name in models:
            rec = {"network": net, "model": name, "seed": seed, "time_scale": time_scale, "devices": devices}
            if _key(rec) in done:
                continue
            t0 = time.time()
            m = score_on_network_split(name, D, [net], split, quick=quick, time_scale=time_scale, seed=seed,
                                       harness=VariantHarness())
            rec.update(n_train=len(split[0]), n_test=len(split[2]),
                       n_test_tasks=int(len(np.unique(split[2].task_key))), metrics=m, cpu=cpu,
                       loadavg=list(os.getloadavg()), wall_s=time.time() - t0, created=time.time())
            with out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            nl = network_error(m)
            nl = "not measured" if nl is None else f"{nl:.1f}%"
            print(f"{net:20s} {name:16s} MAPE {m['mape_pct']:7.1f}%  median APE {m['median_ape_pct']:6.1f}%  "
                  f"network latency err {nl}  ({len(split[2])} test records)", flush=True)


def summary(out: Path, seed: int, time_scale: float, devices: list[str]) -> dict:
    """Per-network table and pooled figures of the JSONL's folds -> OUT.json, OUT.png (and printed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tensorplan.cdmpp.evaluate import network_error

    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["seed"] == seed and r["time_scale"] == time_scale and r["devices"] == devices]
    models = sorted({r["model"] for r in rows})
    nets = sorted({r["network"] for r in rows})
    by = {(r["network"], r["model"]): r for r in rows}
    table, pooled = {}, {}
    for net in nets:
        table[net] = {"n_test": next(by[(net, m)]["n_test"] for m in models if (net, m) in by),
                      "n_test_tasks": next(by[(net, m)]["n_test_tasks"] for m in models if (net, m) in by)}
        for m in models:
            if (net, m) in by:
                x = by[(net, m)]["metrics"]
                table[net][m] = {"mape_pct": x["mape_pct"], "median_ape_pct": x["median_ape_pct"],
                                 "acc20_pct": x["acc20_pct"],
                                 "network_latency_err_pct": network_error(x),
                                 "network_latency_first_err_pct": network_error(x, "first"),
                                 "picked_regret_pct": network_error(x, "picked", "_mean_regret_pct"),
                                 # after an oracle factor per task and domain (folds of a newer harness)
                                 "per_task_scale_floor_pct": x.get("scale_floors", {}).get("per_task_factor_mape_pct"),
                                 "one_scale_floor_pct": x.get("scale_floors", {}).get("one_factor_mape_pct")}
    for m in models:
        have = [n for n in nets if m in table[n]]
        w = np.array([table[n]["n_test"] for n in have], float)
        mape = np.array([table[n][m]["mape_pct"] for n in have])

        def med(col: str) -> float | None:
            v = [table[n][m][col] for n in have if table[n][m][col] is not None]
            return float(np.median(v)) if v else None

        pooled[m] = {"folds": len(have), "pooled_mape_pct": float((w * mape).sum() / w.sum()),
                     "median_network_mape_pct": float(np.median(mape)),
                     "networks_at_or_below_14pct": int((mape <= 14.03).sum()),
                     "median_network_latency_err_pct": med("network_latency_err_pct"),
                     "median_network_latency_first_err_pct": med("network_latency_first_err_pct"),
                     "median_picked_regret_pct": med("picked_regret_pct")}
        floors = [table[n][m]["per_task_scale_floor_pct"] for n in have]
        if have and all(f is not None for f in floors):
            pooled[m]["pooled_per_task_scale_floor_pct"] = float((w * np.array(floors)).sum() / w.sum())
            pooled[m]["pooled_one_scale_floor_pct"] = float(
                (w * np.array([table[n][m]["one_scale_floor_pct"] for n in have])).sum() / w.sum())
    doc = {"bench": "cdmpp_by_network", "seed": seed, "time_scale": time_scale, "devices": devices,
           "cpu": rows[0]["cpu"] if rows else "", "networks": table, "pooled": pooled}
    js = out.with_suffix(".json")
    js.write_text(json.dumps(doc, indent=1))

    # second panel only where the folds carry the label-free whole-network error (newer harness)
    first = any(table[n].get(m, {}).get("network_latency_first_err_pct") is not None for n in nets for m in models)
    fig, axes = plt.subplots(2 if first else 1, 1, figsize=(12, 8.5 if first else 4.5), squeeze=False)
    x = np.arange(len(nets))
    wbar = 0.8 / max(1, len(models))
    panels = [("mape_pct", "MAPE on the network's unseen kernels (%)", 14.03, "CDMPP paper 14.03 %")]
    if first:
        panels.append(("network_latency_first_err_pct", "whole-network error, each kernel's first sample (%)",
                       None, None))
    for ax, (col, ylabel, line, line_label) in zip(axes[:, 0], panels):
        for j, m in enumerate(models):
            v = [table[n].get(m, {}).get(col) for n in nets]
            ax.bar(x + j * wbar, [np.nan if e is None else e for e in v], wbar, label=m)
        if line is not None:
            ax.axhline(line, color="k", ls="--", lw=1, label=line_label)
        ax.set_yscale("log")
        ax.set_xticks(x + wbar * (len(models) - 1) / 2, nets, rotation=60, ha="right")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    axes[0, 0].set_title("Leave one network out (strict: every test kernel unseen)")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)

    print("| held-out network | test records (tasks) | " + " | ".join(
        f"{m} MAPE % | {m} median APE % | {m} net. lat. err % fastest / first" for m in models) + " |")
    print("|---|---:|" + "---:|" * (3 * len(models)))
    f = (lambda v: "–" if v is None else f"{v:.1f}")
    for n in nets:
        cells = []
        for m in models:
            e = table[n].get(m, {})
            cells += [f(e.get("mape_pct")), f(e.get("median_ape_pct")),
                      f"{f(e.get('network_latency_err_pct'))} / {f(e.get('network_latency_first_err_pct'))}"]
        print(f"| {n} | {table[n]['n_test']} ({table[n]['n_test_tasks']}) | " + " | ".join(cells) + " |")
    for m, p in pooled.items():
        print(f"{m}: pooled MAPE {p['pooled_mape_pct']:.1f}% over {p['folds']} folds, median per network "
              f"{p['median_network_mape_pct']:.1f}%, networks <= 14.03%: {p['networks_at_or_below_14pct']}, "
              f"median network latency error {f(p['median_network_latency_err_pct'])}% (fastest programs) / "
              f"{f(p['median_network_latency_first_err_pct'])}% (first samples), median regret of the model's "
              f"picks {f(p['median_picked_regret_pct'])}%")
    print(f"wrote {js} and {out.with_suffix('.png')}")
    return doc


def main(models: str = typer.Option("xgboost,cdmpp", "--models", help="Harness model names (make_model)."),
         seed: int = typer.Option(0, "--seed"),
         time_scale: float = typer.Option(0.625, "--time-scale", help="Harness budget scale (0.625: CDMPP 150 s)."),
         devices: str = typer.Option("local-1t,local-2t", "--devices", help="Device domains to use."),
         shard: str = typer.Option("0/1", "--shard", help="I/N: every N-th network starting at the I-th."),
         networks: str = typer.Option("", "--networks", help="Only these networks (comma-separated)."),
         show: bool = typer.Option(False, "--summary", help="Summarise the JSONL instead of running folds."),
         out: Path = typer.Option(OUT, "--out")) -> None:
    devs = [d for d in devices.split(",") if d]
    if show:
        summary(out, seed, time_scale, devs)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    run([m for m in models.split(",") if m], seed, time_scale, devs, shard,
        [n for n in networks.split(",") if n], out)


if __name__ == "__main__":
    typer.run(main)
