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
    "optimize",
    "coexec",
    "run",
    "export",
)

for _mod in _COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_mod}").register(app)


def _error(msg: str) -> None:
    """One error message on stderr, never re-wrapped to the terminal's width."""
    err_console.print(f"[bold red]error:[/] {escape(msg)}", soft_wrap=True)


def os_error_message(e: OSError) -> str:
    """An OSError (writing an output, reading an input) as one line naming the path and the fault."""
    import errno

    path = e.filename if e.filename is not None else ""
    what = e.strerror or str(e)
    advice = {errno.EISDIR: "it is a directory: pass a file path",
              errno.ENOTDIR: "a part of the path is a file, not a directory",
              errno.EACCES: "no permission: pick a writable location",
              errno.EPERM: "not permitted: pick a writable location",
              errno.EROFS: "read-only file system: pick a writable location",
              errno.ENOSPC: "no space left on the device: free space or write elsewhere",
              errno.ENOENT: "no such file or directory"}.get(e.errno or -1, "")
    where = f"'{path}'" + (f" -> '{e.filename2}'" if getattr(e, "filename2", None) else "") if path else "a file"
    return f"cannot use {where}: {what}" + (f" ({advice})" if advice and advice != what.lower() else "")


def main() -> None:
    try:
        app()
    except TensorplanError as e:
        _error(str(e))
        sys.exit(2)
    except BrokenPipeError:   # `tensorplan ... | head`: the reader left; nothing to report
        sys.exit(0)
    except OSError as e:   # an output that cannot be written (a directory, no permission, a full disk)
        _error(os_error_message(e))
        sys.exit(2)
    except MemoryError as e:
        _error(f"out of memory{f' ({e})' if str(e) else ''}; use smaller input shapes (--input-shape) "
               "or a machine with more memory")
        sys.exit(2)
