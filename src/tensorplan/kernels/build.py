"""Targets, compilation and the `CompiledKernel` callable.

Targets are JSON dicts (TVM 0.27 rejects flag strings). `local_target()` reads
the host CPU name from LLVM so vector width and ISA match the machine. Compiled
libraries are cached in-process by the PrimFunc's structural hash + schedule +
target: structurally equal kernels (repeated blocks) with different weights
compile once, because non-scalar constants are parameters, not immediates.
"""
from __future__ import annotations

import functools
import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tensorplan.devices import usable_cores
from tensorplan.errors import CompileError
from tensorplan.ir.graph import Graph
from tensorplan.kernels.lower import Lowered, lower
from tensorplan.kernels.schedule import apply_schedule

_LOCK = threading.Lock()
_LIB_CACHE: dict[str, Any] = {}


@functools.lru_cache(maxsize=1)
def host_cpu() -> str:
    """LLVM's name for this CPU (e.g. 'znver5'); 'generic' if LLVM cannot tell."""
    import tvm
    try:
        return str(tvm.target.codegen.llvm_get_system_cpu())
    except Exception:  # noqa: BLE001
        return "generic"


def local_target(threads: int | None = None) -> dict:
    """JSON target dict for this CPU with `num-cores` = threads (default: every usable core)."""
    return {"kind": "llvm", "mcpu": host_cpu(), "num-cores": int(threads or usable_cores())}


def make_target(target: Any = None, threads: int | None = None):
    """A `tvm.target.Target` from a dict, a Target, 'local' or None (local CPU)."""
    import tvm
    if target is None or target == "local" or target == "llvm":
        target = local_target(threads)
    if isinstance(target, str):
        try:
            target = json.loads(target)
        except json.JSONDecodeError as e:
            raise CompileError(f"target '{target}' must be a JSON dict such as "
                               f"{json.dumps(local_target())}") from e
    if isinstance(target, dict):
        return tvm.target.Target(target)
    return target


def _target_key(target) -> str:
    try:
        return json.dumps(target.export(), sort_keys=True, default=str)
    except Exception:  # noqa: BLE001
        return str(target)


def _torch_dtype(d: str):
    import torch
    return {"float32": torch.float32, "float16": torch.float16, "float64": torch.float64,
            "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "uint8": torch.uint8,
            "bool": torch.bool, "bfloat16": torch.bfloat16}[d]


ALIGN = 64  # TVM assumes 64-byte aligned buffers and emits aligned vector loads


def is_aligned(t) -> bool:
    return t.is_contiguous() and t.data_ptr() % ALIGN == 0


def aligned(t):
    """`t` itself when contiguous and 64-byte aligned (torch allocations are), else an
    aligned copy: a misaligned buffer (e.g. `torch.from_numpy`) would fault in TVM code."""
    import torch
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(t))
    elif not isinstance(t, torch.Tensor):
        t = torch.from_dlpack(t)  # any DLPack producer (TVM tensors, cupy, jax, ...)
    if is_aligned(t):
        return t
    out = torch.empty(t.shape, dtype=t.dtype)
    out.copy_(t)
    return out


@dataclass
class CompiledKernel:
    """A compiled TVM kernel; call it with torch tensors (zero-copy via DLPack).

    `kernel(*inputs)` allocates and returns the outputs; `kernel(*inputs, out=[...])`
    writes into given tensors; `kernel.bind(inputs, outputs)` returns a zero-argument
    callable with all arguments fixed (what the executor uses: ~0.3 us per call).
    """

    name: str
    input_names: list[str]
    output_names: list[str]
    output_shapes: list[tuple[int, ...]]
    output_dtypes: list[str]
    func: Any
    consts: list[Any]              # torch tensors bound after the inputs
    backend: str = "tvm"
    schedule: dict = field(default_factory=dict)
    lib: Any = None               # keeps the module alive
    source_hash: str = ""

    def alloc_outputs(self) -> list:
        import torch
        return [torch.empty(s, dtype=_torch_dtype(d)) for s, d in zip(self.output_shapes, self.output_dtypes)]

    def __call__(self, *inputs, out: list | None = None):
        outs = out if out is not None else self.alloc_outputs()
        for o in outs:
            if not is_aligned(o):
                raise CompileError(f"kernel '{self.name}': output tensors must be contiguous and "
                                   f"{ALIGN}-byte aligned (allocate them with torch)")
        self.func(*[aligned(x) for x in inputs], *self.consts, *outs)
        return outs if len(outs) > 1 or out is not None else outs[0]

    def bind(self, inputs: list, outputs: list) -> Callable[[], None]:
        """Fix all arguments (they must stay alive and aligned); returns a no-arg callable."""
        for t in (*inputs, *outputs):
            if not is_aligned(t):
                raise CompileError(f"kernel '{self.name}': bound tensors must be contiguous and "
                                   f"{ALIGN}-byte aligned")
        return functools.partial(self.func, *inputs, *self.consts, *outputs)


def compile_lowered(lowered: Lowered, target: Any = None, schedule: dict | None = None,
                    name: str = "kernel", threads: int | None = None) -> CompiledKernel:
    """Schedule and compile a `Lowered` kernel (cached by structure + schedule + target)."""
    import torch
    import tvm
    import tvm_ffi
    tgt = make_target(target, threads)
    sched = dict(schedule or {"name": "default"})
    n_threads = int(tgt.attrs.get("num-cores", threads or usable_cores()) if hasattr(tgt, "attrs")
                    else threads or usable_cores())
    h = hashlib.sha256()
    h.update(str(tvm_ffi.structural_hash(lowered.func)).encode())
    h.update(json.dumps(sched, sort_keys=True, default=str).encode())
    h.update(_target_key(tgt).encode())
    key = h.hexdigest()[:24]
    with _LOCK:
        lib = _LIB_CACHE.get(key)
    if lib is None:
        try:
            mod = apply_schedule(lowered, sched, threads=n_threads, target=tgt, name=name)
            lib = tvm.compile(mod, target=tgt)
        except CompileError:
            raise
        except Exception as e:  # noqa: BLE001
            msg = str(e).strip().splitlines()
            raise CompileError(f"kernel '{name}' ({'+'.join(lowered.ops)}): TVM compile failed: "
                               f"{msg[-1] if msg else type(e).__name__}") from None
        with _LOCK:
            _LIB_CACHE[key] = lib
    consts = [aligned(torch.from_numpy(np.ascontiguousarray(c))) for c in lowered.consts]
    return CompiledKernel(name=name, input_names=list(lowered.inputs), output_names=list(lowered.outputs),
                          output_shapes=[tuple(s) for s in lowered.output_shapes],
                          output_dtypes=list(lowered.output_dtypes), func=lib["main"], consts=consts,
                          backend="tvm", schedule=sched, lib=lib, source_hash=key)


def compile_kernel(sub: Graph, outputs: list[str] | None = None, target: Any = None,
                   schedule: dict | None = None, threads: int | None = None) -> CompiledKernel:
    """Lower + schedule + compile a primitive sub-graph; raises `CompileError` naming the op.
    meta_schedule schedules ("tuned", "sampled") get the kernel lowered without `Let` bindings,
    the form they are drawn on (kernels/sampled.py)."""
    lowered = lower(sub, outputs, use_let=not uses_meta_schedule(schedule))
    return compile_lowered(lowered, target=target, schedule=schedule, name=sub.name, threads=threads)


def uses_meta_schedule(schedule: dict | None) -> bool:
    """Whether a schedule is meta_schedule's ("tuned", "sampled"): its kernel is lowered with
    `use_let=False`."""
    return (schedule or {}).get("name") in ("tuned", "sampled")


def clear_cache() -> None:
    with _LOCK:
        _LIB_CACHE.clear()
