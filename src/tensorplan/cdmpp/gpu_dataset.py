"""A GPU device domain for the CDMPP dataset: CUDA schedules of the same tasks, timed on a GPU.

Why a separate program set: a CPU schedule (parallel/vectorised loops) is not a GPU program, so
unlike a second CPU (`dataset.measure_device`, same programs, new latencies) a GPU domain needs
its own schedules, sampled from meta_schedule's CUDA design space (thread binding, shared-memory
tiling, cross-thread reduction) with the CUDA postprocessors, including `VerifyGPUCode` against
the target's limits.  Sampling needs no GPU (`sample_programs`, run anywhere); `measure_gpu`
runs on the GPU machine, compiles in worker processes (`prebuild`) and times each kernel with
TVM's `time_evaluator` (CUDA events).  The store it writes exports, like any collect store,
into a dataset directory (`dataset.export`), e.g. `data/cdmpp-h100/`.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence


from tensorplan.errors import TensorplanError
from tensorplan.progress import progress_bar
from tensorplan.cdmpp.dataset import NETWORK_KIND, PROGRAM_KIND, TAG, TASK_KIND, TIMER_VERSION, CollectStats, _TaskState, _seed, default_data_dir, pace, record_outcome, round_robin, sample_schedule, task_arrays
from tensorplan.cdmpp.tasks import trace_json

DEFAULT_GPU_TARGET = "nvidia/nvidia-h100"


def _tasks_table(data: str | Path | None):
    import pyarrow.parquet as pq
    d = Path(data) if data else default_data_dir()
    return pq.read_table(d / "tasks.parquet").to_pandas().set_index("task_key")


def sample_programs(target: str = DEFAULT_GPU_TARGET, *, data: str | Path | None = None,
                    programs_per_task: int = 8, tries_per_program: int = 24, workers: int | None = None,
                    progress: bool = True, log: Callable[[str], None] | None = None) -> list[dict]:
    """Up to `programs_per_task` valid schedules per task of the dataset for `target` (a TVM
    target string or tag), each with its replayable trace. Draws are seeded per (task, i), so
    the same call gives the same programs; an invalid draw (a postprocessor rejects it, e.g.
    too much shared memory) is skipped, up to `tries_per_program` draws per wanted program."""
    import tvm
    from tensorplan.forkmap import default_workers, fork_map_iter
    from tensorplan.cdmpp.tasks import task_from_script
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    tgt = tvm.target.Target(target)
    tasks = _tasks_table(data)
    keys = sorted(tasks.index)

    def job(a: int, b: int) -> list:
        out = []
        for tk in keys[a:b]:
            row = tasks.loc[tk]
            task = task_from_script(tk, row["task_name"], row["script"], {}, float(row["flops"]))
            got: list[dict] = []
            try:
                state = _TaskState(task, tgt)
            except Exception as e:  # noqa: BLE001 - a task without a CUDA design space is reported
                out.append(f"sample: task {tk} ({row['task_name']}): no design space for {target}: {e}")
                continue
            for i in range(programs_per_task * tries_per_program):
                if len(got) >= programs_per_task:
                    break
                r = sample_schedule(state, i)
                if r is not None:
                    sch, space = r
                    got.append({"task_key": tk, "index": i, "space": space, "seed": _seed(tk, i),
                                "trace": json.dumps(trace_json(sch), separators=(",", ":")), "target": target})
            out.append(got)
        return out

    t0 = time.time()
    if keys:              # TVM's first design-space generation for a target costs ~40 s (one-time
        row = tasks.loc[keys[0]]  # set-up): pay it here, not once in every forked worker
        _TaskState(task_from_script(keys[0], row["task_name"], row["script"], {}, float(row["flops"])), tgt)
    progs: list[dict] = []
    with progress_bar(f"sample {target}", len(keys), progress) as advance:
        for _, res in fork_map_iter(job, len(keys), workers=default_workers() if workers is None else workers,
                                    chunk=4):
            for r in res:
                if isinstance(r, str):
                    log(r)
                else:
                    progs.extend(r)
            advance(len(res))
    progs.sort(key=lambda p: (p["task_key"], p["index"]))
    log(f"sample: {len(progs)} programs for {len({p['task_key'] for p in progs})}/{len(keys)} tasks "
        f"({target}) in {time.time() - t0:.0f} s")
    return progs


def untimed(programs: Sequence[dict], data: str | Path) -> list[dict]:
    """The `programs` that the dataset at `data` does not hold yet (same task, sample index and
    target): what a later GPU session should time to add programs per task. Sampling is seeded
    per (task, index), so `sample_programs` with more programs per task re-draws the timed ones
    first and this leaves the new draws."""
    import pyarrow.parquet as pq
    path = Path(data) / "programs.parquet"
    if not path.exists():
        raise TensorplanError(f"'{path}' does not exist; pass the GPU dataset whose programs are timed "
                              "(e.g. data/cdmpp-h100)")
    have = pq.read_table(path, columns=["task_key", "index", "target"]).to_pylist()
    timed = {(r["task_key"], int(r["index"]), r["target"]) for r in have}
    return [p for p in programs if (p["task_key"], int(p["index"]), p["target"]) not in timed]


def write_programs(programs: Sequence[dict], path: str | Path) -> Path:
    """Sampled programs -> parquet (zstd): what a GPU machine needs to measure them."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = ("task_key", "index", "space", "seed", "trace", "target")
    pq.write_table(pa.table({c: [p[c] for p in programs] for c in cols}), path, compression="zstd")
    return path


def read_programs(path: str | Path) -> list[dict]:
    import pyarrow.parquet as pq
    path = Path(path)
    if not path.exists():
        raise TensorplanError(f"programs file '{path}' does not exist; write one with "
                              "`tensorplan predictor dataset sample --target ... -o FILE`")
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001
        raise TensorplanError(f"programs file '{path}' is not a readable parquet table ({e}); sample it again") from None
    need = {"task_key", "index", "space", "seed", "trace", "target"}
    if rows and not need <= set(rows[0]):
        raise TensorplanError(f"programs file '{path}' lacks columns {sorted(need - set(rows[0]))}; sample it again")
    return rows


def _time_gpu(lib, args, *, min_repeat_s: float, max_kernel_s: float, repeats: int):
    """Time `main` on the GPU with time_evaluator (CUDA events): one untimed call, `number`
    calls per repeat so a repeat lasts >= `min_repeat_s`, `repeats` repeats; None if too slow."""
    import tvm
    from tensorplan.measure.timer import Timing
    dev = tvm.cuda(0)
    f = lib["main"]
    f(*args)
    dev.sync()
    est = lib.time_evaluator("main", dev, number=1, repeat=1)(*args).mean
    if est > max_kernel_s:
        return f"too slow ({est:.2f} s per call)"
    number = max(1, min(10000, int(math.ceil(min_repeat_s / max(est, 1e-9)))))
    res = lib.time_evaluator("main", dev, number=number, repeat=repeats)(*args)
    return Timing.from_repeats(list(res.results), warmup=1, number=number, threads=1,
                               method=f"tvm time_evaluator on cuda:0, number={number} repeat={repeats}; "
                                      f"1 warm-up call; v{TIMER_VERSION}")


def store_tasks(st, data: str | Path | None = None) -> None:
    """Copy the dataset's tasks and networks into a store, so `export` of it is self-contained."""
    tasks = _tasks_table(data)
    st.put_programs([(TASK_KIND, {"key": tk, "name": r["task_name"], "script": r["script"], "flops": float(r["flops"])})
                     for tk, r in tasks.iterrows()])
    nets: dict[str, dict[str, int]] = {}
    for tk, r in tasks.iterrows():
        for n, c in json.loads(r["networks"]).items():
            nets.setdefault(n, {})[tk] = int(c)
    st.put_programs([(NETWORK_KIND, {"network": n, "tasks": m}) for n, m in sorted(nets.items())])


def measure_gpu(name: str, programs: Sequence[dict], *, data: str | Path | None = None, store: Any = None,
                workers: int | None = None, budget_minutes: float | None = None, limit: int | None = None,
                min_repeat_s: float = 1e-3, repeats: int = 10, max_kernel_s: float = 0.1,
                progress: bool = True, log: Callable[[str], None] | None = None) -> CollectStats:
    """Time CUDA `programs` (from `sample_programs`) on this machine's first GPU as device `name`.

    Each program is stored with its trace and target, each measurement with every repeat, and
    the program is marked done in the same transaction: a killed run resumes where it stopped.
    """
    from tensorplan.devices.detect import local_gpu
    from tensorplan.forkmap import default_workers
    from tensorplan.measure.store import Store
    from tensorplan.cdmpp.prebuild import Prebuilder
    from tensorplan.cdmpp.tasks import task_from_script
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    if not name or not name.replace("-", "").isalnum() or name.startswith("local"):
        raise TensorplanError(f"measure-gpu: name {name!r} must be a short device name such as 'h100' "
                              "(letters, digits, '-'; not 'local')")
    targets = {p["target"] for p in programs}
    if len(targets) > 1:
        raise TensorplanError(f"measure-gpu: the programs mix targets {sorted(targets)}; measure one target per run")
    st = store if isinstance(store, Store) else Store(store)
    store_tasks(st, data)
    job = st.job(f"cdmpp-gpu-{name}-v{TIMER_VERSION}")
    done = job.done_keys()
    todo = [p for p in round_robin(programs) if f"{p['task_key']}:{p['index']}" not in done][:limit]
    stats = CollectStats(skipped_done=len(done))
    if not todo:
        log(f"measure-gpu {name}: nothing left to measure ({len(done)} done)")
        return stats
    tasks = _tasks_table(data)
    tmp = tempfile.TemporaryDirectory(prefix="tensorplan-gpu-")
    w = max(1, (default_workers() - 1) if workers is None else workers)
    pre = Prebuilder(todo, tasks, next(iter(targets)), tmp.name, w)
    gpu = local_gpu(0)
    if gpu is None:
        pre.close()
        raise TensorplanError("measure-gpu: no CUDA GPU is visible (torch.cuda.is_available() is False); "
                              "run it on the GPU machine")
    dev_key = st.put_device(dataclasses.replace(gpu, name=name))
    import tvm
    args_by_task: dict[str, list] = {}
    mods: dict[str, Any] = {}
    t_start = last = time.time()
    try:
        with progress_bar(f"measure {name}", len(todo), progress) as advance:
            for k, path, extra in pre.imap(range(len(todo))):
                p = todo[k]
                tk = p["task_key"]
                timing: Any = "failed"
                if path is not None:
                    try:
                        if tk not in mods:
                            row = tasks.loc[tk]
                            mods[tk] = task_from_script(tk, row["task_name"], row["script"], {}, float(row["flops"]))
                        if tk not in args_by_task:
                            args_by_task[tk] = [tvm.runtime.tensor(a, device=tvm.cuda(0)) for a in task_arrays(mods[tk])]
                        timing = _time_gpu(tvm.runtime.load_module(path), args_by_task[tk], min_repeat_s=min_repeat_s,
                                           max_kernel_s=max_kernel_s, repeats=repeats)
                    except Exception as e:  # noqa: BLE001 - one kernel that fails to load or run is skipped
                        log(f"measure-gpu: program {tk}:{p['index']} failed to run: {str(e).strip().splitlines()[-1][:200]}")
                    Path(path).unlink(missing_ok=True)
                elif stats.failed_build < 5:
                    log(f"measure-gpu: program {tk}:{p['index']} failed to build: {extra}")
                def put(p=p, timing=timing) -> int:
                    payload = {k_: p[k_] for k_ in ("task_key", "index", "space", "seed", "target")}
                    payload["trace"] = json.loads(p["trace"])
                    pk = st.put_program(PROGRAM_KIND, payload)
                    st.put_measurements([(pk, dev_key, timing, TAG, {"timer": TIMER_VERSION})])
                    return 1
                record_outcome(st, job, stats, f"{tk}:{p['index']}", timing, put)
                advance(1)
                stop, last = pace(f"measure-gpu {name}", stats, t_start, last, budget_minutes, log)
                if stop:
                    break           # checked after recording: what was timed is kept
    finally:
        pre.close()
        tmp.cleanup()
    stats.seconds = time.time() - t_start
    log(f"measure-gpu {name}: {json.dumps(stats.to_dict())}")
    return stats
