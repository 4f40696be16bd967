"""Held-out device from one source domain vs from several (CDMPP's cross-device recipe).

CDMPP pre-trains on every device but the target, so its device-feature path sees devices vary;
with one source domain that path sees a single vector. This runs `tensorplan predictor evaluate --splits
device` for each target with one source (the same CPU's matching thread count on the Zen 5 host)
and with every domain of the other machines, same models, same few-shot selections (the target
side of the split does not depend on the sources), and tabulates MAPE.

Each run is one `tensorplan predictor evaluate` call writing `<results-dir>/<target>_<variant>.json`; runs
whose JSON exists are skipped (resumable), `--summarize-only` just rebuilds the table.

    python research/cdmpp/cdmpp_multisource.py            # ~6 min per run on the 2-core VM, 9 runs
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import typer

CPU = "data/cdmpp"
BOTH = "data/cdmpp,data/cdmpp-h100"
ALL_CPU = "local-1t,local-2t,zen4-1t,zen4-2t,gpuhost-1t,gpuhost-16t"
#: (target, variant, data, sources): "single" = one source domain, "multi" = every other machine's
RUNS = [
    ("zen4-1t", "single", CPU, "local-1t"),
    ("zen4-1t", "multi-1t", CPU, "local-1t,gpuhost-1t"),
    ("zen4-1t", "multi", CPU, "local-1t,local-2t,gpuhost-1t,gpuhost-16t"),
    ("gpuhost-1t", "single", CPU, "local-1t"),
    ("gpuhost-1t", "multi", CPU, "local-1t,local-2t,zen4-1t,zen4-2t"),
    ("gpuhost-16t", "single", CPU, "local-2t"),
    ("gpuhost-16t", "multi", CPU, "local-1t,local-2t,zen4-1t,zen4-2t"),
    ("h100", "single", BOTH, "local-1t"),
    ("h100", "multi", BOTH, ALL_CPU),
]
COLUMNS = [("zero_shot", "zero-shot"), ("fewshot_kmeans", "few-shot KMeans"), ("fewshot_random", "few-shot random"),
           ("calibrated_kmeans", "calibrated KMeans"), ("calibrated_random", "calibrated random")]


def summarize(results_dir: Path) -> dict:
    rows = []
    for target, variant, data, sources in RUNS:
        f = results_dir / f"{target}_{variant}.json"
        if not f.exists():
            continue
        res = json.loads(f.read_text())
        dv = res["splits"]["device"]
        for model, m in dv["models"].items():
            rows.append({"target": target, "variant": variant, "sources": dv["source"], "model": model,
                         "n_train": dv["n_train"], "n_test": dv["n_test"],
                         "n_fewshot_kmeans": dv["fewshot"]["kmeans"]["n_target_samples"],
                         **{k: m[k]["mape_pct"] for k, _ in COLUMNS},
                         "wall_time_s": res["wall_time_s"], "machine": res["machine"]})
    return {"bench": "cdmpp_multisource", "rows": rows}


def markdown(summary: dict) -> str:
    L = ["| target | sources | train / test / few-shot | model | " + " | ".join(h for _, h in COLUMNS) + " |",
         "|---|---|---|---|" + "---:|" * len(COLUMNS)]
    for r in summary["rows"]:
        if r["model"] == "roofline":
            continue
        L.append(f"| {r['target']} | {r['sources']} | {r['n_train']:,} / {r['n_test']:,} / {r['n_fewshot_kmeans']} | "
                 f"{r['model']} | " + " | ".join(f"{r[k]:.1f}" for k, _ in COLUMNS) + " |")
    return "\n".join(L)


def main(results_dir: Path = typer.Option(Path("research/cdmpp/results/cdmpp_multisource"), "--results-dir"),
         models: str = typer.Option("cdmpp,xgboost,mlp,roofline", "--models"),
         time_scale: float = typer.Option(0.625, "--time-scale", help="As the harness's published runs."),
         summarize_only: bool = typer.Option(False, "--summarize-only")) -> None:
    results_dir.mkdir(parents=True, exist_ok=True)
    if not summarize_only:
        for target, variant, data, sources in RUNS:
            out = results_dir / f"{target}_{variant}.json"
            if out.exists():
                continue
            cmd = [sys.executable, str(Path(__file__).with_name("evaluate_variants.py")), "--data", data, "--splits", "device",
                   "--models", models, "--time-scale", str(time_scale), "--source", sources,
                   "--target", target, "--out", str(out)]
            print(" ".join(cmd[1:]), flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    s = summarize(results_dir)
    (results_dir.parent / "cdmpp_multisource.json").write_text(json.dumps(s, indent=1))
    print(markdown(s))


if __name__ == "__main__":
    typer.run(main)
