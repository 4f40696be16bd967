"""`tensorplan run`: compile a plan's kernels, run it, time it, check it against ONNX Runtime.

Parses, makes one call (`tensorplan.load_plan(path).run(...)`) and prints its result."""
from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tensorplan.errors import TensorplanError


def register(app: typer.Typer) -> None:
    @app.command()
    def run(plan: str = typer.Argument(..., help="Plan JSON written by `tensorplan orchestrate -o` or "
                                                 "`tensorplan demo --save-plan`."),
            repeats: int = typer.Option(0, "--repeats", "-n", min=0, help="Timed runs (0: repeat for ~2 s)."),
            threads: int = typer.Option(None, help="Threads for every backend (TVM, ONNX Runtime, torch; default: "
                                                   "what the plan was made with, at most every usable core)."),
            check: bool = typer.Option(True, "--check/--no-check",
                                       help="Compare outputs with ONNX Runtime on the original model."),
            tol: float = typer.Option(None, help="Max relative error accepted by --check (default: 1e-4 "
                                                 "for fp32 outputs, 8 machine epsilons for fp16/bf16; a plan "
                                                 "with bf16/fp16/int8 kernels: the tolerance it was made with, "
                                                 "else 0.02)."),
            kernel_times: bool = typer.Option(False, "--kernel-times",
                                              help="Also time every kernel alone (sum vs end-to-end)."),
            as_json: bool = typer.Option(False, "--json", help="Print the result as JSON.")) -> None:
        """Run a plan on this machine: median latency, predicted vs measured, max error vs ORT."""
        import tensorplan as tp
        con = Console(stderr=True)
        from tensorplan.cli.common import one_line_errors

        with one_line_errors():
            if repeats < 0:
                raise TensorplanError(f"--repeats {repeats}: give a count >= 1 (or 0 to repeat for ~2 s)")
            if threads is not None and threads < 1:
                raise TensorplanError(f"--threads {threads}: give a thread count >= 1")
            p = tp.load_plan(plan)     # verified against its model before anything runs
            kw = dict(check=check, repeats=repeats or None, threads=threads, kernel_times=kernel_times, tol=tol)
            if as_json:
                res = p.run(**kw)
                print(json.dumps(res.to_dict(), indent=2, default=float))
            else:
                with con.status(f"compiling and running {plan} ..."):
                    res = p.run(**kw)
                _print(Console(), res)
        if check and not res.ok:
            raise typer.Exit(1)


def _print(con: Console, res) -> None:
    t = Table(title=f"plan for {res.model}", show_header=False)
    t.add_row("kernels", f"{res.kernels}  ({', '.join(f'{k}: {v}' for k, v in sorted(res.backends.items()))})")
    if set(res.precisions) - {"fp32"}:
        t.add_row("precisions", ", ".join(f"{k}: {v}" for k, v in sorted(res.precisions.items())))
    t.add_row("median latency", f"{res.median_s * 1e3:.3f} ms  (CoV {100 * res.timing.get('cov', 0):.1f}%, "
                                f"n={len(res.timing.get('repeats', []))})")
    t.add_row("predicted (sum of kernels)", f"{res.predicted_s * 1e3:.3f} ms")
    if res.kernel_sum_s is not None:
        t.add_row("measured sum of kernels", f"{res.kernel_sum_s * 1e3:.3f} ms")
    t.add_row("compile", f"{res.compile_s:.2f} s")
    t.add_row("arena", f"{res.arena_bytes / 2**20:.1f} MiB")
    if res.max_rel_err is not None:
        colour = "green" if res.ok else "red"
        t.add_row("max rel err vs ORT", f"[{colour}]{res.max_rel_err:.2e}[/] (tolerance {res.tol:.1e})"
                  + ("" if res.ok else " → outputs differ from ONNX Runtime's"))
        if res.reference:
            t.add_row("ORT ran", escape(res.reference))
    if res.fallbacks:
        t.add_row("fallbacks", "\n".join(res.fallbacks[:5]) + (" ..." if len(res.fallbacks) > 5 else ""))
    con.print(t)
