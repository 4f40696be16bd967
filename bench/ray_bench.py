"""Dataset collection in-process vs on a local Ray cluster with the same cores, and Ray's cost per job.

What it measures (one run, interleaved, medians):
- `collect` throughput (records/s) of the same programs (a fresh store each trial), in this process
  and with `ray_address` on a local cluster: a head with no CPUs and one worker node with this
  machine's cores and devices (`tensorplan devices --ray-resources`). Both modes build each
  task's design spaces once per run; workers keep their imports (what a running cluster has).
  The first cluster trial (cold workers: Python, TVM and tensorplan imported on first use) is
  reported on its own and left out of the median.
- overhead per job: a no-op job through `RayRunner` one at a time (round trip) and as a stream
  (pipelined), against `InProcessRunner`; and the per-record difference of the two collections.
The machine's load is recorded before and after every trial; a trial on a machine busier than
its cores, or a spread of more than 10 % between trials, is flagged as noisy.

Usage: python bench/ray_bench.py [--network tiny-mlp] [--programs 6] [--rounds 3] [--noop-jobs 200]
       [--out bench/results/ray_bench.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path


def machine_info() -> dict:
    from tensorplan.devices.detect import cpu_info
    info = cpu_info()
    import ray
    return {"cpu": info["model"], "cores": info["cores"], "threads": info["threads"], "mem_gb": info["mem_gb"],
            "platform": platform.platform(), "python": sys.version.split()[0], "ray": ray.__version__,
            "note": "shared 2-core VM; other jobs may run at the same time"}


def _noop() -> int:
    """A job that does nothing (pickled by value: defined in this script)."""
    return 0


def _collect(network: str, programs: int, ray_address: str | None) -> dict:
    from tensorplan.cdmpp.dataset import collect
    with tempfile.TemporaryDirectory() as d:
        load0 = os.getloadavg()[0]
        st = collect([network], programs_per_task=programs, threads=(1, 2), store=Path(d) / "s.sqlite",
                     progress=False, log=lambda s: None, ray_address=ray_address)
        load1 = os.getloadavg()[0]
    out = st.to_dict()
    out["load_1m_before"], out["load_1m_after"] = load0, load1
    return out


def _noop_overhead(runner, specs, jobs: int) -> dict:
    from tensorplan.measure.cluster import ClusterJob
    spec = specs[-1]
    js = [ClusterJob(_noop, (), label=f"noop {i}", device=spec) for i in range(jobs)]
    t0 = time.perf_counter()
    res = list(runner.run(js))
    stream = (time.perf_counter() - t0) / jobs
    assert all(r.ok for r in res), [r.error for r in res if not r.ok][:3]
    n1 = max(10, jobs // 4)
    lat = []
    for j in js[:n1]:
        t0 = time.perf_counter()
        r = runner.map([j])[0]
        lat.append(time.perf_counter() - t0)
        assert r.ok, r.error
    return {"jobs": jobs, "stream_s_per_job": stream, "round_trip_median_s": statistics.median(lat),
            "round_trip_p90_s": sorted(lat)[int(0.9 * (len(lat) - 1))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--network", default="tiny-mlp")
    ap.add_argument("--programs", type=int, default=6, help="programs per task per trial")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved (in-process, cluster) pairs")
    ap.add_argument("--noop-jobs", type=int, default=200)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "ray_bench.json"))
    a = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from tensorplan.devices import device
    from tensorplan.forkmap import default_workers
    from tensorplan.measure.cluster import ClusterJob, InProcessRunner, RayRunner, node_resources

    cores = default_workers()
    specs = [device("local"), device("local-1t"), device("local-2t")]
    t0 = time.perf_counter()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    c.add_node(num_cpus=cores, resources=node_resources(specs))
    ray.init(address=c.address, log_to_driver=False, logging_level="ERROR")
    cluster_start_s = time.perf_counter() - t0
    runner = RayRunner(c.address)
    lanes = [device("local-1t"), device("local-2t")]
    try:
        trials: list[dict] = []
        cold = None
        for r in range(a.rounds + 1):           # round 0: the cold cluster trial, then interleaved pairs
            order = ["ray", "in-process"] if r % 2 == 0 else ["in-process", "ray"]
            for mode in order:
                if r == 0 and mode == "in-process":
                    continue
                res = _collect(a.network, a.programs, c.address if mode == "ray" else None)
                res.update(mode=mode, round=r)
                print(json.dumps({k: res[k] for k in ("mode", "round", "records", "seconds", "records_per_s",
                                                      "load_1m_before", "load_1m_after")}), flush=True)
                if r == 0:
                    cold = res
                else:
                    trials.append(res)
        summary = {}
        for mode in ("in-process", "ray"):
            rps = [t["records_per_s"] for t in trials if t["mode"] == mode]
            med = statistics.median(rps)
            spread = (max(rps) - min(rps)) / med if med else 0.0
            summary[mode] = {"median_records_per_s": med, "trials_records_per_s": rps, "spread": spread}
        ip, rr = summary["in-process"]["median_records_per_s"], summary["ray"]["median_records_per_s"]
        per_record = {"in_process_s": 1 / ip, "ray_s": 1 / rr, "difference_s": 1 / rr - 1 / ip,
                      "ray_over_in_process": ip / rr}
        noop = {"ray": _noop_overhead(runner, lanes, a.noop_jobs),
                "in-process": _noop_overhead(InProcessRunner(), lanes, a.noop_jobs)}
        loads = [t["load_1m_before"] for t in trials] + [t["load_1m_after"] for t in trials]
        noisy = [f"load {max(loads):.1f} above {cores} cores during the trials"] if max(loads) > cores else []
        noisy += [f"{m} trials spread {s['spread']:.0%}" for m, s in summary.items() if s["spread"] > 0.10]
        res = {"machine": machine_info(), "command": " ".join(["python"] + sys.argv), "network": a.network,
               "programs_per_task": a.programs, "threads": [1, 2], "rounds": a.rounds,
               "cluster": {"nodes": "head (0 CPUs) + 1 worker node", "worker_cpus": cores,
                           "resources": node_resources(specs), "start_s": cluster_start_s},
               "collect": summary, "cold_cluster_trial": cold, "trials": trials, "per_record": per_record,
               "noop_job": noop, "noise_flags": noisy}
    finally:
        runner.close()
        ray.shutdown()
        c.shutdown()
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({"collect": {m: s["median_records_per_s"] for m, s in summary.items()},
                      "per_record": per_record, "noop_job": noop, "noise_flags": noisy}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
