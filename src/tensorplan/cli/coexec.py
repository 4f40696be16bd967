"""`tensorplan coexec MODEL`: plan CPU+GPU co-execution (CoDL) and measure or simulate it."""
from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from tensorplan.errors import TensorplanError


def register(app: typer.Typer) -> None:
    @app.command("coexec")
    def coexec(
        model: str = typer.Argument(..., help="ONNX path or zoo name (e.g. yolov2, vgg-16, posenet, retinaface, candy)"),
        processors: str = typer.Option("cpu,cpu2", help="real processors: 'cpu,cpu2' (two pinned processes, "
                                       "this machine) or 'cpu,cuda'"),
        simulate: str = typer.Option("", "--simulate", help="simulate a SoC instead: sd855 | sd865 | sd888 | kirin990"),
        method: str = typer.Option("greedy", help="chain search: none | greedy | dp | exhaustive | cpu | gpu "
                                   "(real processors; --simulate compares every system)"),
        repeats: int = typer.Option(5, help="timed runs per segment (real processors)"),
        seed: int = typer.Option(0, help="simulator seed"),
        data: str = typer.Option("", help="CoDL training data dir (default: data/codl)"),
        timeline: str = typer.Option("", help="write a timeline PNG of both processors here"),
        as_json: bool = typer.Option(False, "--json", help="print JSON"),
    ) -> None:
        """Plan per-op splits (H/OC × ratio) and operator chains; report predicted vs measured (or simulated) latency."""
        con = Console()
        if simulate:
            from tensorplan.zoo.specs import load_model
            from tensorplan.codl.simulate import SYSTEMS, calibrate, plot_timeline
            from tensorplan.codl.simulate import simulate as sim

            g = load_model(model)
            m = calibrate(simulate)
            res = {s: sim(g, m, s, seed=seed) for s in SYSTEMS}
            out = {"model": model, "soc": simulate, "seed": seed,
                   "systems": {s: r.to_dict() for s, r in res.items()},
                   "note": "simulated: planner quality given the SoC model, not a device measurement"}
            if timeline:
                plot_timeline(res["codl"].events, timeline, f"{model} on {simulate} (simulated CoDL)")
                out["timeline"] = timeline
            if as_json:
                print(json.dumps(out, indent=1, default=float))
                return
            t = Table(title=f"{model} on {simulate} (simulated, seed {seed})")
            t.add_column("system"), t.add_column("latency ms", justify="right"), t.add_column("codl speedup", justify="right")
            for s, r in res.items():
                t.add_row(s, f"{r.latency_s * 1e3:.3g}", f"{r.latency_s / res['codl'].latency_s:.2f}x")
            con.print(t)
            return
        procs = tuple(p.strip() for p in processors.split(","))
        if procs == ("cpu", "cuda"):
            import torch

            if not torch.cuda.is_available():
                raise TensorplanError("--processors cpu,cuda: no CUDA device here; use cpu,cpu2 or --simulate")
            raise TensorplanError("--processors cpu,cuda: no CUDA latency data collected yet; "
                                  "the CUDA co-executor (CudaCoexecutor) runs single segments (see docs/codl.md)")
        if procs != ("cpu", "cpu2"):
            raise TensorplanError(f"--processors {processors!r}: use 'cpu,cpu2' or 'cpu,cuda'")
        from tensorplan.codl.coexecutor import coexec_model

        res = coexec_model(model, method, data or None, repeats)
        if timeline:
            from tensorplan.codl.simulate import plot_timeline

            plot_timeline(res["events"], timeline, f"{model}: cpu (NCHW) + cpu2 (NHWC), measured")
            res["timeline"] = timeline
        if as_json:
            print(json.dumps({k: v for k, v in res.items() if k != "events"}, indent=1, default=float))
            return
        t = Table(title=f"{model}: co-execution on cpu + cpu2 ({method})")
        for c in ("ops", "dim", "ratio", "pred ms", "meas ms (min)", "err"):
            t.add_column(c, justify="right")
        for s in res["segments"]:
            t.add_row(f"{s['ops'][0]}..{s['ops'][1] - 1}", s["dim"], f"{s['ratio']:.1f}",
                      f"{s['predicted']['total'] * 1e3:.3f}", f"{s['measured_min']['total'] * 1e3:.3f}",
                      f"{s['predicted']['total'] / s['measured_min']['total'] - 1:+.0%}")
        con.print(t)
        con.print(f"segments: predicted {res['predicted_s'] * 1e3:.2f} ms, measured {res['measured_min_s'] * 1e3:.2f} ms "
                  f"(min) / {res['measured_median_s'] * 1e3:.2f} ms (median)")
        w = res.get("whole_model")
        if w:
            t = Table(title=f"{model}: whole model, medians of {repeats} interleaved rounds")
            for c in ("run", "ms", "segments ms", "cpu-only ops ms", "hand-off ms", "max rel err vs ORT"):
                t.add_column(c, justify="right")
            for name, v in w["plans"].items():
                m = v["median_s"]
                t.add_row(name, f"{m['total'] * 1e3:.2f}", f"{m['segments'] * 1e3:.2f}", f"{m['cpu_ops'] * 1e3:.2f}",
                          f"{m['handoff'] * 1e3:.2f}", f"{v['max_rel_err_vs_ort']:.1e}")
            for k, v in w["ort_median_s"].items():
                t.add_row(k.replace("_", " "), f"{v * 1e3:.2f}", "", "", "", "")
            con.print(t)
