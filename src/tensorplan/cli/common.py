"""What several commands share: the model argument's help and the --input-shape option.

Why one place: every command that takes a model accepts every form `tensorplan.load` does, and
says so in the same words."""
from __future__ import annotations

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
