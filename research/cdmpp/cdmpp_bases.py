"""How much of a kernel's latency does an analytical estimate explain, before any learning?

A CDMPP with `base=...` learns latency / estimate instead of latency, so the tighter the estimate
tracks latency across tasks, the less the net has to learn (and to extrapolate on unseen
networks). This script scores candidate estimates on the measured records: the spread (std) of
log(latency / estimate) over records and over tasks (std of per-task medians), per device domain.
No training; seconds to run.

Estimates (all from `predict.cdmpp`; peak and bandwidth from each record's device vector):
  none            1 s (the plain latency)
  roofline        `roofline_seconds`: max(FLOPs / peak, max(unique bytes, output bytes) / bandwidth)
  footprint       FLOPs / peak + footprint / bandwidth (`program_footprint_traffic`)
  hierarchy-K     `hierarchy_seconds`: FLOPs / peak + footprint / bw + traffic / (K x bw)
and the cache ratio `fit_cache_ratio` picks on all records of the domain.

With --tasks REGEX it also lists, per matching task (by name), the median of latency / estimate
under the fitted hierarchy estimate and the networks the task occurs in: e.g. which layout kernels
run near their estimate and which far above it.

Usage: python research/cdmpp/cdmpp_bases.py [--devices local-1t,local-2t] [--tasks 'strided_slice|concatenate']
Writes research/cdmpp/results/cdmpp_bases.json.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import typer


def _spread(lat: np.ndarray, est: np.ndarray, task_spread) -> dict:
    lr = np.log(lat / est)
    return {"std_log_ratio": float(lr.std()), "task_std_log_ratio": task_spread(est),
            "median_ratio": float(np.exp(np.median(lr)))}


def main(devices: str = typer.Option("local-1t,local-2t", "--devices", help="Device domains to score, each alone."),
         tasks: str = typer.Option("", "--tasks", help="Regex on task names: list their median latency / estimate."),
         out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_bases.json"), "--out")) -> None:
    import re

    from tensorplan.cdmpp.analytic import TaskSpread, device_peak_bw, fit_cache_ratio, hierarchy_parts, hierarchy_seconds, roofline_seconds
    from tensorplan.cdmpp.arrays import as_arrays
    from tensorplan.cdmpp.dataset import load_dataset

    full = load_dataset().filter_stable(0.01, metric="mad")
    res: dict = {"command": "python research/cdmpp/cdmpp_bases.py --devices " + devices + (f" --tasks '{tasks}'" if tasks else ""),
                 "domains": {}}
    for dev in [d for d in devices.split(",") if d]:
        ds = full.only_devices([dev])
        arr = as_arrays(ds)
        lat, task = arr.latency_s, np.asarray(arr.task_key)
        parts = hierarchy_parts(arr)
        peak, bw = device_peak_bw(arr)
        ts = TaskSpread(lat, task)
        rows = {"none": _spread(lat, np.ones(len(lat)), ts),
                "roofline": _spread(lat, roofline_seconds(arr), ts),
                "footprint": _spread(lat, np.maximum(parts[:, 0] + parts[:, 1], 1e-9), ts)}
        for k in (1, 2, 4, 8, 16, 32):
            rows[f"hierarchy-{k}"] = _spread(lat, hierarchy_seconds(parts, k), ts)
        res["domains"][dev] = {"records": len(lat), "tasks": int(len(set(task))),
                               "peak_gflops": float(np.median(peak) / 1e9), "bw_gbs": float(np.median(bw) / 1e9),
                               "fitted_cache_ratio": fit_cache_ratio(parts, lat, task), "estimates": rows}
        print(f"{dev}: {len(lat)} records, {len(set(task))} tasks, fitted cache ratio "
              f"{res['domains'][dev]['fitted_cache_ratio']:g}")
        for name, r in rows.items():
            print(f"  {name:14s} std log(lat/est) {r['std_log_ratio']:.3f}   across tasks {r['task_std_log_ratio']:.3f}"
                  f"   median lat/est {r['median_ratio']:.2f}")
        if tasks:
            k = res["domains"][dev]["fitted_cache_ratio"]
            ratio = lat / hierarchy_seconds(parts, k)
            rec = ds.records
            listed = []
            for key in sorted(set(task)):
                sel = task == key
                name = str(rec["task_name"][sel].iloc[0])
                if re.search(tasks, name):
                    nets = ",".join(sorted({n for v in rec["networks"][sel] for n, _ in v}))
                    listed.append({"task": key, "name": name, "networks": nets, "records": int(sel.sum()),
                                   "median_latency_us": float(np.median(lat[sel]) * 1e6),
                                   "median_latency_over_estimate": float(np.median(ratio[sel]))})
            listed.sort(key=lambda t: t["median_latency_over_estimate"])
            res["domains"][dev]["tasks"] = listed
            for t in listed:
                print(f"    {t['median_latency_over_estimate']:7.2f}x  {t['median_latency_us']:9.1f} us  "
                      f"{t['name'][:48]:48s} {t['networks']}")
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
