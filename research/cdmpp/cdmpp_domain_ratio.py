"""Per-program latency ratio between two device domains of the committed dataset (same programs).

Why: a second machine's domain (`tensorplan predictor dataset measure-device`) re-times the same schedules,
so the ratio per program shows how far one device factor is from describing the new device. The
oracle floors say what a device transfer can reach even knowing every program's latency on A
exactly: B predicted as A times the best single factor, or the best factor per task (both fitted on
B's labels, so no few-shot method that only learns a factor can do better).

    python research/cdmpp/cdmpp_domain_ratio.py gpuhost-1t local-1t [gpuhost-16t local-2t ...] [--json]
    python research/cdmpp/cdmpp_domain_ratio.py h100 h200 --data data/cdmpp-h100 --out research/cdmpp/results/cdmpp_domain_ratios_gpu.json   # two GPUs, same programs
    python research/cdmpp/cdmpp_domain_ratio.py local-2t local-1t local-1t zen4-1t ... --out research/cdmpp/results/cdmpp_device_floors.json   # source target: the floors
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def ratios(ds, a: str, b: str, max_mad: float = 0.01) -> dict:
    """Per-program latency ratio A / B, and how well A's measured latency alone predicts B's
    (MAPE of A as B: the error floor of a device split from A to B, if B were A), over every
    common program and over those stable (MAD/median <= max_mad) on both, where B is also
    predicted as A times the best factor, one and one per task (`mape_point.factor_floors`)."""
    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.mape_point import factor_floors

    r = ds.records
    pa = r[r["device"] == a].set_index("prog_idx")
    pb = r[r["device"] == b].set_index("prog_idx")
    common = pa.index.intersection(pb.index)
    q = (pa.loc[common, "latency_s"] / pb.loc[common, "latency_s"]).to_numpy()
    p10, p50, p90 = np.percentile(q, [10, 50, 90]) if len(q) else (np.nan,) * 3
    stable = ((pa.loc[common, "mad_rel"] <= max_mad) & (pb.loc[common, "mad_rel"] <= max_mad)).to_numpy()
    la, lb = pa.loc[common, "latency_s"].to_numpy(), pb.loc[common, "latency_s"].to_numpy()
    floors = factor_floors(la[stable], lb[stable], pb.loc[common, "task_key"].to_numpy()[stable])
    return {"a": a, "b": b, "programs": int(len(q)), "median": float(p50), "p10": float(p10), "p90": float(p90),
            "a_as_b_mape_pct": float(100 * np.mean(np.abs(q - 1))) if len(q) else None,
            "stable_programs": int(stable.sum()),
            "a_as_b_mape_pct_stable": float(100 * np.mean(np.abs(q[stable] - 1))) if stable.any() else None,
            **{f"stable_{k}": v for k, v in floors.items()}}


def main() -> None:
    from tensorplan.cdmpp.dataset import load_dataset
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("domains", nargs="+", help="pairs A B: latency on A over latency on B")
    ap.add_argument("--data")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", help="also write the JSON here")
    a = ap.parse_args()
    if len(a.domains) % 2:
        ap.error("give domains in pairs A B")
    ds = load_dataset(a.data)
    res = [ratios(ds, x, y) for x, y in zip(a.domains[::2], a.domains[1::2])]
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        for r in res:
            print(f"{r['a']} / {r['b']}: {r['programs']} programs, median {r['median']:.2f}x "
                  f"(10th-90th percentile {r['p10']:.2f}-{r['p90']:.2f}x); {r['a']} as {r['b']}: MAPE "
                  f"{r['a_as_b_mape_pct']:.1f}%, {r['a_as_b_mape_pct_stable']:.1f}% on the {r['stable_programs']} "
                  "programs stable on both")
            if r["stable_one_factor"] is not None:
                print(f"  {r['b']} predicted as {r['a']}'s latency x {r['stable_one_factor']:.3f} (the MAPE-optimal "
                      f"factor): MAPE {r['stable_one_factor_mape_pct']:.1f}%; one factor per task: "
                      f"{r['stable_per_task_factor_mape_pct']:.1f}% (stable programs)")


if __name__ == "__main__":
    main()
