"""`tensorplan predict | calibrate`: a model's latency on a device, and a correction for this CPU."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from tensorplan.errors import TensorplanError

_err = Console(stderr=True)


def _log(msg: str) -> None:
    _err.print(f"[dim]{msg}[/]")


def _leaf_counts(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint="--leaves") from None


def _dump(obj) -> str:
    return json.dumps(obj, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))


def register(app: typer.Typer) -> None:
    @app.command("predict")
    def predict_cmd(
        model: str = typer.Argument(..., help="ONNX path or zoo name."),
        device: str = typer.Option("local", "--device", help="Device domain ('local' = this CPU; a GPU such as "
                                   "h100 is predicted from CUDA schedules, no GPU needed)."),
        weights: Optional[Path] = typer.Option(None, "--weights", help="Predictor file (default: the shipped "
                                               "CDMPP: the H100 one for a GPU device, the CPU one otherwise)."),
        measure: bool = typer.Option(False, "--measure", help="Also compile and time every kernel here "
                                     "(same schedule) and compare; 'local' devices only."),
        shipped: bool = typer.Option(False, "--shipped", help="Ignore this machine's `tensorplan calibrate` "
                                     "model and predict with the shipped one."),
        input_shape: list[str] = typer.Option(None, "--input-shape", help="NAME=D1,D2,... (repeatable): static "
                                              "shapes for a model with symbolic dimensions."),
        tuned: int = typer.Option(0, "--tuned", help="Also rank each kernel's first N design-space schedules with "
                                  "the model and report the network with the predicted-fastest ones (with --measure: "
                                  "timed too, so you see what the picks are worth)."),
        save_schedules: Optional[Path] = typer.Option(None, "--save-schedules", help="Write each kernel's "
                                                      "scheduled program (the --tuned pick, else the default) as "
                                                      "TVMScript into this directory, with an index."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Predict per-kernel and whole-model latency of a network with CDMPP (--measure: and check it)."""
        from tensorplan.ir.onnx_import import parse_input_shapes
        from tensorplan.cdmpp.predict import predict_network

        r = predict_network(model, device=device, weights=weights, log=None if json_out else _log,
                            measure=measure, progress=not json_out, calibrated=not shipped,
                            input_shapes=parse_input_shapes(input_shape) or None, tuned=tuned,
                            save_schedules=save_schedules)
        if json_out:
            print(_dump(r))
            return
        rng = (f" (members {min(r['member_total_ms']):.3f}–{max(r['member_total_ms']):.3f} ms)"
               if r.get("member_total_ms") else "")
        t = Table(title=f"{r['model']} on {r['domain']} ({r['predictor']}): {r['total_ms']:.3f} ms predicted{rng}")
        spread = all("log_spread" in k for k in r["kernels"])
        cols = ["kernel", "calls", "MFLOP", "leaves", "pred µs"] + (["spread ×"] if spread else []) + (
            ["meas µs", "pred/meas"] if measure else []) + ["× calls µs", "share"] + (
            ["tuned pred µs"] + (["tuned meas µs"] if measure else []) if tuned else [])
        for c in cols:
            t.add_column(c, justify="left" if c == "kernel" else "right")
        tot = max(r["total_ms"] * 1e3, 1e-12)
        for k in sorted(r["kernels"], key=lambda k: -k["total_us"]):
            # spread ×: exp(std of the ensemble members' log predictions), 1.00 = full agreement
            extra = [f"{math.exp(k['log_spread']):.2f}"] if spread else []
            if measure:
                mu = k.get("measured_us")
                extra += [f"{mu:.1f}", f"{k['predicted_us'] / mu:.2f}"] if mu else [k.get("measure_error", "-"), "-"]
            tail = []
            if tuned:   # the model's pick among the kernel's first N schedules ("=" : the default one)
                same = k["tuned_sample"] == k["sample"]
                tail = [f"{k['tuned_us']:.1f}" + (" =" if same else "")]
                if measure:
                    tm = k.get("tuned_measured_us")
                    tail.append(f"{tm:.1f}" if tm else k.get("tuned_measure_error", "-"))
            t.add_row(k["task"], str(k["calls"]), f"{k['flops'] / 1e6:.2f}", str(k["leaves"]), f"{k['predicted_us']:.1f}",
                      *extra, f"{k['total_us']:.1f}", f"{100 * k['total_us'] / tot:.1f}%", *tail)
        Console().print(t)
        _log(f"{r['n_kernels']} kernels; featurize {r['featurize_s']:.1f} s, predict {r['predict_s'] * 1e3:.1f} ms")
        m = r.get("measured")
        if m and m.get("kernels_measured"):
            pk = m["per_kernel"]
            Console().print(
                f"measured at {m['threads']} thread(s), {m['kernels_measured']} of {r['n_kernels']} kernels: "
                f"whole model {m['predicted_ms']:.3f} ms predicted vs {m['measured_ms']:.3f} ms measured "
                f"({m['total_ratio']:.2f}×); per kernel MAPE {pk['mape_pct']:.1f}%, median APE "
                f"{pk['median_ape_pct']:.1f}%, within ±20% {pk['acc20_pct']:.0f}%, Spearman "
                f"{m['spearman_across_kernels']:.2f}")
        if tuned:
            changed = sum(k["tuned_sample"] != k["sample"] for k in r["kernels"])
            Console().print(f"tuned (the predicted-fastest of each kernel's first {tuned} schedules; {changed} of "
                            f"{r['n_kernels']} kernels change): {r['tuned_total_ms']:.3f} ms predicted")
            mt = (m or {}).get("tuned")
            if mt:
                Console().print(f"tuned, measured over {mt['kernels']} kernels: {mt['predicted_ms']:.3f} ms predicted vs "
                                f"{mt['measured_ms']:.3f} ms measured ({mt['total_ratio']:.2f}×); "
                                f"{mt['measured_speedup']:.2f}× faster than the default schedules measured "
                                f"({mt['default_measured_ms']:.3f} ms); {mt['kernels_slower']} kernels got slower")
        if save_schedules is not None:
            _log(f"schedules: {save_schedules}/ (TVMScript per kernel, index in schedules.json)")
        if m and m.get("kernels_failed"):
            _log(f"not measured: {', '.join(m['kernels_failed'])}")
        if r.get("warning"):
            Console(stderr=True).print(f"[yellow]warning:[/] {r['warning']}")

    @app.command("calibrate")
    def calibrate_cmd(
        threads: int = typer.Option(0, "--threads", help="Thread count to calibrate (default: the 'local' domain's)."),
        tasks: int = typer.Option(40, "--tasks", help="Tasks to select (KMeans over the dataset's programs)."),
        per_task: int = typer.Option(4, "--per-task", help="Programs timed here per selected task."),
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
        from tensorplan.cdmpp.model import resolve_domain
        from tensorplan.cdmpp.local_calibration import calibrate_here
        from tensorplan.cdmpp.predict import local_threads

        n = threads or local_threads(resolve_domain("local"))
        info = calibrate_here(local_threads(f"local-{n}t"), n_tasks=tasks, per_task=per_task, data=data, model=model,
                              out=out, exclude_networks=[x for x in exclude.split(",") if x], max_mad=max_mad,
                              force=force, progress=not json_out, log=None if json_out else _log)
        if json_out:
            print(_dump(info))
            return
        h = info["held_out_tasks"]
        cmp = (f"on tasks it was not fitted on: MAPE {h['model_here']['mape_pct']:.1f}% uncalibrated → "
               f"{h['calibrated']['mape_pct']:.1f}% calibrated; " if "calibrated" in h else "")
        Console().print(f"{info['n_timed']} programs of {len(info['tasks'])} tasks timed here in {info['time_s']:.0f} s; "
                        f"this CPU / collection CPU: {info['here_vs_source_median_ratio']:.2f}× (median); {cmp}"
                        + (f"saved {info['path']} (`tensorplan predict MODEL --device local --measure` to check it "
                           "on a network)" if info["installed"] else
                           "not installed: the uncalibrated model predicts this CPU better, `predict` keeps it "
                           "(--force to install anyway)"))
