"""A PyTorch module as a model: export it to a clean, static ONNX file every command accepts.

Why: users hold an `nn.Module`, not an ONNX file. `from_torch(module, inputs)` exports it with
the same exporter and folding as the zoo (`torch_onnx`: TorchScript exporter, constants folded,
every shape static), so the planner, the predictor and ONNX Runtime see what they see for a zoo
model. On the command line a model may be named `package.module:factory` or
`path/to/file.py:factory`, where `factory()` returns `(module, example_inputs)`; the export is
kept in the cache under a hash of its bytes, so a plan made from it names a stable file.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from tensorplan.errors import ModelImportError
from tensorplan.paths import atomic_write, cache_dir

# `pkg.mod:attr` or `some/file.py:attr`
_SPEC = re.compile(r"^(?P<src>[A-Za-z_][\w.]*|[^:]+\.py):(?P<attr>[A-Za-z_]\w*)$")
_EXPORTED: dict[tuple[str, int], tuple[Path, Any, tuple]] = {}   # (spec, opset) -> (file, module, inputs)


def is_torch_spec(spec: str) -> bool:
    """Does `spec` name a PyTorch factory (`pkg.mod:factory`, `file.py:factory`)?"""
    return bool(_SPEC.match(spec)) and not Path(spec).exists()


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _io_names(module, inputs: tuple, outputs: tuple) -> tuple[list[str], list[str]]:
    """Input names from `forward`'s parameters (so feeds read like the Python call), `output[i]`
    for the outputs."""
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    ins = params[:len(inputs)] if len(params) >= len(inputs) else [f"input{i}" for i in range(len(inputs))]
    outs = ["output"] if len(outputs) == 1 else [f"output{i}" for i in range(len(outputs))]
    return ins, outs


def from_torch(module, example_inputs, *, name: str | None = None, opset: int = 17,
               path: str | Path | None = None) -> Path:
    """Export `module` called on `example_inputs` (a tensor or a tuple of them) to a static ONNX
    file and return its path: `path`, or `<cache>/torch/<name>-<hash>.onnx`. The module runs in
    eval mode; the shapes of `example_inputs` become the model's (static) shapes."""
    import torch

    from tensorplan.ir.torch_onnx import finalize, torch_to_onnx

    if not isinstance(module, torch.nn.Module):
        raise ModelImportError(f"from_torch: expected a torch.nn.Module, got {type(module).__name__}")
    inputs = _as_tuple(example_inputs)
    bad = [i for i, t in enumerate(inputs) if not isinstance(t, torch.Tensor)]
    if bad:
        raise ModelImportError(f"from_torch: example input {bad[0]} is a {type(inputs[bad[0]]).__name__}, "
                               "expected a torch.Tensor (pass a tensor or a tuple of tensors)")
    name = name or type(module).__name__
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            try:
                outputs = _as_tuple(module(*inputs))
            except Exception as e:  # noqa: BLE001 - user code
                raise ModelImportError(f"PyTorch module '{name}': forward on the example inputs raised "
                                       f"{type(e).__name__}: {e}") from e
            in_names, out_names = _io_names(module, inputs, outputs)
            try:
                raw = torch_to_onnx(module, inputs, opset, in_names, out_names)
            except Exception as e:  # noqa: BLE001 - the exporter raises many kinds; one clear error
                msg = str(e).split(" Please feel free")[0].strip()
                hint = ("compute that part with operators ONNX has, or export the model to ONNX yourself "
                        "(torch.onnx.export(..., dynamo=True), with the onnxscript package installed, knows more "
                        "operators) and pass the .onnx file"
                        if "is not supported" in msg else
                        "models with data-dependent control flow need a traceable forward")
                raise ModelImportError(f"PyTorch module '{name}': torch.onnx.export failed: {msg}; {hint}") from e
    finally:
        module.train(was_training)
    model = finalize(raw, name, opset, what="PyTorch module", doc="exported by tensorplan.from_torch")
    model.graph.name = name
    data = model.SerializeToString()
    if path is None:
        path = cache_dir() / "torch" / f"{name}-{hashlib.sha256(data).hexdigest()[:12]}.onnx"
    path = Path(path)
    atomic_write(path, data)
    return path


def _load_factory(spec: str):
    m = _SPEC.match(spec)
    src, attr = m["src"], m["attr"]
    try:
        if src.endswith(".py"):
            file = Path(src)
            if not file.exists():
                raise ModelImportError(f"{spec}: no such file {src}")
            mspec = importlib.util.spec_from_file_location(f"tensorplan_user_{file.stem}", file)
            mod = importlib.util.module_from_spec(mspec)
            mspec.loader.exec_module(mod)
        else:
            cwd = str(Path.cwd())
            added = cwd not in sys.path
            if added:
                sys.path.insert(0, cwd)   # `tensorplan` runs from .venv/bin; users mean their own package
            try:
                mod = importlib.import_module(src)
            finally:
                if added:
                    sys.path.remove(cwd)
    except ModelImportError:
        raise
    except Exception as e:  # noqa: BLE001 - any import-time failure of user code
        raise ModelImportError(f"{spec}: cannot import {src}: {type(e).__name__}: {e}") from e
    fn = getattr(mod, attr, None)
    if not callable(fn):
        raise ModelImportError(f"{spec}: {src} has no callable '{attr}' (expected a factory returning "
                               "(module, example_inputs))")
    return fn


def export_spec(spec: str, opset: int = 17) -> Path:
    """The ONNX file for `pkg.mod:factory` / `file.py:factory` (exported once per process)."""
    return _exported(spec, opset)[0]


def exported_module(spec: str, opset: int = 17) -> tuple[Any, tuple]:
    """(module, example inputs) a PyTorch factory returned (the ones its export was made from)."""
    _, module, inputs = _exported(spec, opset)
    return module, inputs


def _exported(spec: str, opset: int) -> tuple[Path, Any, tuple]:
    key = (spec, opset)
    if key not in _EXPORTED:
        fn = _load_factory(spec)
        try:
            got = fn()
        except Exception as e:  # noqa: BLE001 - user code
            raise ModelImportError(f"{spec}: the factory raised {type(e).__name__}: {e}") from e
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise ModelImportError(f"{spec}: the factory returned {type(got).__name__}; it must return "
                                   "(module, example_inputs)")
        path = from_torch(got[0], got[1], name=_SPEC.match(spec)["attr"], opset=opset)
        _EXPORTED[key] = (path, got[0], _as_tuple(got[1]))
    return _EXPORTED[key]


__all__ = ["export_spec", "exported_module", "from_torch", "is_torch_spec"]
