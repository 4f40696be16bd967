"""`tensorplan optimize`: one command from a model to a deployable, verified plan within a budget.

Parses, makes one call (`tensorplan.optimize`) and prints its summary (`OptimizeSummary`)."""
from __future__ import annotations

import json
from pathlib import Path

from enum import Enum

import typer
from rich.console import Console
from rich.table import Table

from tensorplan.cli.common import MODEL_HELP, input_shape_option, output_dir, parse_shapes
from tensorplan.workflows.precision_search import CHOICES

#: --precision's choices (typer lists them in --help and refuses others in one line)
Precision = Enum("Precision", {c: c for c in CHOICES}, type=str)


def register(app: typer.Typer) -> None:
    @app.command()
    def optimize(
        model: str = typer.Argument(..., help=MODEL_HELP),
        out: Path = typer.Option(None, "-o", "--out", help="Directory for plan.json, the deployable model.onnx "
                                 "(when ONNX Runtime runs the whole plan) and report.html."),
        device: str = typer.Option("local", help="This CPU: local (every usable core) or local-<N>t; this "
                                   "machine's GPU: cuda (PyTorch builds the kernels; fp32). A catalog GPU (h100) "
                                   "with --price-only."),
        budget: str = typer.Option("10m", "--budget", help="Time for the whole job, e.g. 90s, 10m, 1h: sizes the "
                                   "schedule sampling and stops measuring in time for the race and the check."),
        samples: int = typer.Option(None, "--samples", min=1, help="Schedules sampled per TIR kernel and ranked by "
                                    "the predictor (default: what the budget affords, 4-32)."),
        top_k: int = typer.Option(3, "--top-k", min=1, help="Predicted-fastest schedules compiled and timed per "
                                  "TIR kernel the solver chooses."),
        input_shape: list[str] = input_shape_option(),
        opset: int = typer.Option(17, help="Opset of a zoo or PyTorch export (ONNX files keep theirs)."),
        threads: int = typer.Option(None, "--threads", min=1, help="Threads kernels are timed and plans run with "
                                    "(default: every usable core)."),
        race: bool = typer.Option(True, "--race/--no-race", help="Race the finalist plans end to end and keep "
                                  "the winner."),
        peers: bool = typer.Option(True, "--peers/--no-peers", help="Time the plan against ONNX Runtime, OpenVINO "
                                   "and torch.compile on the original model, interleaved."),
        ray_address: str = typer.Option(None, "--ray-address", help="Compile and time the kernels that decide on "
                                        "this Ray cluster's workers that offer the device (`ray start "
                                        "--resources`, see `tensorplan devices --ray-resources`); 'auto': the "
                                        "cluster this machine belongs to. Timings land in this machine's store."),
        precision: Precision = typer.Option("fp32", "--precision", case_sensitive=False,
                                      help="Kernel precision: fp32 (default); bf16, fp16 or int8 (each kept kernel "
                                      "tries fp32 and that one); auto (every precision that may beat fp32 on "
                                      "this CPU: the native ones, and int8 without dot-product units; see "
                                      "`tensorplan devices`). Each of the plan's heaviest kernels gets the fastest "
                                      "(backend, precision) whose model outputs stay within --tolerance of fp32."),
        tolerance: float = typer.Option(0.02, "--tolerance", min=0.0, help="Accuracy budget of a reduced "
                                        "precision: the largest |output - fp32 output| allowed, as a share of the "
                                        "output's largest magnitude, on the calibration inputs (0 keeps fp32)."),
        calibration: Path = typer.Option(None, "--calibration", help="Directory of real inputs for calibration "
                                         "and the accuracy check: one .npz per sample holding every input, or "
                                         "NAME.npy per input with a leading sample axis. Without it 8 random "
                                         "samples are drawn, with a warning: they measure numerical drift, not "
                                         "task accuracy."),
        price_as: str = typer.Option(None, "--price-as", help="GPU only: the catalog GPU whose predictions price "
                                     "the kernels (default: the one this GPU is, else h100, the shipped GPU "
                                     "predictor's)."),
        price_only: bool = typer.Option(False, "--price-only", help="GPU only: price every candidate into the "
                                        "store (--device h100 works on any machine; needs TVM) and stop: a GPU "
                                        "machine without TVM then plans from that store (docs/guides/gpu-checks.md)."),
        store: Path = typer.Option(None, "--store", help="Measurement store (default: the project's); predictions "
                                   "and timings are kept there, so a second run times nothing again."),
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON (progress goes to stderr)."),
    ) -> None:
        """Model to verified plan in a budget: predicted costs, measured where they decide, race, report.

        Every candidate kernel is priced by prediction, the BLP's kernels are compiled and timed and the
        BLP solved again until its kernels are all measured; the finalists race end to end and the kept
        plan is checked against ONNX Runtime and timed against ONNX Runtime, OpenVINO and torch.compile.
        With --precision, the plan's heaviest kernels then try bf16, fp16 or int8 on OpenVINO, ONNX Runtime
        and PyTorch, keeping the fastest whose outputs stay within --tolerance of fp32 on the calibration
        inputs; every variant is listed with its accuracy (docs/guides/precision.md).

        On a GPU (--device cuda) the shipped GPU predictor prices the candidates, PyTorch builds and times
        the kernels that decide, the plan runs as one CUDA graph and is timed against torch.compile."""
        import tensorplan as tp

        from tensorplan.cli.common import one_line_errors
        from tensorplan.workflows.optimize import OptimizeSummary, parse_budget
        err = Console(stderr=True)
        with one_line_errors():
            budget_s = parse_budget(budget)
            output_dir(out, "--out")
            plan = tp.optimize(model, device=device, budget_s=budget_s, out_dir=out, samples=samples, top_k=top_k,
                               input_shapes=parse_shapes(input_shape), opset=opset, threads=threads, race=race,
                               peers=peers, progress=True, log=lambda m: err.print(f"[dim]·[/] {m}"),
                               ray_address=ray_address, precision=Precision(precision).value, tolerance=tolerance,
                               calibration=calibration, price_as=price_as, price_only=price_only, store=store)
        summ = OptimizeSummary.from_plan(plan)
        if as_json:
            print(json.dumps({**summ.to_dict(), "kernels": len(plan.kernels),
                              "backends": _backends(plan), "precisions": plan.precisions()}, indent=2,
                             default=str))
            return
        _print(Console(), plan, summ)


def _backends(plan) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in plan.kernels:
        out[k.backend] = out.get(k.backend, 0) + 1
    return out


def _print(con: Console, plan, s) -> None:
    from tensorplan.workflows.precision_search import FP32_RUNNER
    t = Table(title=f"optimize {s.model} on {s.device}", show_header=False)
    t.add_row("plan", f"{len(plan.kernels)} kernels (" + ", ".join(f"{b}: {n}" for b, n in _backends(plan).items())
              + "; " + ", ".join(f"{p}: {n}" for p, n in plan.precisions().items()) + ")")
    if s.measured_plan_ms is not None:
        t.add_row("latency", f"{s.measured_plan_ms:.3f} ms measured end to end; kernels alone sum to "
                  f"{s.solo_sum_ms:.3f} ms" + (" at fp32" if s.reduced else "") + (f"; plan model predicts {s.predicted_plan_ms:.3f} ms"
                                               if s.predicted_plan_ms is not None else ""))
    if s.stop == "price-only":
        t.add_row("predicted", f"{s.solo_sum_ms:.3f} ms, the kernels' predicted times summed (nothing timed, not "
                  f"checked); on the GPU: tensorplan optimize {s.model} --device cuda --price-as {s.device} "
                  "--store <this store>")
    if s.peers_ms:
        runs = (s.timings or {}).get("runners") or {}

        def error(k: str) -> str:      # beside a reduced-precision peer: how far it is from fp32
            r = runs.get(k) or {}
            return (f"; error {r['max_rel_error']:.2g}" if r.get("precision") not in (None, "fp32")
                    and r.get("max_rel_error") is not None else "")
        t.add_row("vs peers", ", ".join(f"{k} {v:.3f} ms" + (f" ({s.peer_notes[k]}{error(k)})" if k in s.peer_notes
                                                             else "")
                                        for k, v in s.peers_ms.items())
                  + (f"  ->  {s.speedup_over_best:.2f}x over {s.best_peer}" if s.best_peer else ""))
    skipped = {k: v for k, v in s.peer_notes.items() if k not in s.peers_ms}
    if skipped:
        t.add_row("peers not run", "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    if s.noisy:
        t.add_row("[bold yellow]noisy run[/]", s.noisy)
    if s.finalists:
        t.add_row("race", "; ".join(f"{k}: {v['measured_ms']:.3f} ms measured, {v['predicted_ms']:.3f} predicted "
                                    f"({int(v['kernels'])} kernels)" for k, v in s.finalists.items())
                  + (f"  (plan model fitted on {s.plan_model_runs} plan runs)" if s.plan_model_runs else
                     "  (no plan measured before: predicted = kernels' solo sum)"))
    t.add_row("check", f"max relative error {s.max_rel_err:.2e} vs ONNX Runtime on {s.reference}"
              + (f" (reduced precision: tolerance {s.tolerance:g})" if s.reduced else "")
              if s.max_rel_err is not None else "not checked")
    if s.precision is not None:
        p = s.precision
        fp32_ms = (s.timings.get("runners") or {}).get(FP32_RUNNER, {}).get("median_ms")
        t.add_row("precision", f"{p.requested} (tried {', '.join(p.precisions)}; tolerance {p.tolerance:g}): "
                  + (", ".join(f"{k} {v}" for k, v in p.chosen.items()) or "no kernel searched")
                  + (f"; the plan at fp32 {fp32_ms:.3f} ms in the same run" if fp32_ms is not None else "")
                  + (f"; backed off {', '.join(p.backed_off)}" if p.backed_off else "")
                  + ("; stopped: budget" if p.stop == "budget" else ""))
        if p.final is not None:
            t.add_row("accuracy", f"{p.final.short()} on {p.calibration}")
        for w in ([p.calibration_warning] if p.calibration_warning else []) + p.warnings:
            t.add_row("[bold yellow]warning[/]", w)
    t.add_row("measured", f"{s.measured} of {s.unique_kernels} unique kernels ({100 * s.measured_share:.1f}%), "
              f"{s.from_store} from the store; {s.draws} schedules sampled for {s.searched} TIR kernels (at most "
              f"{s.samples} each)" + (f", top {s.top_k} timed" if s.top_k else ""))
    t.add_row("solves", f"{len(s.iterations)}, stopped: {s.stop}")
    t.add_row("time", f"{s.total_s:.1f}s of {s.budget_s:.0f}s: "
              + ", ".join(f"{k[:-2]} {v:.1f}s" for k, v in s.phases.items() if v >= 0.05))
    for kind, path in s.artifacts.items():
        if kind == "onnx":
            t.add_row("wrote onnx", f"{path} (runs in {s.artifacts.get('onnx_runtime', 'onnxruntime')})")
        elif kind != "onnx_runtime":
            t.add_row(f"wrote {kind}", path)
    if s.artifacts.get("plan"):
        t.add_row("next", f"tensorplan run {s.artifacts['plan']}")
    con.print(t)
    if s.precision is not None and s.precision.variants:
        con.print(_variants_table(s.precision))


def _variants_table(p) -> Table:
    """Every (backend, precision) tried per kernel: the plan's time with it and its accuracy."""
    t = Table(title=f"precisions tried (plan end to end on {p.samples} calibration samples)")
    for col in ("kernel", "variant", "status", "plan ms", "error", "max abs", "cosine", "top-1"):
        t.add_column(col, justify="right" if col in ("plan ms", "error", "max abs", "cosine", "top-1") else "left")
    skipped = 0
    for v in p.variants:
        if v.status == "budget":
            skipped += 1
            continue
        a = v.accuracy
        colour = {"kept": "bold green", "over tolerance": "red", "not built": "dim", "fell back": "dim",
                  "failed": "red"}.get(v.status, "")
        status = v.status + (f": {v.note}" if v.note and v.status in ("not built", "failed", "fell back") else "")
        t.add_row(v.label, f"{v.backend}/{v.precision}", f"[{colour}]{status}[/]" if colour else status,
                  f"{v.median_ms:.3f}" if v.median_ms is not None else "",
                  f"{a.error:.2g}" if a else "", f"{a.max_abs:.2g}" if a else "", f"{a.cosine:.5f}" if a else "",
                  f"{a.top1_agreement:.1%}" if a and a.top1_agreement is not None else "")
    if skipped:
        t.caption = f"{skipped} variants not tried: the budget ran out"
    return t
