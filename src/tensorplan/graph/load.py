"""`load_model(spec)`: one entry point for "an ONNX path or a zoo name"."""
from __future__ import annotations

from pathlib import Path

from ..errors import ModelImportError, TensorplanError
from .ir import Graph


def _is_path(spec: str) -> bool:
    return spec.endswith(".onnx") or "/" in spec or Path(spec).exists()


def resolve_model_path(spec: str | Path, opset: int = 17) -> Path:
    """The ONNX file behind `spec`: the path itself, or the zoo's cached export."""
    spec_s = str(spec)
    if _is_path(spec_s):
        p = Path(spec_s)
        if not p.exists():
            raise ModelImportError(f"{spec_s}: no such file")
        return p
    try:
        from . import zoo
    except ImportError as e:  # the zoo is optional for ONNX paths
        raise ModelImportError(f"'{spec_s}' is not a file and the model zoo is unavailable ({e})") from None
    try:
        zoo.get_entry(spec_s)
    except TensorplanError as e:
        raise ModelImportError(f"'{spec_s}' is neither an ONNX file nor a zoo model: {e}") from None
    return zoo.export(spec_s, opset)


def load_model(spec: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None,
               opset: int = 17, *, allow_unsupported: bool = False) -> Graph:
    """Import an ONNX path or zoo model name as a static `Graph`.

    `opset` picks the zoo export (ONNX files keep their own opset)."""
    from .onnx_import import import_onnx

    path = resolve_model_path(spec, opset)
    name = Path(path).stem if _is_path(str(spec)) else str(spec)
    return import_onnx(path, input_shapes, allow_unsupported=allow_unsupported, name=name)
