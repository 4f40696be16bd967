"""The calling convention every library-run kernel shares (`VendorKernel`), and its helpers.

Why a module of its own: ONNX Runtime, PyTorch, OpenVINO and the executor's fallbacks all build
`VendorKernel`s; keeping the class apart from any one backend lets each backend module import it
without importing the others.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tensorplan.errors import CompileError
from tensorplan.ir.graph import Graph


def np_dtype(d: str):
    """numpy dtype of a graph dtype name."""
    return {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int64": np.int64,
            "int32": np.int32, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}[d]


def torch_dtype(d: str):
    """torch dtype of a graph dtype name."""
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64, "int64": torch.int64,
            "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}[d]


def out_graph(sub: Graph, outputs: list[str] | None) -> Graph:
    """`sub` with `outputs` as its outputs and only non-constant inputs: what a library session runs."""
    g = sub.copy()
    g.outputs = list(outputs or sub.outputs)
    g.inputs = [i for i in g.inputs if not g.tensors[i].is_constant]
    return g


@dataclass
class VendorKernel:
    """A kernel run by a library (ONNX Runtime / PyTorch); same interface as CompiledKernel."""

    name: str
    backend: str
    input_names: list[str]
    output_names: list[str]
    output_shapes: list[tuple[int, ...]]
    output_dtypes: list[str]
    _bind: Callable[[list, list], Callable[[], Any]]
    schedule: dict = field(default_factory=dict)
    keep: Any = None

    def alloc_outputs(self) -> list:
        import torch
        return [torch.empty(s, dtype=torch_dtype(d)) for s, d in zip(self.output_shapes, self.output_dtypes)]

    def bind(self, inputs: list, outputs: list) -> Callable[[], Any]:
        for t in (*inputs, *outputs):
            if not t.is_contiguous():
                raise CompileError(f"kernel '{self.name}' ({self.backend}): tensors must be contiguous")
        return self._bind(list(inputs), list(outputs))

    def __call__(self, *inputs, out: list | None = None):
        outs = out if out is not None else self.alloc_outputs()
        self.bind([x.contiguous() for x in inputs], outs)()
        return outs if len(outs) > 1 or out is not None else outs[0]


__all__ = ["VendorKernel", "np_dtype", "out_graph", "torch_dtype"]
