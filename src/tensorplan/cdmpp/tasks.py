"""Tensor-program *tasks*: the fused kernels of the zoo networks, as TVM PrimFuncs.

Why: CDMPP/TenSet learn from many schedules of many kernels of real networks.  A task is one
fused kernel (Relax LegalizeOps -> FuseOps -> FuseTIR of the ONNX-imported network),
deduplicated structurally across networks; each task remembers in which networks it occurs
and how often (call sites in Relax `main`), which is the weight of its latency in a network's
end-to-end latency (CDMPP §4.5, TVM `extract_tasks`' weight).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from tensorplan.errors import TensorplanError
from tensorplan.kernels.schedule import trace_json  # noqa: F401 - re-exported (dataset, gpu_dataset)

#: Default networks for the dataset (zoo names); small/medium inputs so that 2 cores cope.
DEFAULT_NETWORKS = ("resnet-50", "mobilenet-v2", "vgg-16", "bert-base", "vit-b16", "segformer-b0",
                    "efficientvit-b1", "yolox-nano", "candy", "posenet", "retinaface", "yolov2",
                    "tiny-attention", "tiny-cnn", "tiny-convnext-ish", "tiny-mlp",
                    # more kernel kinds (SE, 5x5/7x7 depthwise, shuffles, windows, causal attention)
                    "mobilenet-v3-large", "shufflenet-v2", "efficientnet-b0", "convnext-tiny", "mobilevit-s",
                    "swin-tiny", "gpt2")


@dataclass
class Task:
    """One fused kernel: `mod` holds a single PrimFunc named 'main' (unscheduled)."""

    key: str                       # structural hash (hex) of the PrimFunc
    name: str                      # fused function name, e.g. 'fused_conv2d_add_relu'
    mod: Any                       # tvm.IRModule({'main': PrimFunc})
    networks: dict[str, int] = field(default_factory=dict)   # network -> call-site count
    flops: float = 0.0             # TVM's estimate of the kernel's FLOPs

    def script(self) -> str:
        return self.mod.script()


def _struct_key(func) -> str:
    import tvm_ffi
    h = tvm_ffi.structural_hash(func.without_attr("global_symbol"), map_free_vars=True)
    return f"{h & 0xFFFFFFFFFFFFFFFF:016x}"


def _fuse(mod):
    import tvm
    from tvm import relax
    seq = tvm.ir.transform.Sequential([
        relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(),
        relax.transform.DeadCodeElimination(),
    ])
    return seq(mod)


def _call_counts(mod) -> dict[str, int]:
    """Number of call sites of each PrimFunc (GlobalVar name) in the Relax functions."""
    import tvm
    from tvm import relax
    counts: dict[str, int] = {}
    for gv, f in mod.functions.items():
        if not isinstance(f, relax.Function):
            continue

        def visit(e):
            if isinstance(e, relax.Call):
                for a in e.args:
                    if isinstance(a, tvm.ir.GlobalVar):
                        counts[a.name_hint] = counts.get(a.name_hint, 0) + 1
        relax.analysis.post_order_visit(f.body, visit)
    return counts


_BOOKKEEPING_OPS = frozenset({"relax.call_tir", "relax.call_tir_inplace", "relax.call_tir_with_grad"})


def _uncovered_ops(mod) -> dict[str, int]:
    """Relax operators left outside any PrimFunc after fusion (TopK, NMS, sorting, external
    calls): kernels that have no TIR program to featurise, so a prediction leaves them out."""
    import tvm
    from tvm import relax
    out: dict[str, int] = {}
    for _, f in mod.functions.items():
        if not isinstance(f, relax.Function):
            continue

        def visit(e):
            if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name not in _BOOKKEEPING_OPS:
                name = e.op.name
                if name == "relax.call_dps_packed" and e.args and isinstance(e.args[0], relax.ExternFunc):
                    name = f"extern {e.args[0].global_symbol}"
                out[name] = out.get(name, 0) + 1
            elif isinstance(e, relax.Call) and isinstance(e.op, relax.ExternFunc):
                name = f"extern {e.op.global_symbol}"
                out[name] = out.get(name, 0) + 1
        relax.analysis.post_order_visit(f.body, visit)
    return out


def network_tasks(onnx_path: str | Path, network: str) -> list[Task]:
    """Import an ONNX model with TVM Relax, fuse it, and return its fused PrimFuncs as tasks."""
    return network_tasks_and_gaps(onnx_path, network)[0]


def network_tasks_and_gaps(onnx_path: str | Path, network: str) -> tuple[list[Task], dict[str, int]]:
    """`network_tasks` plus the operators no task covers (`_uncovered_ops`: op -> calls)."""
    import onnx
    import tvm
    from tvm import tirx
    from tvm.relax.frontend.onnx import from_onnx
    try:
        model = onnx.load(str(onnx_path))
        mod = from_onnx(model, keep_params_in_input=False)
    except Exception as e:  # noqa: BLE001 - frontend errors are many and deep
        raise TensorplanError(f"network '{network}': TVM's ONNX frontend failed on {onnx_path}: {e}") from None
    fused = _fuse(mod)
    counts = _call_counts(fused)
    out: dict[str, Task] = {}
    for gv, f in fused.functions.items():
        if not isinstance(f, tirx.PrimFunc):
            continue
        n = counts.get(gv.name_hint, 0)
        if n == 0:
            continue
        func = f.with_attr("global_symbol", "main")
        key = _struct_key(func)
        t = out.get(key)
        if t is None:
            try:
                from tvm.s_tir.analysis import estimate_tir_flops
                fl = float(estimate_tir_flops(tvm.IRModule({"main": func})))
            except Exception:  # noqa: BLE001
                fl = 0.0
            t = out[key] = Task(key=key, name=re.sub(r"\d+$", "", gv.name_hint) or gv.name_hint,
                                mod=tvm.IRModule({"main": func}), flops=fl)
        t.networks[network] = t.networks.get(network, 0) + n
    return list(out.values()), _uncovered_ops(fused)


def extract_tasks(networks: Iterable[str] = DEFAULT_NETWORKS, *, opset: int = 17,
                  progress: Any = None) -> list[Task]:
    """Tasks of several zoo networks (or ONNX paths), merged across networks by structure."""
    from tensorplan.zoo.specs import resolve_model
    merged: dict[str, Task] = {}
    for net in networks:
        path, name = resolve_model(net, opset)
        for t in network_tasks(path, name):
            m = merged.get(t.key)
            if m is None:
                merged[t.key] = t
            else:
                for k, v in t.networks.items():
                    m.networks[k] = m.networks.get(k, 0) + v
        if progress is not None:
            progress(name)
    return sorted(merged.values(), key=lambda t: t.key)


def task_from_script(key: str, name: str, script: str, networks: dict[str, int], flops: float = 0.0) -> Task:
    """Rebuild a Task from its stored TVMScript text."""
    import tvm
    try:
        mod = tvm.script.from_source(script)
    except Exception as e:  # noqa: BLE001
        raise TensorplanError(f"task '{name}' ({key}): stored TVMScript does not parse: {e}") from None
    if not isinstance(mod, tvm.IRModule):
        mod = tvm.IRModule({"main": mod})
    return Task(key=key, name=name, mod=mod, networks=dict(networks), flops=flops)


def script_digest(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()[:16]


#: Length of `task_io_vector`: output size, then up to this many - 1 input sizes.
TASK_IO_DIM = 8
_BUFFER_ARG = re.compile(r"T\.Buffer\(\(([^)]*(?:\([^)]*\)[^)]*)*)\),\s*\"(\w+)\"\)")
_INT_DIM = re.compile(r"T\.int(?:32|64)\((\d+)\)")


def buffer_shapes(script: str) -> list[tuple[tuple[int, ...], str]]:
    """(shape, dtype) of each parameter of the task's `main`, read from its TVMScript signature.

    Why text and not the parsed module: parsing 800 task scripts takes ~30 s, the signature ~1 ms.
    """
    start = script.find("def main(")
    if start < 0:
        raise TensorplanError("task script has no `def main(`")
    end = script.find("):\n", start)
    sig = script[start:end if end > 0 else len(script)]
    out = []
    for dims, dtype in _BUFFER_ARG.findall(sig):
        txt = _INT_DIM.sub(r"\1", dims)
        shape = tuple(int(d) for d in txt.replace(" ", "").split(",") if d.isdigit())
        out.append((shape, dtype))
    return out


def task_io_vector(script: str) -> list[float]:
    """log2 element counts of the task's output (last parameter) and of its inputs, largest first,
    zero-padded to TASK_IO_DIM: the problem size a schedule trace alone does not state."""
    return io_vector([math.prod(s) for s, _ in buffer_shapes(script)])


def task_io_of(prog: Any) -> list[float]:
    """`task_io_vector` of an in-memory program (PrimFunc, IRModule with one, or Schedule), read
    from its parameters' buffers; a symbolic dimension counts as 1."""
    import tvm
    from tvm import tirx

    mod = prog.mod if hasattr(prog, "mod") and hasattr(prog, "trace") else prog
    if isinstance(mod, tvm.IRModule):
        funcs = [f for _, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
        if len(funcs) != 1:
            raise TensorplanError(f"task_io_of: expected one PrimFunc, found {len(funcs)}")
        mod = funcs[0]
    sizes = []
    for p in mod.params:                 # TVM 0.27: the parameters are the buffers themselves
        shape = getattr(p, "shape", None)
        if shape is not None:
            sizes.append(math.prod(int(d) if isinstance(d, tirx.IntImm) else 1 for d in shape))
    return io_vector(sizes)


def io_vector(sizes: list[int]) -> list[float]:
    """Parameter element counts (output last) -> the TASK_IO_DIM vector of `task_io_vector`."""
    if not sizes:
        return [0.0] * TASK_IO_DIM
    vec = [math.log2(1 + sizes[-1])] + [math.log2(1 + n) for n in sorted(sizes[:-1], reverse=True)]
    vec = vec[:TASK_IO_DIM]
    return vec + [0.0] * (TASK_IO_DIM - len(vec))


# A schedule of a task, stored as its trace (the dataset and the compile workers replay it);
# `trace_json` is the planner's (kernels/schedule.py), re-exported for the dataset's callers

def replay_trace(mod, trace: list | str):
    """Rebuild the scheduled IRModule from a task's `mod` and a stored trace (JSON list or string)."""
    from tvm import s_tir
    if isinstance(trace, str):
        trace = json.loads(trace)
    sch = s_tir.Schedule(mod)
    try:
        s_tir.Trace.apply_json_to_schedule(trace, sch)
    except Exception as e:  # noqa: BLE001
        raise TensorplanError(f"replay_trace: stored trace does not apply to the task's PrimFunc: {e}") from None
    return sch
