"""Compile stored schedules in spawned worker processes, ahead of the process that times them.

Why: replaying a trace and compiling it (TVM lowering, then LLVM, or NVRTC/nvcc for CUDA)
costs 0.1-1 s a program.  On a many-core machine one process would spend most of a
measurement run compiling.  Workers are *spawned* (fresh interpreters): on a GPU machine
importing TVM already initialises the CUDA driver, and a forked child of such a process fails
its first CUDA call ("initialization error").  They receive the programs and the task scripts
once, at start, and hand back shared libraries (`export_library`) that the parent loads in
milliseconds.

CUDA: on a GPU machine `tvm.compile` itself runs NVRTC (TVM's `tvm_callback_cuda_compile`), so
the worker's library already holds the kernel binary and loading it compiles nothing.
"""
from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

_W: dict[str, Any] = {}          # a worker's state: programs, task scripts, target, out dir


def _init_worker(programs: list, tasks: dict, target: str, out_dir: str, cuda: bool) -> None:
    import tvm
    _W.update(programs=programs, tasks=tasks, target=tvm.target.Target(target), dir=out_dir, cuda=cuda,
              task_cache={})
    if cuda:
        import tvm.support.nvcc  # noqa: F401 - registers TVM's CUDA compile callback


def _task(task_key: str):
    cache = _W.setdefault("task_cache", {})
    if task_key not in cache:
        from tensorplan.cdmpp.tasks import task_from_script
        name, script, flops = _W["tasks"][task_key]
        cache[task_key] = task_from_script(task_key, name, script, {}, flops)
    return cache[task_key]


def _build(k: int) -> tuple[int, str | None, str]:
    """Worker: replay program k, compile, export to `<dir>/<k>.so`; (k, path, "") or (k, None, error)."""
    import tvm
    from tensorplan.cdmpp.tasks import replay_trace
    p = _W["programs"][k]
    try:
        sch = replay_trace(_task(p["task_key"]).mod, p["trace"])
        ex = tvm.compile(sch.mod, target=_W["target"])
        path = str(Path(_W["dir"]) / f"{k}.so")
        ex.export_library(path)
        return k, path, ""
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
        cuda = tgt.kind.name == "cuda"
        progs = [{"task_key": p["task_key"], "trace": p["trace"]} for p in programs]
        need = {p["task_key"] for p in progs}
        scripts = {k: (str(r["task_name"]), str(r["script"]), float(r["flops"]))
                   for k, r in tasks.iterrows() if k in need}
        self.workers = max(1, int(workers))
        self._pool = mp.get_context("spawn").Pool(self.workers, initializer=_init_worker,
                                                  initargs=(progs, scripts, str(tgt), str(out_dir), cuda))

    def map(self, indices: Sequence[int]) -> list[tuple[int, str | None, str]]:
        """Compile these programs now (all workers), in order."""
        return self._pool.map(_build, list(indices), chunksize=1)

    def imap(self, indices: Sequence[int]) -> Iterator[tuple[int, str | None, str]]:
        """Compile in the background, yielding results in order as they are ready."""
        return self._pool.imap(_build, list(indices), chunksize=1)

    def close(self) -> None:
        self._pool.terminate()
        self._pool.join()

    def __enter__(self) -> "Prebuilder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
