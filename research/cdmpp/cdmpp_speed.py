"""CDMPP training time on 30k records and batched prediction throughput, on this CPU.

The measured dataset may hold fewer than 30k records; the training set is then drawn *with
replacement* from the real stable records (the timing depends on the number and the leaf counts
of the programs, not on their labels). Writes research/cdmpp/results/cdmpp_speed.json with machine info.

    python research/cdmpp/cdmpp_speed.py [--data data/cdmpp] [--records 30000] [--epochs 40]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=None)
    ap.add_argument("--records", type=int, default=30000)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--max-cov", type=float, default=0.05)
    ap.add_argument("--out", default="research/cdmpp/results/cdmpp_speed.json")
    ap.add_argument("--variants", default="cmd", help="comma list of: cmd, no_cmd")
    a = ap.parse_args()
    from tensorplan.cdmpp.arrays import as_arrays
    from tensorplan.cdmpp.model import CDMPP
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import machine_info, _throughput

    ds = load_dataset(a.data).filter_stable(max_cov=a.max_cov)
    arr = as_arrays(ds)
    rng = np.random.default_rng(0)
    idx = rng.choice(len(arr), size=a.records, replace=len(arr) < a.records)
    big = arr.subset(idx)
    half = big.subset(np.arange(len(big) // 10))  # unlabelled "target domain" for CMD
    half.latency_s = None
    out = {"data": ds.path, "max_cov": a.max_cov, "real_records": len(arr), "train_records": len(big), "resampled": bool(len(arr) < a.records),
           "leaves_mean": float(big.n_leaves.mean()), "leaves_max": int(big.n_leaves.max()), "runs": {}}
    for name, target in (("no_cmd", None), ("cmd", half)):
        if name not in a.variants.split(","):
            continue
        m = CDMPP(epochs=a.epochs)
        t0, c0, l0 = time.perf_counter(), time.process_time(), os.getloadavg()[0]
        m.fit(big, target=target)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        # wall time depends on what else runs on the shared 2 cores; process CPU time does not
        out["runs"][name] = {"epochs": a.epochs, "train_wall_s": dt, "train_cpu_s": cpu,
                             "wall_s_per_epoch": dt / a.epochs, "cpu_s_per_epoch": cpu / a.epochs,
                             "epochs_in_15_min_wall": int(900 / (dt / a.epochs)),
                             "epochs_in_15_min_cpu": int(900 / (cpu / a.epochs)),
                             "loadavg_start": l0, "loadavg_end": os.getloadavg()[0]}
        print(name, out["runs"][name], flush=True)
    c0 = time.process_time()
    out["predict_per_s"] = _throughput(m, big.subset(np.arange(5000)), min_n=20000)
    out["predict_cpu_s_for_3x20000"] = time.process_time() - c0
    out["machine"] = machine_info()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
