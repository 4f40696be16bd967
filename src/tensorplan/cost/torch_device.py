"""Kernel costs measured on a torch device: each candidate built by `program.torch_kernel`
(Inductor-fused, cuDNN/cuBLAS for linear primitives) and timed where it will run.

Why: this is Korch's profiler for a GPU. tensorplan's TVM runtime cannot launch CUDA kernels, so
on a GPU the candidates come from PyTorch's compiler instead, and the BLP picks among them with
their real latencies. On CUDA a candidate is timed as a CUDA graph of `graph_calls` back-to-back
calls (GPU time per call, without Python's launch cost, which a plan run as one CUDA graph does
not pay either). On a CPU device the foundation's timer times plain calls.

With a `store`, every timing (and every kernel that failed to build) is kept there, keyed by
the candidate, the torch version and the device, so a second run, or a run cut short and started
again, times nothing twice (`cached`: what `cost.lazy.LazyCost` looks up before it predicts).

Compilation is the slow part (Inductor takes ~0.3-3 s per kernel); `jobs > 1` first builds
the candidates in worker processes, which fills Inductor's on-disk caches, so the timing process
then mostly loads compiled kernels. Costs are kept per canonical hash for the object's life
(greedy/no-fusion ablations and the race re-use them).
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable


from tensorplan.errors import CompileError, UnsupportedOperatorError
from tensorplan.ir.graph import Graph

if TYPE_CHECKING:
    from tensorplan.korch.candidates import Candidate

PROGRAM_KIND = "torch_kernel"     # the store's program kind of a candidate built by PyTorch


def cuda_graph_timer(fn: Callable[[], Any], *, calls: int = 20, min_repeats: int = 5,
                     budget_s: float = 0.05) -> float:
    """Median GPU seconds per call of `fn`, captured `calls` times in one CUDA graph and replayed."""
    import torch
    from tensorplan.measure.timer import measure
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    t = measure(g.replay, warmup=2, min_repeats=min_repeats, max_repeats=200, budget_s=budget_s,
                number=1, sync=torch.cuda.synchronize)
    return t.median_s / calls


def _warm_worker(args) -> int:
    """Worker process: build (compile) kernels so Inductor's caches hold them; returns how many built."""
    prim, cands, device = args
    import torch  # noqa: F401
    from tensorplan.kernels.torch_kernel import build_kernel, example_inputs
    n = 0
    for c in cands:
        try:
            k = build_kernel(prim, c.nodes, c.inputs, c.outputs, device=device, compile=True)
            k(*example_inputs(prim, c.inputs, device))
            n += 1
        except Exception:  # noqa: BLE001 - the timing pass reports the failure
            pass
    return n


class TorchDeviceCost:
    """`KernelCost` that compiles each candidate with PyTorch and times it on `device`."""

    supports_regions = False  # ONNX Runtime regions are a CPU feature
    # no finalists' race: on a GPU the plan runs as one CUDA graph, whose time is the sum of the
    # kernels' CUDA-graph timings (bench/results/korch_gpu.json: predicted vs measured within 8 %);
    # the race exists for what solo timings miss on a CPU (thread pools waking between kernels)
    races = False

    def __init__(self, device: str = "cuda", *, compile: bool = True, graph_calls: int = 20,
                 budget_s: float = 0.05, jobs: int = 1, log: Callable[[str], None] | None = None,
                 store: Any = None):
        import torch
        self.device = torch.device(device)
        self.compile = bool(compile)
        self.graph_calls = int(graph_calls)
        self.budget_s = float(budget_s)
        self.jobs = int(jobs)
        self.name = "torch-inductor" if compile else "torch-eager"
        self.cache: dict[str, float] = {}
        self.errors: dict[str, str] = {}
        self.compile_s = 0.0
        self.time_s = 0.0
        self.warm_s = 0.0
        self._log = log or (lambda m: None)
        self.cached_hits = 0
        self.store, self.dev_key = None, ""
        self._keys: dict[str, str] = {}          # canonical hash -> the store's program key
        if store is not None:
            from tensorplan import devices
            from tensorplan.measure.store import Store
            self.store = store if isinstance(store, Store) else Store(store)
            spec = devices.device("cuda" if self.device.type == "cuda" else "local")
            self.dev_key = self.store.put_device(spec)

    # -- KernelCost -------------------------------------------------------------------------
    def cost(self, prim: Graph, cand: "Candidate") -> float:
        return self.cost_many(prim, [cand])[0]

    def cached(self, prim: Graph, cand: "Candidate") -> float | None:
        """The candidate's timing from this object or the store (math.inf: it failed to build); None if never timed."""
        h = cand.canonical_hash
        if h in self.cache:
            return self.cache[h]
        if self.store is None:
            return None
        hit = self.store.get_measurement(self._prog_key(prim, cand), self.dev_key)
        if hit is None:
            return None
        ex = hit.get("extra") or {}
        self.cache[h] = math.inf if ex.get("failed") else float(hit["median_s"])
        if ex.get("error"):
            self.errors[h] = str(ex["error"])
        self.cached_hits += 1
        return self.cache[h]

    def cost_many(self, prim: Graph, cands, progress: bool = False) -> list[float]:
        todo = [c for c in cands if self.cached(prim, c) is None]
        if self.jobs > 1 and self.compile and len(todo) > self.jobs:
            self._warm(prim, todo)
        bar = None
        if progress and todo:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                           TimeRemainingColumn(), transient=True)
            bar.start()
            task = bar.add_task(f"timing {len(todo)} kernels on {self.device}", total=len(todo))
        try:
            for c in todo:
                self.cache[c.canonical_hash] = self._time(prim, c)
                self._keep(prim, c)
                if bar is not None:
                    bar.advance(task)
        finally:
            if bar is not None:
                bar.stop()
        return [self.cache[c.canonical_hash] for c in cands]

    def kernel_info(self, prim: Graph, cand: "Candidate") -> dict[str, Any]:
        return {"backend": "torch-inductor" if self.compile else "torch",
                "schedule": {"device": str(self.device)}}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "device": str(self.device), "graph_calls": self.graph_calls,
                "kernels_timed": len(self.cache) - self.cached_hits, "from_store": self.cached_hits,
                "failed": len(self.errors), "store": str(self.store.path) if self.store is not None else None,
                "warm_s": round(self.warm_s, 3), "compile_s": round(self.compile_s, 3),
                "time_s": round(self.time_s, 3)}

    # -- internals --------------------------------------------------------------------------
    def _prog_key(self, prim: Graph, c: "Candidate") -> str:
        key = self._keys.get(c.canonical_hash)
        if key is None:
            import torch

            from tensorplan.cost import node_index
            byname = node_index(prim)           # cached per graph
            ops = [byname[n].op for n in c.nodes]
            key = self._keys[c.canonical_hash] = self.store.put_program(PROGRAM_KIND, {
                "canonical_hash": c.canonical_hash, "kind": c.kind, "ops": ops,
                "backend": self.name, "torch": torch.__version__, "graph_calls": self.graph_calls})
        return key

    def _keep(self, prim: Graph, c: "Candidate") -> None:
        """The timing just taken, into the store (a failure too: it is not built again)."""
        if self.store is None:
            return
        from tensorplan.measure.timer import Timing
        sec = self.cache[c.canonical_hash]
        extra = {"backend": self.name}
        if c.canonical_hash in self.errors:
            extra["error"] = self.errors[c.canonical_hash]
        if not math.isfinite(sec):
            extra["failed"] = True
        t = Timing.from_repeats([sec if math.isfinite(sec) else 1e9], method=f"{self.name}:{self.device.type}")
        self.store.put_measurement(self._prog_key(prim, c), self.dev_key, t, extra=extra)

    def _warm(self, prim: Graph, todo) -> None:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor
        t0 = time.perf_counter()
        # longest kernels first, dealt round-robin, so the workers finish together
        order = sorted(todo, key=lambda c: -len(c.nodes))
        chunks = [order[k::self.jobs] for k in range(self.jobs)]
        with ProcessPoolExecutor(self.jobs, mp_context=mp.get_context("spawn")) as ex:
            built = sum(ex.map(_warm_worker, [(prim, ch, str(self.device)) for ch in chunks]))
        self.warm_s += time.perf_counter() - t0
        self._log(f"warmed Inductor caches: {built}/{len(todo)} kernels in {self.warm_s:.1f}s "
                  f"with {self.jobs} processes")

    def _time(self, prim: Graph, c: "Candidate") -> float:
        from tensorplan.kernels.torch_kernel import build_kernel, example_inputs
        import torch
        t0 = time.perf_counter()
        try:
            k = build_kernel(prim, c.nodes, c.inputs, c.outputs, device=self.device, compile=self.compile)
            xs = example_inputs(prim, c.inputs, self.device)
            k(*xs)
        except (CompileError, UnsupportedOperatorError) as e:
            self.errors[c.canonical_hash] = str(e)[:300]
            self.compile_s += time.perf_counter() - t0
            if len(c.nodes) == 1:
                raise  # a single primitive must always run (cost contract)
            return math.inf
        self.compile_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        from tensorplan.measure.timer import measure
        try:
            with torch.inference_mode():
                if self.device.type == "cuda":
                    try:
                        sec = cuda_graph_timer(lambda: k(*xs), calls=self.graph_calls, budget_s=self.budget_s)
                    except RuntimeError as e:  # not capturable: time stream launches instead
                        self.errors.setdefault(c.canonical_hash, f"CUDA graph capture: {str(e)[:200]}")
                        torch.cuda.synchronize()
                        sec = measure(lambda: k(*xs), warmup=2, budget_s=self.budget_s, number=None,
                                      sync=torch.cuda.synchronize).median_s
                else:
                    sec = measure(lambda: k(*xs), warmup=2, budget_s=self.budget_s, number=None).median_s
        except Exception as e:  # noqa: BLE001 - a kernel that fails at run time is not a candidate
            self.errors[c.canonical_hash] = f"run: {type(e).__name__}: {str(e)[:300]}"
            if len(c.nodes) == 1:
                raise CompileError(f"single primitive {c.nodes[0]} fails on {self.device}: {e}") from e
            return math.inf
        self.time_s += time.perf_counter() - t0
        return max(float(sec), 1e-9)


__all__ = ["PROGRAM_KIND", "TorchDeviceCost", "cuda_graph_timer"]
