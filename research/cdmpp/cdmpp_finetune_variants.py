"""Few-shot fine-tuning variants on the harness's device split, from one source model.

Why: to see whether the few-shot error is a fine-tuning problem (steps, learning rate, which layers)
or a source-model problem. Trains CDMPP once on `local-2t` (CMD towards the unlabelled `local-1t`
pool), then fine-tunes a copy per variant on the same KMeans / random samples the harness uses and
scores the same common test set. Appends one JSON line per (variant, method) to
research/cdmpp/results/cdmpp_finetune_variants.jsonl.

    .venv/bin/python research/cdmpp/cdmpp_finetune_variants.py --seconds 150
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import typer

VARIANTS = ({}, {"finetune_steps": 1000}, {"finetune_scope": "all"}, {"finetune_lr": 1e-3},
            {"finetune_steps": 1000, "finetune_lr": 1e-3, "finetune_scope": "all"})


def main(seconds: float = typer.Option(150.0, "--seconds", help="Source training budget."),
         cmd_alpha: float = typer.Option(1.0, "--cmd-alpha"), seed: int = typer.Option(0, "--seed"),
         out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_finetune_variants.jsonl"), "--out")) -> None:
    from tensorplan.cdmpp.metrics import regression_metrics
    from tensorplan.cdmpp.model import CDMPP
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import device_split

    ds = load_dataset(None).filter_stable(max_cov=0.01, metric="mad")
    dv = device_split(ds, "local-2t", "local-1t", per_task=8, seed=seed)  # as in the harness
    tr, va, te, pool, sel = dv["train"], dv["val"], dv["test"], dv["pool"], dv["selections"]
    unlabelled = pool.subset(np.arange(len(pool)))
    unlabelled.latency_s = None
    m = CDMPP(epochs=4000, max_time_s=seconds, seed=seed, cmd_alpha=cmd_alpha).fit(
        tr, va, unlabelled if cmd_alpha else None)
    zero = regression_metrics(m.predict(te), te.latency_s)
    print("zero-shot MAPE", round(zero["mape_pct"], 2), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    for var in VARIANTS:
        for method in ("kmeans", "random"):
            m2 = copy.deepcopy(m)
            for k, v in var.items():
                setattr(m2, k, v)
            m2.finetune(pool.subset(sel[method][0]), base=tr)
            r = regression_metrics(m2.predict(te), te.latency_s)
            row = {"variant": var, "method": method, "n_samples": int(len(sel[method][0])), "seconds": seconds,
                   "cmd_alpha": cmd_alpha, "seed": seed, "zero_shot_mape_pct": zero["mape_pct"], "test": r}
            print(json.dumps({"variant": var, "method": method, "mape": round(r["mape_pct"], 2),
                              "median": round(r["median_ape_pct"], 2)}), flush=True)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    typer.run(main)
