"""`inspect`: what a model holds (operators, FLOPs, bytes, parameters), which operators tensorplan
runs itself and which it hands to ONNX Runtime, and optionally a numerical check of the reference
executor against ONNX Runtime."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tensorplan.ir.analysis import check_against_ort, graph_flops, min_bytes, op_summary, param_count
from tensorplan.ir.graph import Graph


@dataclass
class ModelReport:
    """Everything `tensorplan inspect` prints (`to_dict` for --json).

    `ops` maps an operator type to its count, FLOPs and bytes; `unsupported` lists the nodes no
    runtime here executes, `foreign` those without a tensorplan rule that ONNX Runtime runs one at a
    time (opaque in plans); `check` is the reference executor vs ONNX Runtime, when asked for."""

    model: str
    path: str | None
    opset: int
    import_s: float
    inputs: dict[str, dict[str, Any]]
    outputs: dict[str, dict[str, Any]]
    nodes: int
    parameters: int
    flops: int
    bytes_moved: int
    min_bytes: int
    ops: dict[str, dict[str, int]]
    unsupported: list[dict[str, str]] = field(default_factory=list)
    foreign: list[dict[str, str]] = field(default_factory=list)
    check: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if d["check"] is None:
            d.pop("check")
        return d


def inspect_model(model: str | Path | Graph, input_shapes: dict[str, tuple[int, ...]] | None = None,
                  opset: int = 17, check: bool = False, seed: int = 0) -> ModelReport:
    """Inspect `model` (a `Graph`, ONNX path, zoo name or PyTorch factory); unsupported operators
    are reported, not raised, so a user sees the whole list. `check` compares the reference
    executor with ONNX Runtime on the original file, on inputs drawn with `seed`."""
    from tensorplan.ir.reference import is_foreign, unsupported_nodes
    from tensorplan.zoo.specs import load, resolve_model_path

    t0 = time.perf_counter()
    graph = model if isinstance(model, Graph) else load(model, input_shapes, opset, allow_unsupported=True)
    import_s = time.perf_counter() - t0
    path = resolve_model_path(graph.source, opset) if graph.source else None
    bad = {name for name, _ in unsupported_nodes(graph)}
    summary = op_summary(graph)
    report = ModelReport(
        model=str(graph.source or graph.name), path=str(path) if path else None, opset=graph.opset,
        import_s=import_s,
        inputs={i: {"shape": list(graph.tensors[i].shape), "dtype": graph.tensors[i].dtype} for i in graph.inputs},
        outputs={o: {"shape": list(graph.tensors[o].shape), "dtype": graph.tensors[o].dtype} for o in graph.outputs},
        nodes=len(graph.nodes), parameters=param_count(graph), flops=graph_flops(graph),
        bytes_moved=int(sum(r["bytes"] for r in summary.values())), min_bytes=min_bytes(graph), ops=summary,
        unsupported=[{"node": n.name, "op": n.op, "domain": n.domain} for n in graph.nodes if n.name in bad],
        foreign=[{"node": n.name, "op": n.op, "domain": n.domain} for n in graph.nodes
                 if is_foreign(n) and n.name not in bad])
    if check:
        if report.unsupported:
            report.check = {"skipped": "model has unsupported operators", "passed": False}
        else:
            report.check = _check(graph, path, seed)
    return report


def _check(graph: Graph, path: Path | None, seed: int) -> dict[str, Any]:
    """`check_against_ort`, refused up front when the inputs cannot fit in memory, and with any
    ONNX Runtime (or reference executor) failure as one TensorplanError naming the model."""
    from tensorplan.errors import TensorplanError
    from tensorplan.zoo.specs import check_run_memory

    name = graph.source or graph.name
    check_run_memory(graph, "inspect --check")
    try:
        return check_against_ort(graph, path, seed=seed)
    except TensorplanError:
        raise
    except MemoryError as e:
        raise TensorplanError(f"{name}: inspect --check ran out of memory ({e}); use smaller input shapes "
                              "(--input-shape)") from None
    except Exception as e:  # onnxruntime raises its own pybind exception types (Fail, InvalidArgument, ...)
        first = (str(e).strip().splitlines() or [""])[0][:500]
        raise TensorplanError(f"{name}: inspect --check failed in {_origin(e)}: {type(e).__name__}: {first}") from None


def _origin(e: BaseException) -> str:
    mod = type(e).__module__ or ""
    return "ONNX Runtime" if "onnxruntime" in mod else "the check (reference executor vs ONNX Runtime)"


__all__ = ["ModelReport", "inspect_model"]
