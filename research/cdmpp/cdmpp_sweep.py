"""Train CDMPP once with the given hyper-parameters; print train and test error (one JSON line).

Why: to tell under-fitting (train error ≈ test error) from over-fitting, one setting at a time, at a
fixed time budget. Each run trains on one thread, so two settings can run side by side on 2 cores.
`--split network` trains on the harness's held-out-network split instead of the sample split and
adds what a tuner needs from the model: the within-task rank correlation and the whole-network
errors and picks' regret (`evaluate.NETWORK_PICKS`) of the held-out networks.

    .venv/bin/python research/cdmpp/cdmpp_sweep.py '{"w_mape": 0.0}' --seconds 150
    .venv/bin/python research/cdmpp/cdmpp_sweep.py '{"batch_size": 200}' --n-train 2000 --seconds 90   # can it overfit?
    .venv/bin/python research/cdmpp/cdmpp_sweep.py '{"cmd_alpha": 0, "parts_input": true, "w_rank": 1}' --split network \\
        --devices local-1t,local-2t --seconds 150 --out research/cdmpp/results/cdmpp_rank.jsonl
    .venv/bin/python research/cdmpp/cdmpp_sweep.py --summary research/cdmpp/results/cdmpp_rank.jsonl   # medians over seeds
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer

HOLDOUT = "efficientvit-b1,tiny-mlp,mobilenet-v2"   # the published evaluation's held-out networks


def summarize(path: Path) -> list[dict]:
    """One row per (params, split) of a sweep JSONL: the median over its seeds of each test figure."""
    groups: dict[tuple, list[dict]] = {}
    for r in map(json.loads, filter(str.strip, path.read_text().splitlines())):
        groups.setdefault((json.dumps(r["params"], sort_keys=True), r.get("split", "sample")), []).append(r)
    rows = []
    for (params, split), rs in groups.items():
        def med(get):
            vals = [v for v in (get(r) for r in rs) if v is not None]
            return float(np.median(vals)) if vals else None
        net = (lambda pick, key: lambda r: r.get("network", {}).get(pick, {}).get(key))
        rows.append({"params": json.loads(params), "split": split, "seeds": sorted(r["seed"] for r in rs),
                     "mape_pct": med(lambda r: r["test"]["mape_pct"]),
                     "median_ape_pct": med(lambda r: r["test"]["median_ape_pct"]),
                     "spearman_within_task": med(lambda r: r["test"].get("spearman_within_task")),
                     "network_first_err_pct": med(net("first", "_mean_ape_pct")),
                     "network_picked_err_pct": med(net("picked", "_mean_ape_pct")),
                     "picks_regret_pct": med(net("picked", "_mean_regret_pct"))})
    return rows


def _print_table(rows: list[dict]) -> None:
    print("| params | split | seeds | MAPE % | median APE % | ρ in task | network err, first % | "
          "network err, picked % | picks' regret % |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    f = (lambda x, fmt="{:.1f}": "—" if x is None else fmt.format(x))
    for r in rows:
        print(f"| `{json.dumps(r['params'])}` | {r['split']} | {len(r['seeds'])} | {f(r['mape_pct'])} | "
              f"{f(r['median_ape_pct'])} | {f(r['spearman_within_task'], '{:.3f}')} | "
              f"{f(r['network_first_err_pct'])} | {f(r['network_picked_err_pct'])} | {f(r['picks_regret_pct'])} |")


def main(params: str = typer.Argument("{}", help="JSON dict of CDMPP(...) keyword arguments."),
         seconds: float = typer.Option(150.0, "--seconds", help="Training time budget."),
         n_train: int = typer.Option(0, "--n-train", help="Use only the first N training records (0 = all)."),
         split: str = typer.Option("sample", "--split", help="sample, or network (held-out networks)."),
         holdout: str = typer.Option(HOLDOUT, "--holdout", help="Held-out networks of --split network."),
         devices: str = typer.Option("", "--devices", help="Device domains to use, comma-separated (default: all)."),
         out: Path = typer.Option(None, "--out", help="Also append the JSON line to this file."),
         seed: int = typer.Option(0, "--seed"),
         summary: Path = typer.Option(None, "--summary", help="Summarise this sweep JSONL (medians over seeds) "
                                      "into a markdown table and <file>.json; trains nothing.")) -> None:
    if summary:
        rows = summarize(summary)
        summary.with_suffix(".json").write_text(json.dumps(rows, indent=1))
        _print_table(rows)
        return
    import torch

    from tensorplan.cdmpp.metrics import regression_metrics
    from tensorplan.cdmpp.model import CDMPP
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import EvalData, _network_errors, network_split, sample_split

    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.harness import VariantHarness

    torch.set_num_threads(1)
    kw = json.loads(params)
    ds = load_dataset(None)
    ds = (ds.only_devices(devices.split(",")) if devices else ds).filter_stable(max_cov=0.01, metric="mad")
    data = EvalData(ds)
    if split == "network":
        tr, va, te = network_split(ds, holdout.split(","), seed, data)
    elif split == "sample":
        tr, va, te = sample_split(ds, seed, data)
    else:
        raise typer.BadParameter(f"--split: sample or network, not {split!r}")
    if n_train:
        tr = tr.subset(np.arange(min(n_train, len(tr))))
    m = CDMPP(**{"epochs": 4000, "max_time_s": seconds, "seed": seed, **kw}).fit(tr, va)
    sub = np.random.default_rng(seed).choice(len(tr), min(4000, len(tr)), replace=False)
    test = VariantHarness().score(m, te)
    test.pop("by_leaves")
    res = {"params": kw, "seconds": seconds, "split": split, "seed": seed, "n_train": len(tr),
           "train_time_s": m.train_time_s, "steps": m.history[-1]["step"] if m.history else 0,
           "train": regression_metrics(m.predict(tr.subset(sub)), tr.latency_s[sub]), "test": test}
    if split == "network":
        nl = _network_errors(m, data, holdout.split(","), None)
        res["network"] = {pick: {k: v for k, v in e.items() if k.startswith("_")} for pick, e in nl.items()}
    line = json.dumps(res)
    print(line)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    typer.run(main)
