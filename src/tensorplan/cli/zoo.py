"""`tensorplan zoo`: list the built-in reference models and export them to ONNX.

Parses, calls `tensorplan.zoo` and prints."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

zoo_app = typer.Typer(help="Built-in reference models (random weights, exported to ONNX on demand).",
                      no_args_is_help=True)


def _shape(s) -> str:
    return "x".join(str(d) for d in s)


@zoo_app.command("list")
def list_cmd(tag: Optional[str] = typer.Option(None, "--tag", help="only models with this tag "
                                                "(korch, codl, test, transformer, detection, ...)"),
             as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table")) -> None:
    """List zoo models: name, inputs, parameter count, tags, description."""
    import tensorplan as tp

    zoo = tp.zoo
    rows = []
    for e in zoo.list_models(tag):
        d = e.to_dict()
        d["params"] = zoo.param_count(e.name)
        rows.append(d)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table(title=f"tensorplan zoo ({len(rows)} models)")
    for col in ("name", "inputs", "params", "tags", "description"):
        table.add_column(col, overflow="fold")
    for r in rows:
        inputs = ", ".join(f"{k} {_shape(v)}" + ("" if r["input_dtypes"][k] == "float32" else f" {r['input_dtypes'][k]}")
                           for k, v in r["input_shapes"].items())
        table.add_row(r["name"], inputs, f"{r['params'] / 1e6:.2f}M", ",".join(r["tags"]), r["description"])
    Console().print(table)


@zoo_app.command("export")
def export_cmd(name: str = typer.Argument(..., help="zoo model name (see `tensorplan zoo list`)"),
               opset: int = typer.Option(17, "--opset", help="ONNX opset, 11..21"),
               output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                     help="copy the ONNX file here (default: print the cache path)"),
               force: bool = typer.Option(False, "--force", help="re-export even if a cached file is current"),
               as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Export NAME to ONNX (cached under the tensorplan cache dir) and optionally copy it to -o."""
    import tensorplan as tp
    from tensorplan.cli.common import output_file

    output_file(output, "-o/--output")
    path = tp.zoo.export(name, opset=opset, force=force)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, output)
        path = output
    if as_json:
        typer.echo(json.dumps({"name": name, "opset": opset, "path": str(path), "bytes": path.stat().st_size}))
    else:
        typer.echo(str(path))


def register(app: typer.Typer) -> None:
    app.add_typer(zoo_app, name="zoo")
