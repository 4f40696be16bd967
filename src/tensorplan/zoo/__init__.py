"""Reference models, built in code with seeded random weights (no downloads).

Each model is a PyTorch module exported on demand to a static, constant-folded
ONNX file cached under `cache_dir()/zoo/<name>-opset<N>.onnx`; a JSON sidecar
holds the cache key (zoo version, model version, torch version), so a code
change re-exports instead of serving a stale file.

    from tensorplan import zoo
    zoo.list_models(tag="korch")        # [ZooEntry, ...]
    path = zoo.export("candy", opset=11)
    graph = zoo.load("resnet-50")       # tensorplan Graph
    module, inputs = zoo.build_torch("tiny-cnn")
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from tensorplan.errors import TensorplanError
from tensorplan.paths import atomic_write, cache_dir
from tensorplan.zoo._registry import ZOO_VERSION, ZooEntry

# Importing the model modules fills the registry.
from tensorplan.zoo import tiny, cnn, mobile, detection, style, transformer, hf_vision, efficientvit, synthetic  # noqa: F401,E402
from tensorplan.zoo._registry import _REGISTRY  # noqa: E402

MIN_OPSET, MAX_OPSET = 11, 21

__all__ = ["ZooEntry", "ZOO_VERSION", "list_models", "get_entry", "build_torch", "example_inputs",
           "onnx_model", "export", "load", "param_count", "cache_path", "MIN_OPSET", "MAX_OPSET"]


def list_models(tag: str | None = None) -> list[ZooEntry]:
    """All entries (optionally only those carrying `tag`), sorted by name."""
    entries = sorted(_REGISTRY.values(), key=lambda e: e.name)
    if tag is not None:
        entries = [e for e in entries if tag in e.tags]
    return entries


def get_entry(name: str) -> ZooEntry:
    """The entry for `name`; an unknown name raises an error listing the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise TensorplanError(f"unknown zoo model '{name}'; known models: "
                              f"{', '.join(sorted(_REGISTRY))}") from None


def _randomize_norms(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Give BatchNorm layers non-trivial statistics so BN folding is actually exercised
    (fresh BN is the identity: mean 0, var 1, weight 1, bias 0)."""
    for m in module.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            n = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                    m.bias.copy_(torch.randn(n, generator=gen) * 0.1)


def example_inputs(name: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Seeded example inputs in the order of `entry.input_shapes`."""
    entry = get_entry(name)
    gen = torch.Generator().manual_seed(seed + 1)
    out = []
    for iname, shape in entry.input_shapes.items():
        dt = entry.dtype(iname)
        if dt == "int64":
            out.append(torch.randint(0, entry.int_high, shape, generator=gen, dtype=torch.int64))
        else:
            out.append(torch.randn(shape, generator=gen, dtype=getattr(torch, dt)))
    return tuple(out)


def build_torch(name: str, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """(module in eval mode with seeded random weights, seeded example inputs).

    The global torch RNG is left untouched."""
    entry = get_entry(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = entry.builder()
        _randomize_norms(module, torch.Generator().manual_seed(seed))
    return module.eval(), example_inputs(name, seed)


_PARAMS: dict[str, int] = {}


def param_count(name: str) -> int:
    """Number of trainable parameters, counted on the meta device (no memory, milliseconds)."""
    if name not in _PARAMS:
        entry = get_entry(name)
        with torch.device("meta"):
            module = entry.builder()
        _PARAMS[name] = int(sum(p.numel() for p in module.parameters()))
    return _PARAMS[name]


def _check_opset(opset: int) -> None:
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise TensorplanError(f"opset {opset!r} is not supported by the zoo; use {MIN_OPSET}..{MAX_OPSET}")


def onnx_model(name: str, opset: int = 17, seed: int = 0):
    """A freshly exported, folded and checked `onnx.ModelProto` (no cache)."""
    from tensorplan.ir.torch_onnx import finalize, torch_to_onnx

    _check_opset(opset)
    entry = get_entry(name)
    module, inputs = build_torch(name, seed)
    with torch.no_grad():
        raw = torch_to_onnx(module, inputs, opset, list(entry.input_shapes), list(entry.output_names))
    return finalize(raw, name, opset)


def cache_path(name: str, opset: int = 17) -> Path:
    """Where `export` keeps the file (it may not exist yet)."""
    get_entry(name)
    return cache_dir() / "zoo" / f"{name}-opset{opset}.onnx"


def _cache_key(entry: ZooEntry, opset: int) -> dict:
    return {"zoo_version": ZOO_VERSION, "model_version": entry.version, "name": entry.name,
            "opset": opset, "torch": torch.__version__, "seed": 0}


def export(name: str, opset: int = 17, force: bool = False) -> Path:
    """Path of the cached ONNX export of `name` at `opset`, exporting it first if needed."""
    _check_opset(opset)
    entry = get_entry(name)
    path = cache_path(name, opset)
    meta_path = path.with_suffix(".json")
    key = _cache_key(entry, opset)
    if not force and path.exists() and meta_path.exists():
        try:
            if json.loads(meta_path.read_text()).get("key") == key:
                return path
        except (OSError, ValueError):
            pass  # unreadable sidecar: re-export
    model = onnx_model(name, opset)
    data = model.SerializeToString()
    atomic_write(path, data)
    atomic_write(meta_path, json.dumps({"key": key, "bytes": len(data),
                                         "nodes": len(model.graph.node)}, indent=1).encode())
    return path


def load(name: str, opset: int = 17):
    """The zoo model as a tensorplan `Graph` (exported and cached on first use)."""
    from tensorplan.ir.onnx_import import import_onnx

    graph = import_onnx(export(name, opset), name=name)
    graph.source = name
    return graph


def numpy_inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """`example_inputs` as an ONNX Runtime feed dict."""
    entry = get_entry(name)
    return {k: v.numpy() for k, v in zip(entry.input_shapes, example_inputs(name, seed))}


__all__.append("numpy_inputs")
