"""`tensorplan predictor dataset collect|remeasure|measure-device|merge-device|sample|measure-gpu|merge-gpu|export|stats`: the CDMPP tensor-program dataset."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

dataset_app = typer.Typer(help="Collect, export and summarise the CDMPP tensor-program dataset.",
                          no_args_is_help=True)

_STORE_OPT = typer.Option(None, "--store", help="Measurement store (default: $TENSORPLAN_STORE or <cache>/store.sqlite).")


@dataset_app.command("collect")
def collect(networks: Optional[str] = typer.Option(None, "--networks", help="Comma-separated zoo names or .onnx paths "
                                                   "(default: the zoo networks of tensorplan.cdmpp.tasks.DEFAULT_NETWORKS)."),
            programs_per_task: int = typer.Option(64, "--programs-per-task", min=1, help="Schedules sampled per task."),
            threads: str = typer.Option("1,2", "--threads", help="Thread counts; each is a device domain local-<N>t."),
            store: Optional[Path] = _STORE_OPT,
            budget_minutes: Optional[float] = typer.Option(None, "--budget-minutes", help="Stop after this long (resume later)."),
            batch: int = typer.Option(4, "--batch", min=1, help="Programs per task per round-robin visit."),
            max_kernel_ms: float = typer.Option(100.0, "--max-kernel-ms", help="Skip programs slower than this per call."),
            prefix: Optional[str] = typer.Option(None, "--prefix", help="Name this machine's domains <prefix>-<N>t "
                                                 "(e.g. zen4) instead of local-<N>t: another CPU than the dataset's."),
            min_task_flops: Optional[float] = typer.Option(None, "--min-task-flops",
                                                           help="Only tasks with at least this many FLOPs."),
            exclude_data: Optional[Path] = typer.Option(
                None, "--exclude-data", help="Skip programs this export timed (with a larger --max-kernel-ms: "
                                             "time the big programs it skipped as too slow)."),
            ray_address: Optional[str] = typer.Option(
                None, "--ray-address", help="Time on this Ray cluster: each thread count's programs on a worker "
                                            "offering that device (`tensorplan devices --ray-resources` there, "
                                            "`ray start --resources`); 'auto': the cluster this machine belongs "
                                            "to. Records land in this machine's store."),
            json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
            no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar (for logs).")) -> None:
    """Sample schedules of every fused kernel, compile once, time at each thread count; resumable."""
    from tensorplan.cli.common import positive, thread_counts
    ths = thread_counts(threads)
    positive(budget_minutes, "--budget-minutes")
    os.environ["TVM_NUM_THREADS"] = str(max(ths))   # before TVM's runtime pool exists
    positive(max_kernel_ms, "--max-kernel-ms")
    from tensorplan.cdmpp.dataset import collect as _collect
    from tensorplan.cdmpp.dataset import timed_programs
    nets = [n.strip() for n in networks.split(",")] if networks else None
    st = _collect(nets, programs_per_task=programs_per_task, threads=ths, store=store,
                  budget_minutes=budget_minutes, batch=batch, max_kernel_s=max_kernel_ms / 1e3,
                  min_task_flops=min_task_flops, exclude=timed_programs(exclude_data) if exclude_data else None,
                  progress=not no_progress, prefix=prefix, ray_address=ray_address)
    d = st.to_dict()
    if json_out:
        print(json.dumps(d, indent=1))
    else:
        Console().print(f"collected {d['programs']} programs, {d['records']} records in {d['seconds']:.0f} s "
                        f"({d['records_per_s']:.2f} records/s); failed sample/build/too slow "
                        f"{d['failed_sample']}/{d['failed_build']}/{d['too_slow']}"
                        + (f"; {d['lost']} programs lost on the cluster (rerun to time them)" if d["lost"] else ""))


@dataset_app.command("remeasure")
def remeasure(store: Optional[Path] = _STORE_OPT,
              threads: str = typer.Option("1,2", "--threads", help="Thread counts to re-time."),
              budget_minutes: Optional[float] = typer.Option(None, "--budget-minutes", help="Stop after this long (resume later)."),
              measured_before: Optional[str] = typer.Option(
                  None, "--measured-before",
                  help="Only programs measured before this ISO time (UTC), e.g. 2026-11-22T02:00 (a noisy period)."),
              json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Re-time stored programs with the current timer (replaces their measurements); resumable."""
    from tensorplan.cli.common import positive, thread_counts
    from tensorplan.errors import StoreError, TensorplanError
    from tensorplan.cdmpp.dataset import remeasure as _remeasure
    if store is not None and not store.exists():
        raise StoreError(f"store '{store}' does not exist; pass an existing --store file")
    ths = thread_counts(threads)
    positive(budget_minutes, "--budget-minutes")
    before = None
    if measured_before:
        from datetime import datetime, timezone
        try:
            dt = datetime.fromisoformat(measured_before)
        except ValueError:
            raise TensorplanError(f"--measured-before: expected an ISO time such as 2026-11-22T02:00, "
                                  f"got {measured_before!r}") from None
        before = (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()
    d = _remeasure(store, threads=ths, budget_minutes=budget_minutes, measured_before=before).to_dict()
    print(json.dumps(d, indent=1) if json_out else
          f"re-timed {d['programs']} programs ({d['records_per_s']:.2f} records/s), {d['too_slow']} skipped")


@dataset_app.command("measure-device")
def measure_device(prefix: str = typer.Option(..., "--prefix", help="Name of this machine's domains: records "
                                              "become <prefix>-<N>t, e.g. zen4 -> zen4-1t, zen4-2t."),
                   data: Optional[Path] = typer.Option(None, "--data", help="Dataset directory (default: the committed data/cdmpp/)."),
                   store: Optional[Path] = _STORE_OPT,
                   threads: str = typer.Option("1,2", "--threads", help="Thread counts; each is a device domain <prefix>-<N>t."),
                   programs_per_task: int = typer.Option(8, "--programs-per-task", min=1, help="Dataset programs re-timed per task."),
                   budget_minutes: Optional[float] = typer.Option(None, "--budget-minutes", help="Stop after this long (resume later)."),
                   merge: bool = typer.Option(True, "--merge/--no-merge", help="Add the records to the dataset when done."),
                   workers: int = typer.Option(1, "--workers", min=1, help="Processes compiling batches of programs "
                                               "ahead of timing (on a many-core machine compiling is the bottleneck)."),
                   json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
                   no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar (for logs).")) -> None:
    """Time the dataset's programs on this machine as a new device domain; resumable.

    Same schedules and features, new latencies: for cross-device evaluation and few-shot
    fine-tuning. Programs the dataset already holds on every requested domain are skipped, so a
    second machine of the same kind adds new programs."""
    from tensorplan.cli.common import positive, thread_counts
    ths = thread_counts(threads)
    positive(budget_minutes, "--budget-minutes")
    os.environ["TVM_NUM_THREADS"] = str(max(ths))   # before TVM's runtime pool exists
    from tensorplan.cdmpp.dataset import measure_device as _measure, merge_device as _merge
    d = _measure(prefix, data=data, store=store, threads=ths, programs_per_task=programs_per_task,
                 budget_minutes=budget_minutes, progress=not no_progress, workers=workers).to_dict()
    if merge:
        d["merge"] = _merge(prefix, data=data, store=store)
    if json_out:
        print(json.dumps(d, indent=1))
    else:
        Console().print(f"timed {d['programs']} programs, {d['records']} records in {d['seconds']:.0f} s "
                        f"({d['records_per_s']:.2f} records/s); failed/too slow {d['failed_build']}/{d['too_slow']}"
                        + (f"; merged into {d['merge']['dir']} ({d['merge']['records']} records)" if merge else ""))


def _merge_and_report(merge, key: str, data: Optional[Path], store: Optional[Path], json_out: bool, wrote: str) -> None:
    """Run a `dataset.merge_*` on an existing store and print what it added."""
    from tensorplan.errors import StoreError
    if store is not None and not store.exists():
        raise StoreError(f"store '{store}' does not exist; pass the --store {wrote} wrote to")
    r = merge(key, data=data, store=store)
    print(json.dumps(r, indent=1) if json_out else f"{r['records_added']} records of {', '.join(r['devices'])} "
          f"-> {r['dir']} ({r['records']} records)")


@dataset_app.command("merge-device")
def merge_device(prefix: str = typer.Option(..., "--prefix", help="Domains <prefix>-<N>t measured by measure-device."),
                 data: Optional[Path] = typer.Option(None, "--data", help="Dataset directory (default: the committed data/cdmpp/)."),
                 store: Optional[Path] = _STORE_OPT,
                 json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Add the records of a (possibly interrupted) measure-device run to the dataset."""
    from tensorplan.cdmpp.dataset import merge_device as _merge
    _merge_and_report(_merge, prefix, data, store, json_out, "measure-device")


@dataset_app.command("merge-gpu")
def merge_gpu(name: str = typer.Option(..., "--name", help="GPU domain timed by measure-gpu, e.g. h200."),
              data: Path = typer.Option(..., "--data", help="GPU dataset whose programs were timed (e.g. data/cdmpp-h100)."),
              store: Optional[Path] = _STORE_OPT,
              json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Add a second GPU's timings of a GPU dataset's own programs to that dataset (a new domain)."""
    from tensorplan.cdmpp.dataset import merge_gpu as _merge
    _merge_and_report(_merge, name, data, store, json_out, "measure-gpu")


@dataset_app.command("sample")
def sample(target: str = typer.Option("nvidia/nvidia-h100", "--target", help="TVM target string or tag to sample "
                                      "schedules for (no GPU needed), e.g. nvidia/nvidia-h100, nvidia/nvidia-a100."),
           out: Path = typer.Option(..., "-o", "--out", help="Programs file to write (parquet)."),
           data: Optional[Path] = typer.Option(None, "--data", help="Dataset whose tasks to sample (default: data/cdmpp/)."),
           programs_per_task: int = typer.Option(8, "--programs-per-task", min=1, help="Valid schedules wanted per task."),
           skip_timed: Optional[Path] = typer.Option(None, "--skip-timed", help="GPU dataset whose programs are left "
                                                     "out (already timed), e.g. data/cdmpp-h100."),
           workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Sampling processes (default: every CPU)."),
           json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Sample schedules of every task from TARGET's design space, for `measure-gpu`.

    The design space's postprocessors are applied; `measure-gpu` then times the programs on the
    GPU machine as a new device domain. With --skip-timed DIR (and more programs per task than DIR
    holds) the file holds only the draws DIR has not timed: a later GPU session's work."""
    from tensorplan.cli.common import output_file
    from tensorplan.cdmpp.gpu_dataset import sample_programs, untimed, write_programs
    output_file(out, "-o/--out")
    if skip_timed is not None:
        untimed([], skip_timed)        # a wrong directory fails now, not after minutes of sampling
    progs = sample_programs(target, data=data, programs_per_task=programs_per_task, workers=workers)
    drawn = len(progs)
    if skip_timed is not None:
        progs = untimed(progs, skip_timed)
    write_programs(progs, out)
    r = {"programs": len(progs), "tasks": len({p["task_key"] for p in progs}), "target": target, "file": str(out),
         "already_timed_left_out": drawn - len(progs)}
    print(json.dumps(r, indent=1) if json_out else f"{r['programs']} programs of {r['tasks']} tasks -> {out}")


@dataset_app.command("measure-gpu")
def measure_gpu(programs: Path = typer.Option(..., "--programs", help="Programs file from `tensorplan predictor dataset sample`."),
                name: str = typer.Option(..., "--name", help="Device domain name of this GPU, e.g. h100."),
                store: Optional[Path] = _STORE_OPT,
                data: Optional[Path] = typer.Option(None, "--data", help="Dataset holding the tasks (default: data/cdmpp/)."),
                workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Compile processes (default: CPUs - 1)."),
                budget_minutes: Optional[float] = typer.Option(None, "--budget-minutes", help="Stop after this long (resume later)."),
                limit: Optional[int] = typer.Option(None, "--limit", min=1, help="Measure at most this many programs."),
                json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
                no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar (for logs).")) -> None:
    """Compile and time sampled CUDA programs on this machine's GPU as device NAME; resumable.

    `tensorplan predictor dataset export --store S --out DIR` then writes them as a dataset."""
    from tensorplan.cli.common import positive
    from tensorplan.cdmpp.gpu_dataset import measure_gpu as _measure, read_programs
    positive(budget_minutes, "--budget-minutes")
    d = _measure(name, read_programs(programs), data=data, store=store, workers=workers,
                 budget_minutes=budget_minutes, limit=limit, progress=not no_progress).to_dict()
    if json_out:
        print(json.dumps(d, indent=1))
    else:
        Console().print(f"timed {d['programs']} programs in {d['seconds']:.0f} s ({d['records_per_s']:.2f} records/s); "
                        f"failed/too slow {d['failed_build']}/{d['too_slow']}")


@dataset_app.command("export")
def export(store: Optional[Path] = _STORE_OPT,
           out: Optional[Path] = typer.Option(None, "--out", help="Output directory (default: the repo's data/cdmpp/)."),
           workers: Optional[int] = typer.Option(None, "--workers", min=1,
                                                 help="Processes replaying and featurising programs (default: every CPU)."),
           json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON.")) -> None:
    """Featurise every stored program and write the compact dataset (parquet + float16 npz)."""
    from tensorplan.errors import StoreError
    from tensorplan.cli.common import output_dir
    from tensorplan.cdmpp.dataset import export as _export
    output_dir(out, "--out")
    if store is not None and not store.exists():
        raise StoreError(f"store '{store}' does not exist; pass an existing --store file")
    r = _export(store, out, workers=workers)
    if json_out:
        print(json.dumps(r, indent=1))
    else:
        Console().print(f"{r['records']} records, {r['programs']} programs, {r['tasks']} tasks -> {r['dir']} "
                        f"({r['bytes'] / 1e6:.1f} MB)")


@dataset_app.command("stats")
def stats(data: Optional[Path] = typer.Option(None, "--data", help="Dataset directory (default: the committed data/cdmpp/)."),
          max_cov: float = typer.Option(0.01, "--max-cov", min=0.0, help="Spread threshold for stable records (network latencies)."),
          metric: str = typer.Option("cov", "--metric", help="Spread measure: cov (std/mean, CDMPP) or mad (MAD/median)."),
          json_out: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Counts (records, programs, tasks, networks, devices), stability, and measured network latencies.

    Each network's latency is summed twice: from each kernel's fastest program (tuned) and from its
    first design-space sample (untuned, what `tensorplan predict` schedules)."""
    import numpy as np

    from tensorplan.cdmpp.dataset import load_dataset
    ds = load_dataset(data)
    s = ds.stats()
    nl = ds.network_latencies(max_cov=max_cov, metric=metric)
    first = ds.network_latencies(max_cov=max_cov, metric=metric, program="first")
    s["network_latency_s"] = {f"{n}@{d}": v for (n, d), v in sorted(nl.items())}
    s["network_latency_first_sample_s"] = {f"{n}@{d}": v for (n, d), v in sorted(first.items())}
    if nl:   # how much slower the untuned network (each kernel's first sample) is than the tuned one
        s["first_sample_slowdown_median"] = float(np.median([first[k] / nl[k] for k in nl]))
    if json_out:
        print(json.dumps(s, indent=1))
        return
    con = Console()
    con.print(f"[bold]{s['path']}[/]: {s['records']} records, {s['programs']} programs, "
              f"{s['tasks_measured']}/{s['tasks_total']} tasks, {s['n_networks']} networks")
    t = Table(show_header=True)
    t.add_column("what")
    t.add_column("value", justify="right")
    for d, n in s["devices"].items():
        t.add_row(f"records on {d}", str(n))
    t.add_row("stable (CoV <= 1%)", f"{s['stable_records_cov_1pct']} ({100 * s['stable_fraction']:.1f}%)")
    t.add_row("stable (CoV <= 5%)", str(s["stable_records_cov_5pct"]))
    t.add_row("median CoV", f"{100 * s['median_cov']:.2f}%")
    t.add_row("stable (MAD/median <= 1%)", str(s["stable_records_mad_1pct"]))
    t.add_row("leaves per program (min/median/max)", f"{s['leaves'].get('min')}/{s['leaves'].get('median')}/{s['leaves'].get('max')}")
    for k, v in s["network_latency_s"].items():
        f = s["network_latency_first_sample_s"][k]
        t.add_row(f"network {k}", f"{v * 1e3:.3f} ms; first samples {f * 1e3:.3f} ms ({f / v:.2f}×)")
    if "first_sample_slowdown_median" in s:
        t.add_row("first samples / fastest, median network", f"{s['first_sample_slowdown_median']:.2f}×")
    con.print(t)
