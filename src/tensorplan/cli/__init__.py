"""The `tensorplan` command: one typer app; each area registers its commands.

The CLI only parses arguments and prints; the work is one call in the Python API.
Every `TensorplanError` is printed as one clear message (exit code 2), no traceback.
"""
from __future__ import annotations

import importlib
import sys

import typer
from rich.console import Console
from rich.markup import escape

from tensorplan.errors import TensorplanError

app = typer.Typer(help="tensorplan: latency prediction, kernel orchestration and co-execution for DNNs.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
err_console = Console(stderr=True)

# Each module defines `register(app: typer.Typer)`; add yours here (one line).
_COMMAND_MODULES = (
    "predict",
    "predictor",
    "zoo",
    "devices",
    "store",
    "inspect",
    "demo",
    "orchestrate",
    "coexec",
    "run",
    "export",
)

for _mod in _COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_mod}").register(app)


def main() -> None:
    try:
        app()
    except TensorplanError as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}")
        sys.exit(2)
