"""Few-shot adaptation to a new device domain (reference/cdmpp.md §3).

Which programs to measure on the new device? CDMPP's KMeans task selection clusters the candidate
programs' features into S clusters and, visiting clusters from largest to smallest, picks the
not-yet-chosen task whose programs lie closest (mean distance) to the cluster centre; the chosen
tasks then cover the feature distribution. Random selection of the same size is the control.
Selection uses features only (no latency), so it can run before anything is measured.
"""
from __future__ import annotations

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.arrays import FeatureScaler, ProgramArrays, as_arrays

METHODS = ("kmeans", "random")


def program_vectors(arr: ProgramArrays, scaler: FeatureScaler | None = None) -> np.ndarray:
    """Fixed-length vector per program: [mean | max] of min-max-scaled leaf features, log leaf count.

    Programs have different leaf counts, so the reference's flattened N_leaf*164 vector is replaced
    by pooled statistics of the same scaled features.
    """
    scaler = scaler or FeatureScaler.fit(arr.leaf_data)
    x = scaler.transform(arr.leaf_data)
    starts = arr.offsets[:-1]
    s = np.add.reduceat(x, starts, axis=0)
    mx = np.maximum.reduceat(x, starts, axis=0)
    n = arr.n_leaves[:, None].astype(np.float32)
    return np.hstack([s / n, mx, np.log2(n) / 6.0]).astype(np.float32)


def select_tasks_kmeans(arr, n_tasks: int, seed: int = 0, scaler: FeatureScaler | None = None,
                        max_points: int = 20000) -> list[str]:
    """CDMPP §3.1: KMeans(S) on program vectors; per cluster (largest first) the closest unused task."""
    from sklearn.cluster import KMeans

    arr = as_arrays(arr)
    tasks = np.unique(arr.task_key)
    if not 1 <= n_tasks <= len(tasks):
        raise TensorplanError(f"kmeans selection: n_tasks={n_tasks} but the pool has {len(tasks)} tasks")
    rng = np.random.default_rng(seed)
    idx = np.arange(len(arr)) if len(arr) <= max_points else np.sort(rng.choice(len(arr), max_points, replace=False))
    X = program_vectors(arr, scaler)[idx]
    tk = arr.task_key[idx]
    km = KMeans(n_clusters=n_tasks, random_state=seed, n_init=4).fit(X)
    tasks = np.unique(tk)
    # D[c, t] = mean distance from centre c to the programs of task t
    D = np.empty((n_tasks, len(tasks)))
    for j, t in enumerate(tasks):
        pts = X[tk == t]
        D[:, j] = np.linalg.norm(pts[None, :, :] - km.cluster_centers_[:, None, :], axis=2).mean(1)
    sizes = np.bincount(km.labels_, minlength=n_tasks)
    chosen: list[str] = []
    used = np.zeros(len(tasks), bool)
    for c in np.argsort(-sizes, kind="stable"):
        d = np.where(used, np.inf, D[c])
        j = int(np.argmin(d))
        used[j] = True
        chosen.append(str(tasks[j]))
    return chosen


def select_tasks_random(arr, n_tasks: int, seed: int = 0) -> list[str]:
    """Control: `n_tasks` distinct tasks drawn uniformly."""
    arr = as_arrays(arr)
    tasks = np.unique(arr.task_key)
    if not 1 <= n_tasks <= len(tasks):
        raise TensorplanError(f"random selection: n_tasks={n_tasks} but the pool has {len(tasks)} tasks")
    rng = np.random.default_rng(seed)
    return [str(t) for t in rng.choice(tasks, n_tasks, replace=False)]


def select_tasks(arr, n_tasks: int, method: str = "kmeans", seed: int = 0) -> list[str]:
    if method == "kmeans":
        return select_tasks_kmeans(arr, n_tasks, seed)
    if method == "random":
        return select_tasks_random(arr, n_tasks, seed)
    raise TensorplanError(f"task selection method '{method}': use one of {METHODS}")


def programs_of_tasks(arr, tasks: list[str], per_task: int, seed: int = 0) -> np.ndarray:
    """Indices of up to `per_task` random programs from each of `tasks` (what would be measured)."""
    arr = as_arrays(arr)
    rng = np.random.default_rng(seed)
    out = []
    for t in tasks:
        ii = np.flatnonzero(arr.task_key == t)
        out.append(ii if len(ii) <= per_task else rng.choice(ii, per_task, replace=False))
    return np.sort(np.concatenate(out)) if out else np.zeros(0, np.int64)


def few_shot_split(arr, n_tasks: int, per_task: int, method: str = "kmeans", seed: int = 0):
    """(fine-tune indices, evaluation indices, chosen tasks) for a target-domain pool."""
    arr = as_arrays(arr)
    tasks = select_tasks(arr, n_tasks, method, seed)
    ft = programs_of_tasks(arr, tasks, per_task, seed)
    rest = np.setdiff1d(np.arange(len(arr)), ft)
    return ft, rest, tasks


def selection_cmd(arr, idx: np.ndarray, k: int = 5) -> float:
    """CMD between the whole pool and the selected programs (lower = better coverage, §3.1 step 5)."""
    import torch

    from tensorplan.cdmpp.model import cmd

    arr = as_arrays(arr)
    X = program_vectors(arr)
    return float(cmd(torch.from_numpy(X), torch.from_numpy(X[idx]), k))


def finetune_model(model, base, target_pool, n_tasks: int, per_task: int, method: str = "kmeans",
                   seed: int = 0, steps: int | None = None):
    """Select, 'measure' (take the labels of) and fine-tune; returns (model, ft_idx, eval_idx, tasks).

    `model` is already trained on `base`. CDMPP fine-tunes its weights (with CMD towards the rest of
    the pool); baselines refit on base + the few target samples.
    """
    pool = as_arrays(target_pool)
    ft, rest, tasks = few_shot_split(pool, n_tasks, per_task, method, seed)
    if model.adapts_by_finetune:
        model.finetune(pool.subset(ft), base=base, steps=steps)
    else:
        model.finetune(pool.subset(ft), base=base)
    return model, ft, rest, tasks


ADAPT = ("finetune", "calibrate")


def finetune_device(device: str, *, model=None, data=None, n_tasks: int = 10, per_task: int = 8,
                    method: str = "kmeans", steps: int = 300, seed: int = 0, out=None,
                    max_cov: float = 0.01, stability: str = "mad", adapt: str = "finetune",
                    source: str | None = None) -> dict:
    """Adapt a CDMPP model to `device` from the dataset's records of that domain.

    The records of `device` are the pool; `n_tasks` tasks are selected (`method`), `per_task` of their
    programs are the labelled few-shot set and the rest measures before/after accuracy.
    `adapt="finetune"` trains the model's head (CDMPP); `"calibrate"` keeps the model, predicts as on
    `source` (default: the first other device in the data) and fits a correction (`calibrate.py`).
    """
    if adapt not in ADAPT:
        raise TensorplanError(f"finetune: adapt must be one of {ADAPT}, got {adapt!r}")
    from pathlib import Path

    from tensorplan.cdmpp.base import load_estimator
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.metrics import regression_metrics
    from tensorplan.cdmpp.model import load_shipped, resolve_domain

    dom = resolve_domain(device)
    est = load_shipped() if model is None else load_estimator(model)
    if not est.adapts_by_finetune:
        raise TensorplanError(f"finetune: '{model}' is a {type(est).__name__}, not a CDMPP model "
                              "(or an ensemble of them)")
    ds = load_dataset(data) if data is None or isinstance(data, (str, Path)) else data
    ds = ds.filter_stable(max_cov=max_cov, metric=stability)
    pool_ds = ds.device(dom)
    if len(pool_ds) == 0:
        raise TensorplanError(f"finetune: the dataset has no stable records on '{dom}'; "
                              f"known devices: {sorted(ds.records['device'].unique())}")
    base_domains = list(getattr(est, "domains_", None) or [])
    pool = as_arrays(pool_ds)
    ft, rest, tasks = few_shot_split(pool, min(n_tasks, len(np.unique(pool.task_key))), per_task, method, seed)
    test = pool.subset(rest)
    before = regression_metrics(est.predict(test), test.latency_s) if len(test) else {}
    others = ds.subset(ds.records["device"].to_numpy() != dom)  # replayed while fine-tuning
    if adapt == "calibrate":
        from tensorplan.cdmpp.calibrate import Calibrated

        known = sorted(set(others.records["device"]))
        src = source or (known[0] if known else None)
        if src is None:
            raise TensorplanError(f"finetune --adapt calibrate: name a --source device; the data has only '{dom}'")
        from tensorplan.cdmpp.arrays import device_features
        est = Calibrated(est, source=src, seed=seed,
                         source_features=device_features(src, ds.devices).tolist()).fit(pool.subset(ft))
    else:
        est.finetune(pool.subset(ft), base=as_arrays(others) if len(others) else None, steps=steps)
    after = regression_metrics(est.predict(test), test.latency_s) if len(test) else {}
    info = {"device": dom, "adapt": adapt, "method": method, "tasks": tasks, "n_target_samples": int(len(ft)),
            "n_eval": int(len(rest)), "before": before, "after": after}
    if base_domains:
        est.domains_ = sorted(set(base_domains) | {dom})
    if out is not None:
        info["path"] = str(est.save(out))
    return info
