"""The zoo's registry: one `ZooEntry` per model, filled by the model modules at import.

Builders live next to their architecture code; the registry only records what
a caller needs to know without building anything (name, inputs, tags, source).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

# Bump when the export pipeline changes (folding, naming, init); invalidates every cached file.
ZOO_VERSION = 1

_REGISTRY: dict[str, "ZooEntry"] = {}


@dataclass(frozen=True)
class ZooEntry:
    """What a zoo model is and where its architecture comes from."""

    name: str
    description: str
    input_shapes: dict[str, tuple[int, ...]]
    tags: frozenset[str]
    source: str
    family: str
    builder: Callable[[], torch.nn.Module] = field(repr=False, compare=False)
    input_dtypes: dict[str, str] = field(default_factory=dict)
    output_names: tuple[str, ...] = ("output",)
    # Per-model version: bump when this model's code changes (invalidates its cache only).
    version: int = 1
    # Upper bound (exclusive) for integer inputs, e.g. the vocabulary size for token ids.
    int_high: int = 2

    def dtype(self, input_name: str) -> str:
        return self.input_dtypes.get(input_name, "float32")

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
            "input_dtypes": {k: self.dtype(k) for k in self.input_shapes},
            "output_names": list(self.output_names),
            "tags": sorted(self.tags),
            "family": self.family,
            "source": self.source,
            "version": self.version,
        }


def register(name: str, *, description: str, input_shapes: dict[str, tuple[int, ...]],
             tags: set[str] | frozenset[str], source: str, family: str,
             input_dtypes: dict[str, str] | None = None,
             output_names: tuple[str, ...] = ("output",), version: int = 1,
             int_high: int = 2) -> Callable:
    """Decorator for a zero-argument builder returning an `nn.Module` in any mode."""

    def deco(fn: Callable[[], torch.nn.Module]) -> Callable[[], torch.nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"zoo model '{name}' registered twice")
        _REGISTRY[name] = ZooEntry(
            name=name, description=description,
            input_shapes={k: tuple(v) for k, v in input_shapes.items()},
            tags=frozenset(tags), source=source, family=family, builder=fn,
            input_dtypes=dict(input_dtypes or {}), output_names=tuple(output_names),
            version=version, int_high=int_high)
        return fn

    return deco
