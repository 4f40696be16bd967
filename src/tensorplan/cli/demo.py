"""`tensorplan demo`: the main job on a model (a bundled one by default).

Parses, makes one call (`tensorplan.run_demo`) and prints its report."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tensorplan.cli.common import MODEL_HELP, output_file


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(model: str = typer.Argument("candy", help=MODEL_HELP),
             threads: int = typer.Option(None, help="Intra-op threads for every runtime (default: every core "
                                                    "this process may use)."),
             opset: int = typer.Option(17, help="Opset of a zoo or PyTorch export (ONNX files keep theirs)."),
             orchestrate: bool = typer.Option(True, help="Also plan fused kernels (Korch, measured "
                                              "costs cached in the store), run the plan and race it "
                                              "against ONNX Runtime, OpenVINO and torch.compile."),
             report: str = typer.Option(None, "--report", help="Also write a self-contained HTML report "
                                        "(charts of the interleaved rounds, per-operator time, the plan's kernels)."),
             save_plan: str = typer.Option(None, "--save-plan", help="Also write the plan JSON here "
                                           "(`tensorplan run` / `tensorplan export` take it)."),
             vs_torch_compile: bool = typer.Option(True, "--vs-torch-compile/--no-vs-torch-compile",
                                                   help="Also race torch.compile of the model's PyTorch module "
                                                   "(zoo models and PyTorch factories have one)."),
             rounds: int = typer.Option(15, min=1, help="Interleaved rounds of the plan against the peers."),
             as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
        """The main job: plan MODEL's fused kernels and race the plan against ORT, OpenVINO, torch.compile.

        Imports MODEL, checks the reference executor against ONNX Runtime, shows the device and
        per-operator timings, then orchestrates fused kernels and races the plan against ONNX
        Runtime, OpenVINO (fp32, and its default bf16 on CPUs with bf16 units, labelled) and
        torch.compile, interleaved in one run; the headline is the speed-up over the best fp32 one,
        and a noisy run is flagged."""
        import tensorplan as tp

        from tensorplan.cli.common import one_line_errors
        from tensorplan.errors import TensorplanError
        con = Console(stderr=as_json)
        with one_line_errors():
            if threads is not None and threads < 1:
                raise TensorplanError(f"--threads {threads}: give a thread count >= 1")
            output_file(save_plan, "--save-plan")
            output_file(report, "--report")
            rep = tp.run_demo(model, threads=threads, opset=opset, orchestrate=orchestrate,
                              progress=not as_json, log=lambda m: con.print(f"[dim]{m}[/]"),
                              vs_torch_compile=vs_torch_compile, save_plan=save_plan, rounds=rounds)
        ok_all = rep.agree and (rep.plan is None or rep.plan.agree)
        if report:
            from tensorplan.workflows.report import write_demo_report
            con.print(f"[dim]report: {write_demo_report(rep, report)}[/]")
        if as_json:
            print(json.dumps(rep.to_dict(), indent=2, default=str))
            raise typer.Exit(0 if ok_all else 1)
        _print(con, rep)
        if not ok_all:
            raise typer.Exit(1)


def _print(con: Console, rep) -> None:
    d = rep.device
    con.print(f"[bold]device[/]: {d.name} — {d.cores} cores, {d.peak_fp32_gflops:.0f} GFLOP/s matmul (measured), "
              f"{d.mem_bw_gbs:.1f} GB/s (measured)")
    con.print(f"[bold]model[/]: {rep.model} — {rep.nodes} nodes, {rep.params / 1e6:.2f} M params, "
              f"{rep.gflops:.2f} GFLOPs, imported in {rep.import_s:.2f} s")
    ok = "[green]agree[/]" if rep.agree else "[red]DISAGREE[/]"
    con.print(f"ONNX Runtime alone: median {rep.ort_median_ms:.2f} ms (CoV {rep.ort_cov:.1%}); "
              f"reference executor {rep.reference_ms:.1f} ms; max rel. error "
              f"{rep.max_rel_error:.2e} → {ok} (tolerance {rep.tolerance:.0e})")
    t = Table(title="ONNX Runtime time per operator type (per inference)")
    for col in ("op", "nodes", "ms", "share"):
        t.add_column(col, justify="right" if col != "op" else "left")
    for o in rep.per_op:
        t.add_row(o.op, str(o.count), f"{o.total_ms:.3f}", f"{o.share:.1%}")
    con.print(t)
    p = rep.plan
    if p is None:
        return
    ok = "[green]agree[/]" if p.agree else "[red]DISAGREE[/]"
    con.print(f"[bold]plan[/]: {p.kernels} kernels from {p.primitives} primitives "
              f"(solver {p.solver}, optimised in {p.optimise_s:.1f} s; backends {p.backends})")
    t = p.peers
    tab = Table(title=f"interleaved: the plan vs the runtimes on the original model ({t.rounds} rounds, "
                      "same inputs and threads)")
    for col in ("runtime", "precision", "median ms", "CoV", "max rel. err vs ORT", "tensorplan ×"):
        tab.add_column(col, justify="left" if col == "runtime" else "right")
    for r in sorted(t.runners.values(), key=lambda r: r.median_ms):
        mark = " (best fp32 peer)" if r.name == p.best_peer else (" (beside)" if r.peer and r.precision != "fp32"
                                                                    else "")
        tab.add_row(r.label + mark, r.precision or "", f"{r.median_ms:.3f}", f"{r.cov:.1%}",
                    "" if r.max_rel_error is None else f"{r.max_rel_error:.1e}",
                    "" if r.name == "tensorplan" else f"{r.median_ms / p.plan_median_ms:.2f}×")
    for name, why in t.skipped.items():
        tab.add_row(name, "", "not timed", "", "", why)
    con.print(tab)
    headline = (f"[bold]{p.speedup_vs_best:.2f}×[/] vs the best fp32 peer ({p.best_peer}, "
                f"{p.best_peer_median_ms:.2f} ms)" if p.best_peer else "no fp32 peer timed")
    con.print(f"tensorplan {p.plan_median_ms:.2f} ms (CoV {p.plan_cov:.1%}): {headline}; "
              f"{p.speedup_vs_ort:.2f}× vs ONNX Runtime; predicted {p.predicted_ms:.2f} ms; "
              f"max rel. error vs ONNX Runtime {p.max_rel_error:.2e} → {ok}")
    if p.noisy:
        con.print(f"[bold red]NOISY RUN[/]: {p.noise_reason} — re-run on a quiet machine before quoting these figures")
    if p.saved:
        onnx_out = Path(p.saved).parent / (Path(p.saved).name.split(".")[0] + ".onnx")
        con.print(f"plan: {p.saved}; as one ONNX file for stock ONNX Runtime: "
                  f"[bold]tensorplan export {p.saved} -o {onnx_out}[/]")
