"""Would OpenVINO's CPU runtime be a better ONNX Runtime region backend on this machine? (a probe)

Why: efficientvit-b1 and yolox-nano sit 1.7-1.9x above the roofline bound because ONNX Runtime's
convolutions cannot fuse SiLU and run depthwise convolutions at a fifth of peak (docs/results.md);
OpenVINO fuses Swish into its convolutions and has blocked depthwise kernels. This times the same
ONNX files in both runtimes as `tensorplan.workflows.peers` builds them (ONNX Runtime with default
options; OpenVINO with the latency hint at fp32, and OpenVINO's default precision beside it, bf16
on CPUs with bf16 units), same thread count, interleaved as the benchmarks do (random order, 50 ms
pauses, bursts), checks their outputs against ONNX Runtime and flags a noisy run.

OpenVINO is pinned in pyproject.toml (openvino==2026.4.1; tensorplan uses it as a region backend since
this probe, kernels/openvino.py):

    python bench/openvino_probe.py --models yolox-nano,efficientvit-b1   # -> bench/results/openvino_probe.json
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import typer


def main(models: str = typer.Option("yolox-nano,efficientvit-b1", help="Comma-separated zoo models."),
         rounds: int = typer.Option(15, min=1, help="Interleaved rounds."),
         threads: int = typer.Option(2, min=1, help="Threads for every runtime."),
         out: Path = typer.Option(Path("bench/results/openvino_probe.json"), help="Results JSON.")) -> None:
    try:
        import openvino as ov
    except ImportError:
        raise SystemExit("openvino is not installed: .venv/bin/pip install openvino==2026.4.1") from None
    from tensorplan.devices import resolve
    from tensorplan.ir.reference import random_feeds
    from tensorplan.measure.timer import pinned_threads
    from tensorplan.workflows.peers import (OPENVINO, OPENVINO_DEFAULT, ORT, TORCH_COMPILE, openvino_default_precision,
                                            peer_runners, runners_of, time_interleaved)
    from tensorplan.zoo.specs import as_graph
    rows = []
    for m in models.split(","):
        graph = as_graph(m)
        feeds = random_feeds(graph, seed=0)
        with pinned_threads(threads):
            peers = peer_runners(graph, feeds, threads, torch_compile=False)
            peers = [p for p in peers if p.name != TORCH_COMPILE]     # this probe is about OpenVINO
            bad = [f"{p.label}: {p.skipped}" for p in peers if p.skipped]
            if bad:
                raise SystemExit(f"{m}: " + "; ".join(bad))
            t = time_interleaved(runners_of(peers), rounds, peers=peers, burst_s=0.03)
        med = {k: r.median_ms for k, r in t.runners.items()}
        err = {k: r.max_rel_error for k, r in t.runners.items()}
        row = {"model": m, "median_ms": med, "cov": {k: r.cov for k, r in t.runners.items()},
               "openvino_speedup": med[ORT] / med[OPENVINO], "max_rel_err": err[OPENVINO],
               "noisy": t.noisy, "noise_reason": t.noise_reason}
        if OPENVINO_DEFAULT in t.runners:
            d = t.runners[OPENVINO_DEFAULT]
            row.update(openvino_default_precision=d.precision, openvino_default_speedup=med[ORT] / d.median_ms,
                       max_rel_err_default=d.max_rel_error)
        rows.append(row)
        beside = (f"  OpenVINO {row['openvino_default_precision']} {med[OPENVINO_DEFAULT]:8.2f} ms"
                  if OPENVINO_DEFAULT in med else "")
        print(f"{m:18s} ORT {med[ORT]:8.2f} ms  OpenVINO fp32 {med[OPENVINO]:8.2f} ms  "
              f"ORT/OpenVINO {row['openvino_speedup']:.2f}x  rel err {err[OPENVINO]:.1e}{beside}"
              + (f"  NOISY: {t.noise_reason}" if t.noisy else ""), flush=True)
    res = {"bench": "openvino_probe", "openvino": ov.__version__, "rounds": rounds, "threads": threads, "rows": rows,
           "openvino_default_precision": openvino_default_precision(),
           "machine": resolve("local").to_dict(), "created": time.time()}
    out.write_text(json.dumps(res, indent=1, default=float))
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
