"""Reproduce CoDL's comparison in the SoC simulator: 5 models × 4 SoCs × systems, next to the
published numbers (speedups, per-model CoDL latencies). Calibration inputs (calibration.json)
are kept apart from the compared results (published.json).

    python bench/codl_simulate.py [--seeds 3]   -> bench/results/codl_simulate.json + markdown table
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "codl_simulate.json"
MODELS = ("retinaface", "yolov2", "vgg-16", "posenet", "candy")


def main() -> None:
    from tensorplan.zoo.specs import load_model
    from tensorplan.codl.simulate import PROFILE_DIR, SOCS, SYSTEMS, calibrate, plan_for, simulate
    from tensorplan.codl.partition import CoexecCost, chain_links, extract_ops, plan_ops, regret
    from tensorplan.codl.simulate import sharing_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    pub = json.loads((PROFILE_DIR / "published.json").read_text())
    graphs = {m: load_model(m) for m in MODELS}
    res = {"seeds": args.seeds, "socs": {}, "published": pub}
    for soc in SOCS:
        model = calibrate(soc, graphs)
        per = {}
        for m, g in graphs.items():
            t0 = time.perf_counter()
            lat = {s: float(np.mean([simulate(g, model, s, seed=k).latency_s for k in range(args.seeds)]))
                   for s in SYSTEMS}
            ops, plan, _ = plan_for("codl", g, model)
            cost = CoexecCost(model, sharing_model(model.prof, model.prof.get("image", True)), "cpu", "gpu", 4, "codl")
            dp = plan_ops([o.shape for o in ops], cost, chain_links(g, ops), "dp",
                          None if model.prof.get("image", True) else ("OC",))
            pd = plan.to_dict()
            per[m] = {"latency_ms": {s: v * 1e3 for s, v in lat.items()},
                      "published_codl_ms": pub["codl_ms"][soc][m],
                      "codl_vs_published": lat["codl"] * 1e3 / pub["codl_ms"][soc][m] - 1,
                      "chained_ops": pd["chained_ops"], "n_ops": pd["n_ops"], "dim_share": pd["dim_share"],
                      "greedy_regret_vs_dp": regret(plan, dp) if model.prof.get("image", True) else 0.0,
                      "search_s": pd["search_s"], "sim_s": time.perf_counter() - t0}
        sp = {b: float(np.mean([per[m]["latency_ms"][b] / per[m]["latency_ms"]["codl"] for m in MODELS]))
              for b in ("ulayer", "cpu", "gpu", "codl-nochain")}
        sp["ulayer_max"] = float(max(per[m]["latency_ms"]["ulayer"] / per[m]["latency_ms"]["codl"] for m in MODELS))
        res["socs"][soc] = {"models": per, "speedup_avg": sp}
    snap = [s for s in SOCS if s.startswith("sd")]
    res["snapdragon_speedup_avg"] = {b: float(np.mean([res["socs"][s]["speedup_avg"][b] for s in snap]))
                                     for b in ("ulayer", "cpu", "gpu", "codl-nochain", "ulayer_max")}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(res, indent=1))
    # markdown
    lines = ["| SoC | model | CPU | GPU | µLayer-like | CoDL no chain | CoDL | ideal | published CoDL | off by | chained ops |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for soc in SOCS:
        for m in MODELS:
            r = res["socs"][soc]["models"][m]
            l = r["latency_ms"]
            lines.append(f"| {soc} | {m} | {l['cpu']:.1f} | {l['gpu']:.1f} | {l['ulayer']:.1f} | {l['codl-nochain']:.1f} | "
                         f"{l['codl']:.1f} | {l['ideal']:.1f} | {r['published_codl_ms']} | {r['codl_vs_published']:+.0%} | "
                         f"{r['chained_ops']}/{r['n_ops']} |")
    lines += ["", "| platform | speedup over | simulated | published |", "|---|---|---|---|"]
    for b, key in (("µLayer-like", "ulayer"), ("CPU-only", "cpu"), ("GPU-only", "gpu"), ("µLayer max", "ulayer_max")):
        lines.append(f"| Snapdragon (avg of 3) | {b} | {res['snapdragon_speedup_avg'][key]:.2f}× | "
                     f"{pub['speedup_avg']['snapdragon'][key]:.2f}× |")
    for b, key in (("µLayer-like", "ulayer"), ("CPU-only", "cpu"), ("GPU-only", "gpu")):
        lines.append(f"| Kirin 990 | {b} | {res['socs']['kirin990']['speedup_avg'][key]:.2f}× | "
                     f"{pub['speedup_avg']['kirin990'][key]:.2f}× |")
    md = "\n".join(lines)
    (OUT.with_suffix(".md")).write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
