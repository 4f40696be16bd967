"""Where measurement jobs run: in this process, or as Ray tasks pinned to device resources.

Why one interface: "compile and time this kernel on that device" is a pure job (picklable inputs
-> a small result), so the code that measures does not care where it runs. `job_runner(None)`
runs each job here, in order, exactly as before (Ray is not imported); `job_runner(address)`
sends the same jobs to a Ray cluster. Results always come back to the caller, which writes them
to its own store: workers keep nothing that a killed worker could lose.

Why device resources: every worker machine registers each of its devices as a Ray custom resource
named by the device's identity (`device_resource`: readable name + DeviceSpec key), with capacity
1, and each CPU also as a resource for the physical processor (`cpu_resource`), so a job holds
both: one timing at a time per device, and thread domains of one CPU (`local-1t`, `local-2t`)
never time at once on one machine. A job compiles where it times: on the same machine a
compilation running beside a timing would steal the cores being timed.

Faults: Ray re-runs a job whose worker died (SIGKILL, node lost) up to `max_retries` times,
elsewhere or later; a job that raised on the worker, ran past `job_timeout_s` (its worker is
killed) or kept losing its worker comes back as a `JobResult` with `error` set, attributed to the
job's label, and the other jobs go on.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

import hashlib
import json
import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from tensorplan.devices.spec import DeviceSpec
from tensorplan.errors import ClusterError

RESOURCE_PREFIX = "tensorplan"
# identity fields of the physical processor: a DeviceSpec's without its name and the cores/threads
# a thread domain (local-1t) uses
_PHYSICAL_FIELDS = ("kind", "vendor", "model", "l1_kb", "l2_kb", "l3_kb", "isa")


def device_resource(spec: DeviceSpec) -> str:
    """The Ray resource naming a device: `tensorplan:<name>:<first 12 hex of its DeviceSpec key>`."""
    return f"{RESOURCE_PREFIX}:{spec.name}:{spec.key()[:12]}"


def cpu_resource(spec: DeviceSpec) -> str | None:
    """The Ray resource of the physical CPU behind a CPU device (same for `local`, `local-1t`, ...
    of one processor model), or None for a GPU."""
    if spec.kind != "cpu":
        return None
    ident = {k: getattr(spec, k) for k in _PHYSICAL_FIELDS}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()
    return f"{RESOURCE_PREFIX}-cpu:{digest[:12]}"


def job_resources(spec: DeviceSpec) -> dict[str, float]:
    """What a job timing on `spec` holds while it runs (the device and its physical CPU)."""
    res = {device_resource(spec): 1.0}
    cpu = cpu_resource(spec)
    if cpu is not None:
        res[cpu] = 1.0
    return res


def node_resources(specs: Sequence[DeviceSpec]) -> dict[str, float]:
    """What a worker machine offering `specs` registers (`ray start --resources '<this as JSON>'`)."""
    res: dict[str, float] = {}
    for s in specs:
        res.update(job_resources(s))
    return res


@dataclass(frozen=True)
class ClusterJob:
    """One job: `fn(*args)` where `fn` is a module-level function of tensorplan (shipped to a worker
    by reference, so the worker imports it) and `args` are picklable. `label` names what it
    measures (a kernel, a program) in errors; `device` is the device that must time it, or a tuple
    of devices one worker must offer together (None: any worker CPU, e.g. a job that only compiles)."""

    fn: Callable[..., Any]
    args: tuple
    label: str
    device: DeviceSpec | tuple[DeviceSpec, ...] | None = None

    @property
    def devices(self) -> tuple[DeviceSpec, ...]:
        return () if self.device is None else self.device if isinstance(self.device, tuple) else (self.device,)


@dataclass
class JobResult:
    """What came back for job `index`: its `value`, or `error` (why there is none). `worker` says
    where it ran ("host/<Ray node id>/pid" on a cluster, "in-process" here); `seconds` is its run
    time on the worker."""

    index: int
    label: str
    value: Any = None
    error: str | None = None
    worker: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def _execute(fn: Callable[..., Any], args: tuple) -> tuple[bool, Any, str, float]:
    """Run one job and report (ok, value or error text, worker, seconds); the job's own exception
    becomes its error text, so it is attributed to the job instead of failing the run."""
    t0 = time.perf_counter()
    try:
        value = fn(*args)
        ok = True
    except Exception as e:  # noqa: BLE001 - one failing job must not stop the others
        value = f"{type(e).__name__}: {str(e)[:500]}"
        ok = False
    return ok, value, f"{socket.gethostname()}/{os.getpid()}", time.perf_counter() - t0


class JobRunner(ABC):
    """Runs `ClusterJob`s and yields a `JobResult` for each (see the module docstring); the two
    implementations are `InProcessRunner` and `RayRunner`."""

    kind = "in-process"

    @abstractmethod
    def run(self, jobs: Sequence[ClusterJob]) -> Iterator[JobResult]:
        """Results in completion order (each carries its job's index)."""

    def map(self, jobs: Sequence[ClusterJob]) -> list[JobResult]:
        """Results in job order."""
        out: list[JobResult | None] = [None] * len(jobs)
        for r in self.run(jobs):
            out[r.index] = r
        return [r for r in out if r is not None]

    def check_devices(self, specs: Sequence[DeviceSpec]) -> None:
        """Raise if no worker can time on one of `specs`."""

    def offers_together(self, specs: Sequence[DeviceSpec]) -> bool:
        """Whether one worker offers all of `specs` (so one job can time on each of them); true here."""
        return True

    def describe(self) -> dict[str, Any]:
        return {"runner": self.kind}

    def close(self) -> None:
        """Release what the runner holds (a Ray connection it opened)."""


class InProcessRunner(JobRunner):
    """Each job runs here, in order, when it is reached: what tensorplan did before clusters."""

    def run(self, jobs: Sequence[ClusterJob]) -> Iterator[JobResult]:
        for i, job in enumerate(jobs):
            ok, value, _, secs = _execute(job.fn, job.args)
            yield JobResult(i, job.label, value if ok else None, None if ok else value, "in-process", secs)


def _remote_execute(fn: Callable[..., Any], args: tuple) -> tuple[bool, Any, str, float]:
    """The Ray task body (a plain function, so Ray ships it by reference); the worker is named
    "host/<Ray node id, 12 hex>/pid"."""
    import ray
    ok, value, worker, secs = _execute(fn, args)
    host, pid = worker.split("/")
    return ok, value, f"{host}/{ray.get_runtime_context().get_node_id()[:12]}/{pid}", secs


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """Raise unless the head's `host:port` accepts a connection (Ray itself would retry for minutes);
    'auto' and ray:// addresses are left to Ray."""
    if address == "auto" or "://" in address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--ray-address {address!r}: give the head's HOST:PORT (what `ray start --head` "
                              "prints, e.g. 10.0.0.5:6379) or 'auto' on a machine of the cluster")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise ClusterError(f"--ray-address {address}: no Ray head answers there ({e.strerror or e}); start one "
                              "with `ray start --head` and pass the address it prints, or leave --ray-address "
                              "out to measure here") from None


@dataclass
class _Lane:
    """Jobs waiting for, and running on, one set of resources; `capacity` run at once."""

    capacity: int
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)       # [ref, job index, started, cancelled]


class RayRunner(JobRunner):
    """Jobs as Ray tasks. Each needs its device's resources (`job_resources`) and no CPU slot (the
    device resource alone gates it); a job without a device takes one worker CPU. At most
    capacity + 1 jobs per device are handed to Ray at a time, so a job's timeout counts from when
    it can start, not from when it was queued."""

    kind = "ray"

    def __init__(self, address: str, *, max_retries: int = 3, job_timeout_s: float | None = 600.0):
        import ray  # only here: without --ray-address nothing imports Ray

        self.address = address
        self.max_retries = int(max_retries)
        self.job_timeout_s = job_timeout_s
        self._owns = False
        if not ray.is_initialized():
            _reachable(address)
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR,
                         configure_logging=True, include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise ClusterError(
                    f"--ray-address {address}: cannot join the Ray cluster ({str(e).splitlines()[0][:300]}). "
                    "Start one with `ray start --head` on the head machine and pass the address it prints "
                    "(or 'auto' on a machine of the cluster), or leave --ray-address out to measure here"
                ) from None
            self._owns = True
        self._ray = ray
        self._task = ray.remote(_remote_execute)

    def _cluster(self) -> dict[str, float]:
        return dict(self._ray.cluster_resources())

    def check_devices(self, specs: Sequence[DeviceSpec]) -> None:
        have = self._cluster()
        for s in specs:
            missing = [r for r in job_resources(s) if have.get(r, 0) < 1]
            if missing:
                offered = sorted(r for r in have if r.startswith(RESOURCE_PREFIX))
                raise ClusterError(
                    f"--ray-address {self.address}: no worker of the cluster offers device '{s.name}' (Ray "
                    f"resource(s) {', '.join(missing)}). Start a worker on a machine with that device: "
                    f"`ray start --address <head> --resources '{json.dumps(job_resources(s))}'` (`tensorplan "
                    f"devices --ray-resources` there prints those of its own devices). The cluster offers: "
                    f"{', '.join(offered) or 'no tensorplan devices'}")

    def offers_together(self, specs: Sequence[DeviceSpec]) -> bool:
        need = node_resources(specs)
        return any(n["Alive"] and all(n["Resources"].get(r, 0) >= 1 for r in need) for n in self._ray.nodes())

    def describe(self) -> dict[str, Any]:
        res = self._cluster()
        return {"runner": self.kind, "address": self.address, "nodes": sum(1 for n in self._ray.nodes() if n["Alive"]),
                "devices": sorted(r for r in res if r.startswith(RESOURCE_PREFIX + ":"))}

    def run(self, jobs: Sequence[ClusterJob]) -> Iterator[JobResult]:
        ray = self._ray
        if not jobs:
            return
        self.check_devices(list({d.key(): d for j in jobs for d in j.devices}.values()))
        have = self._cluster()
        lanes: dict[tuple, _Lane] = {}
        for i, job in enumerate(jobs):
            res = node_resources(job.devices)
            key = tuple(sorted(res))
            if key not in lanes:
                cap = min(have.get(r, 0) for r in res) if res else have.get("CPU", 1)
                lanes[key] = _Lane(max(1, int(cap)))
            lanes[key].waiting.append((i, res))
        by_ref: dict[Any, tuple[_Lane, int]] = {}

        def submit(lane: _Lane) -> None:
            while lane.waiting and len(lane.running) < lane.capacity + 1:
                i, res = lane.waiting.popleft()
                job = jobs[i]
                opts: dict[str, Any] = {"max_retries": self.max_retries, "retry_exceptions": False}
                if res:
                    opts.update(num_cpus=0, resources=res)
                ref = self._task.options(**opts).remote(job.fn, job.args)
                lane.running.append([ref, i, None, False])     # ref, job index, started, cancelled
                by_ref[ref] = (lane, i)
            now = time.monotonic()
            for slot in lane.running[:lane.capacity]:     # the ones that can run now: their clock starts
                if slot[2] is None:
                    slot[2] = now

        for lane in lanes.values():
            submit(lane)
        try:
            yield from self._collect(lanes, by_ref, jobs, submit)
        finally:
            for ref in list(by_ref):            # the caller stopped early (budget, error): drop the rest
                ray.cancel(ref)

    def _collect(self, lanes: dict, by_ref: dict, jobs: Sequence[ClusterJob],
                 submit: Callable[[_Lane], None]) -> Iterator[JobResult]:
        ray = self._ray
        while by_ref:
            ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=1.0)
            now = time.monotonic()
            if self.job_timeout_s:
                for lane in lanes.values():
                    for slot in lane.running[:lane.capacity]:
                        if slot[2] is not None and not slot[3] and now - slot[2] > self.job_timeout_s:
                            ray.cancel(slot[0], force=True)     # kills the worker; the job is not retried
                            slot[3] = True
            for ref in ready:
                lane, i = by_ref.pop(ref)
                slot = next(s for s in lane.running if s[0] == ref)
                started = slot[2]
                lane.running.remove(slot)
                yield self._result(ref, i, jobs[i], started, now)
                submit(lane)

    def _result(self, ref: Any, i: int, job: ClusterJob, started: float | None, now: float) -> JobResult:
        from ray import exceptions as rx
        try:
            ok, value, worker, secs = self._ray.get(ref)
        except rx.TaskCancelledError:
            ran = now - started if started is not None else float("nan")
            return JobResult(i, job.label, None, f"timed out: still running after {ran:.0f} s (limit "
                             f"{self.job_timeout_s:g} s); its worker was stopped", "")
        except (rx.WorkerCrashedError, rx.NodeDiedError, rx.OutOfMemoryError, rx.ObjectLostError) as e:
            return JobResult(i, job.label, None, f"its worker died {self.max_retries + 1} times "
                             f"({type(e).__name__}); not retried further", "")
        except rx.RayError as e:
            return JobResult(i, job.label, None, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}", "")
        return JobResult(i, job.label, value if ok else None, None if ok else value, worker, secs)

    def close(self) -> None:
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns = False


def job_runner(ray_address: str | None, **ray_options: Any) -> JobRunner:
    """`InProcessRunner` when `ray_address` is None or empty (Ray is not imported), else a
    `RayRunner` joined to the cluster at `ray_address` ('auto': the cluster this machine is part of)."""
    if not ray_address:
        return InProcessRunner()
    return RayRunner(str(ray_address), **ray_options)


__all__ = ["ClusterJob", "JobResult", "JobRunner", "InProcessRunner", "RayRunner", "job_runner",
           "device_resource", "cpu_resource", "job_resources", "node_resources", "RESOURCE_PREFIX"]
