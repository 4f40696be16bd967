"""What several commands share: the model argument's help and the --input-shape option.

Why one place: every command that takes a model accepts every form `tensorplan.load` does, and
says so in the same words."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import typer

# (not imported from tensorplan.zoo, which would load torch for every `--help`)
MODEL_HELP = ("The model: an ONNX file, a zoo model name (`tensorplan zoo list`), or a PyTorch factory "
              "pkg.module:factory / file.py:factory returning (module, example_inputs).")
INPUT_SHAPE_HELP = "Static shape of a dynamic ONNX input, NAME=D1,D2,... (repeatable), e.g. x=1,3,224,224."


def input_shape_option():
    """A fresh `--input-shape` option (typer options are not shared between commands)."""
    return typer.Option(None, "--input-shape", help=INPUT_SHAPE_HELP)


def parse_shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]] | None:
    """`--input-shape` values as the API's `input_shapes` (None when none were given)."""
    from tensorplan.ir.onnx_import import parse_input_shapes
    return parse_input_shapes(specs) or None


def output_file(path: str | Path | None, option: str) -> Path | None:
    """Check an output FILE option before any work: not a directory, and no part of its parent
    path is a file. Raises OutputPathError naming the option and path (one line, exit 2)."""
    from tensorplan.errors import OutputPathError

    if path is None or str(path) == "":
        return None
    p = Path(path)
    if p.is_dir():
        raise OutputPathError(f"{option} '{p}' is a directory; pass a file path (inside it or elsewhere)")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"{option} '{p}': '{parent}' is a file, not a directory")
            break
    return p


def output_dir(path: str | Path | None, option: str) -> Path | None:
    """Check an output DIRECTORY option before any work: it is not an existing file."""
    from tensorplan.errors import OutputPathError

    if path is None or str(path) == "":
        return None
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{option} '{p}' is a file; pass a directory")
    return p


def positive(value: float | None, option: str) -> float | None:
    """A float option that must be > 0 (a time budget, a scale); None passes."""
    from tensorplan.errors import TensorplanError

    if value is not None and not value > 0:
        raise TensorplanError(f"{option} must be greater than 0, got {value:g}")
    return value


def thread_counts(text: str, option: str = "--threads") -> list[int]:
    """Comma-separated thread counts, each >= 1 (e.g. 1,2)."""
    from tensorplan.errors import TensorplanError

    try:
        counts = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise TensorplanError(f"{option}: expected comma-separated integers such as 1,2, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise TensorplanError(f"{option}: each thread count must be at least 1, got {text!r}")
    return counts


@contextmanager
def one_line_errors():
    """A `TensorplanError` (or an output that cannot be written) inside a command becomes one line
    on stderr and exit code 2, as `tensorplan.cli.main` prints it, also where the app is invoked
    without `main` (typer's CliRunner)."""
    from tensorplan.cli import _error, os_error_message
    from tensorplan.errors import TensorplanError

    try:
        yield
    except TensorplanError as e:
        _error(str(e))
        raise typer.Exit(2) from None
    except OSError as e:
        _error(os_error_message(e))
        raise typer.Exit(2) from None
