"""`tensorplan predict | calibrate`: a model's latency on a device, and a correction for this CPU.

Both parse, make one call (`tensorplan.cdmpp.predict.predict`, `local_calibration.calibrate_here`)
and print its result: a table, or its `to_dict()` as JSON."""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tensorplan.cdmpp.predict import DEFAULT_TUNED

_err = Console(stderr=True)


def _log(msg: str) -> None:
    _err.print(f"[dim]{msg}[/]")


def _dump(obj) -> str:
    return json.dumps(obj, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))


def _checked(label: str, c, n_kernels: int) -> str:
    """One line: a measured check (`MeasuredCheck` or `TunedCheck`): whole model and per kernel."""
    pk = c.per_kernel
    n = getattr(c, "kernels_measured", None) or c.kernels
    return (f"{label}, {n} of {n_kernels} kernels timed: whole model {c.predicted_s * 1e3:.3f} ms predicted vs "
            f"{c.measured_s * 1e3:.3f} ms measured ({c.total_ratio:.2f}×); per kernel MAPE {pk['mape_pct']:.1f}%, "
            f"median APE {pk['median_ape_pct']:.1f}%, within ±20% {pk['acc20_pct']:.0f}%, Spearman "
            f"{c.spearman_across_kernels:.2f}")


def _print_prediction(p, measure: bool) -> None:
    """The per-kernel table (largest share first), what the totals are, and the measured check."""
    # piped or captured output is not cut to rich's 80-column default: the table's nine to twelve
    # columns would wrap their headers there (a terminal, or COLUMNS, sets the width as usual)
    con = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)
    rng = (f" (members {min(p.member_total_s) * 1e3:.3f}–{max(p.member_total_s) * 1e3:.3f} ms)"
           if p.member_total_s else "")
    tuned = bool(p.tuned)
    what = (f"tuned: the predicted-fastest of {p.tuned} schedules per kernel, none timed; untuned "
            f"{p.untuned_total_s * 1e3:.3f} ms" if tuned else "untuned: default schedules")
    t = Table(title=f"{p.model} on {p.domain} ({p.predictor}): {p.total_s * 1e3:.3f} ms predicted{rng}, {what}")
    spread = all(k.log_spread is not None for k in p.kernels)
    # the columns describe each kernel's pick (the schedule the total counts); under --tuned the default
    # schedule's prediction and time follow, "=" where the pick is the default.
    # a kernel predicted below its roofline floor is marked * (each floor is in --json)
    cols = ["kernel", "calls", "MFLOP", "leaves", "pred µs"] + (["spread ×"] if spread else []) + (
        ["meas µs", "pred/meas"] if measure else []) + ["× calls µs", "share"] + (
        ["untuned pred µs"] + (["untuned meas µs"] if measure else []) if tuned else [])
    for c in cols:
        t.add_column(c, justify="left" if c == "kernel" else "right")
    tot = max(p.total_s, 1e-15)
    for k in sorted(p.kernels, key=lambda k: -k.pick_total_s):
        # spread ×: exp(std of the ensemble members' log predictions), 1.00 = full agreement
        extra = [f"{math.exp(k.log_spread):.2f}"] if spread else []
        s, d = k.pick, k.default
        pred = f"{s.predicted_s * 1e6:.1f}" + ("[bold red]*[/]" if k.below_floor else "")
        if measure:
            extra += ([f"{s.measured_s * 1e6:.1f}", f"{s.predicted_s / s.measured_s:.2f}"] if s.measured_s
                      else [s.measure_error or "-", "-"])
        tail = []
        if tuned:
            same = s.sample == d.sample
            tail = ["=" if same else f"{d.predicted_s * 1e6:.1f}"]
            if measure:
                tail.append("=" if same else f"{d.measured_s * 1e6:.1f}" if d.measured_s else (d.measure_error or "-"))
        name = k.name + (" (loop nest)" if d.kind == "unscheduled" else "")
        t.add_row(name, str(k.calls), f"{k.flops / 1e6:.2f}", str(k.leaves), pred, *extra,
                  f"{k.pick_total_s * 1e6:.1f}", f"{100 * k.pick_total_s / tot:.1f}%", *tail)
    con.print(t)
    con.print(f"[dim]{p.what}[/]")
    if tuned:
        changed = sum(k.tuned.sample != k.default.sample for k in p.kernels if k.tuned is not None)
        con.print(f"tuned total {p.total_s * 1e3:.3f} ms predicted ({changed} of {len(p.kernels)} kernels pick "
                  f"another schedule than the default); untuned total (default schedules, --untuned) "
                  f"{p.untuned_total_s * 1e3:.3f} ms predicted")
    if p.floor_s is not None:
        con.print(f"[dim]roofline floor of the whole model: {p.floor_s * 1e3:.4g} ms (per kernel: max(FLOPs / "
                  f"{p.device.peak_fp32_gflops:g} GFLOP/s, output bytes beyond the caches / "
                  f"{p.device.mem_bw_gbs:g} GB/s)); {len(p.below_floor)} kernel(s) predicted below it (marked *)"
                  + ("; the total is below it too" if p.total_below_floor else "") + "[/]")
    _log(f"{len(p.kernels)} kernels; sample + featurize {p.featurize_s:.1f} s, predict {p.predict_s * 1e3:.1f} ms")
    m = p.measured
    if m and m.kernels_measured:
        mt = m.tuned
        if mt:
            con.print(_checked(f"tuned picks measured at {m.threads} thread(s)", mt, len(p.kernels))
                      + f"; {mt.measured_speedup:.2f}× faster than the default schedules measured "
                      f"({mt.default_measured_s * 1e3:.3f} ms); {mt.kernels_slower} kernel(s) got slower")
        con.print(_checked(f"{'untuned default schedules' if tuned else 'default schedules'} measured at "
                           f"{m.threads} thread(s)", m, len(p.kernels)))
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
        tuned: Optional[int] = typer.Option(None, "--tuned", min=1, help="Schedules ranked per kernel (default "
                                            f"{DEFAULT_TUNED}): the model ranks each kernel's first N design-space "
                                            "schedules, none timed, and the total sums the predicted-fastest ones "
                                            "(with --measure: timed too)."),
        untuned: bool = typer.Option(False, "--untuned", help="Predict each kernel's default schedule only (what "
                                     "TVM runs for a kernel nobody tuned) instead of the tuned picks."),
        save_schedules: Optional[Path] = typer.Option(None, "--save-schedules", help="Write each kernel's "
                                                      "scheduled program (the tuned pick, or the default with "
                                                      "--untuned) as TVMScript into this directory, with an index."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Predict per-kernel and whole-model latency with CDMPP.

        The total sums each kernel's tuned pick (the predicted-fastest of its first N sampled schedules,
        none timed); the untuned total (default schedules) is shown beside it, and --untuned predicts
        the default schedules alone."""
        from tensorplan.cdmpp.predict import predict
        from tensorplan.ir.onnx_import import parse_input_shapes

        if untuned and tuned is not None:
            raise typer.BadParameter("--untuned predicts the default schedules only; leave out --tuned N",
                                     param_hint="--untuned")
        n = 0 if untuned else DEFAULT_TUNED if tuned is None else tuned
        p = predict(model, device, tuned=n, measure=measure, weights=weights, calibrated=not shipped,
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
        ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Time the programs on this Ray "
                                                  "cluster's workers offering this CPU at --threads (the same "
                                                  "device identity; `tensorplan devices --ray-resources`); "
                                                  "'auto': the cluster this machine belongs to."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Time a few dataset programs on this CPU (minutes) and calibrate the predictor to it.

        The correction is checked on tasks it was not fitted on (5 folds) against the model as
        `predict` uses it here, and installed only where it wins (or with --force)."""
        from tensorplan.cdmpp.local_calibration import calibrate_here

        c = calibrate_here(threads or None, n_tasks=tasks, per_task=per_task, data=data, model=model, out=out,
                           exclude_networks=[x for x in exclude.split(",") if x], max_mad=max_mad, force=force,
                           progress=not json_out, log=None if json_out else _log, ray_address=ray_address)
        if json_out:
            print(_dump(c.to_dict()))
            return
        h = c.held_out
        cmp = (f"on tasks it was not fitted on: MAPE {h.model_here['mape_pct']:.1f}% uncalibrated → "
               f"{h.calibrated['mape_pct']:.1f}% calibrated; " if h.calibrated is not None else "")
        where = "on the Ray cluster" if ray_address else "here"
        Console().print(f"{c.n_timed} programs of {len(c.tasks)} tasks timed {where} at {c.threads} thread(s) in "
                        f"{c.time_s:.0f} s; this CPU / collection CPU ({c.source}): "
                        f"{c.here_vs_source_median_ratio:.2f}× (median); {cmp}"
                        + (f"saved {c.path} (`tensorplan predict MODEL --device local --measure` to check it "
                           "on a network)" if c.installed else
                           "not installed: the uncalibrated model predicts this CPU better, `predict` keeps it "
                           "(--force to install anyway)"))
