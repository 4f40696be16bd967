"""This machine's measured device numbers: STREAM-style bandwidth (copy, triad) and fp32 GEMM FLOP/s
(ONNX Runtime/MLAS, torch, numpy) at 1 and 2 threads, interleaved over several rounds so a noisy
neighbour hits every configuration alike; reports the median over rounds of each round's best run.

Usage: python bench/device_numbers.py [--rounds 3] [--n 2048] [--out bench/results/device_numbers.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from rich.progress import Progress

from tensorplan.devices.detect import cpu_info, measure_bandwidth, measure_matmul


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--n", type=int, default=1024, help="GEMM size n (n x n x n)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "device_numbers.json"))
    a = ap.parse_args()
    info = cpu_info()
    threads = [t for t in (int(x) for x in a.threads.split(",")) if t <= info["threads"]]
    rounds: list[dict] = []
    t_start = time.time()
    load_start = os.getloadavg()
    with Progress() as prog:
        task = prog.add_task("measuring", total=a.rounds * len(threads) * 2)
        for r in range(a.rounds):
            row: dict = {}
            for t in threads:
                row[f"bw_{t}t"] = measure_bandwidth(t)
                prog.advance(task)
                row[f"mm_{t}t"] = measure_matmul(t, n=a.n)
                prog.advance(task)
            rounds.append(row)
    summary: dict = {}
    for t in threads:
        bws = [r[f"bw_{t}t"] for r in rounds]
        mms = [r[f"mm_{t}t"] for r in rounds]
        backends = sorted({b for m in mms for b in m["per_backend"]})
        summary[f"{t}t"] = {
            "copy_gbs": statistics.median(b["copy_gbs"] for b in bws),
            "triad_gbs": statistics.median(b["triad_gbs"] for b in bws),
            "gemm_gflops_best_backend": statistics.median(m["gflops"] for m in mms),
            "gemm_gflops_best_round": max(m["gflops"] for m in mms),
            "triad_gbs_best_round": max(b["triad_gbs"] for b in bws),
            "gemm_gflops_per_backend": {b: statistics.median(m["per_backend"][b]["gflops"] for m in mms
                                                             if b in m["per_backend"]) for b in backends},
            "best_backend_per_round": [m["backend"] for m in mms],
            "array_mb": bws[0]["array_mb"], "gemm_n": a.n,
        }
    machine = {k: info[k] for k in ("model", "vendor", "cores", "threads", "clock_ghz", "l1_kb", "l2_kb", "l3_kb",
                                     "isa", "mem_gb")}
    machine.update(platform=platform.platform(), python=sys.version.split()[0],
                   load_avg_at_start=load_start, note="shared 2-core VM; other jobs may run at the same time")
    machine["load_avg_at_end"] = os.getloadavg()
    res = {"machine": machine, "command": " ".join(["python"] + sys.argv), "rounds": a.rounds,
           "seconds": round(time.time() - t_start, 1),
           "method": ("per round and thread count: measure_bandwidth (torch copy/triad, 3 arrays of max(4 x L3, 64 MiB), "
                      "best of 10) and measure_matmul (fp32 n^3 GEMM, best run per backend); summary = median over rounds"),
           "summary": summary, "raw": rounds}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    for t, s in summary.items():
        per = ", ".join(f"{b} {g:.0f}" for b, g in s["gemm_gflops_per_backend"].items())
        print(f"{t}: triad {s['triad_gbs']:.1f} GB/s, copy {s['copy_gbs']:.1f} GB/s; GEMM {s['gemm_gflops_best_backend']:.0f} "
              f"GFLOP/s best ({per})")
    print(f"-> {a.out}")


if __name__ == "__main__":
    main()
