"""`tensorplan predict | calibrate`: a model's latency on a device, and a correction for this CPU.

Both parse, make one call (`tensorplan.cdmpp.predict.predict`, `local_calibration.calibrate_here`)
and print its result: a table, or its `to_dict()` as JSON."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

_err = Console(stderr=True)


def _log(msg: str) -> None:
    _err.print(f"[dim]{msg}[/]")


def _dump(obj) -> str:
    return json.dumps(obj, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))


def _print_prediction(p, measure: bool) -> None:
    """The per-kernel table (largest share first), what the totals are, and the measured check."""
    con = Console()
    rng = (f" (members {min(p.member_total_s) * 1e3:.3f}–{max(p.member_total_s) * 1e3:.3f} ms)"
           if p.member_total_s else "")
    t = Table(title=f"{p.model} on {p.domain} ({p.predictor}): {p.total_s * 1e3:.3f} ms predicted, "
                    f"default (untuned) schedules{rng}")
    spread = all(k.log_spread is not None for k in p.kernels)
    tuned = bool(p.tuned)
    # a kernel predicted below its roofline floor is marked * (each floor is in --json)
    cols = ["kernel", "calls", "MFLOP", "leaves", "pred µs"] + (["spread ×"] if spread else []) + (
        ["meas µs", "pred/meas"] if measure else []) + ["× calls µs", "share"] + (
        ["tuned pred µs"] + (["tuned meas µs"] if measure else []) if tuned else [])
    for c in cols:
        t.add_column(c, justify="left" if c == "kernel" else "right")
    tot = max(p.total_s, 1e-15)
    for k in sorted(p.kernels, key=lambda k: -k.total_s):
        # spread ×: exp(std of the ensemble members' log predictions), 1.00 = full agreement
        extra = [f"{math.exp(k.log_spread):.2f}"] if spread else []
        d = k.default
        pred = f"{d.predicted_s * 1e6:.1f}" + ("[bold red]*[/]" if k.below_floor else "")
        if measure:
            extra += ([f"{d.measured_s * 1e6:.1f}", f"{d.predicted_s / d.measured_s:.2f}"] if d.measured_s
                      else [d.measure_error or "-", "-"])
        tail = []
        if tuned and k.tuned is not None:   # the model's pick among the kernel's first N schedules ("=": the default)
            tail = [f"{k.tuned.predicted_s * 1e6:.1f}" + (" =" if k.tuned.sample == d.sample else "")]
            if measure:
                tail.append(f"{k.tuned.measured_s * 1e6:.1f}" if k.tuned.measured_s else (k.tuned.measure_error or "-"))
        name = k.name + (" (loop nest)" if d.kind == "unscheduled" else "")
        t.add_row(name, str(k.calls), f"{k.flops / 1e6:.2f}", str(k.leaves), pred, *extra,
                  f"{k.total_s * 1e6:.1f}", f"{100 * k.total_s / tot:.1f}%", *tail)
    con.print(t)
    con.print(f"[dim]{p.what}[/]")
    if p.floor_s is not None:
        con.print(f"[dim]roofline floor of the whole model: {p.floor_s * 1e3:.4g} ms (per kernel: max(FLOPs / "
                  f"{p.device.peak_fp32_gflops:g} GFLOP/s, output bytes beyond the caches / "
                  f"{p.device.mem_bw_gbs:g} GB/s)); {len(p.below_floor)} kernel(s) predicted below it (marked *)"
                  + ("; the total is below it too" if p.total_below_floor else "") + "[/]")
    _log(f"{len(p.kernels)} kernels; featurize {p.featurize_s:.1f} s, predict {p.predict_s * 1e3:.1f} ms")
    m = p.measured
    if m and m.kernels_measured:
        pk = m.per_kernel
        con.print(f"measured at {m.threads} thread(s), {m.kernels_measured} of {len(p.kernels)} kernels: "
                  f"whole model {m.predicted_s * 1e3:.3f} ms predicted vs {m.measured_s * 1e3:.3f} ms measured "
                  f"({m.total_ratio:.2f}×); per kernel MAPE {pk['mape_pct']:.1f}%, median APE "
                  f"{pk['median_ape_pct']:.1f}%, within ±20% {pk['acc20_pct']:.0f}%, Spearman "
                  f"{m.spearman_across_kernels:.2f}")
    if tuned:
        changed = sum(k.tuned.sample != k.default.sample for k in p.kernels if k.tuned is not None)
        con.print(f"tuned (the predicted-fastest of each kernel's first {p.tuned} schedules; {changed} of "
                  f"{len(p.kernels)} kernels change): {p.tuned_total_s * 1e3:.3f} ms predicted")
        mt = m.tuned if m else None
        if mt:
            con.print(f"tuned, measured over {mt.kernels} kernels: {mt.predicted_s * 1e3:.3f} ms predicted vs "
                      f"{mt.measured_s * 1e3:.3f} ms measured ({mt.total_ratio:.2f}×); {mt.measured_speedup:.2f}× "
                      f"faster than the default schedules measured ({mt.default_measured_s * 1e3:.3f} ms); "
                      f"{mt.kernels_slower} kernels got slower")
    if p.schedules_dir is not None:
        _log(f"schedules: {p.schedules_dir}/ (TVMScript per kernel, index in schedules.json)")
    if m and m.kernels_failed:
        _log(f"not measured: {', '.join(m.kernels_failed)}")
    if p.warning:
        _err.print(f"[yellow]warning:[/] {p.warning}")
    if p.floor_warning:
        _err.print(f"[yellow]warning:[/] {p.floor_warning}")


def register(app: typer.Typer) -> None:
    @app.command("predict")
    def predict_cmd(
        model: str = typer.Argument(..., help="The model: an ONNX path, a zoo name (`tensorplan zoo`), or a "
                                    "PyTorch factory as pkg.mod:factory or file.py:factory."),
        device: str = typer.Option("local", "--device", help="'local' (this CPU, every usable core), "
                                   "'local-<N>t' (this CPU at N threads) or a catalog name (`tensorplan devices`); "
                                   "a GPU such as h100 is predicted from its CUDA schedules, no GPU needed."),
        weights: Optional[Path] = typer.Option(None, "--weights", help="Predictor file (default: the shipped "
                                               "CDMPP: the H100 one for a GPU device, the CPU one otherwise)."),
        measure: bool = typer.Option(False, "--measure", help="Also compile and time every kernel here "
                                     "(same schedule) and compare; this CPU's devices only."),
        shipped: bool = typer.Option(False, "--shipped", help="Ignore this machine's `tensorplan calibrate` "
                                     "model and predict with the shipped one."),
        input_shape: list[str] = typer.Option(None, "--input-shape", help="NAME=D1,D2,... (repeatable): static "
                                              "shapes for a model with symbolic dimensions."),
        tuned: int = typer.Option(0, "--tuned", min=0, help="Also rank each kernel's first N design-space schedules with "
                                  "the model and report the network with the predicted-fastest ones (with --measure: "
                                  "timed too)."),
        save_schedules: Optional[Path] = typer.Option(None, "--save-schedules", help="Write each kernel's "
                                                      "scheduled program (the --tuned pick, else the default) as "
                                                      "TVMScript into this directory, with an index."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Predict per-kernel and whole-model latency with CDMPP.

        The total sums each kernel's default schedule (first valid sample): the latency of TVM's untuned kernels."""
        from tensorplan.cdmpp.predict import predict
        from tensorplan.ir.onnx_import import parse_input_shapes

        p = predict(model, device, tuned=tuned, measure=measure, weights=weights, calibrated=not shipped,
                    input_shapes=parse_input_shapes(input_shape) or None, save_schedules=save_schedules,
                    progress=not json_out, log=None if json_out else _log)
        if json_out:
            print(_dump(p.to_dict()))
        else:
            _print_prediction(p, measure)

    @app.command("calibrate")
    def calibrate_cmd(
        threads: int = typer.Option(0, "--threads", help="Thread count to calibrate (default: every usable core, "
                                    "as `predict --device local`)."),
        tasks: int = typer.Option(40, "--tasks", min=1, help="Tasks to select (KMeans over the dataset's programs)."),
        per_task: int = typer.Option(4, "--per-task", min=1, help="Programs timed here per selected task."),
        max_mad: float = typer.Option(0.05, "--max-mad", help="Leave out timings whose repeat MAD/median "
                                      "exceeds this."),
        exclude: str = typer.Option("", "--exclude-networks", help="Comma-separated networks whose tasks "
                                    "are not used (to test the calibration on kernels it never timed)."),
        data: Optional[Path] = typer.Option(None, "--data", help="Dataset directory (default: data/cdmpp/)."),
        model: Optional[Path] = typer.Option(None, "--model", help="Model to calibrate (default: shipped)."),
        out: Optional[Path] = typer.Option(None, "--out", help="Where to save (default: the cache, where "
                                           "`predict --device local` finds it)."),
        force: bool = typer.Option(False, "--force", help="Install the calibration even where, on tasks it was "
                                   "not fitted on, it predicts worse than the uncalibrated model."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Time a few dataset programs on this CPU (minutes) and calibrate the predictor to it.

        The correction is checked on tasks it was not fitted on (5 folds) against the model as
        `predict` uses it here, and installed only where it wins (or with --force)."""
        from tensorplan.cdmpp.local_calibration import calibrate_here

        c = calibrate_here(threads or None, n_tasks=tasks, per_task=per_task, data=data, model=model, out=out,
                           exclude_networks=[x for x in exclude.split(",") if x], max_mad=max_mad, force=force,
                           progress=not json_out, log=None if json_out else _log)
        if json_out:
            print(_dump(c.to_dict()))
            return
        h = c.held_out
        cmp = (f"on tasks it was not fitted on: MAPE {h.model_here['mape_pct']:.1f}% uncalibrated → "
               f"{h.calibrated['mape_pct']:.1f}% calibrated; " if h.calibrated is not None else "")
        Console().print(f"{c.n_timed} programs of {len(c.tasks)} tasks timed here at {c.threads} thread(s) in "
                        f"{c.time_s:.0f} s; this CPU / collection CPU ({c.source}): "
                        f"{c.here_vs_source_median_ratio:.2f}× (median); {cmp}"
                        + (f"saved {c.path} (`tensorplan predict MODEL --device local --measure` to check it "
                           "on a network)" if c.installed else
                           "not installed: the uncalibrated model predicts this CPU better, `predict` keeps it "
                           "(--force to install anyway)"))
