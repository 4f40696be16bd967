"""`tensorplan inspect`: what a model is made of, and whether tensorplan computes it right.

Parses, makes one call (`tensorplan.inspect`) and prints its report."""
from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from tensorplan.cli.common import MODEL_HELP, input_shape_option, parse_shapes


def _fmt(n: float, unit: str = "") -> str:
    for div, suf in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suf}{unit}"
    return f"{n:.0f} {unit}".rstrip()


def register(app: typer.Typer) -> None:
    @app.command()
    def inspect(model: str = typer.Argument(..., help=MODEL_HELP),
                input_shape: list[str] = input_shape_option(),
                opset: int = typer.Option(17, help="Opset of a zoo or PyTorch export (ONNX files keep theirs)."),
                check: bool = typer.Option(False, "--check", help="Compare the reference executor "
                                           "with ONNX Runtime on random inputs (tolerance 1e-4; fp16/bf16 outputs: "
                                           "8 machine epsilons)."),
                seed: int = typer.Option(0, min=0, help="Seed of the random inputs for --check."),
                as_json: bool = typer.Option(False, "--json", help="Print the report as JSON.")) -> None:
        """Operators by type (count, FLOPs, bytes), parameters, totals, unsupported operators."""
        import tensorplan as tp

        shapes = parse_shapes(input_shape)
        con = Console()
        if as_json:
            rep = tp.inspect(model, shapes, opset, check, seed)
            print(json.dumps(rep.to_dict(), indent=2))
        else:
            with con.status(f"importing {model} ..."):
                rep = tp.inspect(model, shapes, opset, check, seed)
            _print(con, rep.to_dict())
        if check and not rep.check.get("passed", False):
            raise typer.Exit(1)


def _print(con: Console, rep: dict) -> None:
    ins = ", ".join(f"{k} {tuple(v['shape'])} {v['dtype']}" for k, v in rep["inputs"].items())
    outs = ", ".join(f"{k} {tuple(v['shape'])}" for k, v in rep["outputs"].items())
    con.print(f"[bold]{rep['model']}[/] (opset {rep['opset']}, imported in {rep['import_s']:.2f} s)")
    con.print(f"inputs: {ins}\noutputs: {outs}")
    con.print(f"{rep['nodes']} nodes, {_fmt(rep['parameters'])} parameters, "
              f"{_fmt(rep['flops'], 'FLOP')}, {_fmt(rep['bytes_moved'], 'B')} moved "
              f"(op by op; at least {_fmt(rep['min_bytes'], 'B')})")
    t = Table(title="operators by type")
    for col in ("op", "count", "FLOPs", "bytes", "FLOP share"):
        t.add_column(col, justify="left" if col == "op" else "right")
    total = max(rep["flops"], 1)
    for op, r in rep["ops"].items():
        t.add_row(op, str(r["count"]), _fmt(r["flops"]), _fmt(r["bytes"], "B"),
                  f"{r['flops'] / total:.1%}")
    con.print(t)
    if rep["unsupported"]:
        con.print(f"[bold red]{len(rep['unsupported'])} unsupported node(s):[/]")
        for u in rep["unsupported"]:
            dom = f"{u['domain']}::" if u["domain"] else ""
            con.print(f"  - {dom}{u['op']} (node '{u['node']}')")
    else:
        con.print("all operators supported")
    if rep.get("foreign"):
        ops = sorted({(f"{u['domain']}::" if u["domain"] else "") + u["op"] for u in rep["foreign"]})
        con.print(f"[yellow]{len(rep['foreign'])} node(s) without a tensorplan rule run in ONNX Runtime, "
                  f"one node at a time (opaque in plans): {', '.join(ops)}[/]")
    chk = rep.get("check")
    if chk:
        if "skipped" in chk:
            con.print(f"check skipped: {chk['skipped']}")
        else:
            for o, e in chk["rel_errors"].items():
                con.print(f"  {o}: max rel. error {e:.2e}")
            verdict = "[green]PASS[/]" if chk["passed"] else "[red]FAIL[/]"
            con.print(f"reference vs ONNX Runtime: {chk['max_rel_error']:.2e} → {verdict} "
                      f"(tolerance {chk['tolerance']:g})")
