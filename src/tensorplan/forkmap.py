"""Run a function over index ranges in forked worker processes.

Why fork: the work items (TVM IRModules, schedules) live in the parent and are not cheap to
pickle; forked children inherit them, so only the index ranges go out and the (small, picklable)
results come back. Where fork is unavailable (not Linux) or one worker is asked for, it runs
in-process, so callers need no second code path.
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import os
from typing import Any, Callable, Iterator

_JOB: Callable[[int, int], list] | None = None


def _run(span: tuple[int, int]) -> tuple[int, list]:
    assert _JOB is not None
    return span[0], _JOB(*span)


def default_workers() -> int:
    """CPUs this process may use (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def spans(n: int, chunk: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + chunk)) for s in range(0, n, chunk)]


def fork_map_iter(job: Callable[[int, int], list], n: int, *, workers: int | None = None,
                  chunk: int = 32) -> Iterator[tuple[int, list]]:
    """Yield (start, job(start, end)) for consecutive chunks of range(n), in completion order.

    `job(start, end)` returns one result per index. Exceptions raised in a worker are re-raised
    here. `workers=None` uses every available CPU; 1 (or no fork support) runs in-process.
    """
    global _JOB
    w = default_workers() if workers is None else max(1, int(workers))
    parts = spans(n, chunk)
    if w == 1 or len(parts) <= 1 or "fork" not in mp.get_all_start_methods():
        for a, b in parts:
            yield a, job(a, b)
        return
    _JOB = job
    gc.freeze()          # children's collector then leaves the inherited heap alone (no copy-on-write storm)
    try:
        with mp.get_context("fork").Pool(min(w, len(parts))) as pool:
            yield from pool.imap_unordered(_run, parts)
    finally:
        gc.unfreeze()
        _JOB = None


def fork_map(job: Callable[[int, int], list], n: int, *, workers: int | None = None,
             chunk: int = 32) -> list[Any]:
    """Results of `job` for every index of range(n), in order (see `fork_map_iter`)."""
    out: list[Any] = [None] * n
    for a, res in fork_map_iter(job, n, workers=workers, chunk=chunk):
        out[a:a + len(res)] = res
    return out
