"""Featurisation throughput (programs/s) of the CDMPP compact-AST featurizer on real dataset programs.

Measures, interleaved over `--rounds` rounds (median reported, machine load recorded):
  lower      TVM lowering pipeline only (tensorplan.cdmpp.features.lower_for_features)
  walk       our Python walk (tree + 164-d leaves) on pre-lowered TIR
  compact    compact_ast() per program = lower + walk
  many       featurize_many() (batched lowering), one process
  many_par   featurize_many(workers=all CPUs): batches in forked processes
  tvm_pst    TVM's C++ meta_schedule PerStoreFeature (its own lowering + features, no tree);
             a hybrid "C++ leaves + Python tree" path would cost at least tvm_pst + lower + a tree walk.

`--scaling 1,4,8,16` measures instead only featurize_many at each worker count (interleaved per
round; batch = n / (4 x workers), at least 8): how throughput grows with cores on a many-core host.
The programs are then replayed in forked workers too (replay is ~35 ms/program, 10x featurisation).

    .venv/bin/python bench/features_speed.py --n 200 --out bench/results/features_speed.json
    python bench/features_speed.py --n 3200 --scaling 1,2,4,8,16 --out bench/results/features_scaling_gpuhost.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path


def pass_costs(mods: list, ref: list) -> dict:
    """Per-pass lowering time (ms/program) and, per pass, on how many programs leaving it out changes
    the compact AST: which passes the featuriser cannot drop to go faster."""
    import numpy as np
    import tvm
    from tensorplan.cdmpp import features as F
    seq = F._pipeline(False)
    out = {}
    cur = list(mods)
    for i, p in enumerate(seq.passes):
        t = time.perf_counter()
        cur = [p(m) for m in cur]
        ms = (time.perf_counter() - t) / len(mods) * 1e3
        rest = tvm.ir.transform.Sequential([q for j, q in enumerate(seq.passes) if j != i])
        changed = 0
        for m, r in zip(mods, ref):
            try:
                got = F.compact_ast(rest(m)["main"], lowered=True)
                same = (got.leaf_features.shape == r.leaf_features.shape
                        and np.allclose(got.leaf_features, r.leaf_features, atol=1e-3)
                        and np.array_equal(got.preorder, r.preorder))
            except Exception:  # noqa: BLE001 - a pass the walk cannot do without
                same = False
            changed += not same
        out[p.info.name] = {"ms_per_program": ms, "programs_changed_without_it": changed}
    return out


def machine() -> dict:
    """Where a result was measured (both report kinds)."""
    return {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(), "python": platform.python_version()}


def replay(ds, record_ids: list[int], workers: int) -> list:
    """Scheduled IRModules of the records; replayed in forked workers (sent back as TVM JSON)."""
    import tvm
    from tensorplan.forkmap import fork_map
    from tensorplan.cdmpp import dataset as D
    if workers <= 1:
        return [D.record_schedule(ds, r).mod for r in record_ids]
    js = fork_map(lambda a, b: [tvm.ir.save_json(D.record_schedule(ds, r).mod) for r in record_ids[a:b]],
                  len(record_ids), workers=workers, chunk=32)
    return [tvm.ir.load_json(j) for j in js]


def scaling(a, ds, record_ids: list[int]) -> None:
    """featurize_many throughput per worker count, rounds interleaved, medians."""
    from tensorplan.forkmap import default_workers
    from tensorplan.cdmpp import features as F
    counts = [int(w) for w in a.scaling.split(",")]
    t = time.perf_counter()
    mods = replay(ds, record_ids, default_workers())
    replay_s = time.perf_counter() - t
    n = len(mods)
    F.featurize_many(mods[:8])                       # warm: pass pipeline, type tables
    res: dict[int, list[float]] = {w: [] for w in counts}
    for _ in range(a.rounds):
        for w in counts:
            t = time.perf_counter()
            out = F.featurize_many(mods, workers=w, batch=max(8, n // (4 * w)))
            res[w].append(n / (time.perf_counter() - t))
            assert len(out) == n and all(o.n_leaves > 0 for o in out)
    base = statistics.median(res[counts[0]])
    summary = {str(w): {"median_programs_per_s": statistics.median(v), "all": v,
                        "speedup_vs_first": statistics.median(v) / base} for w, v in res.items()}
    report = {"bench": "features_speed_scaling", "programs": n, "rounds": a.rounds,
              "replay_s_all_workers": replay_s, "scaling": summary,
              "machine": machine(),
              "created": time.time()}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1))
    for w, v in summary.items():
        print(f"workers {w:>3s} {v['median_programs_per_s']:8.1f} programs/s ({v['speedup_vs_first']:.2f}x)")
    print(f"{n} programs, replay {replay_s:.1f} s; load average {os.getloadavg()}; wrote {a.out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None, help="dataset directory (default: committed data/cdmpp)")
    ap.add_argument("--n", type=int, default=200, help="programs to featurise")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="bench/results/features_speed.json")
    ap.add_argument("--no-passes", action="store_true", help="skip the per-pass lowering costs (the slowest part)")
    ap.add_argument("--scaling", default=None, metavar="W1,W2,..",
                    help="only featurize_many throughput at these worker counts (many-core hosts)")
    a = ap.parse_args()

    import numpy as np
    from tensorplan.cdmpp import dataset as D
    from tensorplan.cdmpp import features as F

    ds = D.load_dataset(a.data)
    rng = np.random.default_rng(0)
    progs = ds.records.drop_duplicates("prog_idx")
    pick = rng.choice(len(progs), size=min(a.n, len(progs)), replace=False)
    if a.scaling:
        return scaling(a, ds, [int(progs.iloc[i]["record_id"]) for i in pick])
    t = time.perf_counter()
    schs = [D.record_schedule(ds, int(progs.iloc[i]["record_id"])) for i in pick]
    replay_ms = (time.perf_counter() - t) / len(schs) * 1e3
    mods = [s.mod for s in schs]
    n = len(mods)
    F.tvm_per_store_feature(schs[0])       # warm: TuneContext import
    F.compact_ast(mods[0])

    from tensorplan.forkmap import default_workers
    workers = default_workers()
    res: dict[str, list[float]] = {k: [] for k in ("lower", "walk", "compact", "many", "many_par", "tvm_pst")}
    leaves = []
    for _ in range(a.rounds):
        t = time.perf_counter(); low = [F.lower_for_features(m) for m in mods]; res["lower"].append(n / (time.perf_counter() - t))
        t = time.perf_counter(); out = [F.compact_ast(x, lowered=True) for x in low]; res["walk"].append(n / (time.perf_counter() - t))
        t = time.perf_counter(); [F.compact_ast(m) for m in mods]; res["compact"].append(n / (time.perf_counter() - t))
        t = time.perf_counter(); F.featurize_many(mods); res["many"].append(n / (time.perf_counter() - t))
        t = time.perf_counter(); F.featurize_many(mods, workers=workers, batch=32); res["many_par"].append(n / (time.perf_counter() - t))
        t = time.perf_counter(); [F.tvm_per_store_feature(s) for s in schs]; res["tvm_pst"].append(n / (time.perf_counter() - t))
        leaves = [o.n_leaves for o in out]
    summary = {k: {"median_programs_per_s": statistics.median(v), "all": v} for k, v in res.items()}
    passes = {} if a.no_passes else pass_costs(mods, [F.compact_ast(m) for m in mods])

    # cross-check against TVM's PerStoreFeature on the same real programs: our row of each buffer's
    # last non-constant store vs TVM's row for that buffer, and the summed ("pack-sum") vectors
    xc = {"programs": n, "rows_match": 0, "sum_match": 0, "shape_mismatch": 0,
          "group_max_abs_diff": {g: 0.0 for g in F.FEATURE_GROUPS}, "group_programs_exact": {g: 0 for g in F.FEATURE_GROUPS}}
    for s_, m in zip(schs, mods):
        mine = F.rows_like_tvm(F.compact_ast(m))
        ref = F.tvm_per_store_feature(s_)
        if mine.shape != ref.shape:
            xc["shape_mismatch"] += 1
            continue
        xc["rows_match"] += bool(np.allclose(mine, ref, atol=2e-3, rtol=1e-4))
        xc["sum_match"] += bool(np.allclose(mine.sum(0), ref.sum(0), atol=1e-2, rtol=1e-4))
        for g, (lo, hi) in F.FEATURE_GROUPS.items():
            d = float(np.abs(mine[:, lo:hi] - ref[:, lo:hi]).max()) if len(mine) else 0.0
            xc["group_max_abs_diff"][g] = max(xc["group_max_abs_diff"][g], d)
            xc["group_programs_exact"][g] += d <= 2e-3
    report = {
        "bench": "features_speed", "programs": n, "rounds": a.rounds,
        "leaves_per_program_median": statistics.median(leaves) if leaves else 0,
        "results": summary, "crosscheck_vs_tvm_per_store_feature": xc,
        "workers": workers, "replay_ms_per_program": replay_ms, "lowering_passes": passes,
        "machine": machine(),
        "created": time.time(),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(report, indent=1))
    for k, v in summary.items():
        print(f"{k:8s} {v['median_programs_per_s']:8.1f} programs/s")
    print(f"cross-check vs TVM PerStoreFeature: rows match {xc['rows_match']}/{n}, sums match {xc['sum_match']}/{n}, "
          f"row-count mismatch {xc['shape_mismatch']}; per group exact: {xc['group_programs_exact']}")
    print(f"schedule replay {replay_ms:.1f} ms/program; lowering passes (ms/program, programs whose AST "
          f"changes without it): " + ", ".join(f"{k} {v['ms_per_program']:.2f} ({v['programs_changed_without_it']})"
                                              for k, v in passes.items()))
    print(f"load average {os.getloadavg()}; wrote {a.out}")


if __name__ == "__main__":
    main()
