"""`load(spec)`: one entry point for every form of model a command accepts.

A model spec is an ONNX path, a zoo name or a PyTorch factory (`pkg.mod:factory` /
`file.py:factory`, see `from_torch`). Every stage after loading receives the `Graph`; the
graph remembers its spec (`Graph.source`), so a plan made from it can reload the model in
another process.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tensorplan.errors import ModelImportError, TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.zoo.from_torch import export_spec, exported_module, is_torch_spec

# What every command that takes a model says about it (CLI help texts use it).
MODEL_FORMS = ("an ONNX file, a zoo model name (`tensorplan zoo list`), or a PyTorch factory "
               "`pkg.module:factory` / `file.py:factory` returning (module, example_inputs)")


def _is_path(spec: str) -> bool:
    return spec.endswith(".onnx") or "/" in spec or Path(spec).exists()


def resolve_model_path(spec: str | Path, opset: int = 17) -> Path:
    """The ONNX file behind `spec`: the path itself, the export of a PyTorch factory, or the zoo's
    cached export."""
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
        raise ModelImportError(f"'{spec_s}' is not {MODEL_FORMS}: {e}") from None
    return zoo.export(spec_s, opset)


def resolve_model(spec: str | Path, opset: int = 17) -> tuple[Path, str]:
    """(ONNX file, model name) behind `spec`: a file is named by its stem, a PyTorch factory
    `pkg.mod:factory` by `factory`, a zoo model by itself."""
    path = Path(resolve_model_path(spec, opset))
    spec_s = str(spec)
    if is_torch_spec(spec_s):
        return path, spec_s.rsplit(":", 1)[1]
    return path, (path.stem if _is_path(spec_s) else spec_s)


def load(spec: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None,
         opset: int = 17, *, allow_unsupported: bool = False) -> Graph:
    """Import a model (ONNX path, zoo name or PyTorch factory) as a static `Graph`.

    `input_shapes` fixes the dynamic dimensions of an ONNX file; `opset` picks the zoo's and a
    factory's export (ONNX files keep their own opset)."""
    from tensorplan.ir.onnx_import import import_onnx

    path, name = resolve_model(spec, opset)
    graph = import_onnx(path, input_shapes, allow_unsupported=allow_unsupported, name=name)
    graph.source = str(spec)
    return graph


# The name codl/ still calls; `load` is the one to use.
load_model = load


def as_graph(model: str | Path | Graph, input_shapes: dict[str, tuple[int, ...]] | None = None,
             opset: int = 17) -> Graph:
    """A `Graph` as is, a spec loaded: why every stage can take either and load only once."""
    if isinstance(model, Graph):
        return model
    return load(model, input_shapes=input_shapes, opset=opset)


def onnx_bytes(graph: Graph, opset: int = 17) -> bytes:
    """The ONNX model `graph` came from (its file, unchanged), or `graph` exported when it was built
    in memory: what ONNX Runtime runs as the reference."""
    if graph.source:
        return resolve_model_path(graph.source, opset).read_bytes()
    from tensorplan.ir.to_onnx import graph_to_onnx
    return graph_to_onnx(graph).SerializeToString()


def torch_source(model: str | Graph, opset: int = 17) -> tuple[Any, tuple] | None:
    """(module, example inputs) behind a model when it has one: a PyTorch factory or a zoo model
    (random weights, as exported); None for an ONNX file or a graph built in memory. What `demo`
    compiles with `torch.compile` to race against."""
    spec = model.source if isinstance(model, Graph) else str(model)
    if not spec:
        return None
    if is_torch_spec(spec):
        return exported_module(spec, opset)
    if _is_path(spec):
        return None
    from tensorplan import zoo
    return zoo.build_torch(spec)


__all__ = ["MODEL_FORMS", "as_graph", "load", "load_model", "onnx_bytes", "resolve_model", "resolve_model_path",
           "torch_source"]
