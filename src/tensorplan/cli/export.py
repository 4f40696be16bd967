"""`tensorplan export`: a plan (or a model's exact rewrites) as one ONNX file for stock ONNX Runtime.

Parses, makes one call (`tensorplan.export_onnx`) and prints its result."""
from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from tensorplan.cli.common import MODEL_HELP, input_shape_option, output_file, parse_shapes


def register(app: typer.Typer) -> None:
    @app.command()
    def export(
        target: str = typer.Argument(..., help="A plan JSON from `tensorplan orchestrate -o`, or a model (then its "
                                               "exact rewrites only). " + MODEL_HELP),
        output: str = typer.Option(..., "--output", "-o", help="Write the ONNX model here."),
        threads: int = typer.Option(None, help="ONNX Runtime intra-op threads for the check and the timing "
                                               "(default: every core this process may use)."),
        check: bool = typer.Option(True, "--check/--no-check",
                                   help="Compare its outputs with ONNX Runtime on the original model."),
        tol: float = typer.Option(None, help="Max relative error accepted by --check (default: 1e-4 for fp32 "
                                             "outputs, 8 machine epsilons for fp16/bf16)."),
        rounds: int = typer.Option(15, min=0, help="Interleaved timing rounds, original vs exported (0: no timing)."),
        input_shape: list[str] = input_shape_option(),
        opset: int = typer.Option(17, help="Opset of a zoo or PyTorch export (plans and ONNX files keep theirs)."),
        as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ) -> None:
        """Write a plan as one standalone ONNX file, check it and time it against the original in ONNX Runtime."""
        import tensorplan as tp
        con = Console(stderr=True)
        log = None if as_json else (lambda msg: con.print(f"[dim]{msg}[/]"))
        from tensorplan.cli.common import one_line_errors
        from tensorplan.errors import TensorplanError
        with one_line_errors(), con.status(f"exporting {target} ..."):
            output_file(output, "--output")
            if rounds < 0:
                raise TensorplanError(f"--rounds {rounds}: give a count >= 0 (0: no timing)")
            if threads is not None and threads < 1:
                raise TensorplanError(f"--threads {threads}: give a thread count >= 1")
            res = tp.export_onnx(target, output, threads=threads, check=check, tol=tol, rounds=rounds, opset=opset,
                                 input_shapes=parse_shapes(input_shape), log=log)
        if as_json:
            print(json.dumps(res.to_dict(), indent=2, default=float))
        else:
            _print(Console(), res)
        if check and not res.ok:
            raise typer.Exit(1)


def _print(con: Console, res) -> None:
    t = Table(title=f"{res.model} -> {res.path}", show_header=False)
    t.add_row("what it is", res.relation)
    if res.rewrites:
        t.add_row("exact rewrites", ", ".join(f"{k} x{v}" for k, v in sorted(res.rewrites.items())))
    t.add_row("operators", f"{res.nodes[0]} -> {res.nodes[1]}")
    t.add_row("GFLOP", f"{res.gflop[0]:.2f} -> {res.gflop[1]:.2f}")
    t.add_row("size", f"{res.bytes / 2**20:.1f} MiB")
    if res.max_rel_err is not None:
        colour = "green" if res.ok else "red"
        t.add_row("max rel err vs ORT", f"[{colour}]{res.max_rel_err:.2e}[/] (tolerance {res.tol:.0e})")
    if res.timing:
        tm = res.timing
        t.add_row("ONNX Runtime, original", f"{tm['original_ms']:.2f} ms")
        t.add_row("ONNX Runtime, exported", f"{tm['exported_ms']:.2f} ms  ([bold]{tm['speedup']:.2f}x[/], "
                                            f"{tm['rounds']} interleaved rounds, {tm['threads']} threads)")
    opts = ", ".join(f"{k}={v}" for k, v in res.session.items())
    t.add_row("run it with", f"onnxruntime.InferenceSession(path, so): {opts} (stored in the file's metadata)")
    con.print(t)
