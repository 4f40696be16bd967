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


def _fmt_bytes(n: float) -> str:
    for div, suf in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= div:
            return f"{n / div:.1f} {suf}"
    return f"{int(n)} B"


def check_run_memory(graph: Graph, what: str = "running the model", available: int | None = None,
                     fraction: float = 0.8) -> None:
    """Refuse, before anything is allocated, to run `graph` on random inputs when its declared
    shapes need more memory than this machine has free: the inputs themselves (plus the float64
    buffer a random float input is drawn in) and its largest tensor. `available` defaults to
    `psutil.virtual_memory().available`; the limit is `fraction` of it. Raises a TensorplanError
    naming the input (or tensor), its shape and the bytes it would need."""
    import numpy as np

    if available is None:
        import psutil
        available = int(psutil.virtual_memory().available)
    limit = int(available * fraction)

    def nbytes(t) -> tuple[int, int]:
        try:
            item = 2 if t.dtype == "bfloat16" else np.dtype(t.dtype).itemsize
        except TypeError:
            item = 4
        n = 1
        for d in t.shape:
            n *= max(int(d), 0)
        floating = t.dtype in ("bfloat16",) or (t.dtype != "bool" and np.issubdtype(np.dtype(
            "float32" if t.dtype == "bfloat16" else t.dtype), np.floating))
        return n * item, n * 8 if floating else 0     # (the tensor, its float64 draw)

    inputs = [(name, graph.tensors[name]) for name in graph.inputs]
    sizes = {name: nbytes(t) for name, t in inputs}
    need = sum(b for b, _ in sizes.values()) + max((tmp for _, tmp in sizes.values()), default=0)
    if inputs and need > limit:
        name, t = max(inputs, key=lambda it: sum(sizes[it[0]]))
        shape = "x".join(str(d) for d in t.shape)
        raise TensorplanError(
            f"{graph.source or graph.name}: input '{name}' is declared {shape} {t.dtype}: "
            f"{_fmt_bytes(sizes[name][0])} per input (about {_fmt_bytes(need)} with all inputs while "
            f"drawing them), more than {_fmt_bytes(limit)} ({fraction:.0%} of the {_fmt_bytes(available)} "
            f"of memory free) for {what}; refused before allocating. Pass a smaller shape with "
            f"--input-shape {name}=D1,D2,... if the input is dynamic, or fix the model's declared shape.")
    big = [(nbytes(t)[0], n, t) for n, t in graph.tensors.items() if t.data is None and n not in sizes]
    if big:
        b, name, t = max(big, key=lambda x: x[0])
        if b > limit:
            shape = "x".join(str(d) for d in t.shape)
            raise TensorplanError(
                f"{graph.source or graph.name}: tensor '{name}' is {shape} {t.dtype} ({_fmt_bytes(b)}), more than "
                f"{_fmt_bytes(limit)} ({fraction:.0%} of the {_fmt_bytes(available)} of memory free) for {what}; "
                f"refused before allocating. Use smaller input shapes (--input-shape).")


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


__all__ = ["MODEL_FORMS", "as_graph", "check_run_memory", "load", "load_model", "onnx_bytes", "resolve_model", "resolve_model_path",
           "torch_source"]
