"""One interface over kernel costs: measured, predicted or analytical.

The planner only knows `KernelCost.cost(prim, cand) -> seconds`. Concrete models:
`AnalyticalCost` (roofline, here: planning works with no measurement at all),
`tensorplan.cost.measured.MeasuredCost` (compiles and times kernels, caches in the
store), `tensorplan.cost.torch_device.TorchDeviceCost` (PyTorch kernels timed on a GPU) and
`tensorplan.cost.predicted.CDMPPCost` (CDMPP's predicted latency, nothing timed).

Contract for implementers:
- return seconds (float > 0) for one run of the kernel on the model's device;
- return `math.inf` when the candidate cannot be built as one kernel; the planner then
  never selects it. A singleton candidate (one primitive) must always be finite, because
  any single primitive can run through a fallback (reference executor / torch);
- costs must depend only on `cand.canonical_hash` (the planner costs each hash once);
- optionally implement `cost_many(prim, cands, progress=...) -> list[float]` to batch work
  (compile in parallel, one store transaction); `cost_many` below uses it when present.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, Protocol, runtime_checkable

import numpy as np

from tensorplan.korch.fission import category
from tensorplan.ir.graph import Graph, Node

if TYPE_CHECKING:  # plan imports cost, not the other way round at run time
    from tensorplan.korch.candidates import Candidate


@runtime_checkable
class KernelCost(Protocol):
    """Latency of a candidate kernel in seconds (`math.inf` if it cannot be built)."""

    name: str

    def cost(self, prim: Graph, cand: "Candidate") -> float: ...


# ---------------------------------------------------------------------------------------------
# work counting (used by the roofline model)
# ---------------------------------------------------------------------------------------------

def _numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def node_flops(prim: Graph, n: Node) -> int:
    """FLOPs of one primitive: 2*MACs for linear ops, one per output (or input for reductions)
    element otherwise. Uses `tensorplan.ir.analysis.node_flops` when it exists."""
    try:
        from tensorplan.ir import analysis  # written by another helper; same definition
        return int(analysis.node_flops(prim, n))
    except (ImportError, AttributeError):
        pass
    t = prim.tensors
    out = t[n.outputs[0]].shape if n.outputs and n.outputs[0] else ()
    if n.op == "MatMul":
        a = t[n.inputs[0]].shape
        return 2 * _numel(out) * (a[-1] if a else 1)
    if n.op in ("Conv", "ConvTranspose"):
        w = t[n.inputs[1]].shape
        group = int(n.attrs.get("group", 1))
        if n.op == "Conv":
            return 2 * _numel(out) * _numel(w[1:])
        x = t[n.inputs[0]].shape
        return 2 * _numel(x) * _numel(w[1:]) // max(group, 1) * group
    if n.op == "Gemm":
        a = t[n.inputs[0]].shape
        k = a[0] if n.attrs.get("transA", 0) else a[-1]
        return 2 * _numel(out) * k
    if category(n.op) == "reduce":
        return _numel(t[n.inputs[0]].shape)
    if category(n.op) == "layout":
        return 0
    return _numel(out)


def kernel_work(prim: Graph, cand: "Candidate") -> tuple[int, int]:
    """(FLOPs, bytes moved) of a fused kernel: its external inputs (incl. weights) and its
    outputs are read/written once; intermediates stay on chip (the point of fusion)."""
    byname = node_index(prim)
    flops = sum(node_flops(prim, byname[x]) for x in cand.nodes)
    nbytes = sum(prim.tensors[i].nbytes for i in (*cand.inputs, *cand.const_inputs))
    nbytes += sum(prim.tensors[o].nbytes for o in cand.outputs)
    return flops, nbytes


_INDEX_CACHE: dict[int, tuple[int, dict[str, Node]]] = {}


def node_index(prim: Graph) -> dict[str, Node]:
    """Name -> node of a primitive graph, cached per graph object (costing looks nodes up by name
    for thousands of candidates)."""
    key = id(prim)
    hit = _INDEX_CACHE.get(key)
    if hit is None or hit[0] != len(prim.nodes):
        hit = (len(prim.nodes), {n.name: n for n in prim.nodes})
        _INDEX_CACHE[key] = hit
    return hit[1]


class AnalyticalCost:
    """Roofline: max(FLOPs / peak, bytes / bandwidth) + a per-kernel launch overhead.

    Why: lets the whole pipeline plan without a single measurement (CI, unseen devices) and
    is the baseline the measured/predicted models must beat. `efficiency` scales the peaks
    (real kernels rarely reach them); `launch_s` is the fixed cost that makes fusion pay."""

    name = "analytical"

    def __init__(self, device: Any = "local", launch_s: float | None = None,
                 compute_eff: float = 0.7, memory_eff: float = 0.7):
        if isinstance(device, str):
            from tensorplan import devices
            device = devices.device(device)
        self.device = device
        self.peak_flops = float(device.peak_fp32_gflops) * 1e9 * compute_eff
        self.bandwidth = float(device.mem_bw_gbs) * 1e9 * memory_eff
        kind = getattr(device, "kind", "cpu")
        self.launch_s = launch_s if launch_s is not None else (5e-6 if kind == "gpu" else 2e-6)

    def cost(self, prim: Graph, cand: "Candidate") -> float:
        if cand.kind == "region":
            return math.inf  # what ONNX Runtime fuses inside a region is unknown until timed
        flops, nbytes = kernel_work(prim, cand)
        return max(flops / self.peak_flops, nbytes / self.bandwidth) + self.launch_s

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "peak_flops": self.peak_flops, "bandwidth": self.bandwidth,
                "launch_s": self.launch_s, "device": getattr(self.device, "name", str(self.device))}


def cost_many(model: KernelCost, prim: Graph, cands: Iterable["Candidate"], *,
              progress: bool = False, description: str = "costing kernels") -> np.ndarray:
    """Costs of all candidates, each canonical hash costed once (repeated blocks share it).

    Uses `model.cost_many(prim, unique_cands, progress=...)` when the model has it (batched
    measurement), else calls `model.cost` per unique hash under a rich progress bar."""
    cands = list(cands)
    first: dict[str, "Candidate"] = {}
    for c in cands:
        first.setdefault(c.canonical_hash, c)
    uniq = list(first.values())
    batched = getattr(model, "cost_many", None)
    if callable(batched):
        vals = list(batched(prim, uniq, progress=progress))
    else:
        vals = []
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeRemainingColumn(), transient=True) as bar:
                task = bar.add_task(description, total=len(uniq))
                for c in uniq:
                    vals.append(float(model.cost(prim, c)))
                    bar.advance(task)
        else:
            vals = [float(model.cost(prim, c)) for c in uniq]
    by_hash = {c.canonical_hash: float(v) for c, v in zip(uniq, vals)}
    out = np.array([by_hash[c.canonical_hash] for c in cands], dtype=np.float64)
    bad = [c for c, v in zip(cands, out) if not (v > 0) and not math.isinf(v)]
    if bad:
        from tensorplan.errors import TensorplanError
        raise TensorplanError(f"cost model '{getattr(model, 'name', model)}' returned a non-positive "
                              f"cost for candidate {bad[0].id} (nodes {list(bad[0].nodes)[:3]})")
    return out


__all__ = ["KernelCost", "AnalyticalCost", "cost_many", "kernel_work", "node_flops", "node_index"]
