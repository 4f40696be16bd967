"""What a user gets from `tensorplan export`: each benchmark model's plan as one ONNX file, run by
stock ONNX Runtime, checked and timed against the original model in ONNX Runtime, interleaved.

Per model it exports the plan `bench/korch_bench.py` kept (in the cache, `plans/MODEL.json`) when
there is one, so the result says whether the file *is* the plan; otherwise the model's exact
rewrites (`tensorplan export MODEL`), which is the same file when the plan is one ONNX Runtime
session. Models run one after the other, nothing else timed at the same time.

Usage: python bench/export_bench.py [--models a,b] [--rounds 15] [--out bench/results/export.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = "candy,segformer-b0,efficientvit-b1,yolox-nano,yolov4,resnet-50,bert-base"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=MODELS, help="comma-separated zoo names")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-plans", dest="plans", action="store_false",
                    help="export the models' rewrites even where a cached plan exists")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "export.json"))
    a = ap.parse_args()
    from tensorplan.devices.detect import machine_info
    from tensorplan.paths import cache_dir
    from tensorplan.workflows.export import export_onnx

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            plan = cache_dir() / "plans" / f"{name}.json"
            target = str(plan) if a.plans and plan.exists() else name
            res = export_onnx(target, Path(tmp) / f"{name}.onnx", threads=a.threads, rounds=a.rounds)
            d = res.to_dict()
            d.pop("path")
            d["target"] = "plan" if target != name else "model"
            d["loadavg"] = list(os.getloadavg())
            rows.append(d)
            tm = d["timing"]
            print(f"{name}: {res.relation}; original {tm['original_ms']:.2f} ms, exported {tm['exported_ms']:.2f} ms "
                  f"({tm['speedup']:.2f}x), max rel err {res.max_rel_err:.1e}", flush=True)
    out = {"machine": machine_info(threads=a.threads), "command": " ".join(sys.argv), "models": rows}
    Path(a.out).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
