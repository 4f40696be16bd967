"""`export_onnx`: a plan, or a model's exact rewrites, as one ONNX file that stock ONNX Runtime runs.

The work is `Plan.export` / `runtime.export.export_model`; this is the one call the
`tensorplan export` command makes, whatever its target is.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from tensorplan.ir.graph import Graph
from tensorplan.runtime.export import ExportResult, export_model
from tensorplan.runtime.plan import Plan, load_plan
from tensorplan.zoo.specs import as_graph


def export_onnx(target: Plan | Graph | str | Path, out: str | Path, *, threads: int | None = None,
                check: bool = True, tol: float | None = None, rounds: int = 15, opset: int = 17,
                input_shapes: dict[str, tuple[int, ...]] | None = None, spinning: bool | None = None,
                log: Callable[[str], None] | None = None) -> ExportResult:
    """Write `target` to `out` as one ONNX model: a `Plan` or a plan JSON file (`plan.export`), or a
    model (a `Graph`, ONNX path, zoo name or PyTorch factory: its exact rewrites only). The file is
    checked against ONNX Runtime on the original model (`check`, max relative error <= `tol`) and
    both are timed in ONNX Runtime, interleaved, for `rounds` rounds (0: no timing), with `threads`
    intra-op threads (default every usable core) and the plan's spinning choice (`spinning`
    overrides it). `opset` and `input_shapes` apply to a model spec."""
    if isinstance(target, (str, Path)) and str(target).endswith(".json"):
        target = load_plan(target)
    if isinstance(target, Plan):
        return target.export(out, threads=threads, check=check, tol=tol, rounds=rounds, spinning=spinning, log=log)
    graph = as_graph(target, input_shapes, opset)
    return export_model(graph, out, threads=threads, check=check, tol=tol, rounds=rounds, spinning=spinning, log=log)


__all__ = ["export_onnx"]
