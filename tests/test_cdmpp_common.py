"""Shared fixture for the CDMPP tests: a small, deterministic slice of the committed real dataset.

Import the fixture into a test module with `from test_cdmpp_common import cdmpp_small  # noqa: F401`.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest


@functools.lru_cache(maxsize=1)
def _load_small(n_tasks: int = 12, per_task: int = 16):
    from tensorplan.cdmpp.dataset import default_data_dir, load_dataset

    d = Path(os.environ.get("TENSORPLAN_CDMPP_DATA") or default_data_dir())
    if not (d / "records.parquet").exists():
        pytest.skip(f"{d} has not been exported yet (tensorplan predictor dataset export)")
    ds = load_dataset(d).filter_stable(max_cov=0.25)
    ds = ds.subset(ds.records["device"].isin(["local-1t", "local-2t"]).to_numpy())   # the collection CPU's domains
    r = ds.records
    both = r.groupby("task_key")["device"].nunique()
    counts = r.groupby("task_key").size()
    ok = [t for t in sorted(both.index) if both[t] == 2 and counts[t] >= 6]
    # spread the chosen tasks over networks and leaf counts: sort by (first network, n_leaves)
    first_net = r.groupby("task_key")["networks"].first().map(lambda v: v[0][0] if len(v) else "")
    leaves = r.groupby("task_key")["n_leaves"].max()
    ok.sort(key=lambda t: (first_net[t], leaves[t], t))
    step = max(1, len(ok) // n_tasks)
    tasks = ok[::step][:n_tasks]
    rng = np.random.default_rng(0)
    keep = []
    for t in tasks:
        for d in ("local-1t", "local-2t"):
            ii = np.flatnonzero((r["task_key"] == t).to_numpy() & (r["device"] == d).to_numpy())
            keep.extend(rng.choice(ii, size=min(per_task, len(ii)), replace=False).tolist())
    sub = ds.subset(np.sort(np.array(keep)))
    te_tasks = set(tasks[::4])
    is_te = sub.records["task_key"].isin(te_tasks).to_numpy()
    return {
        "ds": sub,
        "train": sub.subset(~is_te), "test": sub.subset(is_te),
        "source": sub.device("local-2t"), "target": sub.device("local-1t"),
    }


@pytest.fixture(scope="module")
def cdmpp_small():
    return _load_small()
