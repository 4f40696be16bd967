"""`tensorplan coexec MODEL`: plan CPU+GPU co-execution (CoDL) and run it, or simulate it on a SoC.

Parses, makes one call (`tensorplan.workflows.coexec.coexec` or `.simulate`) and prints its result."""
from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table


def _print_simulation(r, con: Console) -> None:
    t = Table(title=f"{r.model} on {r.soc} (simulated, seed {r.seed})")
    t.add_column("system"), t.add_column("latency ms", justify="right"), t.add_column("codl speedup", justify="right")
    for s, res in r.systems.items():
        t.add_row(s, f"{res.latency_s * 1e3:.3g}", f"{r.speedup(s):.2f}x")
    con.print(t)
    con.print(f"[dim]{r.note}[/]")


def _print_coexec(r, con: Console) -> None:
    t = Table(title=f"{r.model}: co-execution on {' + '.join(r.processors)} ({r.method})")
    for c in ("ops", "dim", "ratio", "pred ms", "meas ms (min)", "err"):
        t.add_column(c, justify="right")
    for s in r.segments:
        t.add_row(f"{s.start}..{s.end - 1}", s.dim, f"{s.ratio:.1f}", f"{s.predicted.total * 1e3:.3f}",
                  f"{s.measured.total * 1e3:.3f}", f"{s.predicted.total / s.measured.total - 1:+.0%}")
    con.print(t)
    con.print(f"segments: predicted {r.predicted_s * 1e3:.2f} ms, measured {r.measured_min_s * 1e3:.2f} ms "
              f"(min) / {r.measured_median_s * 1e3:.2f} ms (median)")
    w = r.whole_model
    if w is not None:
        t = Table(title=f"{r.model}: whole model, medians of {len(w.ort_rounds)} interleaved rounds")
        for c in ("run", "ms", "segments ms", "cpu-only ops ms", "hand-off ms", "max rel err vs ORT"):
            t.add_column(c, justify="right")
        for name, v in w.plans.items():
            m = v.median
            t.add_row(name, f"{m.total * 1e3:.2f}", f"{m.segments * 1e3:.2f}", f"{m.cpu_ops * 1e3:.2f}",
                      f"{m.handoff * 1e3:.2f}", f"{v.max_rel_err_vs_ort:.1e}")
        for threads, v in w.ort_median_s.items():
            t.add_row(f"ort {threads}t", f"{v * 1e3:.2f}", "", "", "", "")
        con.print(t)


def register(app: typer.Typer) -> None:
    @app.command("coexec")
    def coexec_cmd(
        model: str = typer.Argument(..., help="The model: an ONNX path, a zoo name (e.g. yolov2, vgg-16, posenet, "
                                    "retinaface, candy), or a PyTorch factory as pkg.mod:factory or file.py:factory."),
        processors: str = typer.Option("cpu,cpu2", help="Real processors: 'cpu,cpu2' (two pinned processes on "
                                       "this machine, the second standing in for the GPU) or 'cpu,cuda'."),
        simulate: str = typer.Option("", "--simulate", help="Simulate a SoC instead: sd855 | sd865 | sd888 | "
                                     "kirin990 (every system is compared)."),
        method: str = typer.Option("greedy", help="Chain search on real processors: none | greedy | dp | "
                                   "exhaustive, or one processor alone: cpu | gpu."),
        repeats: int = typer.Option(5, min=1, help="Timed runs per segment and whole-model rounds (real processors)."),
        seed: int = typer.Option(0, min=0, help="Simulator seed."),
        data: str = typer.Option("", help="CoDL training data directory (default: data/codl)."),
        timeline: str = typer.Option("", help="Write a timeline PNG of both processors here."),
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Plan per-op splits (H/OC × ratio) and operator chains; report predicted vs measured (or simulated) latency."""
        from tensorplan.cli.common import output_file

        output_file(timeline, "--timeline")
        con = Console()
        if simulate:
            from tensorplan.workflows.coexec import simulate as simulate_model

            r = simulate_model(model, simulate, seed=seed)
        else:
            from tensorplan.workflows.coexec import coexec

            r = coexec(model, processors, method=method, repeats=repeats, data=data or None)
        out = r.to_dict()
        if timeline:
            out["timeline"] = str(r.save_timeline(timeline))
        if as_json:
            print(json.dumps(out, indent=1, default=float))
        elif simulate:
            _print_simulation(r, con)
        else:
            _print_coexec(r, con)
