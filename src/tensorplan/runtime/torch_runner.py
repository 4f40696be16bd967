"""Run a `Plan` on a torch device (a CUDA GPU), each kernel a PyTorch program (`kernels.torch_kernel`).

Why: the TVM/ONNX Runtime executor (`runtime.executor`) is CPU-only here. On a GPU the plan's
kernels are Inductor-fused programs and cuDNN/cuBLAS calls; the runner keeps every tensor on
the device, frees each one after its last reader (the caching allocator reuses the memory), and
can capture the whole plan once as a CUDA graph, so a run is one replay with no Python between
kernels (what `torch.compile(mode="reduce-overhead")` does for the whole model).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorplan.errors import PlanError, TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.runtime.executor import RunResult, ort_reference

if TYPE_CHECKING:  # the plan module runs this one (Plan.run), not the other way round
    from tensorplan.runtime.plan import Plan


class TorchPlanRunner:
    """Compiled kernels of one plan on `device`; `run(feeds)` or, after `bind(feeds)`, `replay()`."""

    def __init__(self, plan: "Plan", prim: Graph | None = None, *, device: str = "cuda", compile: bool = True,
                 cuda_graph: bool = True):
        import torch
        from tensorplan.kernels.torch_kernel import build_kernel
        self.torch = torch
        self.plan = plan
        self.prim = prim if prim is not None else plan.primitive_graph()
        self.device = torch.device(device)
        self.use_graph = bool(cuda_graph) and self.device.type == "cuda"
        bad = [k.id for k in plan.kernels if k.kind == "region"]
        if bad:
            raise PlanError(f"plan kernels {bad} are ONNX Runtime regions, which run on the CPU only; "
                            f"re-run orchestrate with a torch device cost (regions off)")
        int8 = [k.id for k in plan.kernels if k.precision == "int8"]
        if int8:
            raise PlanError(f"plan kernels {int8[:5]} are int8 (ONNX Runtime / OpenVINO quantized models), which "
                            "run on the CPU only; re-plan them at fp32, bf16 or fp16 for a torch device")
        autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}
        by_id = {k.id: k for k in plan.kernels}
        self.order = [by_id[i] for i in plan.order]
        t0 = time.perf_counter()
        self.kernels = {k.id: build_kernel(self.prim, k.nodes, k.inputs, k.outputs, device=self.device,
                                           compile=compile, autocast=autocast.get(k.precision))
                        for k in self.order}
        self.build_s = time.perf_counter() - t0
        last: dict[str, int] = {}
        for j, k in enumerate(self.order):
            for i in k.inputs:
                last[i] = j
        keep = set(self.prim.outputs)
        self.free_after = [[i for i in k.inputs if last.get(i) == j and i not in keep]
                           for j, k in enumerate(self.order)]
        self._graph = None
        self._static_in: dict[str, Any] = {}
        self._static_out: dict[str, Any] = {}

    def _execute(self, env: dict[str, Any]) -> dict[str, Any]:
        for j, k in enumerate(self.order):
            outs = self.kernels[k.id](*[env[i] for i in k.inputs])
            for name, val in zip(k.outputs, outs):
                env[name] = val
            for i in self.free_after[j]:
                env.pop(i, None)
        return {o: env[o] for o in self.prim.outputs}

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """One run on device tensors (numpy arrays are moved to the device); returns device tensors."""
        torch = self.torch
        env = {i: torch.as_tensor(feeds[i]).to(self.device) for i in self.prim.inputs}
        with torch.inference_mode():
            return self._execute(env)

    def bind(self, feeds: dict[str, Any]) -> None:
        """Fix the inputs; with a CUDA graph, capture the whole plan once (after a warm-up run)."""
        torch = self.torch
        self._static_in = {i: torch.as_tensor(feeds[i]).to(self.device).clone() for i in self.prim.inputs}
        with torch.inference_mode():
            if not self.use_graph:
                return
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    self._execute(dict(self._static_in))
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self._static_out = self._execute(dict(self._static_in))
            self._graph = g

    def replay(self) -> dict[str, Any]:
        """Run the bound inputs (a graph replay when captured); returns the output tensors."""
        if self._graph is not None:
            self._graph.replay()
            return self._static_out
        with self.torch.inference_mode():
            return self._execute(dict(self._static_in))

    def outputs_numpy(self, outs: dict[str, Any]) -> dict[str, np.ndarray]:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
        return {k: v.detach().float().cpu().numpy() if v.dtype.is_floating_point else v.cpu().numpy()
                for k, v in outs.items()}


def is_torch_plan(plan: "Plan") -> bool:
    """True when the plan's kernels were built for `TorchPlanRunner` (cost model on a torch device)."""
    return bool(plan.kernels) and all(k.backend.startswith("torch") and "device" in k.schedule
                                      for k in plan.kernels)


def run_torch_plan(plan: "Plan", prim: Graph, feeds: dict[str, np.ndarray], *, check: bool = True,
                   repeats: int | None = None, budget_s: float = 2.0, tol: float = 1e-4,
                   threads: int | None = None) -> RunResult:
    """`Plan.run` for torch plans: build, bind (CUDA graph on a GPU), time, check vs ORT (ONNX Runtime
    and CPU kernels use `threads`, default every usable core)."""
    import torch
    from tensorplan.devices import usable_cores
    from tensorplan.ir.reference import rel_error
    from tensorplan.measure.timer import measure
    threads = int(threads or usable_cores())
    device = plan.kernels[0].schedule.get("device", "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TensorplanError(f"this plan's kernels were chosen for '{device}', and this machine has no CUDA "
                              f"GPU; run it on a GPU machine or re-run orchestrate for this device")
    compile_ = any(k.backend == "torch-inductor" for k in plan.kernels)
    from tensorplan.measure.timer import pinned_threads
    with pinned_threads(None if device.startswith("cuda") else threads):
        r = TorchPlanRunner(plan, prim, device=device, compile=compile_)
        r.bind(feeds)
        outs = r.outputs_numpy(r.replay())
        sync = torch.cuda.synchronize if r.device.type == "cuda" else None
        n = repeats or None
        tm = measure(r.replay, warmup=2, min_repeats=n or 5, max_repeats=n or 500,
                     budget_s=0.0 if n else budget_s, sync=sync)
    errors: dict[str, float] = {}
    max_err = ok = None
    if check:
        ref = ort_reference(plan, feeds, threads=threads)
        errors = {o: float(rel_error(np.atleast_1d(outs[o]), np.atleast_1d(ref[o]))) for o in prim.outputs if o in ref}
        max_err = max(errors.values()) if errors else None
        ok = max_err is not None and max_err <= tol
    backends: dict[str, int] = {}
    for k in plan.kernels:
        backends[k.backend] = backends.get(k.backend, 0) + 1
    return RunResult(model=str(plan.source.get("model")), kernels=len(plan.kernels), median_s=tm.median_s,
                     timing=tm.to_dict(), predicted_s=plan.predicted_s, max_rel_err=max_err, ok=ok,
                     backends=backends, compile_s=r.build_s, arena_bytes=0,
                     fallbacks=[], outputs=outs, kernel_sum_s=None, errors=errors, tol=tol)


__all__ = ["TorchPlanRunner", "is_torch_plan", "run_torch_plan"]
