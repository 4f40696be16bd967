"""Run the benchmarks behind docs/results.md, then re-render it (`make bench`).

Each step is the exact command the docs quote; results land in bench/results/ and
`bench/summarize.py` turns them into docs/results.md. The full set takes hours (korch_bench
alone one to two), so `--only` / `--skip` pick steps and `--list` shows them. Steps run one
after another: timings taken side by side would measure each other. The CDMPP experiments have
their own list of steps, `research/run_experiments.py`, which runs through `main` here.

Usage: python bench/run_all.py [--list] [--only NAME,...] [--skip NAME,...] [--keep-going]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TP = str(Path(PY).with_name("tensorplan"))  # the CLI of the same environment

#: (name, command, rough minutes on the 2-core development VM)
STEPS: list[tuple[str, list[str], float]] = [
    ("device", [PY, "bench/device_numbers.py", "--rounds", "5"], 3),
    ("store", [PY, "bench/store_throughput.py"], 2),
    ("import", [PY, "bench/import_check.py"], 8),
    ("kernels", [PY, "bench/korch_kernels.py"], 5),
    ("candidates", [PY, "bench/korch_candidates.py", "--check", "--fresh"], 55),
    ("korch", [PY, "bench/korch_bench.py", "--results-dir", "bench/results/korch_rewrite", "--force"], 120),
    # YOLOX-nano sits on the 1.5x roofline line and this VM has fast and slow phases: five more runs
    # of the same command give docs/results.md its run-to-run table
    *((f"korch-repeat-{i}", [PY, "bench/korch_bench.py", "--models", "yolox-nano", "--results-dir",
                             f"bench/results/korch_repeats/yolox-nano/run{i}", "--force"], 1.5) for i in range(1, 6)),
    ("standalone", [PY, "bench/korch_standalone.py", "--models",
                    "candy,segformer-b0,efficientvit-b1,yolox-nano,yolov4,resnet-50,bert-base"], 15),
    ("export", [PY, "bench/export_bench.py"], 3),
    ("beyond-zoo", [PY, "bench/beyond_zoo.py"], 12),
    ("ort-profile", [PY, "bench/ort_profile.py", "--models", "efficientvit-b1,yolox-nano,segformer-b0,candy"], 1),
    ("korch-gpu", [PY, "bench/korch_gpu.py", "--models", "candy", "efficientvit-b1", "yolox-nano", "bert-base",
                   "resnet-50", "segformer-b0", "yolov4"], 60),
    ("openvino", [PY, "bench/openvino_probe.py", "--models",
                  "yolox-nano,efficientvit-b1,segformer-b0,candy,yolov4,resnet-50,bert-base"], 10),
    ("winograd", [PY, "bench/winograd_probe.py"], 1),
    ("codl-predictor", [PY, "bench/codl_predictor.py"], 5),
    ("codl-coexec", [PY, "bench/codl_coexec.py"], 10),
    ("codl-simulate", [PY, "bench/codl_simulate.py", "--seeds", "3"], 5),
    # CDMPP and its baselines on the three splits (docs/results.md, "CDMPP: prediction accuracy")
    ("cdmpp-accuracy", [TP, "predictor", "evaluate", "--devices", "local-1t,local-2t", "--holdout",
                    "efficientvit-b1,tiny-mlp,mobilenet-v2", "--time-scale", "0.625",
                    "--out", "bench/results/cdmpp_eval.json"], 80),
    # `tensorplan predict --measure` with the default tuned picks on the 7 models and 3 outside the dataset,
    # against ONNX Runtime in the same run (issue 59)
    ("predict-tuned", [PY, "bench/predict_tuned.py"], 60),
    # the ONNX project's backend node tests against tensorplan and ONNX Runtime (issue 60)
    ("onnx-conformance", [PY, "bench/onnx_conformance.py"], 1),
    # tensorplan optimize on the 7 Korch models and 6 others, cold store, against the peers (issue 59)
    ("optimize", [PY, "bench/optimize_bench.py"], 240),
    ("ray", [PY, "bench/ray_bench.py", "--rounds", "5"], 10),
    ("precision", [PY, "bench/precision_bench.py", "--budget", "4m"], 90),
    ("precision-matched", [PY, "bench/precision_bench.py", "--budget", "4m", "--tolerance", "openvino-default",
                           "--results-dir", "bench/results/precision_match",
                           "--out", "bench/results/precision_bench_match.json"], 90),
    ("summarize", [PY, "bench/summarize.py"], 0.1),
]


def main(argv: list[str] | None = None, steps: list[tuple[str, list[str], float]] = STEPS,
         description: str = __doc__.splitlines()[0]) -> int:
    """Run `steps` (default: this file's) as the command line `argv` asks."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--list", action="store_true", help="Show the steps and exit.")
    ap.add_argument("--only", default="", help="Comma-separated step names to run (summarize always runs last).")
    ap.add_argument("--skip", default="", help="Comma-separated step names to leave out.")
    ap.add_argument("--keep-going", action="store_true", help="Run the remaining steps after a failure.")
    a = ap.parse_args(argv)
    names = [s[0] for s in steps]
    only = [x for x in a.only.split(",") if x]
    skip = [x for x in a.skip.split(",") if x]
    bad = sorted(set(only + skip) - set(names))
    if bad:
        ap.error(f"unknown step(s) {bad}; steps: {', '.join(names)}")
    chosen = [s for s in steps if (not only or s[0] in only or s[0] == "summarize") and s[0] not in skip]
    if a.list:
        for name, cmd, minutes in steps:
            print(f"{name:15s} ~{minutes:>5.1f} min  {' '.join(_shown(c) for c in cmd)}")
        return 0
    failed = []
    for name, cmd, minutes in chosen:
        print(f"== {name} (~{minutes:.0f} min): {' '.join(cmd)}", flush=True)
        t0 = time.time()
        rc = subprocess.call(cmd, cwd=ROOT)
        print(f"== {name}: exit {rc} after {(time.time() - t0) / 60:.1f} min", flush=True)
        if rc != 0:
            failed.append(name)
            if not a.keep_going:
                break
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _shown(arg: str) -> str:
    """A command word as the docs quote it: the interpreter and installed scripts by their name."""
    return Path(arg).name if arg == PY or Path(arg).parent == Path(PY).parent else arg


if __name__ == "__main__":
    sys.exit(main())
