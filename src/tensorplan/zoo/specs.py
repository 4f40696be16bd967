"""`load_model(spec)`: one entry point for "an ONNX path, a zoo name or a PyTorch factory"
(`pkg.mod:factory` / `file.py:factory`, see `from_torch`)."""
from __future__ import annotations

from pathlib import Path

from tensorplan.errors import ModelImportError, TensorplanError
from tensorplan.ir.graph import Graph


def _is_path(spec: str) -> bool:
    return spec.endswith(".onnx") or "/" in spec or Path(spec).exists()


def resolve_model_path(spec: str | Path, opset: int = 17) -> Path:
    """The ONNX file behind `spec`: the path itself, the export of a PyTorch factory, or the zoo's
    cached export."""
    from tensorplan.zoo.from_torch import export_spec, is_torch_spec

    spec_s = str(spec)
    if is_torch_spec(spec_s):
        return export_spec(spec_s, opset)
    if _is_path(spec_s):
        p = Path(spec_s)
        if not p.exists():
            raise ModelImportError(f"{spec_s}: no such file")
        return p
    try:
        from tensorplan import zoo
    except ImportError as e:  # the zoo is optional for ONNX paths
        raise ModelImportError(f"'{spec_s}' is not a file and the model zoo is unavailable ({e})") from None
    try:
        zoo.get_entry(spec_s)
    except TensorplanError as e:
        raise ModelImportError(f"'{spec_s}' is neither an ONNX file, a zoo model nor a PyTorch factory "
                               f"(pkg.module:factory): {e}") from None
    return zoo.export(spec_s, opset)


def resolve_model(spec: str | Path, opset: int = 17) -> tuple[Path, str]:
    """(ONNX file, model name) behind `spec`: a file is named by its stem, a PyTorch factory
    `pkg.mod:factory` by `factory`, a zoo model by itself."""
    from tensorplan.zoo.from_torch import is_torch_spec

    path = Path(resolve_model_path(spec, opset))
    spec_s = str(spec)
    if is_torch_spec(spec_s):
        return path, spec_s.rsplit(":", 1)[1]
    return path, (path.stem if _is_path(spec_s) else spec_s)


def load_model(spec: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None,
               opset: int = 17, *, allow_unsupported: bool = False) -> Graph:
    """Import an ONNX path, zoo model name or PyTorch factory as a static `Graph`.

    `opset` picks the zoo's and a factory's export (ONNX files keep their own opset)."""
    from tensorplan.ir.onnx_import import import_onnx

    path, name = resolve_model(spec, opset)
    return import_onnx(path, input_shapes, allow_unsupported=allow_unsupported, name=name)
