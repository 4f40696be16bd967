"""Train CDMPP once on the sample split with the given hyper-parameters; print train and test error.

Why: to tell under-fitting (train error ≈ test error) from over-fitting, one setting at a time, at a
fixed time budget. Each run trains on one thread, so two settings can run side by side on 2 cores.

    .venv/bin/python bench/cdmpp_sweep.py '{"w_mape": 0.0}' --seconds 150
    .venv/bin/python bench/cdmpp_sweep.py '{"batch_size": 200}' --n-train 2000 --seconds 90   # can it overfit?
"""
from __future__ import annotations

import json

import numpy as np
import typer


def main(params: str = typer.Argument("{}", help="JSON dict of CDMPP(...) keyword arguments."),
         seconds: float = typer.Option(150.0, "--seconds", help="Training time budget."),
         n_train: int = typer.Option(0, "--n-train", help="Use only the first N training records (0 = all)."),
         seed: int = typer.Option(0, "--seed")) -> None:
    from tensorplan.predict.cdmpp import CDMPP, regression_metrics
    from tensorplan.predict.dataset import load_dataset
    from tensorplan.predict.evaluate import sample_split

    kw = json.loads(params)
    tr, va, te = sample_split(load_dataset(None).filter_stable(max_cov=0.01, metric="mad"), seed)
    if n_train:
        tr = tr.subset(np.arange(min(n_train, len(tr))))
    m = CDMPP(**{"epochs": 4000, "max_time_s": seconds, "seed": seed, **kw}).fit(tr, va)
    sub = np.random.default_rng(seed).choice(len(tr), min(4000, len(tr)), replace=False)
    res = {"params": kw, "seconds": seconds, "n_train": len(tr), "train_time_s": m.train_time_s,
           "steps": m.history[-1]["step"] if m.history else 0,
           "train": regression_metrics(m.predict(tr.subset(sub)), tr.latency_s[sub]),
           "test": regression_metrics(m.predict(te), te.latency_s)}
    print(json.dumps(res))


if __name__ == "__main__":
    typer.run(main)
