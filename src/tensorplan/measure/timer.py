"""Timing methodology: warm-up, repeat until a time budget, median, coefficient of variation kept.

Why this shape: the first calls pay for page faults, lazy init and cold caches (warm-up); a fixed count
of repeats is either too few for µs kernels or too slow for 100 ms ones (time budget with min/max);
the median resists the outliers of a shared machine, and the CoV stored with every record says how far
to trust it (`is_stable`). `number` calls per repeat amortise the timer's own ~µs cost for tiny kernels;
`sync` (e.g. `torch.cuda.synchronize`) makes asynchronous devices finish inside the timed region.
Every `Timing` states its method in words so a stored number can be judged later.
"""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

from tensorplan.errors import TensorplanError

# environment variables that size the thread pools of child processes (and of libraries not yet loaded)
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS")


@dataclass
class Timing:
    """One measured latency: median/mean/min seconds per call, CoV of the repeats, the repeats themselves."""

    median_s: float
    mean_s: float
    min_s: float
    cov: float
    repeats: list[float]
    warmup: int
    method: str
    number: int = 1
    threads: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Timing":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    @classmethod
    def from_repeats(cls, repeats: list[float], *, warmup: int = 0, method: str = "", number: int = 1,
                     threads: int | None = None) -> "Timing":
        """Summarise per-call times measured elsewhere (e.g. TVM `time_evaluator().results`)."""
        if not repeats:
            raise TensorplanError("Timing.from_repeats: no repeats given; measure at least one run")
        r = [float(x) for x in repeats]
        mean = statistics.fmean(r)
        sd = statistics.pstdev(r) if len(r) > 1 else 0.0
        return cls(median_s=statistics.median(r), mean_s=mean, min_s=min(r),
                   cov=sd / mean if mean > 0 else 0.0, repeats=r, warmup=warmup, method=method,
                   number=number, threads=threads)

    def __str__(self) -> str:
        return f"{_fmt_s(self.median_s)} ±{100 * self.cov:.1f}% (n={len(self.repeats)})"


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.2f} µs"


def is_stable(timing: Timing, max_cov: float = 0.1) -> bool:
    """True when the repeats agree (CoV <= max_cov) and there were at least 3 of them."""
    return len(timing.repeats) >= 3 and math.isfinite(timing.cov) and timing.cov <= max_cov


# -------------------------------------------------------------------------------------------------
# thread pinning
# -------------------------------------------------------------------------------------------------
def _tvm_threadpool() -> tuple[Callable[..., Any], Callable[[], int]] | None:
    """(config_threadpool, NumThreads) of TVM's runtime if TVM is *already* imported; never imports it.

    TVM 0.27 registers `runtime.config_threadpool(affinity_mode, nthreads)` and `runtime.NumThreads`
    as global functions. The pool is sized once (TVM_NUM_THREADS or TVM's core count) when first used;
    config_threadpool can then only lower the count, not raise it past that size.
    """
    if "tvm" not in sys.modules:
        return None
    try:
        import tvm_ffi

        cfg = tvm_ffi.get_global_func("runtime.config_threadpool", allow_missing=True)
        num = tvm_ffi.get_global_func("runtime.NumThreads", allow_missing=True)
    except Exception:  # pragma: no cover - TVM without the ffi package
        return None
    if cfg is None or num is None:
        return None
    return cfg, num


@contextlib.contextmanager
def pinned_threads(n: int | None, *, affinity: bool = False) -> Iterator[dict[str, Any]]:
    """Run the block with n threads in torch, BLAS/OpenMP pools, ORT/TVM-by-env child processes and
    TVM's runtime pool; restore everything afterwards. Yields what was actually set (e.g. TVM's pool
    may be smaller than n if it was created earlier with fewer workers). `affinity=True` also restricts
    this process to the first n allowed CPUs. n=None leaves everything as is. ONNX Runtime sessions
    fix their pool at creation: build them with `intra_op_num_threads=n` inside the block.
    """
    if n is None:
        yield {"threads": None}
        return
    n = int(n)
    if n < 1:
        raise TensorplanError(f"pinned_threads: thread count must be >= 1, got {n}")
    info: dict[str, Any] = {"threads": n}
    saved_env = {k: os.environ.get(k) for k in THREAD_ENV_VARS}
    for k in THREAD_ENV_VARS:
        os.environ[k] = str(n)
    stack = contextlib.ExitStack()
    torch_old = None
    tvm_old = None
    aff_old = None
    try:
        if "torch" in sys.modules:  # only touch torch if the caller uses it (importing costs ~1 s)
            import torch

            torch_old = torch.get_num_threads()
            torch.set_num_threads(n)
            info["torch"] = torch.get_num_threads()
        try:
            from threadpoolctl import threadpool_limits

            stack.enter_context(threadpool_limits(limits=n))
            info["blas"] = n
        except ImportError:  # pragma: no cover
            pass
        tp = _tvm_threadpool()
        if tp is not None:
            cfg, num = tp
            tvm_old = int(num())
            cfg(1, n)  # affinity mode 1 = "big" cores (all cores on a homogeneous CPU)
            info["tvm"] = int(num())
        if affinity and hasattr(os, "sched_setaffinity"):
            aff_old = os.sched_getaffinity(0)
            os.sched_setaffinity(0, sorted(aff_old)[:n])
            info["affinity"] = sorted(os.sched_getaffinity(0))
        yield info
    finally:
        stack.close()
        if aff_old is not None:
            os.sched_setaffinity(0, aff_old)
        if tvm_old is not None:
            tp = _tvm_threadpool()
            if tp is not None:
                tp[0](1, tvm_old)
        if torch_old is not None:
            import torch

            torch.set_num_threads(torch_old)
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -------------------------------------------------------------------------------------------------
# measure
# -------------------------------------------------------------------------------------------------
def measure(fn: Callable[[], Any], *, warmup: int = 3, min_repeats: int = 5, max_repeats: int = 100,
            budget_s: float = 0.3, threads: int | None = None, number: int | None = 1,
            sync: Callable[[], Any] | None = None, min_repeat_s: float = 1e-3) -> Timing:
    """Time `fn()`: `warmup` untimed calls, then repeats until `budget_s` has passed and at least
    `min_repeats` were taken (never more than `max_repeats`); each repeat times `number` back-to-back
    calls and records their mean. `number=None` picks it so one repeat lasts >= `min_repeat_s`.
    `sync` is called before each clock read (use `torch.cuda.synchronize` for CUDA work).
    """
    if min_repeats < 1 or max_repeats < min_repeats:
        raise TensorplanError(f"measure: need 1 <= min_repeats ({min_repeats}) <= max_repeats ({max_repeats})")
    if number is not None and number < 1:
        raise TensorplanError(f"measure: number must be >= 1 or None (auto), got {number}")
    clock = time.perf_counter
    with pinned_threads(threads) as pinned:
        for _ in range(warmup):
            fn()
        if sync:
            sync()
        if number is None:
            number = _calibrate(fn, sync, min_repeat_s)
        reps: list[float] = []
        t_begin = clock()
        while len(reps) < max_repeats and (len(reps) < min_repeats or clock() - t_begin < budget_s):
            if sync:
                sync()
            t0 = clock()
            for _ in range(number):
                fn()
            if sync:
                sync()
            reps.append((clock() - t0) / number)
    thr = f"threads={threads}" if threads is not None else "threads=unchanged"
    if threads is not None and pinned.get("tvm") not in (None, threads):
        thr += f" (tvm pool {pinned['tvm']})"
    method = (f"warmup={warmup}; repeat until {budget_s:g} s or {max_repeats} runs (min {min_repeats}); "
              f"number={number}; median; {thr}" + ("; sync" if sync else ""))
    return Timing.from_repeats(reps, warmup=warmup, method=method, number=number, threads=threads)


def measure_stable(fn: Callable[[], Any], *, max_cov: float = 0.1, attempts: int = 3, **kw: Any) -> Timing:
    """`measure` again (up to `attempts` times) while the CoV exceeds `max_cov`; keep the attempt with the
    lowest CoV and flag it (`extra['unstable'] = True`) if none was stable, as the design asks of records."""
    best: Timing | None = None
    for i in range(max(1, attempts)):
        t = measure(fn, **kw)
        if best is None or t.cov < best.cov:
            best = t
        if is_stable(t, max_cov):
            break
    assert best is not None
    best.extra.update(attempts=i + 1, unstable=not is_stable(best, max_cov), max_cov=max_cov)
    best.method += f"; re-measured while CoV > {max_cov:g} (attempt {i + 1} of <= {attempts}, lowest CoV kept)"
    return best


def _calibrate(fn: Callable[[], Any], sync: Callable[[], Any] | None, min_repeat_s: float) -> int:
    """Smallest power of two of calls that lasts >= min_repeat_s (capped at 2**16).

    A batch that crosses the threshold is timed once more and the faster of the two counts: on a
    shared machine one preempted batch of a µs-kernel would otherwise fix `number` far too low.
    """
    def batch(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if sync:
            sync()
        return time.perf_counter() - t0

    number = 1
    while number < 2 ** 16:
        if batch(number) >= min_repeat_s and batch(number) >= min_repeat_s:
            break
        number *= 2
    return number


def interleaved(runners: dict[str, Callable[[], Any]], rounds: int, pause_s: float = 0.05,
                seed: int = 0, burst_s: float = 0.0, max_burst: int = 20) -> dict[str, list[float]]:
    """Time several systems against each other: one warm-up call each, then `rounds` rounds that
    run every system in a fresh random order (a fixed rotation would always seat a system
    right after the same neighbour, whose lingering threads it then inherits), sleeping `pause_s`
    before each so spinning thread pools park. Returns one time per system per round.

    `burst_s` > 0 measures steady state instead of a cold call: in each round a system runs
    back to back for about `burst_s` seconds (at most `max_burst` calls, sized from its warm-up
    call) after one untimed call, and the round records the median of that burst. Why: after the
    pause a model's first call pays for waking threads and refilling caches, so single calls
    swing by tens of percent (CoV 0.4 for YOLOX-nano); bursts make small models comparable. The
    untimed call keeps models slower than the burst (one timed call) steady too, so every
    model is timed the same way whatever its size."""
    import random
    import statistics
    rng = random.Random(seed)
    names = list(runners)
    times: dict[str, list[float]] = {n: [] for n in names}
    reps: dict[str, int] = {}
    for n in names:
        t0 = time.perf_counter()
        runners[n]()
        warm = time.perf_counter() - t0
        reps[n] = max(1, min(int(max_burst), int(burst_s / max(warm, 1e-6)))) if burst_s > 0 else 1
    for _ in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for n in order:
            time.sleep(pause_s)
            if burst_s > 0:
                runners[n]()  # untimed: wakes the thread pool, refills the caches
            ts = []
            for _ in range(reps[n]):
                t0 = time.perf_counter()
                runners[n]()
                ts.append(time.perf_counter() - t0)
            times[n].append(statistics.median(ts))
    return times
