"""`tensorplan inspect`: what a model holds (operators, FLOPs, bytes, parameters), which
operators tensorplan runs itself and which it hands to ONNX Runtime, and optionally a
numerical check of the reference executor against ONNX Runtime."""
from __future__ import annotations

from tensorplan.ir.analysis import check_against_ort, graph_flops, min_bytes, op_summary, param_count


def inspect_model(spec: str, input_shapes: dict[str, tuple[int, ...]] | None = None,
                  opset: int = 17, check: bool = False, seed: int = 0) -> dict:
    """Everything `tensorplan inspect` prints, as a JSON-ready dict.

    Unsupported operators are reported (not raised) so a user sees the whole list."""
    import time

    from tensorplan.zoo.specs import load_model, resolve_model_path
    from tensorplan.ir.reference import is_foreign, unsupported_nodes

    path = resolve_model_path(spec, opset)
    t0 = time.perf_counter()
    graph = load_model(spec, input_shapes, opset, allow_unsupported=True)
    import_s = time.perf_counter() - t0
    bad = {name for name, _ in unsupported_nodes(graph)}
    unsupported = [{"node": n.name, "op": n.op, "domain": n.domain} for n in graph.nodes if n.name in bad]
    foreign = [{"node": n.name, "op": n.op, "domain": n.domain} for n in graph.nodes
               if is_foreign(n) and n.name not in bad]
    summary = op_summary(graph)
    report = {
        "model": str(spec),
        "path": str(path),
        "opset": graph.opset,
        "import_s": import_s,
        "inputs": {i: {"shape": list(graph.tensors[i].shape), "dtype": graph.tensors[i].dtype}
                   for i in graph.inputs},
        "outputs": {o: {"shape": list(graph.tensors[o].shape), "dtype": graph.tensors[o].dtype}
                    for o in graph.outputs},
        "nodes": len(graph.nodes),
        "parameters": param_count(graph),
        "flops": graph_flops(graph),
        "bytes_moved": int(sum(r["bytes"] for r in summary.values())),
        "min_bytes": min_bytes(graph),
        "ops": summary,
        "unsupported": unsupported,
        # no tensorplan rule: run node by node in ONNX Runtime, opaque in plans
        "foreign": foreign,
    }
    if check:
        if unsupported:
            report["check"] = {"skipped": "model has unsupported operators", "passed": False}
        else:
            report["check"] = check_against_ort(graph, path, seed=seed)
    return report
