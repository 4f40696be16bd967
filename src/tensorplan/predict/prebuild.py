"""Compile stored schedules in spawned worker processes, ahead of the process that times them.

Why: replaying a trace and compiling it (TVM lowering, then LLVM, or NVRTC/nvcc for CUDA)
costs 0.1-1 s a program.  On a many-core machine one process would spend most of a
measurement run compiling.  Workers are *spawned* (fresh interpreters): on a GPU machine
importing TVM already initialises the CUDA driver, and a forked child of such a process fails
its first CUDA call ("initialization error").  They receive the programs and the task scripts
once, at start, and hand back shared libraries (`export_library`) that the parent loads in
milliseconds.

CUDA: TVM 0.27 keeps a CUDA kernel as source in the library and compiles it when the library
is *loaded* (`tvm_callback_cuda_compile`), i.e. in the parent.  So the workers also compile each
kernel's source to a cubin, and `install_cubin_cache` makes the parent's callback return that
binary (keyed by the source's hash) instead of compiling again; a miss compiles as TVM would.
"""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

_W: dict[str, Any] = {}          # a worker's state: programs, task scripts, target, out dir


def _source_key(code: str) -> str:
    return hashlib.sha1(code.encode()).hexdigest()


def cuda_compiler() -> str:
    """'nvrtc' where NVIDIA's Python bindings are installed (in-process, fastest), else 'nvcc'."""
    try:
        from cuda.bindings import nvrtc  # noqa: F401
        return "nvrtc"
    except ImportError:
        return "nvcc"


def _init_worker(programs: list, tasks: dict, target: str, out_dir: str, cuda: str | None) -> None:
    import tvm
    _W.update(programs=programs, tasks=tasks, target=tvm.target.Target(target), dir=out_dir, cuda=cuda,
              task_cache={})
    if cuda:
        import tvm.support.nvcc  # noqa: F401 - registers TVM's CUDA compile callback


def _task(task_key: str):
    cache = _W.setdefault("task_cache", {})
    if task_key not in cache:
        from .tasks import task_from_script
        name, script, flops = _W["tasks"][task_key]
        cache[task_key] = task_from_script(task_key, name, script, {}, flops)
    return cache[task_key]


def _build(k: int) -> tuple[int, str | None, dict[str, bytes] | str]:
    """Worker: replay program k, compile, export to `<dir>/<k>.so`; CUDA sources also to cubins."""
    import tvm
    from .dataset import replay_trace
    p = _W["programs"][k]
    try:
        sch = replay_trace(_task(p["task_key"]).mod, p["trace"])
        ex = tvm.compile(sch.mod, target=_W["target"])
        path = str(Path(_W["dir"]) / f"{k}.so")
        ex.export_library(path)
        cubins: dict[str, bytes] = {}
        if _W["cuda"]:
            from tvm.support import nvcc
            mode = _W["cuda"]
            arch = str(_W["target"].attrs.get("arch", "")) or None
            with _W["target"]:                       # nvcc.py reads the arch from the target in scope
                for m in ex.mod.imports:
                    if m.kind == "cuda":
                        code = m.inspect_source()
                        cubins[_source_key(code)] = bytes(nvcc.compile_cuda(
                            code, target_format="cubin" if mode == "nvrtc" else "fatbin", arch=arch, compiler=mode))
        return k, path, cubins
    except Exception as e:  # noqa: BLE001 - a program that does not build is a normal outcome
        return k, None, f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"[:300]


class Prebuilder:
    """A pool of spawned compile workers over `programs` (dicts with task_key and trace).

    `tasks` is the dataset's tasks table indexed by task_key; `out_dir` receives the libraries.
    """

    def __init__(self, programs: Sequence[dict], tasks, target, out_dir: str | Path, workers: int):
        import tvm
        os.makedirs(out_dir, exist_ok=True)
        tgt = tvm.target.Target(target)
        cuda = cuda_compiler() if tgt.kind.name == "cuda" else None
        progs = [{"task_key": p["task_key"], "trace": p["trace"]} for p in programs]
        need = {p["task_key"] for p in progs}
        scripts = {k: (str(r["task_name"]), str(r["script"]), float(r["flops"]))
                   for k, r in tasks.iterrows() if k in need}
        self.workers = max(1, int(workers))
        self._pool = mp.get_context("spawn").Pool(self.workers, initializer=_init_worker,
                                                  initargs=(progs, scripts, str(tgt), str(out_dir), cuda))

    def map(self, indices: Sequence[int]) -> list[tuple[int, str | None, Any]]:
        """Compile these programs now (all workers), in order."""
        return self._pool.map(_build, list(indices), chunksize=1)

    def imap(self, indices: Sequence[int]) -> Iterator[tuple[int, str | None, Any]]:
        """Compile in the background, yielding results in order as they are ready."""
        return self._pool.imap(_build, list(indices), chunksize=1)

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()

    def __enter__(self) -> "Prebuilder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def install_cubin_cache(cache: dict[str, bytes], stats: dict[str, int]) -> None:
    """Make TVM's load-time CUDA compile return the workers' binaries (`cache`, consumed)."""
    import tvm_ffi
    from tvm.support import nvcc
    fallback = nvcc.tvm_callback_cuda_compile

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _cached(code, *rest):  # noqa: ANN001 - TVM calls it with the kernel source
        hit = cache.pop(_source_key(code), None)
        stats["hit" if hit is not None else "miss"] = stats.get("hit" if hit is not None else "miss", 0) + 1
        return hit if hit is not None else fallback(code)
