"""A TenSet-like dataset of measured tensor programs (CDMPP's training data), built locally.

Why: no PyPI TVM can replay TenSet's Ansor records, so the data is regenerated with
apache-tvm 0.27 meta-schedule (reference/cdmpp.md §7.2).  For every *task* (a fused kernel
of a zoo network, `tasks.py`) we sample schedules from the post-order-apply design space
(replay-trace style: every random decision re-sampled), apply the mandatory postprocessors,
compile in-process once and time the same binary with 1 and with 2 runtime threads: two
device domains `local-1t` and `local-2t` (`tensorplan.devices.resolve`).

Collection writes into the measurement `Store` (programs of kind `cdmpp_program` holding the
replayable schedule trace JSON; one measurement per device with every repeat) and marks each
sample done in the same transaction, so a killed run loses at most the program in flight and
`collect` resumes where it stopped.  `export` turns a store into the compact committed form
under `data/cdmpp/` (parquet+zstd records, float16 leaf features), which `load_dataset` reads.

Thread domains: TVM's runtime pool must be created at the largest thread count (`init_pool`)
before it is ever configured down; the first ~9k programs were timed before this was fixed, so
their 2-thread records ran on one worker.  `export` leaves such records out (timer version < 4)
and `remeasure` re-times stored programs (both thread counts) with the fixed timer.

Network latency ground truth ("measured network"): for network N and device D,
T(N, D) = sum over N's tasks of (call-site count) x (median latency of the fastest *stable*
sampled program of that task on D).  It is the end-to-end time of the network compiled with
the best sampled schedule of every kernel, with kernels run back to back (no framework
overhead) -- exactly the quantity CDMPP's `end2end/replay.py` predicts (sum of weight x
predicted latency), so predicted and measured network latencies are comparable.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.progress import progress_bar
from tensorplan.cdmpp.tasks import replay_trace, task_io_vector, trace_json
from tensorplan.kernels.sampled import DesignSpace, draw_seed

PROGRAM_KIND = "cdmpp_program"
TASK_KIND = "cdmpp_task"
NETWORK_KIND = "cdmpp_network"
TAG = "cdmpp"
JOB = "cdmpp-collect"
DEFAULT_MAX_COV = 0.01          # CDMPP §2.6: keep records whose repeat CoV <= 1 %


def mad_rel(repeats) -> float:
    """Median absolute deviation of timing repeats over their median; inf for none (or a 0 median)."""
    r = np.asarray(repeats, np.float64)
    m = float(np.median(r)) if len(r) else 0.0
    return float(np.median(np.abs(r - m)) / m) if m > 0 else float("inf")


def default_data_dir() -> Path:
    """`data/cdmpp/` of the source checkout (the committed dataset)."""
    return Path(__file__).resolve().parents[3] / "data" / "cdmpp"


# =========================================================================== collection

def _seed(task_key: str, i: int) -> int:
    """The seed of a task's draw i (`kernels.sampled.draw_seed`, which the planner's sampler shares)."""
    return draw_seed(task_key, i)


def task_arrays(task) -> list[np.ndarray]:
    """Input/output arrays of a task's PrimFunc: uniform [0.5, 1) floats, integer inputs zero
    (they are indices: 0 is always in range), booleans true. Seeded, so every device times the
    same data."""
    from tvm.s_tir import meta_schedule as ms
    rng = np.random.default_rng(0)
    out = []
    for a in ms.arg_info.ArgInfo.from_prim_func(task.mod["main"]):
        shape = [int(x) for x in a.shape]
        dt = str(a.dtype)
        if dt in ("float32", "float64"):
            arr = rng.random(shape, dtype=np.dtype(dt)) * 0.5 + 0.5
        elif dt.startswith("float"):
            arr = (rng.random(shape, dtype=np.float32) * 0.5 + 0.5).astype(dt)
        elif dt == "bool":
            arr = np.ones(shape, dtype=bool)
        else:
            arr = np.zeros(shape, dtype=dt)
        out.append(arr)
    return out


class _TaskState(DesignSpace):
    """A task's design spaces and postprocessors (`kernels.sampled.DesignSpace`), plus its
    argument tensors."""

    def __init__(self, task, target):
        super().__init__(task.mod, target, key=task.key)
        self.task = task
        self._args = None
        self.slow = 0                                   # programs skipped as too slow
        self.ok = 0                                     # programs measured

    def args(self):
        """Input/output tensors on the CPU (`task_arrays`); freed by `release`."""
        if self._args is None:
            import tvm
            self._args = [tvm.runtime.tensor(a) for a in task_arrays(self.task)]
        return self._args

    def release(self) -> None:
        """Drop the argument tensors (447 tasks' tensors would not fit in memory together)."""
        self._args = None


def sample_schedule(state: _TaskState, i: int):
    """Sample program i of a task: design space i mod n_spaces, every decision re-drawn with a
    seed derived from (task, i), then the mandatory postprocessors. Returns (sch, space) or None."""
    return state.draw(i)


TIMER_VERSION = 4
# v4: the runtime pool is created by a parallel kernel run at the largest thread count before any
# config_threadpool call. Before (v1-v3) the first configuration call came first, and TVM then ran
# "2-thread" kernels on one worker: records on multi-thread devices with timer < 4 are invalid.
MIN_VALID_MULTITHREAD_TIMER = 4


def init_pool(max_threads: int) -> None:
    """Create TVM's runtime thread pool with `max_threads` workers by running a parallel kernel.

    Must run before any `runtime.config_threadpool` call in the process: if the pool is first
    configured down to 1 thread and then used, later raising it to 2 reports 2 threads but runs
    parallel loops on one worker (measured: 2-thread time == 1-thread time).
    """
    os.environ["TVM_NUM_THREADS"] = str(max_threads)
    import tvm
    from tvm import s_tir, te
    A = te.placeholder((64, 1024), name="A")
    B = te.compute((64, 1024), lambda i, j: A[i, j] * 2.0, name="B")
    sch = s_tir.Schedule(tvm.IRModule({"main": te.create_prim_func([A, B])}))
    sch.work_on("main")
    sch.parallel(sch.get_loops(sch.get_sblock("B"))[0])
    lib = tvm.compile(sch.mod, target=tvm.target.Target({"kind": "llvm", "num-cores": max_threads})).jit()
    a = tvm.runtime.tensor(np.ones((64, 1024), np.float32))
    b = tvm.runtime.tensor(np.zeros((64, 1024), np.float32))
    lib["main"](a, b)
    from tensorplan.measure.timer import _tvm_threadpool
    cfg, num = _tvm_threadpool()
    cfg(1, max_threads)
    if int(num()) != max_threads:
        raise TensorplanError(f"TVM's runtime pool has {int(num())} thread(s), need {max_threads}: it was used "
                              f"before in this process; start a fresh process with TVM_NUM_THREADS={max_threads}")
    global _POOL_THREADS
    _POOL_THREADS = max_threads


_POOL_THREADS = 0       # the size `init_pool` created TVM's runtime pool with in this process (0: not yet)




def _time_lib(lib, args, threads: Sequence[int], *, min_repeat_s: float, max_kernel_s: float,
              repeats: int) -> dict[int, Any] | str:
    """Time one compiled kernel at each thread count with TVM's time_evaluator.

    The call time is estimated at 1 thread (uncontended by our own pool); `number` calls per
    repeat only for kernels shorter than `min_repeat_s` (20 µs), otherwise 1: on a shared 2-core
    machine, back-to-back calls of a 2-thread kernel wait for the pool's second worker to be
    scheduled (~ms per call), while single calls do not.  One untimed call per thread count,
    then 3-`repeats` repeats (about 10 ms of timed runs per thread count); the median is kept.
    """
    import tvm
    from tensorplan.measure.timer import Timing, _tvm_threadpool
    cfg, num = _tvm_threadpool()
    dev = tvm.cpu()
    f = lib["main"]
    cfg(1, min(threads))
    t0 = time.perf_counter()
    f(*args)
    est = time.perf_counter() - t0
    if est > 4 * max_kernel_s:
        cfg(1, max(threads))
        return f"too slow ({est:.2f} s per call)"
    ev = lib.time_evaluator("main", dev, number=1, repeat=1)
    est = min(est, ev(*args).mean)
    if est > max_kernel_s:
        cfg(1, max(threads))
        return f"too slow ({est:.2f} s per call)"
    number = max(1, min(1000, int(math.ceil(min_repeat_s / max(est, 1e-9)))))
    rep = int(max(3, min(repeats, 0.01 // max(number * est, 1e-9))))
    out: dict[int, Any] = {}
    for t in threads:
        cfg(1, t)
        if int(num()) != t:
            raise TensorplanError(f"collect: could not set TVM's pool to {t} thread(s) (has {int(num())})")
        f(*args)
        ev = lib.time_evaluator("main", dev, number=number, repeat=rep)
        res = ev(*args)
        out[t] = Timing.from_repeats(list(res.results), warmup=1, number=number, threads=int(num()),
                                     method=f"tvm time_evaluator number={number} repeat={rep}; "
                                            f"1 warm-up call; runtime pool {int(num())} thread(s); v{TIMER_VERSION}")
    cfg(1, max(threads))
    return out


@dataclass
class CollectStats:
    programs: int = 0
    records: int = 0
    failed_sample: int = 0
    failed_build: int = 0
    too_slow: int = 0
    skipped_done: int = 0
    seconds: float = 0.0
    lost: int = 0               # programs whose job the cluster could not finish (left for the next run)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["records_per_s"] = self.records / self.seconds if self.seconds else 0.0
        return d


def _store_tasks(store, tasks) -> None:
    store.put_programs([(TASK_KIND, {"key": t.key, "name": t.name, "script": t.script(),
                                     "flops": t.flops}) for t in tasks])


def _load_store_tasks(store, networks: Sequence[str]):
    """Tasks of `networks` already extracted into the store, or None if any network is missing."""
    from tensorplan.cdmpp.tasks import task_from_script
    nets = {}
    for (payload,) in store._read("SELECT payload FROM programs WHERE kind=?", (NETWORK_KIND,)):
        p = json.loads(payload)
        nets[p["network"]] = p["tasks"]
    if not all(n in nets for n in networks):
        return None
    scripts = {}
    for (payload,) in store._read("SELECT payload FROM programs WHERE kind=?", (TASK_KIND,)):
        p = json.loads(payload)
        scripts[p["key"]] = p
    tasks = {}
    for n in networks:
        for k, c in nets[n].items():
            if k not in tasks:
                p = scripts[k]
                tasks[k] = task_from_script(k, p["name"], p["script"], {}, p.get("flops", 0.0))
            tasks[k].networks[n] = c
    return sorted(tasks.values(), key=lambda t: t.key)


def get_tasks(store, networks: Sequence[str], log: Callable[[str], None] = print):
    """Extract (or reload from the store) the tasks of `networks`."""
    from tensorplan.cdmpp.tasks import network_tasks
    from tensorplan.zoo.specs import resolve_model
    cached = _load_store_tasks(store, networks)
    if cached is not None:
        return cached
    merged: dict = {}
    for n in networks:
        path, name = resolve_model(n)
        t0 = time.time()
        ts = network_tasks(path, name)
        _store_tasks(store, ts)
        store.put_program(NETWORK_KIND, {"network": name, "tasks": {t.key: t.networks[name] for t in ts}})
        log(f"tasks: {name}: {len(ts)} fused kernels ({time.time() - t0:.1f} s)")
        for t in ts:
            m = merged.setdefault(t.key, t)
            if m is not t:
                m.networks.update(t.networks)
    return sorted(merged.values(), key=lambda t: t.key)


def local_specs(threads: Sequence[int], prefix: str | None = None, what: str = "collect") -> dict:
    """This machine's DeviceSpec per thread count, named `local-<N>t`, or `<prefix>-<N>t` when this
    machine is another CPU than the dataset's own (its records then form their own domains)."""
    import dataclasses
    from tensorplan.devices import resolve
    if prefix is None:
        return {t: resolve(f"local-{t}t") for t in threads}
    if not prefix or not prefix.replace("-", "").isalnum() or prefix.startswith("local"):
        raise TensorplanError(f"{what}: prefix {prefix!r} must be a short name such as 'zen4' "
                              "(letters, digits, '-'; not 'local', which names the dataset's own domains)")
    return {t: dataclasses.replace(resolve(f"local-{t}t"), name=f"{prefix}-{t}t") for t in threads}


def collect(networks: Sequence[str] | None = None, *, programs_per_task: int = 64,
            threads: Sequence[int] = (1, 2), store: Any = None, budget_minutes: float | None = None,
            batch: int = 4, min_repeat_s: float = 2e-5, repeats: int = 15, max_kernel_s: float = 0.1,
            max_task_flops: float | None = None, min_task_flops: float | None = None,
            exclude: set[tuple[str, int]] | None = None, progress: bool = True, prefix: str | None = None,
            log: Callable[[str], None] | None = None, ray_address: str | None = None) -> CollectStats:
    """Sample, compile and time programs for every task of `networks`; resumable.

    Round-robin over tasks, `batch` programs per task per visit, so stopping early (budget or
    kill) still leaves every task covered.  Returns counts and the measured record rate.
    `prefix` names the records' domains `<prefix>-<N>t` instead of `local-<N>t` (`local_specs`).
    `exclude` holds (task key, sample index) pairs not to sample (`timed_programs` of an export):
    with a larger `max_kernel_s`, a pass over what the dataset skipped as too slow.

    Each visit is a job (`collect_programs`); `ray_address` runs the jobs on that Ray cluster, on a
    worker offering every thread domain (device `local-<N>t`) of the run, or else one job per
    domain on a worker offering it, and writes their records here as they come back
    (`measure.cluster`); the programs are the same, each record says which worker timed it. A
    visit the cluster could not finish is counted `lost` and left for the next run.
    """
    from tensorplan.measure.cluster import ClusterJob, job_runner
    threads = sorted({int(t) for t in threads})
    runner = job_runner(ray_address)
    if runner.kind == "in-process":
        # TVM sizes its runtime pool from TVM_NUM_THREADS (default here: 1) when first used; create it
        # with the largest thread count by running a parallel kernel before anything configures it.
        init_pool(max(threads))
    specs = local_specs(threads, prefix)
    runner.check_devices(list(specs.values()))
    from tensorplan.measure.store import Store
    from tensorplan.cdmpp.tasks import DEFAULT_NETWORKS

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    networks = list(networks or DEFAULT_NETWORKS)
    st = store if isinstance(store, Store) else Store(store)
    t_start = time.time()
    deadline = t_start + budget_minutes * 60 if budget_minutes else None
    dev_keys = {t: st.put_device(s) for t, s in specs.items()}
    tasks = get_tasks(st, networks, log)
    if max_task_flops:
        tasks = [t for t in tasks if t.flops <= max_task_flops]
    if min_task_flops:
        tasks = [t for t in tasks if t.flops >= min_task_flops]
    exclude = exclude or set()
    job = st.job(JOB if prefix is None else f"{JOB}-{prefix}")
    done = job.done_keys()
    stats = CollectStats()
    total = sum(1 for t in tasks for i in range(programs_per_task) if (t.key, i) not in exclude)
    n_done0 = sum(1 for t in tasks for i in range(programs_per_task)
                  if f"{t.key}:{i}" in done and (t.key, i) not in exclude)
    stats.skipped_done = n_done0
    log(f"collect: {len(tasks)} tasks from {len(networks)} networks; {programs_per_task} programs/task; "
        f"threads {threads}; {n_done0}/{total} already done; store {st.path}"
        + (f"; jobs on the Ray cluster at {ray_address}" if runner.kind == "ray" else ""))
    # one job times a program at every thread count (one binary), here or on a worker offering all
    # the domains; otherwise each thread domain is its own job, timed by a worker that offers it
    together = runner.offers_together(list(specs.values()))
    groups = [tuple(threads)] if together else [(t,) for t in threads]
    if runner.kind == "in-process":
        _TASKS.update({t.key: t for t in tasks})     # the jobs find them here instead of parsing scripts
    scripts: dict[str, str] = {}
    run_id = f"{os.getpid()}-{time.time_ns()}"        # workers rebuild task states once per run
    tally: dict[tuple[str, tuple], list[int]] = {}    # (task, group) -> [programs measured, too slow]
    dead: set[str] = set()                             # tasks given up (no design space / all too slow)
    timer = dict(min_repeat_s=min_repeat_s, max_kernel_s=max_kernel_s, repeats=repeats)

    prog_bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        prog_bar = Progress(TextColumn("[bold]collect"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), transient=False)
        prog_bar.start()
        bar = prog_bar.add_task("collect", total=total, completed=n_done0, info="")
    last_log = time.time()
    waiting: dict[str, list] = {}       # item -> [thread groups whose outcome has not come back, any records?]
    try:
        for start in range(0, programs_per_task, batch):
            if deadline and time.time() > deadline:
                raise _Budget()
            jobs: list = []
            for task in tasks:
                todo = [i for i in range(start, min(start + batch, programs_per_task))
                        if f"{task.key}:{i}" not in done and (task.key, i) not in exclude]
                if not todo:
                    continue
                if task.key in dead:
                    with st.transaction():
                        for i in todo:
                            job.mark_done(f"{task.key}:{i}")
                            done.add(f"{task.key}:{i}")
                    stats.failed_sample += len(todo)
                    continue
                if runner.kind == "ray" and task.key not in scripts:
                    scripts[task.key] = task.script()
                for g in groups:
                    ok0, slow0 = tally.setdefault((task.key, g), [0, 0])
                    pj = ProgramsJob(task.key, task.name, scripts.get(task.key, ""), float(task.flops), tuple(todo),
                                     g, max(threads), timer["min_repeat_s"], timer["max_kernel_s"],
                                     timer["repeats"], ok0, slow0, run_id)
                    jobs.append(ClusterJob(collect_programs, (pj,), label=f"task {task.name} ({task.key}) "
                                           f"programs {todo[0]}..{todo[-1]} at {','.join(map(str, g))} thread(s)",
                                           device=tuple(specs[t] for t in g)))
                for i in todo:
                    waiting[f"{task.key}:{i}"] = [set(groups), False]
            for r in runner.run(jobs):
                pj = jobs[r.index].args[0]
                if not r.ok:
                    stats.lost += len(pj.indices)
                    log(f"collect: {r.label}: {r.error}; left for the next run")
                    continue
                finished = _record_programs(st, job, stats, pj, r, dev_keys, waiting, tally, dead, log)
                done.update(finished)
                if prog_bar is not None and finished:
                    el = time.time() - t_start
                    prog_bar.update(bar, advance=len(finished),
                                    info=f"{stats.records} rec, {stats.records / el:.2f} rec/s")
                if time.time() - last_log > 60:
                    last_log = time.time()
                    el = time.time() - t_start
                    log(f"[{el / 60:.1f} min] programs {stats.programs} records {stats.records} "
                        f"({stats.records / el:.2f} rec/s) failed sample/build/slow "
                        f"{stats.failed_sample}/{stats.failed_build}/{stats.too_slow}; "
                        f"done {n_done0 + stats.programs + stats.failed_sample}/{total}")
                if deadline and time.time() > deadline:
                    raise _Budget()
    except _Budget:
        log("collect: time budget reached; stopping (resume by running the same command)")
    finally:
        if prog_bar is not None:
            prog_bar.stop()
        stats.seconds = time.time() - t_start
        runner.close()
        if runner.kind == "in-process":
            _TASKS.clear()
            _STATES.clear()
    log(f"collect: {json.dumps(stats.to_dict())}")
    return stats


def _record_programs(st, job, stats: CollectStats, pj: "ProgramsJob", r, dev_keys: dict, waiting: dict,
                     tally: dict, dead: set, log: Callable[[str], None]) -> list[str]:
    """Write what one `collect_programs` job returned: each timed program and its records, and mark
    each item done, in one transaction, once every thread group's outcome for it is in. Returns
    the items finished."""
    tl = tally[(pj.task_key, pj.threads)]
    finished = []
    with st.transaction():
        for oc in r.value:
            item = f"{pj.task_key}:{oc.index}"
            w = waiting.get(item)
            if oc.status == "ok":
                extra = dict(oc.extra)
                if r.worker != "in-process":
                    extra["worker"] = r.worker              # which machine timed it
                pk = st.put_program(PROGRAM_KIND, oc.payload)
                st.put_measurements([(pk, dev_keys[t], oc.timings[t], TAG, extra) for t in pj.threads])
                stats.records += len(pj.threads)
                if w is not None and not w[1]:
                    stats.programs += 1                      # the program's first records
                    w[1] = True
                tl[0] += 1
            elif oc.status == "too_slow":
                stats.too_slow += 1
                tl[1] += 1
            elif oc.status == "failed_build":
                stats.failed_build += 1
            else:                                            # failed_sample, no_space, gave_up
                stats.failed_sample += 1
                if oc.status in ("no_space", "gave_up") and pj.task_key not in dead:
                    dead.add(pj.task_key)
                    if oc.note:
                        log(f"task {pj.task_name} ({pj.task_key}): {oc.note}")
            if w is not None:
                w[0].discard(pj.threads)
                if not w[0]:
                    del waiting[item]
                    job.mark_done(item)
                    finished.append(item)
    return finished


@dataclass(frozen=True)
class ProgramsJob:
    """One `collect` job: sample, compile and time programs `indices` of one task at `threads`
    (the task travels as its TVMScript; empty where this process already holds the task)."""

    task_key: str
    task_name: str
    task_script: str
    task_flops: float
    indices: tuple[int, ...]
    threads: tuple[int, ...]        # timed in this job
    pool_threads: int               # TVM runtime pool of the run (its largest thread count)
    min_repeat_s: float
    max_kernel_s: float
    repeats: int
    ok0: int = 0                    # the task's programs measured / too slow before this job (give-up rule)
    slow0: int = 0
    run: str = ""                   # the collect run: a worker keeps task states for one run only


@dataclass
class ProgramOutcome:
    """What became of program `index`: status "ok" (payload, timings per thread count, extra),
    "failed_sample", "failed_build", "too_slow", "no_space" or "gave_up" (with a note)."""

    index: int
    status: str
    payload: dict | None = None
    timings: dict | None = None
    extra: dict | None = None
    note: str = ""


_TASKS: dict[str, Any] = {}     # task key -> Task this process already holds (in-process collect)
_STATES: dict[str, Any] = {}    # task key -> its _TaskState (None: no design space), built once per run
_STATES_RUN: list[str] = [""]   # the run `_STATES` belongs to


def collect_programs(pj: ProgramsJob) -> list[ProgramOutcome]:
    """The job behind `collect` (pure: its outcomes depend only on `pj`): per program index, sample
    the schedule (seeded by task and index), compile once, time at each of `pj.threads`. A task
    whose first programs are all too slow is given up, as is one without a design space."""
    import tvm
    from tensorplan.cdmpp.tasks import task_from_script
    if _POOL_THREADS != pj.pool_threads:
        init_pool(pj.pool_threads)
    if _STATES_RUN[0] != pj.run:                       # a new run: the last run's states go
        _STATES.clear()
        _STATES_RUN[0] = pj.run
    target = tvm.target.Target({"kind": "llvm", "num-cores": pj.pool_threads})
    note = ""
    if pj.task_key not in _STATES:
        try:
            task = _TASKS.get(pj.task_key) or task_from_script(pj.task_key, pj.task_name, pj.task_script, {},
                                                                pj.task_flops)
            state = _TaskState(task, target)
            _STATES[pj.task_key] = state if state.spaces else None
            note = "" if state.spaces else "no design space"
        except Exception as e:  # noqa: BLE001
            _STATES[pj.task_key] = None
            note = f"no design space: {e}"
    state = _STATES[pj.task_key]
    if state is None:
        return [ProgramOutcome(i, "no_space", note=note or "no design space") for i in pj.indices]
    state.ok, state.slow = pj.ok0, pj.slow0
    out = []
    try:
        for i in pj.indices:
            if state.slow >= 4 and state.ok == 0:          # every program so far too slow: give up the task
                out.append(ProgramOutcome(i, "gave_up", note="its first programs were all too slow"))
                continue
            out.append(_one_program(state, i, target, pj.threads, pj.min_repeat_s, pj.max_kernel_s, pj.repeats))
    finally:
        state.release()
    return out


class _Budget(Exception):
    pass


def timed_programs(path: str | Path) -> set[tuple[str, int]]:
    """(task key, sample index) of every program an export timed on any device: what `collect
    --exclude-data` leaves out, so a second pass times only what the first skipped or never reached."""
    import pyarrow.parquet as pq
    f = Path(path) / "programs.parquet"
    if not f.exists():
        raise TensorplanError(f"dataset '{path}': no programs.parquet; pass a directory written by "
                              "`tensorplan predictor dataset export`")
    t = pq.read_table(f, columns=["task_key", "index"]).to_pandas()
    return set(zip(t["task_key"].astype(str), t["index"].astype(int)))


def _one_program(state, i, target, threads, min_repeat_s, max_kernel_s, repeats) -> ProgramOutcome:
    import tvm
    t0 = time.perf_counter()
    r = sample_schedule(state, i)
    if r is None:
        return ProgramOutcome(i, "failed_sample")
    sch, space = r
    t1 = time.perf_counter()
    try:
        lib = tvm.compile(sch.mod, target=target)
        lib = lib.jit() if hasattr(lib, "jit") else lib
    except Exception:  # noqa: BLE001
        return ProgramOutcome(i, "failed_build")
    t2 = time.perf_counter()
    try:
        timings = _time_lib(lib, state.args(), threads, min_repeat_s=min_repeat_s,
                            max_kernel_s=max_kernel_s, repeats=repeats)
    except Exception:  # noqa: BLE001 - runtime failure of a random schedule
        return ProgramOutcome(i, "failed_build")
    t3 = time.perf_counter()
    if isinstance(timings, str):
        state.slow += 1
        return ProgramOutcome(i, "too_slow", note=timings)
    state.ok += 1
    payload = {"task_key": state.task.key, "index": i, "space": space, "seed": _seed(state.task.key, i),
               "trace": trace_json(sch)}
    extra = {"sample_s": round(t1 - t0, 4), "build_s": round(t2 - t1, 4), "time_s": round(t3 - t2, 4),
             "timer": TIMER_VERSION}
    return ProgramOutcome(i, "ok", payload, dict(timings), extra)


def time_trace(task, trace, target, threads: Sequence[int], **timer) -> dict[int, Any] | str:
    """Replay a stored schedule trace of `task`, compile it and time it at each thread count
    (`_time_lib`); "failed" if it no longer replays, builds or runs here."""
    try:
        sch = replay_trace(task.mod, trace)
    except Exception:  # noqa: BLE001 - one broken program must not stop the run
        return "failed"
    return time_module(sch.mod, task, target, threads, **timer)


@dataclass(frozen=True)
class TraceJob:
    """Re-time one stored program (`time_trace`) as a job that can run elsewhere: the task as its
    TVMScript, the schedule trace, the thread count and the timer's settings."""

    task_key: str
    task_name: str
    task_script: str
    task_flops: float
    trace: Any
    threads: int
    min_repeat_s: float = 2e-5
    repeats: int = 15
    max_kernel_s: float = 1.0


_TRACE_TASKS: dict[str, Any] = {}   # task key -> Task rebuilt from its script in this process


def time_trace_job(j: TraceJob) -> dict[int, Any] | str:
    """`time_trace` of the job's program at its thread count (TVM's pool created at that count
    first, `init_pool`); the job's task is parsed once per process."""
    import tvm
    from tensorplan.cdmpp.tasks import task_from_script
    if _POOL_THREADS != j.threads:
        init_pool(j.threads)
    task = _TRACE_TASKS.get(j.task_key)
    if task is None:
        task = _TRACE_TASKS[j.task_key] = task_from_script(j.task_key, j.task_name, j.task_script, {}, j.task_flops)
    target = tvm.target.Target({"kind": "llvm", "num-cores": j.threads})
    return time_trace(task, j.trace, target, [j.threads], min_repeat_s=j.min_repeat_s, repeats=j.repeats,
                      max_kernel_s=j.max_kernel_s)


def time_module(mod, task, target, threads: Sequence[int], **timer) -> dict[int, Any] | str:
    """Compile a scheduled program of `task` and time it at each thread count (`_time_lib`, the
    dataset's timer; the pool must have been created with `init_pool`); "failed" if it does not
    build or run, "too slow ..." past `max_kernel_s`."""
    import tvm
    try:
        lib = tvm.compile(mod, target=target).jit()
    except Exception:  # noqa: BLE001
        return "failed"
    return _time_built(lib, task, threads, **timer)


def _time_built(lib, task, threads: Sequence[int], **timer) -> dict[int, Any] | str:
    """Time a compiled program of `task` on its seeded inputs; "failed" if it does not run."""
    import tvm
    try:
        return _time_lib(lib, [tvm.runtime.tensor(a) for a in task_arrays(task)], threads, **timer)
    except Exception:  # noqa: BLE001
        return "failed"


def remeasure(store: Any = None, *, threads: Sequence[int] = (1, 2), budget_minutes: float | None = None,
              max_kernel_s: float = 0.1, min_repeat_s: float = 2e-5, repeats: int = 15,
              measured_before: float | None = None,
              log: Callable[[str], None] | None = None) -> CollectStats:
    """Re-time stored programs (replayed from their traces) with the current timer, replacing their
    measurements on every thread count; round-robin over tasks; resumable (job per timer version).

    `measured_before` (Unix time) re-times only programs with a measurement taken before it: the
    way to replace records from a period when the machine was shared (their own job, so a full
    pass done earlier does not hide them)."""
    threads = sorted({int(t) for t in threads})
    init_pool(max(threads))
    import tvm
    from tensorplan.devices import resolve
    from tensorplan.measure.store import Store
    from tensorplan.cdmpp.tasks import task_from_script
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    st = store if isinstance(store, Store) else Store(store)
    dev_keys = {t: st.put_device(resolve(f"local-{t}t")) for t in threads}
    target = tvm.target.Target({"kind": "llvm", "num-cores": max(threads)})
    job = st.job(f"cdmpp-remeasure-v{TIMER_VERSION}" + (f"-before{int(measured_before)}" if measured_before else ""))
    done = job.done_keys()
    stale = None if measured_before is None else {
        k for (k,) in st._read("SELECT DISTINCT prog_key FROM measurements WHERE created < ?", (float(measured_before),))}
    scripts = {}
    for (payload,) in st._read("SELECT payload FROM programs WHERE kind=?", (TASK_KIND,)):
        p = json.loads(payload)
        scripts[p["key"]] = p
    by_task: dict[str, list] = {}
    for pk, payload in st._read("SELECT prog_key, payload FROM programs WHERE kind=? ORDER BY prog_key",
                                (PROGRAM_KIND,)):
        if pk not in done and (stale is None or pk in stale):
            by_task.setdefault(json.loads(payload)["task_key"], []).append((pk, payload))
    order = []
    queues = [v for _, v in sorted(by_task.items())]
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    stats = CollectStats()
    t_start, last = time.time(), time.time()
    mods: dict[str, Any] = {}
    for pk, payload in order:
        if budget_minutes and time.time() - t_start > budget_minutes * 60:
            break
        p = json.loads(payload)
        tk = p["task_key"]
        if tk not in mods:
            s_ = scripts[tk]
            mods[tk] = task_from_script(tk, s_["name"], s_["script"], {}, s_.get("flops", 0.0))
        task = mods[tk]
        timings = time_trace(task, p["trace"], target, threads, min_repeat_s=min_repeat_s,
                             max_kernel_s=max_kernel_s, repeats=repeats)
        with st.transaction():
            if not isinstance(timings, str):
                st.put_measurements([(pk, dev_keys[t], timings[t], TAG, {"timer": TIMER_VERSION, "remeasured": True})
                                     for t in threads])
                stats.records += len(threads)
                stats.programs += 1
            else:
                stats.too_slow += 1
            job.mark_done(pk)
        if time.time() - last > 60:
            last = time.time()
            el = last - t_start
            log(f"remeasure [{el / 60:.1f} min] programs {stats.programs} ({stats.records / el:.2f} rec/s)")
    stats.seconds = time.time() - t_start
    log(f"remeasure: {json.dumps(stats.to_dict())}")
    return stats


def device_programs(data: str | Path | None = None, programs_per_task: int = 8, seed: int = 0) -> list[dict]:
    """Programs of the committed dataset to re-time on another device: up to `programs_per_task`
    per task (seeded choice), ordered round-robin over tasks so a run stopped early still covers
    every task evenly."""
    import pyarrow.parquet as pq
    d = Path(data) if data else default_data_dir()
    prog = pq.read_table(d / "programs.parquet").to_pandas()
    rng = np.random.default_rng(seed)
    chosen = []
    for _, g in sorted(prog.groupby("task_key"), key=lambda kv: kv[0]):
        rows = g.iloc[rng.permutation(len(g))[:programs_per_task]]
        chosen.extend({"prog_key": r.prog_key, "task_key": r.task_key, "index": int(r.index),
                       "space": int(r.space), "seed": int(r.seed), "trace": r.trace} for r in rows.itertuples())
    return round_robin(chosen)


def in_dataset(data: Path, devices: Sequence[str]) -> set[str]:
    """Keys of the dataset programs already timed on every one of `devices` (a later session on
    another machine of the same kind then times only new programs; `merge_device` keeps both)."""
    import pyarrow.parquet as pq
    rec = pq.read_table(data / "records.parquet", columns=["prog_idx", "device"]).to_pandas()
    rec = rec[rec["device"].isin(list(devices))]
    full = rec.groupby("prog_idx")["device"].nunique()
    idx = set(full.index[full == len(set(devices))])
    if not idx:
        return set()
    prog = pq.read_table(data / "programs.parquet", columns=["prog_idx", "prog_key"]).to_pandas()
    return set(prog.loc[prog["prog_idx"].isin(idx), "prog_key"])


def round_robin(programs: Sequence[dict]) -> list[dict]:
    """Order programs task by task in turns (each task's own order kept), so a run stopped early
    covers every task evenly."""
    by_task: dict[str, list] = {}
    for p in programs:
        by_task.setdefault(p["task_key"], []).append(p)
    queues = [v for _, v in sorted(by_task.items())]
    out = []
    for k in range(max((len(q) for q in queues), default=0)):
        out.extend(q[k] for q in queues if k < len(q))
    return out


def measure_device(prefix: str, *, data: str | Path | None = None, store: Any = None,
                   threads: Sequence[int] = (1, 2), programs_per_task: int = 8, seed: int = 0,
                   budget_minutes: float | None = None, max_kernel_s: float = 0.1, min_repeat_s: float = 2e-5,
                   repeats: int = 15, progress: bool = True, workers: int = 1,
                   log: Callable[[str], None] | None = None) -> CollectStats:
    """Time programs of the committed dataset on *this* machine as new device domains
    `{prefix}-{t}t` (e.g. another CPU than the one the dataset was collected on).

    `workers` > 1 compiles batches of programs in that many worker processes (`prebuild`), then
    times the batch with the workers idle: on a many-core machine compiling is the bottleneck.

    The programs keep their features (same schedules), so only latencies are new; `merge_device`
    adds them to the dataset. Measurements go into `store` with the program marked done in the
    same transaction: a killed run resumes where it stopped.
    """
    threads = sorted({int(t) for t in threads})
    import tempfile
    import tvm
    from tensorplan.measure.store import Store
    from tensorplan.cdmpp.tasks import task_from_script
    import pyarrow.parquet as pq
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    d = Path(data) if data else default_data_dir()
    st = store if isinstance(store, Store) else Store(store)
    target = tvm.target.Target({"kind": "llvm", "num-cores": max(threads)})
    job = st.job(f"cdmpp-device-{prefix}-v{TIMER_VERSION}")
    done = job.done_keys() | in_dataset(d, [f"{prefix}-{t}t" for t in threads])
    todo = [p for p in device_programs(d, programs_per_task, seed) if p["prog_key"] not in done]
    tasks = pq.read_table(d / "tasks.parquet").to_pandas().set_index("task_key")
    pre = None
    if workers > 1 and todo:
        from tensorplan.cdmpp.prebuild import Prebuilder
        tmp = tempfile.TemporaryDirectory(prefix="tensorplan-prebuild-")
        pre = Prebuilder(todo, tasks, target, tmp.name, workers)
    init_pool(max(threads))
    specs = local_specs(threads, prefix, "measure-device")
    dev_keys = {t: st.put_device(sp) for t, sp in specs.items()}
    stats = CollectStats(skipped_done=len(done))
    t_start = last = time.time()
    mods: dict[str, Any] = {}
    timer = dict(min_repeat_s=min_repeat_s, max_kernel_s=max_kernel_s, repeats=repeats)

    def task_of(tk: str):
        if tk not in mods:
            row = tasks.loc[tk]
            mods[tk] = task_from_script(tk, row["task_name"], row["script"], {}, float(row["flops"]))
        return mods[tk]

    def timed():
        """(program, timings) in order; compiled here or in batches by the workers."""
        if pre is None:
            for p in todo:
                yield p, time_trace(task_of(p["task_key"]), p["trace"], target, threads, **timer)
            return
        step = 4 * pre.workers
        for a in range(0, len(todo), step):
            for k, path, _ in pre.map(range(a, min(len(todo), a + step))):
                p = todo[k]
                if path is None:
                    yield p, "failed"
                    continue
                yield p, _time_built(tvm.runtime.load_module(path), task_of(p["task_key"]), threads, **timer)
                os.remove(path)

    try:
        with progress_bar(f"measure {prefix}", len(todo), progress) as advance:
            for p, timings in timed():
                def put(p=p, timings=timings) -> int:
                    payload = {k: p[k] for k in ("task_key", "index", "space", "seed")}
                    payload["trace"] = json.loads(p["trace"])
                    pk = st.put_program(PROGRAM_KIND, payload)
                    st.put_measurements([(pk, dev_keys[t], timings[t], TAG,
                                          {"timer": TIMER_VERSION, "dataset_prog_key": p["prog_key"]})
                                         for t in threads])
                    return len(threads)
                record_outcome(st, job, stats, p["prog_key"], timings, put)
                advance(1)
                stop, last = pace(f"measure-device {prefix}", stats, t_start, last, budget_minutes, log)
                if stop:
                    break           # checked after recording: what was timed is kept
    finally:
        if pre is not None:
            pre.close()
            tmp.cleanup()
    stats.seconds = time.time() - t_start
    log(f"measure-device {prefix}: {json.dumps(stats.to_dict())}")
    return stats


def record_outcome(st, job, stats: CollectStats, done_key: str, outcome: Any, put: Callable[[], int]) -> None:
    """Record one program's outcome in one store transaction and mark it done in the resumable job:
    a timing is written by `put()` (returns the records written); "failed" / "too_slow" are counted."""
    with st.transaction():
        if not isinstance(outcome, str):
            stats.records += put()
            stats.programs += 1
        elif outcome == "failed":
            stats.failed_build += 1
        else:
            stats.too_slow += 1
        job.mark_done(done_key)


def pace(what: str, stats: CollectStats, t_start: float, last: float, budget_minutes: float | None,
         log: Callable[[str], None]) -> tuple[bool, float]:
    """After each measured program: (budget spent?, time of the last progress line), logging one
    line a minute."""
    now = time.time()
    if budget_minutes and now - t_start > budget_minutes * 60:
        return True, last
    if now - last > 60:
        log(f"{what} [{(now - t_start) / 60:.1f} min] programs {stats.programs} "
            f"({stats.records / (now - t_start):.2f} rec/s)")
        return False, now
    return False, last


def merge_device(prefix: str, *, data: str | Path | None = None, store: Any = None,
                 log: Callable[[str], None] | None = None) -> dict:
    """Add the `{prefix}-Nt` records measured by `measure_device` to the dataset's records.parquet
    and meta.json (a program timed again replaces its earlier record: re-running is safe)."""
    def ours(dev: str) -> bool:
        return dev.startswith(prefix + "-") and dev[len(prefix) + 1:-1].isdigit() and dev.endswith("t")
    return _merge_records(ours, lambda m: m["extra"].get("dataset_prog_key"), data=data, store=store,
                          what="merge-device", none_hint=f"the store holds no measurements of devices '{prefix}-Nt'; "
                          f"run `tensorplan predictor dataset measure-device --prefix {prefix}` first", log=log)


def merge_gpu(name: str, *, data: str | Path | None = None, store: Any = None,
              log: Callable[[str], None] | None = None) -> dict:
    """Add GPU `name`'s records of `measure_gpu` to a GPU dataset holding the same programs (its
    programs.parquet given to `measure-gpu`); a program timed again replaces its earlier record.

    A store program's key is the hash of its payload (task, index, seed, target, trace), so the
    programs timed on a second GPU carry the dataset's `prog_key`s: features are shared and only
    the latencies are new, as for the CPU domains of `merge_device`."""
    return _merge_records(lambda dev: dev == name, lambda m: m["prog_key"], data=data, store=store,
                          what="merge-gpu", none_hint=f"the store holds no measurements of device '{name}'; "
                          f"run `tensorplan predictor dataset measure-gpu --name {name}` first", log=log)


def _check_same_model(first: dict, later: dict, name: str, what: str) -> None:
    """Records of one domain must come from one kind of machine."""
    a, b = ((e.get("spec") or {}).get("model") for e in (first, later))
    if a and b and a != b:
        raise TensorplanError(f"{what}: domain {name} was measured on '{a}', this store's machine is '{b}'; "
                              "name another machine's domains differently (--prefix / --name)")


def _merge_records(ours: Callable[[str], bool], source_key: Callable[[dict], str | None], *,
                   data: str | Path | None, store: Any, what: str, none_hint: str,
                   log: Callable[[str], None] | None) -> dict:
    """Append a store's measurements of the devices `ours` accepts to a dataset whose programs
    they time (`source_key(m)` names the dataset program). A (program, device) pair timed again
    replaces its earlier record; records of programs the store did not time are kept.

    A domain that keeps earlier records keeps its spec too (the figures models read), and a later
    machine's spec is listed under `later_specs`: on shared machines a later measurement of the same
    hardware can read far lower bandwidth while its timings still fit the first spec.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tensorplan.measure.store import Store
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    d = Path(data) if data else default_data_dir()
    st = store if isinstance(store, Store) else Store(store)
    prog = pq.read_table(d / "programs.parquet").to_pandas()
    pidx = dict(zip(prog["prog_key"], prog["prog_idx"]))
    rows, devices = [], {}
    for m in st.measurements(kind=PROGRAM_KIND, tag=TAG):
        dev = m["device"]
        if not ours(dev):
            continue
        src = source_key(m)
        if src not in pidx:
            raise TensorplanError(f"{what}: a {dev} measurement names program {src!r}, which is not in {d}; "
                                  "measure against the same dataset you merge into")
        devices[dev] = m["dev_key"]
        rows.append((pidx[src], m))
    if not rows:
        raise TensorplanError(f"{what}: {none_hint}")
    old = pq.read_table(d / "records.parquet")
    fresh = {(i, m["device"]) for i, m in rows}
    old = old.filter(pa.array([not (ours(str(dv)) and (int(i), str(dv)) in fresh)
                               for i, dv in zip(old.column("prog_idx").to_pylist(), old.column("device").to_pylist())]))
    new = pa.table({
        "prog_idx": np.array([i for i, _ in rows], dtype=np.int32),
        "device": [m["device"] for _, m in rows],
        "device_key": [m["dev_key"] for _, m in rows],
        "latency_s": np.array([m["median_s"] for _, m in rows], dtype=np.float64),
        "mean_s": np.array([m["mean_s"] for _, m in rows], dtype=np.float64),
        "min_s": np.array([m["min_s"] for _, m in rows], dtype=np.float64),
        "cov": np.array([m["cov"] for _, m in rows], dtype=np.float64),
        "repeats": pa.array([m["repeats"] for _, m in rows], type=pa.list_(pa.float32())),
        "number": np.array([m["number"] for _, m in rows], dtype=np.int32),
        "timer_version": np.array([int(m["extra"].get("timer", 1)) for _, m in rows], dtype=np.int8),
    }).cast(old.schema)
    meta = json.loads((d / "meta.json").read_text())
    kept = set(old.column("device").to_pylist())        # domains with earlier records still there
    known = meta.setdefault("devices", {})
    for name in [k for k in known if ours(k) and k not in kept]:
        del known[name]
    for name, key in devices.items():
        spec = st.get_device(key)
        entry = {"key": key, "spec": spec.to_dict() if spec else None}
        if name not in known:
            known[name] = entry
        else:
            _check_same_model(known[name], entry, name, what)
            later = known[name].setdefault("later_specs", [])
            if entry["spec"] != known[name]["spec"] and entry not in later:
                later.append(entry)
    pq.write_table(pa.concat_tables([old, new]), d / "records.parquet", compression="zstd", compression_level=19)
    meta["n_records"] = int(len(old) + len(new))
    (d / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    log(f"{what}: {len(new)} records of {sorted(devices)} -> {d}")
    return {"dir": str(d), "records_added": len(new), "devices": sorted(devices), "records": int(len(old) + len(new))}


# =========================================================================== export / load

def is_gpu_target(target: str | None) -> bool:
    """Whether a program's recorded target (None: the CPU of `collect`) is a GPU."""
    if not target:
        return False
    import tvm
    return tvm.target.Target(target).kind.name in ("cuda", "rocm", "vulkan", "metal", "opencl")


def _featurize_programs(tasks_by_key: dict, programs: list[dict], log, progress: bool = True,
                        workers: int | None = None):
    """Replay every stored trace and compute its compact AST, in forked workers (every CPU by
    default; replay dominates, ~36 ms a program). A program that fails is logged and left None."""
    from tensorplan.forkmap import default_workers, fork_map_iter
    from tensorplan.cdmpp.features import compact_ast

    def job(a: int, b: int) -> list:
        out = []
        for k in range(a, b):
            p = programs[k]
            try:
                out.append(compact_ast(replay_trace(tasks_by_key[p["task_key"]].mod, p["trace"]),
                                       is_gpu=is_gpu_target(p.get("target"))))
            except Exception as e:  # noqa: BLE001 - one bad program must not sink the export
                out.append(f"export: program {k} of task {p['task_key']} dropped: {e}")
        return out

    asts: list = [None] * len(programs)
    t0 = time.time()
    w = default_workers() if workers is None else workers
    with progress_bar("featurize", len(programs), progress) as advance:
        for a, res in fork_map_iter(job, len(programs), workers=w, chunk=16):
            for k, r in enumerate(res, start=a):
                if isinstance(r, str):
                    log(r)
                else:
                    asts[k] = r
            advance(len(res))
    log(f"export: featurized {len(programs)} programs in {time.time() - t0:.1f} s ({w} workers)")
    return asts


def export(store: Any = None, out_dir: str | Path | None = None, *, log: Callable[[str], None] | None = None,
           progress: bool = True, workers: int | None = None) -> dict:
    """Write the compact dataset (parquet+zstd records/tasks, float16 leaf features) from a store;
    programs are replayed and featurised in `workers` processes (None: every CPU)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tensorplan.measure.store import Store
    from tensorplan.cdmpp.tasks import task_from_script

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    st = store if isinstance(store, Store) else Store(store)
    out = Path(out_dir) if out_dir else default_data_dir()
    out.mkdir(parents=True, exist_ok=True)
    # tasks and networks
    nets: dict[str, dict[str, int]] = {}
    for (payload,) in st._read("SELECT payload FROM programs WHERE kind=?", (NETWORK_KIND,)):
        p = json.loads(payload)
        nets[p["network"]] = p["tasks"]
    tasks: dict[str, Any] = {}
    for (payload,) in st._read("SELECT payload FROM programs WHERE kind=?", (TASK_KIND,)):
        p = json.loads(payload)
        t = task_from_script(p["key"], p["name"], p["script"], {}, p.get("flops", 0.0))
        tasks[t.key] = t
    for n, m in nets.items():
        for k, c in m.items():
            if k in tasks:
                tasks[k].networks[n] = c
    # measurements
    progs: dict[str, dict] = {}
    rows = []
    devices = {}
    n_invalid = 0
    for m in st.measurements(kind=PROGRAM_KIND, tag=TAG):
        if (m["threads"] or 1) > 1 and int(m["extra"].get("timer", 1)) < MIN_VALID_MULTITHREAD_TIMER:
            n_invalid += 1                   # multi-thread record from before the pool fix: not 2 threads
            continue
        pk = m["prog_key"]
        if pk not in progs:
            progs[pk] = m["payload"]
        devices[m["device"]] = m["dev_key"]
        rows.append(m)
    prog_keys = sorted(progs)
    pidx = {k: i for i, k in enumerate(prog_keys)}
    plist = [progs[k] for k in prog_keys]
    asts = _featurize_programs(tasks, plist, log, progress, workers)
    if any(a is None for a in asts):                      # drop programs that failed to featurise
        keep = [i for i, a in enumerate(asts) if a is not None]
        prog_keys = [prog_keys[i] for i in keep]
        plist = [plist[i] for i in keep]
        asts = [asts[i] for i in keep]
        pidx = {k: i for i, k in enumerate(prog_keys)}
        rows = [m for m in rows if m["prog_key"] in pidx]
    # features: one block per program
    n_leaves = np.array([a.n_leaves for a in asts], dtype=np.int32)
    offsets = np.concatenate([[0], np.cumsum(n_leaves)]).astype(np.int64)
    feats = np.concatenate([a.leaf_features for a in asts]).astype(np.float16) if asts else np.zeros((0, 164), np.float16)
    pre_len = np.array([len(a.preorder) for a in asts], dtype=np.int32)
    pre_off = np.concatenate([[0], np.cumsum(pre_len)]).astype(np.int64)
    np.savez_compressed(out / "features.npz", leaf_features=feats, leaf_offsets=offsets,
                        positions=np.concatenate([a.positions for a in asts]).astype(np.int32) if asts else np.zeros(0, np.int32),
                        preorder=np.concatenate([a.preorder for a in asts]).astype(np.int32) if asts else np.zeros(0, np.int32),
                        preorder_offsets=pre_off,
                        leaf_is_const=np.concatenate([a.leaf_is_const for a in asts]) if asts else np.zeros(0, bool),
                        flops=np.array([a.flops for a in asts], dtype=np.float64))
    # programs table
    pq.write_table(pa.table({
        "prog_idx": np.arange(len(plist), dtype=np.int32),
        "prog_key": prog_keys,
        "task_key": [p["task_key"] for p in plist],
        "index": [int(p["index"]) for p in plist],
        "space": [int(p["space"]) for p in plist],
        "seed": [int(p["seed"]) for p in plist],
        "trace": [json.dumps(p["trace"], separators=(",", ":")) for p in plist],
        "target": [str(p.get("target") or "llvm") for p in plist],
    }), out / "programs.parquet", compression="zstd", compression_level=19)
    # records table
    pq.write_table(pa.table({
        "prog_idx": np.array([pidx[m["prog_key"]] for m in rows], dtype=np.int32),
        "device": [m["device"] for m in rows],
        "device_key": [m["dev_key"] for m in rows],
        "latency_s": np.array([m["median_s"] for m in rows], dtype=np.float64),
        "mean_s": np.array([m["mean_s"] for m in rows], dtype=np.float64),
        "min_s": np.array([m["min_s"] for m in rows], dtype=np.float64),
        "cov": np.array([m["cov"] for m in rows], dtype=np.float64),
        "repeats": pa.array([m["repeats"] for m in rows], type=pa.list_(pa.float32())),
        "number": np.array([m["number"] for m in rows], dtype=np.int32),
        "timer_version": np.array([int(m["extra"].get("timer", 1)) for m in rows], dtype=np.int8),
    }), out / "records.parquet", compression="zstd", compression_level=19)
    # tasks table
    tk = sorted(tasks)
    pq.write_table(pa.table({
        "task_key": tk,
        "task_name": [tasks[k].name for k in tk],
        "networks": [json.dumps(tasks[k].networks, sort_keys=True) for k in tk],
        "flops": np.array([tasks[k].flops for k in tk], dtype=np.float64),
        "script": [tasks[k].script() for k in tk],
    }), out / "tasks.parquet", compression="zstd", compression_level=19)
    devs = {}
    for name, key in devices.items():
        spec = st.get_device(key)
        devs[name] = {"key": key, "spec": spec.to_dict() if spec else None}
    meta = {"format": 1, "created": time.time(), "n_programs": len(plist), "n_records": len(rows),
            "n_tasks_measured": len({p["task_key"] for p in plist}), "devices": devs,
            "networks": sorted(nets), "feature_dim": 164,
            "collection": {"sampler": "meta_schedule post-order-apply design space, replay-trace decisions, "
                                      "mandatory postprocs", "timer": "tvm time_evaluator after 1 warm-up call; number so that one repeat lasts >= 0.2 ms "
                                      "(>= 1 ms in the first ~700 records); 3-15 repeats (about 20 ms of timed runs); median. "
                                      "timer_version 3: call time estimated at 1 thread, number=1 unless the kernel is "
                                      "< 20 us, 3-15 repeats (about 10 ms per thread count)"}}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
    size = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    log(f"export: {len(rows)} records, {len(plist)} programs, {len(tk)} tasks -> {out} ({size / 1e6:.1f} MB); "
        f"{n_invalid} invalid multi-thread records (timer < {MIN_VALID_MULTITHREAD_TIMER}) left out")
    return {"dir": str(out), "records": len(rows), "programs": len(plist), "tasks": len(tk), "bytes": size,
            "invalid_multithread_records_left_out": n_invalid}


@dataclass
class Dataset:
    """Measured programs: one row of `records` per (program, device).

    `records` columns: record_id, prog_idx, prog_key, task_key, task_name, networks (list of
    (network, call-site count)), device, device_key, latency_s (median of the repeats), mean_s,
    min_s, cov (std/mean of the repeats), mad_rel (median absolute deviation / median), repeats,
    number (calls per repeat), flops (program float ops), n_leaves, trace (replayable JSON string),
    sample_index (the task's design-space sample number; `tensorplan predict` schedules the lowest
    one that compiles), task_io (`tasks.task_io_vector`: log2 sizes of the task's output and inputs).
    `leaves[i]` / `positions[i]` are the [n_leaves, 164] float32 features and the CDMPP positions of
    record i, `preorders[i]` its compact-AST serialisation (node ids, -1 end markers); records of
    the same program share the arrays.
    """

    records: Any                     # pandas.DataFrame
    leaves: list[np.ndarray]
    positions: list[np.ndarray]
    tasks: Any                       # pandas.DataFrame: task_key, task_name, networks, flops, script
    devices: dict[str, dict] = field(default_factory=dict)
    path: str = ""
    preorders: list[np.ndarray] = field(default_factory=list)   # compact-AST serialisation per record
    _task_mods: dict = field(default_factory=dict, repr=False)   # parsed task IRModules (cache)

    def __len__(self) -> int:
        return len(self.records)

    # ---- selection
    def subset(self, idx: Sequence[int] | np.ndarray) -> "Dataset":
        """Rows by position (ints) or boolean mask."""
        idx = np.asarray(idx)
        if idx.dtype == bool:
            idx = np.flatnonzero(idx)
        rec = self.records.iloc[idx].reset_index(drop=True)
        pre = [self.preorders[i] for i in idx] if self.preorders else []
        return Dataset(rec, [self.leaves[i] for i in idx], [self.positions[i] for i in idx], self.tasks,
                       self.devices, self.path, pre, self._task_mods)

    def filter_stable(self, max_cov: float = DEFAULT_MAX_COV, min_task_samples: int = 0,
                      metric: str = "cov") -> "Dataset":
        """CDMPP §2.6: drop records whose repeat CoV (std/mean) > max_cov (default 1 %) or latency <= 0;
        optionally drop (task, device) groups with fewer than `min_task_samples` survivors (CDMPP: 48).
        metric="mad" thresholds the robust spread `mad_rel` (MAD/median) instead: on a shared machine
        a single preempted repeat inflates the CoV although the median is fine."""
        r = self.records
        if metric not in ("cov", "mad"):
            raise TensorplanError(f"filter_stable: metric must be 'cov' or 'mad', got {metric!r}")
        spread = r["cov"].to_numpy() if metric == "cov" else r["mad_rel"].to_numpy()
        ok = (spread <= max_cov) & (r["latency_s"].to_numpy() > 0)
        ds = self.subset(ok)
        if min_task_samples > 0 and len(ds):
            cnt = ds.records.groupby(["task_key", "device"])["record_id"].transform("count").to_numpy()
            ds = ds.subset(cnt >= min_task_samples)
        return ds

    def device(self, name: str) -> "Dataset":
        return self.subset(self.records["device"].to_numpy() == name)

    def only_devices(self, names: Sequence[str]) -> "Dataset":
        """Records of these device domains; a name with no records is an error (a typo would
        otherwise train or evaluate on nothing, or on less than asked)."""
        have = set(self.records["device"].unique())
        bad = [d for d in names if d not in have]
        if bad:
            raise TensorplanError(f"no records on device domain(s) {bad} in '{self.path}'; it has {sorted(have)}")
        return self.subset(self.records["device"].isin(list(names)).to_numpy())

    def only_leaf_counts(self, counts: Sequence[int]) -> "Dataset":
        """Records of programs with these numbers of leaves (buffer stores). CDMPP's released
        scripts keep only 5-leaf programs by default; this reproduces that setting."""
        keep = self.records["n_leaves"].isin([int(c) for c in counts]).to_numpy()
        if not keep.any():
            have = sorted(int(c) for c in self.records["n_leaves"].unique())
            raise TensorplanError(f"no programs with {list(counts)} leaves in '{self.path}'; leaf counts: {have}")
        return self.subset(keep)

    def split(self, kind: str = "network", holdout: Any = None, seed: int = 0,
              test_fraction: float = 0.2) -> tuple["Dataset", "Dataset"]:
        """(train, test) split.

        kind="network": test = records of tasks occurring in the held-out network(s) `holdout`
          (str or list; default: one network drawn with `seed`); train = tasks of no held-out
          network (a task shared with a training network counts as seen, so it is removed from test
          too -- strictly unseen kernels).
        kind="device": test = records on device(s) `holdout` (default the last device name), train = rest.
        kind="task": a `test_fraction` of tasks (by seed) held out.
        kind="sample": CDMPP's default: records sorted by latency, every 5th to test (80/20).
        """
        r = self.records
        n = len(r)
        rng = np.random.default_rng(seed)
        if kind == "network":
            nets = sorted({k for v in r["networks"] for k, _ in v})
            if not nets:
                raise TensorplanError("split(kind='network'): the dataset has no network information")
            hold = [holdout] if isinstance(holdout, str) else list(holdout or [nets[rng.integers(len(nets))]])
            bad = [h for h in hold if h not in nets]
            if bad:
                raise TensorplanError(f"split: unknown network(s) {bad}; known: {nets}")
            in_hold = np.array([any(k in hold for k, _ in v) for v in r["networks"]])
            in_train_net = np.array([any(k not in hold for k, _ in v) for v in r["networks"]])
            test = in_hold & ~in_train_net
            train = ~in_hold
            return self.subset(train), self.subset(test)
        if kind == "device":
            devs = sorted(r["device"].unique())
            hold = [holdout] if isinstance(holdout, str) else list(holdout or devs[-1:])
            test = r["device"].isin(hold).to_numpy()
            return self.subset(~test), self.subset(test)
        if kind == "task":
            tks = np.array(sorted(r["task_key"].unique()))
            k = max(1, int(round(test_fraction * len(tks))))
            hold = set(rng.choice(tks, size=k, replace=False)) if holdout is None else set(holdout)
            test = r["task_key"].isin(hold).to_numpy()
            return self.subset(~test), self.subset(test)
        if kind == "sample":
            order = np.argsort(r["latency_s"].to_numpy(), kind="stable")
            test = np.zeros(n, bool)
            test[order[4::5]] = True
            return self.subset(~test), self.subset(test)
        raise TensorplanError(f"split: kind must be 'network', 'device', 'task' or 'sample', got {kind!r}")

    # ---- ground truth
    def _stable_rows(self, max_cov: float | None, metric: str):
        r = self.records
        if max_cov is None:
            return r
        col = {"cov": "cov", "mad": "mad_rel"}.get(metric)
        if col is None:
            raise TensorplanError(f"metric must be 'cov' or 'mad', got {metric!r}")
        return r[r[col] <= max_cov]

    def network_latencies(self, max_cov: float | None = DEFAULT_MAX_COV, metric: str = "cov",
                          program: str = "fastest") -> dict[tuple[str, str], float]:
        """Measured network latency per (network, device): sum over the network's tasks of
        call-site count x median latency of one stable sampled program of the task (module doc):
        its fastest (`program="fastest"`, a tuned network) or its lowest-numbered design-space
        sample (`"first"`, what `tensorplan predict` schedules: an untuned network).
        Networks with a task lacking any stable measurement on that device are left out."""
        r = self._stable_rows(max_cov, metric)
        g = r.groupby(["task_key", "device"])
        if program == "fastest":
            lat = g["latency_s"].min().to_dict()
        elif program == "first":
            f = r.loc[g["sample_index"].idxmin()]
            lat = dict(zip(zip(f["task_key"], f["device"]), f["latency_s"]))
        else:
            raise TensorplanError(f"network_latencies: program must be 'fastest' or 'first', got {program!r}")
        devs = sorted(r["device"].unique())
        out = {}
        for net, tk in self.network_tasks().items():
            for d in devs:
                if all((k, d) in lat for k in tk):
                    out[(net, d)] = float(sum(c * lat[(k, d)] for k, c in tk.items()))
        return out

    def network_tasks(self) -> dict[str, dict[str, int]]:
        """network -> {task_key: call-site count}: how a network's latency sums its kernels."""
        out: dict[str, dict[str, int]] = {}
        for key, nets in zip(self.tasks["task_key"], self.tasks["networks"]):
            for net, c in nets:
                out.setdefault(net, {})[key] = c
        return out

    def stats(self) -> dict:
        r = self.records
        nets = sorted({k for v in self.tasks["networks"] for k, _ in v})
        stable = r["cov"] <= DEFAULT_MAX_COV
        return {
            "path": self.path, "records": int(len(r)), "programs": int(r["prog_idx"].nunique()) if len(r) else 0,
            "tasks_total": int(len(self.tasks)), "tasks_measured": int(r["task_key"].nunique()) if len(r) else 0,
            "networks": nets, "n_networks": len(nets),
            "devices": {d: int(c) for d, c in r["device"].value_counts().sort_index().items()},
            "stable_records_cov_1pct": int(stable.sum()),
            "stable_fraction": float(stable.mean()) if len(r) else 0.0,
            "stable_records_cov_5pct": int((r["cov"] <= 0.05).sum()),
            "stable_records_mad_1pct": int((r["mad_rel"] <= 0.01).sum()),
            "stable_fraction_by_device": {d: {"cov_1pct": float((g["cov"] <= 0.01).mean()),
                                              "cov_5pct": float((g["cov"] <= 0.05).mean()),
                                              "mad_1pct": float((g["mad_rel"] <= 0.01).mean()),
                                              "median_cov": float(g["cov"].median())}
                                          for d, g in r.groupby("device")},
            "median_cov": float(r["cov"].median()) if len(r) else 0.0,
            "latency_s": {"min": float(r["latency_s"].min()), "median": float(r["latency_s"].median()),
                          "max": float(r["latency_s"].max())} if len(r) else {},
            "leaves": {"min": int(r["n_leaves"].min()), "median": float(r["n_leaves"].median()),
                       "max": int(r["n_leaves"].max())} if len(r) else {},
            "programs_per_task_median": float(r.groupby("task_key")["prog_idx"].nunique().median()) if len(r) else 0,
        }


def load_dataset(path: str | Path | Sequence[str | Path] | None = None) -> Dataset:
    """Load the exported dataset (default: the committed `data/cdmpp/`).

    Several directories (a list, or one string joined by commas, e.g.
    `data/cdmpp,data/cdmpp-h100`) load as one dataset (`concat_datasets`): how the CPU domains and
    the GPU domain, exported separately, are trained on together.
    """
    if isinstance(path, (list, tuple)) or (path is not None and "," in str(path)):
        parts = list(path) if isinstance(path, (list, tuple)) else [p for p in str(path).split(",") if p.strip()]
        return concat_datasets([load_dataset(Path(str(p).strip())) for p in parts])
    import pyarrow.parquet as pq
    d = Path(path) if path else default_data_dir()
    need = ["records.parquet", "programs.parquet", "tasks.parquet", "features.npz", "meta.json"]
    miss = [n for n in need if not (d / n).exists()]
    if miss:
        raise TensorplanError(f"dataset '{d}': missing {miss}; run `tensorplan predictor dataset export --out {d}` "
                              "after `tensorplan predictor dataset collect`")
    meta = json.loads((d / "meta.json").read_text())
    rec = pq.read_table(d / "records.parquet").to_pandas()
    prog = pq.read_table(d / "programs.parquet").to_pandas()
    tasks = pq.read_table(d / "tasks.parquet").to_pandas()
    tasks["networks"] = [sorted(json.loads(s).items()) for s in tasks["networks"]]
    z = np.load(d / "features.npz")
    feats, off = z["leaf_features"], z["leaf_offsets"]
    pos = z["positions"]
    flops = z["flops"]
    n_prog = len(prog)
    p_leaves = [feats[off[i]:off[i + 1]].astype(np.float32) for i in range(n_prog)]
    p_pos = [pos[off[i]:off[i + 1]] for i in range(n_prog)]
    pre, poff = z["preorder"], z["preorder_offsets"]
    p_pre = [pre[poff[i]:poff[i + 1]] for i in range(n_prog)]
    pi = rec["prog_idx"].to_numpy()
    tk = prog["task_key"].to_numpy()[pi]
    tinfo = tasks.set_index("task_key")
    rec.insert(0, "record_id", np.arange(len(rec), dtype=np.int64))
    rec["prog_key"] = prog["prog_key"].to_numpy()[pi]
    rec["task_key"] = tk
    rec["task_name"] = tinfo.loc[tk, "task_name"].to_numpy()
    rec["networks"] = list(tinfo.loc[tk, "networks"].to_numpy())
    rec["flops"] = flops[pi]
    rec["n_leaves"] = (off[1:] - off[:-1])[pi].astype(np.int32)
    rec["trace"] = prog["trace"].to_numpy()[pi]
    rec["sample_index"] = prog["index"].to_numpy()[pi].astype(np.int64)   # design-space sample number
    io = {k: task_io_vector(sc) for k, sc in zip(tasks["task_key"], tasks["script"])}
    rec["task_io"] = [io[k] for k in tk]
    rec["repeats"] = [list(x) for x in rec["repeats"]]
    # robust spread: median absolute deviation / median (insensitive to the rare repeat that another
    # process preempted, unlike the CoV = std/mean that CDMPP filters on)
    rec["mad_rel"] = [mad_rel(x) for x in rec["repeats"]]
    return Dataset(rec, [p_leaves[i] for i in pi], [p_pos[i] for i in pi], tasks, meta.get("devices", {}), str(d),
                   [p_pre[i] for i in pi])


def concat_datasets(parts: Sequence[Dataset]) -> Dataset:
    """One dataset from several exports (e.g. the CPU domains and the GPU domain).

    Programs stay distinct (`prog_idx` is offset per part); a task in several parts is kept once.
    A device domain may appear in several parts only if they time different programs (e.g. new
    tasks collected later on the same machine type, `collect --prefix`); the first part's spec
    describes it. Two parts timing the same program on one domain would be two records of it with
    no way to tell which one to trust, so that is refused.
    """
    import pandas as pd
    if not parts:
        raise TensorplanError("concat_datasets: no datasets given")
    if len(parts) == 1:
        return parts[0]
    seen: dict[str, str] = {}
    progs: dict[str, set] = {}
    for ds in parts:
        for dev, keys in ds.records.groupby("device")["prog_key"]:
            shared = progs.setdefault(dev, set()) & set(keys)
            if shared:
                raise TensorplanError(f"concat_datasets: device domain '{dev}' times {len(shared)} of the same "
                                      f"programs in '{seen[dev]}' and '{ds.path}'; merge it into one export "
                                      "(`tensorplan predictor dataset merge-device`)")
            progs[dev] |= set(keys)
            seen.setdefault(dev, ds.path)
    recs, off = [], 0
    for ds in parts:
        r = ds.records.copy()
        r["prog_idx"] = r["prog_idx"] + off
        off = int(r["prog_idx"].max()) + 1 if len(r) else off
        recs.append(r)
    rec = pd.concat(recs, ignore_index=True)
    rec["record_id"] = np.arange(len(rec), dtype=np.int64)
    tasks = pd.concat([ds.tasks for ds in parts], ignore_index=True).drop_duplicates("task_key").reset_index(drop=True)
    devices: dict = {}
    for ds in parts:                                   # the first part's spec of each domain
        for k, v in ds.devices.items():
            if k in seen and k not in devices:
                devices[k] = v
    return Dataset(rec, [x for ds in parts for x in ds.leaves], [x for ds in parts for x in ds.positions], tasks,
                   devices, ",".join(ds.path for ds in parts),
                   [x for ds in parts for x in ds.preorders] if all(ds.preorders for ds in parts) else [])


def task_module(ds: Dataset, task_key: str):
    """The unscheduled IRModule of a task (for replaying a record's trace)."""
    from tensorplan.cdmpp.tasks import task_from_script
    mod = ds._task_mods.get(task_key)
    if mod is not None:
        return mod
    row = ds.tasks[ds.tasks["task_key"] == task_key]
    if not len(row):
        raise TensorplanError(f"dataset: unknown task {task_key}")
    r = row.iloc[0]
    mod = ds._task_mods[task_key] = task_from_script(task_key, r["task_name"], r["script"], dict(r["networks"]),
                                                     r["flops"]).mod
    return mod


def record_schedule(ds: Dataset, record_id: int):
    """Replay record `record_id`'s trace: the scheduled s_tir.Schedule."""
    r = ds.records.iloc[int(record_id)]
    return replay_trace(task_module(ds, r["task_key"]), r["trace"])
