"""Store write throughput: batched `put_measurements` (goal >= 10,000 records/s), batched `put_programs`,
and single-record `put_measurement` for contrast, on a fresh SQLite file in a temp dir.

Usage: python bench/store_throughput.py [--records 100000] [--batch 1000] [--out bench/results/store_throughput.json]
Writes JSON with the machine description.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.progress import Progress

from tensorplan.devices.detect import cpu_info
from tensorplan.devices import resolve
from tensorplan.measure.store import Store
from tensorplan.measure.timer import Timing


def machine_info() -> dict:
    info = cpu_info()
    return {"cpu": info["model"], "cores": info["cores"], "threads": info["threads"], "mem_gb": info["mem_gb"],
            "platform": platform.platform(), "python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version,
            "load_avg": os.getloadavg(), "note": "shared 2-core VM; other jobs may run at the same time"}


def run(records: int, batch: int, reps: int) -> dict:
    results: dict = {"records": records, "batch": batch, "repeats_per_record": 10, "trials": []}
    for trial in range(reps):
        with tempfile.TemporaryDirectory() as d:
            s = Store(Path(d) / "bench.sqlite")
            dk = s.put_device(resolve("h100"))
            timing = Timing.from_repeats([1e-4 * (1 + 0.01 * k) for k in range(10)], warmup=3, method="bench")
            t0 = time.perf_counter()
            keys: list[str] = []
            for i in range(0, records, batch):
                keys += s.put_programs([("tir", {"op": "matmul", "i": j, "shape": [64, 64, j % 97]})
                                        for j in range(i, min(i + batch, records))])
            t_prog = time.perf_counter() - t0
            t0 = time.perf_counter()
            with Progress(transient=True) as prog:
                task = prog.add_task(f"trial {trial + 1}: put_measurements", total=records)
                for i in range(0, records, batch):
                    rows = [(k, dk, timing, "", {"j": i}) for k in keys[i:i + batch]]
                    s.put_measurements(rows)
                    prog.advance(task, len(rows))
            t_meas = time.perf_counter() - t0
            n_single = min(2000, records)
            t0 = time.perf_counter()
            for k in keys[:n_single]:
                s.put_measurement(k, dk, timing, tag="single")
            t_single = time.perf_counter() - t0
            assert s.count("measurements") == records + n_single
            size = s.stats()["file_bytes"]
            s.close()
        results["trials"].append({"programs_per_s": records / t_prog, "measurements_per_s": records / t_meas,
                                  "single_put_per_s": n_single / t_single, "file_bytes": size})
    for k in ("programs_per_s", "measurements_per_s", "single_put_per_s"):
        results[f"median_{k}"] = statistics.median(t[k] for t in results["trials"])
    results["goal_measurements_per_s"] = 10_000
    results["meets_goal"] = results["median_measurements_per_s"] >= 10_000
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "store_throughput.json"))
    a = ap.parse_args()
    res = {"machine": machine_info(), "command": " ".join(["python"] + sys.argv), **run(a.records, a.batch, a.trials)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(f"batched put_measurements: {res['median_measurements_per_s']:,.0f} records/s (median of {a.trials}); "
          f"put_programs: {res['median_programs_per_s']:,.0f}/s; single put_measurement: "
          f"{res['median_single_put_per_s']:,.0f}/s -> {a.out}")


if __name__ == "__main__":
    main()
