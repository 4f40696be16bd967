"""Calibrate the shipped predictor to *this* machine from a few programs timed here.

Why: the shipped model learnt every label on the collection CPU's type(s), so on another CPU it
predicts what the kernels take there, not here (`tensorplan predict --measure` shows by how much).
CDMPP's answer is few-shot adaptation; `calibrate.Calibrated` is the variant used here (a small
boosted-tree correction of log(target / source prediction) from parallel / vector / unroll features).

This module makes it a one-command step on the user's machine: KMeans-select tasks from the
committed dataset (CDMPP §3.1, features only), replay `per_task` of their programs, compile and
time them here with the dataset's timer, fit the correction, check it on tasks it was not fitted
on, and, where it wins there, save the calibrated model under the cache, keyed by this CPU and
thread count, where `predict(device="local")` picks it up. On a CPU the model already learnt, the
correction only adds noise, and the check declines it.
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.progress import progress_bar
from tensorplan.cdmpp.predict import host_id, local_model_path, local_threads


# repeat MAD / median above which a timing is left out. The dataset keeps 1 % (its records came from
# a quiet machine); a user's shared machine rarely meets that, while a 5 % MAD still pins the median
# of 15 repeats far below the device factor corrected here
MAX_MAD = 0.05


@dataclass
class HeldOutCheck:
    """A correction scored on tasks it was not fitted on, against the model as `predict` uses it."""

    n: int                         # samples predicted out of fold
    folds: int
    calibration_better: bool       # lower MAPE than the uncalibrated model (or too few samples to tell)
    model_here: dict[str, float] | None = None    # the uncalibrated model's metrics on those samples
    calibrated: dict[str, float] | None = None    # the correction's
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"n": self.n, "folds": self.folds, "calibration_better": self.calibration_better}
        if self.model_here is not None:
            d.update(model_here=self.model_here, calibrated=self.calibrated)
        if self.note:
            d["note"] = self.note
        return d


@dataclass
class LocalCalibration:
    """What `calibrate_here` timed, fitted and decided; `path` is the saved model where installed."""

    host: str
    threads: int
    source: str                    # the dataset domain the correction starts from
    tasks: list[str]
    n_timed: int
    n_selected: int
    skipped: dict[str, int]        # programs left out, by reason (failed, too_slow, unstable)
    time_s: float
    excluded_networks: list[str]
    max_mad: float
    here_vs_source_median_ratio: float
    uncalibrated_on_samples: dict[str, float]
    calibrated_on_samples: dict[str, float]
    held_out: HeldOutCheck
    sample_latency_s: list[float]              # the timings, to re-fit without re-timing
    sample_record_ids: list[int] | None        # the dataset records they replayed
    installed: bool
    path: str | None

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name not in ("held_out", "sample_latency_s", "sample_record_ids")}
        d["held_out_tasks"] = self.held_out.to_dict()
        d["samples"] = {"record_id": self.sample_record_ids, "latency_s": self.sample_latency_s}
        return d


def held_out_check(make: Callable[[], "object"], samples, baseline_pred: np.ndarray, folds: int = 5) -> HeldOutCheck:
    """Leave-tasks-out check of a correction before it is installed: `make()` fitted on the samples
    of the other tasks predicts each fold's tasks. Returns both models' metrics on those held-out
    predictions and whether the correction is the better one (lower MAPE).

    Why: a correction always fits its own samples better (in-sample), yet on a CPU the model
    already learnt it can make unseen kernels worse; `baseline_pred` is what `predict` would use
    instead (the model given this CPU's device vector)."""
    from sklearn.model_selection import GroupKFold

    from tensorplan.cdmpp.metrics import regression_metrics

    y = np.asarray(samples.latency_s, np.float64)
    groups = np.asarray(samples.task_key)
    k = min(folds, len(np.unique(groups)))
    cv = np.full(len(y), np.nan)
    if k >= 2:
        for tr, te in GroupKFold(n_splits=k).split(y, groups=groups):
            if len(tr) >= 8:                     # Calibrated's minimum
                cv[te] = make().fit(samples.subset(tr)).predict(samples.subset(te))
    ok = np.isfinite(cv)
    if ok.sum() < 4:
        return HeldOutCheck(int(ok.sum()), k, True,
                            note="too few samples for a held-out check; the correction is installed unchecked")
    base = regression_metrics(np.asarray(baseline_pred)[ok], y[ok])
    cal = regression_metrics(cv[ok], y[ok])
    return HeldOutCheck(int(ok.sum()), k, bool(cal["mape_pct"] < base["mape_pct"]), model_here=base, calibrated=cal)


def calibrate_here(threads: int | None = None, *, n_tasks: int = 40, per_task: int = 4, data=None, model=None,
                   out: str | Path | None = None, exclude_networks: Sequence[str] = (), seed: int = 0,
                   max_mad: float = MAX_MAD, force: bool = False,
                   progress: bool = True, log: Callable[[str], None] | None = None,
                   ray_address: str | None = None) -> LocalCalibration:
    """Time `n_tasks` x `per_task` dataset programs here at `threads` threads (default: every usable
    core, what `predict(device="local")` predicts) and fit a correction.

    `exclude_networks`: leave the tasks of these networks out of the selection (to test the
    calibrated model on kernels the calibration never timed). The model is saved to `out` (default
    `local_model_path(threads)`) when, on tasks it was not fitted on, it beats the model as
    `predict` uses it here (`held_out_check`), or when `force`; otherwise nothing is saved (and a
    stale calibration at `out` is removed), so `predict` keeps the uncalibrated model.
    `ray_address`: the programs are timed on that Ray cluster's workers offering this CPU at
    `threads` threads (the same DeviceSpec identity, `measure.cluster`), not here."""
    from tensorplan.devices import resolve
    from tensorplan.measure.cluster import ClusterJob, job_runner

    from tensorplan.cdmpp.arrays import as_arrays, device_features
    from tensorplan.cdmpp.base import load_estimator
    from tensorplan.cdmpp.calibrate import Calibrated
    from tensorplan.cdmpp.dataset import TraceJob, init_pool, load_dataset, mad_rel, time_trace_job
    from tensorplan.cdmpp.finetune import programs_of_tasks, select_tasks_kmeans
    from tensorplan.cdmpp.metrics import regression_metrics
    from tensorplan.cdmpp.model import load_shipped

    threads = local_threads("local" if threads is None else f"local-{threads}t")   # checked against this CPU
    runner = job_runner(ray_address)
    spec = resolve(f"local-{threads}t")
    runner.check_devices([spec])
    if runner.kind == "in-process":
        init_pool(threads)      # first, before anything configures TVM's runtime pool
    # the correction starts from the collection CPU's records at the most threads up to this count
    # (the dataset's local-<N>t domains); it learns the device and thread-count shift from there
    stable = load_dataset(data).filter_stable(max_cov=0.01, metric="mad")
    have = sorted(int(m.group(1)) for d in set(stable.records["device"]) if (m := re.fullmatch(r"local-(\d+)t", d)))
    if not have:
        raise TensorplanError(f"calibrate: the dataset '{data or 'data/cdmpp'}' has no stable records on a "
                              "'local-<N>t' domain, the collection CPU's records the correction starts from")
    source = f"local-{max([n for n in have if n <= threads], default=have[0])}t"
    ds = stable.device(source)
    if exclude_networks:
        drop = {t for t, nets in zip(ds.tasks["task_key"], ds.tasks["networks"])
                if any(n in exclude_networks for n, _ in nets)}
        ds = ds.subset(np.flatnonzero(~ds.records["task_key"].isin(drop).to_numpy()))
    est = load_shipped() if model is None else load_estimator(model)
    arr = as_arrays(ds)
    tasks = select_tasks_kmeans(arr, min(n_tasks, len(np.unique(arr.task_key))), seed=seed)
    idx = programs_of_tasks(arr, tasks, per_task, seed)
    rows = ds.tasks.set_index("task_key")

    def job(i: int) -> ClusterJob:
        tk = str(arr.task_key[i])
        r = rows.loc[tk]
        tj = TraceJob(tk, str(r["task_name"]), str(r["script"]), float(r["flops"]), arr.trace[i], threads,
                      min_repeat_s=2e-5, repeats=15, max_kernel_s=1.0)
        return ClusterJob(time_trace_job, (tj,), label=f"program {i} of task {r['task_name']} ({tk})", device=spec)

    lat = np.full(len(idx), np.nan)
    skipped = {"failed": 0, "too_slow": 0, "unstable": 0}
    t0 = time.perf_counter()
    where = "here" if runner.kind == "in-process" else "on the cluster"
    with progress_bar(f"time {len(idx)} programs {where}", len(idx), progress) as advance:
        jobs = [job(i) for i in idx]
        for res in runner.run(jobs):
            j, i = res.index, idx[res.index]
            r = res.value if res.ok else "failed"
            if not res.ok and log:
                log(f"calibrate: {res.label}: {res.error}")
            if isinstance(r, str):          # no longer replays / builds / runs, or too slow
                skipped["failed" if r == "failed" else "too_slow"] += 1
            elif mad_rel(r[threads].repeats) > max_mad:    # the dataset's robust stability measure
                skipped["unstable"] += 1
            else:
                lat[j] = r[threads].median_s
            advance()
    runner.close()
    ok = np.isfinite(lat)
    if ok.sum() < 8:
        raise TensorplanError(f"calibrate: only {int(ok.sum())} of {len(idx)} programs were timed stably here "
                              f"(need 8; skipped: {skipped}); if 'unstable' dominates the machine is busy: rerun "
                              "when it is quiet, or select more programs (--tasks, --per-task)")
    here = dataclasses.replace(arr.subset(idx[ok]), latency_s=lat[ok])
    src_feats = device_features(source, ds.devices).tolist()

    def make() -> Calibrated:
        return Calibrated(est, source=source, seed=seed, source_features=src_feats)

    cal = make().fit(here)
    dom = f"local-{threads}t"
    cal.domains_ = [dom]                    # this CPU at this thread count: what predict uses it for
    cal.domain_features_ = {dom: device_features(dom).tolist()}
    src_pred = cal.source_predict(here)
    # what `predict(device="local")` gives without a calibration: the model with this CPU's vector
    here_pred = est.predict(here.on_device(cal.domain_features_[dom]))
    check = held_out_check(make, here, here_pred)
    dest = Path(out) if out is not None else local_model_path(threads)
    res = LocalCalibration(
        host=host_id(), threads=threads, source=source, tasks=[str(t) for t in tasks], n_timed=int(ok.sum()),
        n_selected=int(len(idx)), skipped=skipped, time_s=time.perf_counter() - t0,
        excluded_networks=list(exclude_networks), max_mad=max_mad,
        here_vs_source_median_ratio=float(np.median(lat[ok] / arr.latency_s[idx[ok]])),
        uncalibrated_on_samples=regression_metrics(src_pred, lat[ok]),
        calibrated_on_samples=regression_metrics(cal.predict(here), lat[ok]), held_out=check,
        sample_latency_s=[float(x) for x in lat[ok]],
        sample_record_ids=[int(x) for x in arr.record_id[idx[ok]]] if arr.record_id is not None else None,
        installed=bool(check.calibration_better or force), path=None)
    if res.installed:
        dest.parent.mkdir(parents=True, exist_ok=True)
        res.path = str(cal.save(dest))
        dest.with_suffix(".calibration.json").write_text(json.dumps(res.to_dict(), indent=1))
    else:
        dest.unlink(missing_ok=True)        # a stale calibration would be picked up by predict
    if log:
        log(f"calibrated on {res.n_timed} programs of {len(tasks)} tasks timed {where}: this CPU runs them "
            f"{res.here_vs_source_median_ratio:.2f}x the collection CPU's time (median){_held_out_text(check)}; "
            + (f"saved {res.path}" if res.installed else
               "not installed: the model already predicts this CPU better without it, and `predict` keeps it "
               "(force=True to install the calibration anyway)"))
    return res


def _held_out_text(check: HeldOutCheck) -> str:
    if check.calibrated is None:
        return ""
    return (f"; on tasks it was not fitted on: MAPE {check.calibrated['mape_pct']:.1f} % calibrated vs "
            f"{check.model_here['mape_pct']:.1f} % uncalibrated")
