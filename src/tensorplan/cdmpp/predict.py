"""Whole-network latency prediction: `predict(model, device) -> NetworkPrediction`.

A network becomes its fused kernels (`tasks.network_tasks`); each kernel gets its first N valid
meta-schedule design-space samples (drawn exactly as the dataset draws its programs:
`task_schedules`), their compact ASTs and predicted latencies, and the predicted-fastest is the
kernel's pick: the model acts as a tuner's cost model, with nothing timed. The network's latency
is the call-count-weighted sum of the picks: the latency of tuned kernels, what a user deploys,
not of TVM's untuned ones. The first valid sample (the default schedule, what
TVM runs for a kernel nobody tuned) is always among the N, so the tuned total never exceeds the
untuned one, which is reported beside it; `tuned=0` predicts the default schedules alone.

Why N = `DEFAULT_TUNED` (32): the predicted total still drops with N, but by less each doubling
while its cost doubles (2-core AMD EPYC VM, shipped model, 2026-12-02): from 8 to 16 to 32 to 64
samples, mobilenet-v2 28.5 -> 24.1 -> 22.2 -> 20.7 ms, resnet-50 444 -> 373 -> 325 -> 299 ms,
bert-base 764 -> 727 -> 676 -> 644 ms (untuned: 70, 827, 1112 ms); sampling + featurising costs
17-28 ms a program on one core, so 32 -> 64 would add 10-20 s per model on 2 cores for 5-8 %.

Why `measure`: a prediction alone is a claim. With `measure=True` every kernel is also compiled
with that same schedule and timed on this machine with the dataset's timer (`dataset.time_module`,
TVM's runtime pool at the device's thread count), so the user sees per kernel and for the whole
network how far the prediction is from this CPU's reality. That is only possible for this
machine's own CPU (`local`, `local-Nt`). On a CPU other than the one the training data came
from, this is a zero-shot test of a new device: the device vector describes this machine, while
every label the model learnt from came from the collection CPU.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from tensorplan.devices.spec import DeviceSpec
from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.progress import progress_bar
from tensorplan.cdmpp.arrays import ProgramArrays
from tensorplan.cdmpp.base import load_estimator
from tensorplan.cdmpp.metrics import regression_metrics
from tensorplan.cdmpp.model import SHIPPED_MODEL, load_shipped

# the dataset's timer settings (`dataset.collect`), with a longer cap: a network's big kernels
# (a VGG convolution with an untuned schedule) run for seconds and must still be timed
MEASURE_TIMER = {"min_repeat_s": 2e-5, "repeats": 15, "max_kernel_s": 5.0}

# the dataset drew its CPU programs for an llvm target of this many cores (its domains are
# local-1t and local-2t); drawing for the same target keeps draw i the dataset's program i
DATASET_SAMPLER_CORES = 2

SHIPPED_GPU_MODEL = SHIPPED_MODEL.with_name("cdmpp-h100.pt")
GPU_SAMPLE_TRIES = 8 * 24   # gpu_dataset.sample_programs: programs_per_task x tries_per_program

# schedules compared per kernel by default (`predict(tuned=)`, `tensorplan predict --tuned`); why 32: the
# module docstring
DEFAULT_TUNED = 32

# what a kernel's schedule is (`SchedulePrediction.kind`)
DEFAULT = "default"          # first valid design-space sample: what TVM runs for an untuned kernel
TUNED = "tuned"              # the predicted-fastest of the kernel's first N samples
UNSCHEDULED = "unscheduled"  # no valid sample: the plain loop nest


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def host_id() -> str:
    """This CPU as a file-name slug: 'amd-epyc-family-25-model-1'."""
    from tensorplan.devices.detect import cpu_info

    return re.sub(r"[^a-z0-9]+", "-", cpu_info()["model"].lower()).strip("-")


def local_model_path(threads: int) -> Path:
    """Where `tensorplan calibrate` saves this CPU's calibration at `threads` threads, and where
    `predict` looks for it."""
    from tensorplan.paths import cache_dir

    return cache_dir() / "models" / f"cdmpp-local-{host_id()}-{threads}t.pt"


# ------------------------------------------------------------------------------------------------
# Result objects
# ------------------------------------------------------------------------------------------------

@dataclass
class SchedulePrediction:
    """One scheduled program of a kernel: which one (`kind`, design-space draw `sample`), its
    predicted latency per call, and, under `measure`, its time on this machine."""

    kind: str                      # DEFAULT | TUNED | UNSCHEDULED
    sample: int | None             # the draw index (the dataset's program `index`); None: loop nest
    predicted_s: float
    candidates: int = 1            # schedules it was picked among (TUNED: up to N)
    measured_s: float | None = None
    measured_cov: float | None = None
    measure_error: str | None = None


@dataclass
class KernelPrediction:
    """A fused kernel of the network: its default schedule's prediction and, under `tuned`, the
    model's pick among its first N schedules (`pick`: the one the network's total counts).
    `predicted_s`/`total_s` stay the default schedule's, as in the JSON's unprefixed fields."""

    name: str                      # TVM's fused-function name
    key: str                       # structural hash of the kernel (the dataset's task key)
    calls: int                     # how often the network runs it
    flops: float
    leaves: int                    # compact-AST leaves of the default program
    default: SchedulePrediction
    tuned: SchedulePrediction | None = None
    log_spread: float | None = None   # an ensemble's std of its members' log predictions of `pick`
    floor_s: float | None = None      # the device's roofline floor per call (`roofline_floor`)

    @property
    def pick(self) -> SchedulePrediction:
        """The schedule the network's total counts: the tuned pick, else the default."""
        return self.tuned if self.tuned is not None else self.default

    @property
    def pick_total_s(self) -> float:
        """Predicted seconds over all calls of `pick`."""
        return self.pick.predicted_s * self.calls

    @property
    def below_floor(self) -> bool:
        """The counted schedule (`pick`) is predicted faster than the device's peak and bandwidth allow."""
        return self.floor_s is not None and self.pick.predicted_s < self.floor_s

    @property
    def predicted_s(self) -> float:
        """Predicted seconds per call of the default schedule."""
        return self.default.predicted_s

    @property
    def total_s(self) -> float:
        """Predicted seconds over all calls of the default schedule."""
        return self.default.predicted_s * self.calls

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"task": self.name, "key": self.key, "calls": self.calls, "flops": self.flops,
                             "leaves": self.leaves, "schedule": self.default.kind, "sample": self.default.sample,
                             "predicted_us": 1e6 * self.predicted_s, "total_us": 1e6 * self.total_s}
        if self.log_spread is not None:
            d["log_spread"] = self.log_spread
        if self.floor_s is not None:
            d.update(floor_us=1e6 * self.floor_s, below_floor=self.below_floor)
        _measured_fields(d, self.default, "")
        if self.tuned is not None:
            d.update(candidates=self.tuned.candidates, tuned_sample=self.tuned.sample,
                     tuned_us=1e6 * self.tuned.predicted_s, tuned_total_us=1e6 * self.tuned.predicted_s * self.calls)
            _measured_fields(d, self.tuned, "tuned_")
        return d


def _measured_fields(d: dict, s: SchedulePrediction, prefix: str) -> None:
    if s.measured_s is not None:
        d[f"{prefix}measured_us"] = 1e6 * s.measured_s
        if s.measured_cov is not None:
            d[f"{prefix}measured_cov"] = s.measured_cov
    if s.measure_error is not None:
        d[f"{prefix}measure_error"] = s.measure_error


@dataclass
class TunedCheck:
    """The model's picks timed, over the kernels timed both ways: how well the tuned total was
    predicted (per-kernel error on the picks, the whole-network ratio) and what the picks are
    worth here against the default schedules."""

    kernels: int
    changed: int                   # kernels whose pick is not the default schedule
    predicted_s: float
    measured_s: float
    default_measured_s: float
    kernels_slower: int            # picks measured >5 % slower than the default schedule
    per_kernel: dict[str, float] | None = None      # `regression_metrics` of the picks, each kernel once
    spearman_across_kernels: float | None = None

    @property
    def total_ratio(self) -> float:
        return self.predicted_s / self.measured_s

    @property
    def measured_speedup(self) -> float:
        return self.default_measured_s / self.measured_s

    def to_dict(self) -> dict[str, Any]:
        return {"kernels": self.kernels, "changed": self.changed, "predicted_ms": 1e3 * self.predicted_s,
                "measured_ms": 1e3 * self.measured_s, "default_measured_ms": 1e3 * self.default_measured_s,
                "total_ratio": self.total_ratio, "total_ape_pct": 100 * abs(self.total_ratio - 1),
                "measured_speedup": self.measured_speedup, "kernels_slower": self.kernels_slower,
                "per_kernel": self.per_kernel, "spearman_across_kernels": self.spearman_across_kernels}


@dataclass
class MeasuredCheck:
    """Prediction against measurement over the kernels that were timed: the default schedules'
    per-kernel error metrics, rank correlation across kernels and call-weighted totals (the
    unprefixed fields, as earlier runs wrote them), and under `tuned` the same for the picks
    (`tuned`); `counted` is the check of the schedules the network's total counts."""

    kernels_measured: int
    kernels_failed: list[str]
    per_kernel: dict[str, float] | None = None      # `model.regression_metrics` of the timed kernels
    spearman_across_kernels: float | None = None
    predicted_s: float | None = None
    measured_s: float | None = None
    tuned: TunedCheck | None = None
    threads: int | None = None                      # the thread count the kernels were timed at
    measure_s: float | None = None                  # wall time spent compiling and timing

    @property
    def total_ratio(self) -> float | None:
        return self.predicted_s / self.measured_s if self.measured_s else None

    @property
    def counted(self) -> "TunedCheck | MeasuredCheck":
        """The check of the schedules the headline total counts: the picks when tuned, else the defaults."""
        return self.tuned if self.tuned is not None else self

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kernels_measured": self.kernels_measured, "kernels_failed": self.kernels_failed,
                             "schedules": "default"}
        if self.threads is not None:
            d["threads"] = self.threads
        if self.kernels_measured:
            d.update(per_kernel=self.per_kernel, spearman_across_kernels=self.spearman_across_kernels,
                     predicted_ms=1e3 * self.predicted_s, measured_ms=1e3 * self.measured_s,
                     total_ratio=self.total_ratio, total_ape_pct=100 * abs(self.total_ratio - 1))
        if self.tuned is not None:
            d["tuned"] = self.tuned.to_dict()
        return d


@dataclass
class NetworkPrediction:
    """A network's predicted latency on a device: per kernel and in total, with what was predicted
    (which schedules), by which model, and how far the device lies from what the model learnt.
    `total_s` is the headline: the tuned picks when `tuned` > 0 (the default), else the default
    schedules; `untuned_total_s` is always the default schedules' total; `what` says which."""

    model: str
    device: DeviceSpec
    domain: str                    # the device as the predictor names it ('local-2t', 'h100')
    predictor: str                 # the estimator's class
    weights: str                   # the predictor file
    trained_on: list[str]          # the domains the predictor learnt
    kernels: list[KernelPrediction]
    not_predicted: dict[str, int] = field(default_factory=dict)   # operator -> count outside every kernel
    tuned: int = 0                 # N of `tuned=N`; 0: default schedules only (the total is untuned)
    zero_shot: bool = False        # the model never learnt this device (or learnt another machine as it)
    outside_learnt: list[str] = field(default_factory=list)  # device figures outside every learnt device
    same_device_as: str | None = None   # a learnt domain with this device's vector, predicted as it
    warning: str | None = None     # the zero-shot note, with what to do about it
    member_total_s: list[float] | None = None   # an ensemble: the headline total as each member predicts it
    below_floor: list[str] = field(default_factory=list)   # kernels predicted below their roofline floor
    total_below_floor: bool = False             # the total predicted below the sum of the kernels' floors
    floor_warning: str | None = None            # says so, naming them and the device figures
    measured: MeasuredCheck | None = None
    schedules_dir: Path | None = None
    featurize_s: float = 0.0
    predict_s: float = 0.0

    @property
    def kind(self) -> str:
        return self.device.kind

    @property
    def total_s(self) -> float:
        """The headline: predicted network latency with every kernel's pick (`KernelPrediction.pick`):
        the predicted-fastest of its first `tuned` samples, or its default schedule when `tuned` is 0."""
        return sum(k.pick_total_s for k in self.kernels)

    @property
    def untuned_total_s(self) -> float:
        """Predicted network latency with every kernel's default (untuned) schedule."""
        return sum(k.total_s for k in self.kernels)

    @property
    def tuned_total_s(self) -> float | None:
        """Predicted network latency with the model's pick for every kernel (`tuned`), else None."""
        return self.total_s if self.tuned else None

    @property
    def total_is(self) -> str:
        """Which schedules the headline total counts: TUNED or DEFAULT."""
        return TUNED if self.tuned else DEFAULT

    @property
    def floor_s(self) -> float | None:
        """The network's roofline floor: calls x each kernel's floor, summed (None: not computed)."""
        if any(k.floor_s is None for k in self.kernels):
            return None
        return sum(k.floor_s * k.calls for k in self.kernels)

    @property
    def unscheduled(self) -> list[str]:
        """Kernels with no valid sample, predicted from their plain loop nest."""
        return [k.name for k in self.kernels if k.default.kind == UNSCHEDULED]

    @property
    def what(self) -> str:
        """What the totals are, in one sentence for a reader."""
        untuned = ("the predicted latency of each kernel's default schedule (its first valid meta-schedule sample, "
                   "what TVM runs for a kernel nobody tuned)")
        if not self.tuned:
            return f"total = sum over kernels of calls x {untuned}: untuned kernels (--untuned / tuned=0)"
        return (f"total = sum over kernels of calls x the predicted latency of each kernel's predicted-fastest of "
                f"its first {self.tuned} meta-schedule samples (ranked by the model, none timed): tuned kernels; "
                f"untuned total = the same with {untuned}")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`tensorplan predict --json`); latencies in ms (totals) and µs (kernels)."""
        d: dict[str, Any] = {
            "model": self.model, "device": self.device.name, "domain": self.domain, "kind": self.kind,
            "predicted": self.what, "predictor": self.predictor, "weights": self.weights,
            "trained_on": self.trained_on, "zero_shot": self.zero_shot, "outside_learnt": self.outside_learnt,
            "same_device_as": self.same_device_as, "warning": self.warning,
            "kernels": [k.to_dict() for k in self.kernels], "n_kernels": len(self.kernels),
            "total_ms": 1e3 * self.total_s, "total_is": self.total_is, "tuned": self.tuned,
            "untuned_total_ms": 1e3 * self.untuned_total_s,
            "not_predicted": self.not_predicted, "unscheduled": self.unscheduled,
            "featurize_s": self.featurize_s, "predict_s": self.predict_s, "device_spec": self.device.to_dict()}
        if self.tuned:
            d["tuned_total_ms"] = 1e3 * self.tuned_total_s
        if self.floor_s is not None:
            d.update(floor=FLOOR_WHAT, floor_ms=1e3 * self.floor_s, below_floor=self.below_floor,
                     total_below_floor=self.total_below_floor, floor_warning=self.floor_warning)
        if self.member_total_s is not None:
            d["member_total_ms"] = [1e3 * t for t in self.member_total_s]
        if self.measured is not None:
            d["measured"] = self.measured.to_dict()
            d["measure_s"] = self.measured.measure_s
        if self.schedules_dir is not None:
            d["schedules_dir"] = str(self.schedules_dir)
        return d


# ------------------------------------------------------------------------------------------------
# Pieces
# ------------------------------------------------------------------------------------------------

FLOOR_WHAT = ("roofline floor per kernel = max(FLOPs / the device's peak FP32 FLOP/s, the bytes of its output beyond "
              "what the device's caches hold / its memory bandwidth), from the DeviceSpec's figures; a prediction "
              "below it is faster than those figures allow")


def cache_bytes(spec: DeviceSpec) -> float:
    """All on-chip cache of a device in bytes (L1 and L2 per core on a CPU, the GPU's L2, the L3)."""
    per = spec.cores if spec.kind == "cpu" else 1
    return 1024.0 * ((float(spec.l1_kb or 0) + float(spec.l2_kb or 0)) * max(int(per or 1), 1) + float(spec.l3_kb or 0))


def roofline_floor(spec: DeviceSpec, flops, out_bytes) -> np.ndarray:
    """Seconds per call no kernel can beat on `spec` as its figures state it: max(FLOPs / peak FP32
    FLOP/s, (output bytes - all on-chip cache) / memory bandwidth). The memory term is what must
    reach memory on every call: a kernel writes its whole output, and what its caches cannot hold
    leaves the chip. Unique or input bytes are no floor: a kernel timed warm reads them from
    cache (on the CPU dataset 6 % of the timings beat bytes / DRAM bandwidth; none beats this
    term). A device without a figure (0) has no term for it."""
    flops = np.maximum(np.asarray(flops, np.float64), 0.0)
    spill = np.maximum(np.asarray(out_bytes, np.float64) - cache_bytes(spec), 0.0)
    peak, bw = float(spec.peak_fp32_gflops or 0.0) * 1e9, float(spec.mem_bw_gbs or 0.0) * 1e9
    tc = flops / peak if peak > 0 else np.zeros_like(flops)
    tm = spill / bw if bw > 0 else np.zeros_like(spill)
    return np.maximum(tc, tm)


def output_bytes(prog: Any) -> float:
    """Bytes of a kernel's output (its PrimFunc's last parameter), 0 when it cannot be read."""
    import math

    import tvm
    from tvm import tirx

    try:
        mod = prog.mod if hasattr(prog, "mod") and not isinstance(prog, tvm.IRModule) else prog
        if isinstance(mod, tvm.IRModule):
            funcs = [f for _, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
            mod = funcs[0] if len(funcs) == 1 else None
        buf = mod.params[-1]            # TVM 0.27: the parameters are the buffers themselves
        if getattr(buf, "shape", None) is None and hasattr(mod, "buffer_map"):
            buf = mod.buffer_map[buf]
        shape = [int(d) if isinstance(d, tirx.IntImm) else 1 for d in buf.shape]
        return float(math.prod(shape) * tvm.DataType(str(buf.dtype)).bits // 8)
    except Exception:  # noqa: BLE001 - no readable output buffer: no memory term
        return 0.0


def _floor_check(res: "NetworkPrediction") -> None:
    """Fill in the kernels whose counted schedule is predicted below their floor, whether the
    headline total is, and the warning."""
    res.below_floor = [k.name for k in res.kernels if k.below_floor]
    floor = res.floor_s
    res.total_below_floor = floor is not None and res.total_s < floor
    if not res.below_floor and not res.total_below_floor:
        res.floor_warning = None
        return
    spec = res.device
    names = ", ".join(f"{k.name} ({1e6 * k.pick.predicted_s:.3g} < {1e6 * k.floor_s:.3g} µs)"
                      for k in res.kernels if k.below_floor)
    res.floor_warning = (
        f"{len(res.below_floor)} of {len(res.kernels)} kernels predicted below the roofline floor of "
        f"'{res.domain}' ({spec.peak_fp32_gflops:g} GFLOP/s, {spec.mem_bw_gbs:g} GB/s): {names}"
        + (f"; the total too ({1e3 * res.total_s:.4g} ms < floor {1e3 * floor:.4g} ms)" if res.total_below_floor
           else "")
        + ". Such a prediction is faster than the device can run: the model extrapolates there (check it with "
          "--measure on this CPU, or calibrate), or the device's figures (peak, bandwidth, cache sizes) are wrong.")

def task_schedules(task, target=None, n: int = 1, tries: int = 8) -> list[tuple]:
    """The first `n` valid meta-schedule design-space samples of a task among draws 0..tries-1 ->
    [(module, sample index)]: the same sampler and seeds as the dataset, so the programs look like
    the training data, and draw i is the dataset's program `index` i of that task where it was
    measured. Empty when no draw is valid (or the task has no design space)."""
    import tvm

    from tensorplan.cdmpp.dataset import _TaskState, sample_schedule

    target = target or tvm.target.Target({"kind": "llvm", "num-cores": DATASET_SAMPLER_CORES})
    out = []
    try:
        st = _TaskState(task, target)
        for i in range(tries if st.spaces else 0):
            r = sample_schedule(st, i)
            if r is not None:
                out.append((r[0].mod, i))
                if len(out) == n:
                    break
    except Exception:  # noqa: BLE001 - a task meta-schedule cannot schedule: the caller falls back
        pass
    return out


def _domain_is_gpu(name: str, vector=None) -> bool:
    """Whether a learnt domain is a GPU: its learnt device vector says so ('is_gpu' comes first);
    without one, what `devices.resolve` says (a dataset-only name such as 'zen4-1t' is a CPU)."""
    if vector is not None and len(vector):
        return float(vector[0]) >= 0.5
    from tensorplan.devices import resolve
    try:
        return resolve(name).kind == "gpu"
    except Exception:  # noqa: BLE001 - a dataset-only domain name
        return False


def gpu_target(spec: DeviceSpec, domain: str | None = None):
    """The TVM target a GPU's programs are scheduled for: its `nvidia/...` tag (the tag the GPU
    dataset was sampled with for the H100), or the catalog's `tvm_tag` of a GPU of the same die
    (the H200 -> the H100's); a clear error for a GPU TVM has no tag for."""
    import tvm

    extra = spec.extra or {}
    if extra.get("tvm_tag"):                   # a GPU TVM has no tag of its own for (the H200)
        return tvm.target.Target(extra["tvm_tag"])
    names = [n for n in (domain, spec.name, str(extra.get("catalog", ""))) if n]
    for n in names:
        base = re.split(r"-(?:sxm|pcie|nvl)", n.lower())[0]              # 'a100-sxm4-40gb' -> 'a100'
        for b in dict.fromkeys((base, re.sub(r"([a-z])(\d)", r"\1-\2", base))):  # 'rtx4090' -> 'rtx-4090'
            for tag in (f"nvidia/nvidia-{b}", f"nvidia/geforce-{b}", f"nvidia/tesla-{b}"):
                try:
                    return tvm.target.Target(tag)
                except Exception:  # noqa: BLE001 - not a known tag; try the next spelling
                    continue
    raise TensorplanError(f"device '{names[0]}': TVM has no CUDA target tag for it (tried nvidia/nvidia-{names[0]}), "
                          "so its kernels cannot be scheduled as GPU programs; predict a GPU TVM knows "
                          "(e.g. h100, a100)")


def local_threads(device: str | DeviceSpec) -> int:
    """Thread count of this machine's CPU as a device ('local' -> every usable core, 'local-2t' -> 2);
    a clear error for any other device, since only this CPU can be timed here."""
    if isinstance(device, DeviceSpec):
        if device.kind == "cpu" and re.fullmatch(r"local(-\d+t)?", device.name):
            return device.threads
        name = device.name
    else:
        name = str(device).strip().lower()
        if name == "local":
            return usable_cores()
        m = re.fullmatch(r"local-(\d+)t", name)
        if m:
            n = int(m.group(1))
            if not 1 <= n <= usable_cores():
                raise TensorplanError(f"device '{name}': this process may use {usable_cores()} CPU(s), "
                                      f"cannot time kernels at {n} threads")
            return n
    raise TensorplanError(f"measuring times the kernels on this machine, so the device must be 'local' or "
                          f"'local-<N>t', not '{name}'; predict '{name}' without measuring")


def resolve_device(device: str | DeviceSpec) -> tuple[DeviceSpec, str]:
    """(spec, domain): the device resolved once, and the name the predictor knows it by. This
    CPU ('local', or a spec of it) is the domain 'local-<threads>t'; a name keeps the spelling it
    was given ('h100'), a spec its own name."""
    from tensorplan.devices import resolve

    spec = resolve(device)
    if isinstance(device, DeviceSpec):
        dom = spec.name
    else:
        dom = str(device).strip().lower()
    if spec.kind == "cpu" and spec.name == "local":
        dom = f"local-{spec.threads}t"
    return spec, dom


def measured_summary(kernels: Sequence[KernelPrediction], threads: int | None = None) -> MeasuredCheck:
    """Prediction vs measurement over the kernels that were timed: per-kernel metrics (each kernel
    once), rank correlation across kernels, and the call-weighted totals over the same kernels;
    with tuned picks timed too, what the picks are worth (`TunedCheck`)."""
    from scipy.stats import spearmanr

    ok = [k for k in kernels if k.default.measured_s]
    out = MeasuredCheck(kernels_measured=len(ok), kernels_failed=[k.name for k in kernels if not k.default.measured_s],
                        threads=threads)
    if not ok:
        return out
    pred = np.array([k.default.predicted_s for k in ok])
    meas = np.array([k.default.measured_s for k in ok])
    calls = np.array([k.calls for k in ok], np.float64)
    out.per_kernel = regression_metrics(pred, meas)
    out.spearman_across_kernels = float(spearmanr(pred, meas).statistic) if len(ok) > 2 else float("nan")
    out.predicted_s = float(calls @ pred)
    out.measured_s = float(calls @ meas)
    both = [k for k in ok if k.tuned is not None and k.tuned.measured_s]
    if both:
        c = np.array([k.calls for k in both], np.float64)
        tp_ = np.array([k.tuned.predicted_s for k in both])
        tm = np.array([k.tuned.measured_s for k in both])
        out.tuned = TunedCheck(
            kernels=len(both), changed=sum(k.tuned.sample != k.default.sample for k in both),
            predicted_s=float(c @ tp_), measured_s=float(c @ tm),
            default_measured_s=float(c @ np.array([k.default.measured_s for k in both])),
            kernels_slower=sum(k.tuned.measured_s > 1.05 * k.default.measured_s for k in both),
            per_kernel=regression_metrics(tp_, tm),
            spearman_across_kernels=float(spearmanr(tp_, tm).statistic) if len(both) > 2 else float("nan"))
    return out


def _save_schedules(out: Path, network: str, kernels: list[KernelPrediction], mods: list) -> None:
    """Write each kernel's scheduled program as TVMScript (DIR/<kernel>.py) and an index
    (DIR/schedules.json: kernel, task key, calls, sample index, predicted µs, file)."""
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for k, mod in zip(kernels, mods):
        f = out / f"{k.name}.py"
        f.write_text(mod.script())
        s = k.tuned or k.default
        index.append({"kernel": k.name, "key": k.key, "calls": k.calls, "file": f.name, "schedule": s.kind,
                      "sample": s.sample, "predicted_us": 1e6 * s.predicted_s})
    (out / "schedules.json").write_text(json.dumps({"network": network, "kernels": index}, indent=1))


def static_onnx(path: Path, name: str, input_shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    """`path` itself when its inputs have static shapes and none are given; otherwise the model
    imported with `input_shapes` (a symbolic dimension left open is one clear error naming it) and
    written back as a static ONNX file in the cache, which TVM's frontend then sees (a dynamic model
    would give kernels with symbolic loop bounds, which no latency model can time)."""
    from tensorplan.ir.onnx_import import import_onnx, load_proto
    from tensorplan.ir.to_onnx import graph_to_onnx
    from tensorplan.paths import atomic_write, cache_dir
    proto = load_proto(path)[0]
    inits = {t.name for t in proto.graph.initializer}
    dynamic = any(d.dim_value <= 0 for i in proto.graph.input if i.name not in inits
                  for d in i.type.tensor_type.shape.dim)
    if not dynamic and not input_shapes:
        return path
    data = graph_to_onnx(import_onnx(path, input_shapes, name=name)).SerializeToString()
    out = cache_dir() / "static" / f"{name}-{hashlib.sha256(data).hexdigest()[:12]}.onnx"
    if not out.exists():
        atomic_write(out, data)
    return out


def model_onnx(graph_or_spec: Graph | str | Path,
               input_shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[Path, str]:
    """(static ONNX file, network name) TVM's frontend reads: a spec's own file (an ONNX path, the
    zoo's export, a PyTorch factory's export: the files the dataset's tasks came from), or a
    `Graph` written once to the cache."""
    from tensorplan.paths import atomic_write, cache_dir
    from tensorplan.zoo.specs import resolve_model

    if isinstance(graph_or_spec, Graph):
        from tensorplan.ir.to_onnx import graph_to_onnx

        name = graph_or_spec.name
        data = graph_to_onnx(graph_or_spec).SerializeToString()
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "graph"
        path = cache_dir() / "graphs" / f"{slug}-{hashlib.sha256(data).hexdigest()[:12]}.onnx"
        if not path.exists():
            atomic_write(path, data)
    else:
        path, name = resolve_model(graph_or_spec)
    return static_onnx(path, name, input_shapes), name


def sampler_target(spec: DeviceSpec, dom: str):
    """The target a device's kernels are sampled for: its CUDA tag on a GPU, else None (the
    dataset's llvm target, `task_schedules`)."""
    return gpu_target(spec, dom) if spec.kind == "gpu" else None


def scheduled_module(task, target, sample: int | None):
    """Kernel `task`'s program drawn as design-space sample `sample` (None: the plain loop nest):
    the same module `task_schedules` drew (the draw is seeded by task and index), rebuilt where a
    forked worker featurised it."""
    import tvm

    from tensorplan.cdmpp.dataset import _TaskState, sample_schedule

    if sample is None:
        return task.mod
    st = _TaskState(task, target or tvm.target.Target({"kind": "llvm", "num-cores": DATASET_SAMPLER_CORES}))
    r = sample_schedule(st, sample)
    if r is None:
        raise TensorplanError(f"kernel '{task.name}': design-space sample {sample} no longer yields a valid "
                              "schedule (TVM's sampler changed?); predict again")
    return r[0].mod


def network_programs(path: str | Path, name: str, dom: str, tuned: int = 0, progress: bool = False,
                     log: Callable[[str], None] | None = None, specs: dict | None = None,
                     device: DeviceSpec | None = None, workers: int | None = None) -> tuple:
    """A network's fused kernels, each with its default schedule (then up to `tuned` - 1 more
    samples), featurised for domain `dom` -> (tasks, gaps, programs, sample index or None per task,
    compact ASTs, ProgramArrays). Programs are (task index, sample index or None), each task's
    default first; `scheduled_module` rebuilds one. What `predict` predicts; a study that compares
    several predictors on the same kernels computes it once. `device`: `dom`'s spec (its kind, its
    GPU target, its device vector), else `dom` is resolved by name; `specs`: a dataset's recorded
    devices (`Dataset.devices`), for a `dom` such as zen4-2t that only a dataset describes.

    Why `workers` (None: every usable CPU; 1: in-process): drawing and featurising the schedules is
    most of `predict`'s time at N = 32 (~20 ms a program), and kernels are independent, so they go
    to forked processes, each returning its compact ASTs (the modules stay there; `scheduled_module`
    rebuilds one). mobilenet-v2, N = 32, 2-core VM, 2026-12-02: 17.5-19.4 s in-process, 13.0-13.7 s
    with 2 workers on the quiet machine (lowering the network, ~7 s, stays serial); with other jobs
    at a load of 4 on its 2 cores, 19.6-29.9 s against 26.2-33.4 s: two workers gain nothing there."""
    from tensorplan.cdmpp.features import featurize_many
    from tensorplan.cdmpp.tasks import network_tasks_and_gaps, task_io_of
    from tensorplan.forkmap import fork_map_iter

    if device is None:
        rec = ((specs or {}).get(dom) or {}).get("spec")
        is_gpu = rec.get("kind") == "gpu" if rec else _domain_is_gpu(dom)
    else:
        is_gpu = device.kind == "gpu"
        specs = {**(specs or {}), dom: {"spec": device.to_dict()}}   # the device vector from this spec
    tasks, gaps = network_tasks_and_gaps(path, name)
    if gaps and log:
        log("not predicted (no TIR kernel after TVM's fusion; their time is not in the total): "
            + ", ".join(f"{op.removeprefix('relax.')} x{n}" for op, n in sorted(gaps.items())))
    if not tasks:
        raise TensorplanError(f"model '{name}': no fused kernels found")
    target = gpu_target(device or resolve_device(dom)[0], dom) if is_gpu else None
    # a big convolution's CUDA design space yields a valid draw (postprocessors pass) once in up to
    # ~100 draws (resnet-50), so a GPU gets the dataset sampler's whole budget per task
    tries = (GPU_SAMPLE_TRIES if is_gpu else 8) + 4 * tuned

    def job(a: int, b: int) -> list:
        out = []
        for t in tasks[a:b]:
            got = task_schedules(t, target, max(1, tuned), tries)
            mods = [m for m, _ in got] or [t.mod]
            out.append(([i for _, i in got], featurize_many(mods, is_gpu=is_gpu), [task_io_of(m) for m in mods]))
        return out

    per_task: list = [None] * len(tasks)
    with progress_bar("sample + featurize schedules", len(tasks), progress) as advance:
        for a, res in fork_map_iter(job, len(tasks), workers=workers, chunk=1):
            for j, r in enumerate(res, start=a):
                per_task[j] = r
                if log:
                    log(f"{tasks[j].name}: " + (f"meta-schedule sample {r[0][0]}" if r[0] else UNSCHEDULED)
                        + (f", {len(r[0])} schedules to compare" if tuned else ""))
            advance(len(res))
    progs: list[tuple[int, int | None]] = []
    first_sample: list[int | None] = []
    asts, io = [], []
    for j, (samples, a, i) in enumerate(per_task):
        first_sample.append(samples[0] if samples else None)
        progs.extend((j, s) for s in (samples or [None]))
        asts.extend(a)
        io.extend(i)
    arr = ProgramArrays.from_programs([a.leaf_features for a in asts], [a.positions for a in asts], device=dom,
                                      task_key=[tasks[j].key for j, _ in progs], flops=[a.flops for a in asts],
                                      task_io=io, specs=specs)
    return tasks, gaps, progs, first_sample, asts, arr


# ------------------------------------------------------------------------------------------------
# The call
# ------------------------------------------------------------------------------------------------

@dataclass
class _DeviceCheck:
    zero_shot: bool = False
    outside: list[str] = field(default_factory=list)
    same_as: str | None = None
    warning: str | None = None


def _device_check(est, dom: str, here: np.ndarray, is_gpu: bool) -> _DeviceCheck:
    """How the device stands to what the model learnt: in-domain, learnt under another name, or
    zero-shot (naming the figures that differ and those outside every learnt device)."""
    from tensorplan.devices.spec import feature_differences, features_outside

    known = list(getattr(est, "domains_", None) or [])
    learnt_all = getattr(est, "domain_features_", None) or {}
    learnt = learnt_all.get(dom)
    diff = feature_differences(learnt, here) if learnt is not None else []
    # hardware the model learnt under another name: a catalog name (h100-sxm is the 'h100' measured),
    # or this CPU when the model learnt it as another domain than the `local-*` one it resolves to
    same_as = (next((d for d, v in learnt_all.items() if d != dom and np.allclose(v, here, rtol=0.05)), None)
               if learnt is None or diff else None)
    out = _DeviceCheck(same_as=same_as)
    if same_as is not None:
        return out
    out.outside = features_outside(list(learnt_all.values()), here)
    beyond = (f"; this device lies outside every device the model learnt ({', '.join(out.outside)}), so the "
              "model extrapolates there" if out.outside else "")
    if diff:
        out.zero_shot = True
        out.warning = (f"zero-shot: the model learnt '{dom}' on another machine (its device vector differs from "
                       f"what '{dom}' resolves to here: {', '.join(diff)}){beyond}. Expect larger errors than "
                       "on the machine it learnt; run `tensorplan calibrate` here (minutes) and predict again.")
    elif known and dom not in known:
        out.zero_shot = True
        out.warning = (f"zero-shot: the model was trained on {', '.join(known)}, never on '{dom}'{beyond}; "
                       + ("expect larger errors than on a learnt CPU. Run `tensorplan calibrate` on that machine."
                          if not is_gpu else
                          "with one GPU learnt, the device vector barely moves its predictions, so expect the "
                          "learnt GPU's latencies, not this one's. Measure programs there (tensorplan predictor "
                          "dataset measure-gpu) and train on them."))
    return out


def predict(graph_or_spec: Graph | str | Path, device: str | DeviceSpec = "local", *, tuned: int = DEFAULT_TUNED,
            measure: bool = False, weights: str | Path | None = None, calibrated: bool = True,
            input_shapes: dict[str, tuple[int, ...]] | None = None, save_schedules: str | Path | None = None,
            progress: bool = False, log: Callable[[str], None] | None = None) -> NetworkPrediction:
    """A network's latency on `device`, per fused kernel and in total, predicted by CDMPP.

    `graph_or_spec`: a `Graph`, or an ONNX path, zoo name, `pkg.mod:factory` or `file.py:factory`.
    `device`: a name ('local' = this CPU at every usable core, 'local-Nt', a catalog name such as
    'h100': a GPU is predicted from its CUDA schedules, no GPU needed) or a `DeviceSpec`.

    `tuned` = N > 0 (default `DEFAULT_TUNED`): the predictor as a tuner's cost model, with no
    measurement: each kernel's first N valid samples (its default schedule, what TVM runs untuned,
    is the first) are predicted, the predicted-fastest is its pick, and `total_s` sums the picks
    (`untuned_total_s` the defaults beside it). `tuned=0`: the default schedules alone.

    `measure`: also compile and time each kernel's program(s) here (this CPU only) and compare
    (`NetworkPrediction.measured`: per-kernel error and the whole-network ratio, for the default
    schedules and, under `tuned`, for the picks). `weights`: a predictor file (default: the shipped model, the
    H100 one for a GPU). `calibrated`: on this CPU, use the model `tensorplan calibrate` fitted
    here when there is one (and no `weights`). `input_shapes` fixes the symbolic dimensions of a
    dynamic model. `save_schedules` = DIR: each kernel's scheduled program (the pick under `tuned`,
    else the default) as TVMScript, DIR/<kernel>.py, plus DIR/schedules.json listing them; compile
    one with `tvm.compile(tvm.script.from_source(text))`."""
    import tvm

    from tensorplan.cdmpp.dataset import init_pool, time_module

    if tuned < 0:
        raise TensorplanError(f"tuned: the number of schedules to compare per kernel must be >= 0, got {tuned}")
    path, name = model_onnx(graph_or_spec, input_shapes)   # a bad model fails here, before any model loading
    threads = local_threads(device) if measure else None
    if threads is not None:
        init_pool(threads)     # before anything configures TVM's runtime pool (dataset.init_pool)
    spec, dom = resolve_device(device)
    is_gpu = spec.kind == "gpu"
    local = re.fullmatch(r"local-(\d+)t", dom)
    here_model = None
    if weights is None and calibrated and local:
        here_model = local_model_path(int(local.group(1)))
        weights = here_model if here_model.exists() else None    # `tensorplan calibrate` made one for this CPU
    if weights is None and is_gpu:
        weights = SHIPPED_GPU_MODEL                  # trained on the H100's own CUDA programs
    try:
        est = load_shipped() if weights is None else load_estimator(weights)
    except TensorplanError as e:
        if here_model is None or weights != here_model:
            raise
        raise TensorplanError(f"this CPU's calibration (cached by `tensorplan calibrate`) could not be used: {e}. "
                              "Rerun `tensorplan calibrate` (it replaces that file), or predict with the shipped "
                              "model (--shipped, calibrated=False)") from None
    known = list(getattr(est, "domains_", None) or [])
    learnt_all = getattr(est, "domain_features_", None) or {}
    if is_gpu and known and not any(_domain_is_gpu(d, learnt_all.get(d)) for d in known):
        raise TensorplanError(f"device '{dom}' is a GPU, but '{weights or SHIPPED_MODEL}' was trained on CPU "
                              f"domains only ({', '.join(known)}), and a CPU-trained model has never seen a GPU "
                              "program. Predict without weights to use the shipped H100 model, or train one on "
                              "GPU data: tensorplan predictor train --data data/cdmpp-h100")
    check = _device_check(est, dom, np.asarray(spec.feature_vector(), np.float32), is_gpu)
    if check.same_as and log:
        log(f"'{dom}' has the device vector of '{check.same_as}', which the model learnt: predicting it as "
            f"'{check.same_as}'")
    if check.warning and log:
        log(f"warning: {check.warning}")
    t0 = time.perf_counter()
    tasks, gaps, progs, first_sample, asts, arr = network_programs(path, name, dom, tuned=tuned, progress=progress,
                                                                   log=log, device=spec)
    t1 = time.perf_counter()
    # an ensemble also says how much its members disagree (std of log latency) per kernel
    logs = est.member_log_predictions(arr) if hasattr(est, "member_log_predictions") else None
    pred, spread = est.from_logs(logs) if logs is not None else (est.predict(arr), None)
    t2 = time.perf_counter()
    owner = np.array([j for j, _ in progs])
    first = np.searchsorted(owner, np.arange(len(tasks)))       # each task's default-schedule row
    floors = roofline_floor(spec, [t.flops for t in tasks], [output_bytes(t.mod) for t in tasks])
    kernels: list[KernelPrediction] = []
    counted = first.copy()                                      # each task's row the headline total counts
    for j, t in enumerate(tasks):
        r = first[j]
        kind = DEFAULT if first_sample[j] is not None else UNSCHEDULED
        k = KernelPrediction(name=t.name, key=t.key, calls=int(t.networks.get(name, 1)), flops=float(t.flops),
                             leaves=asts[r].n_leaves, default=SchedulePrediction(kind, progs[r][1], float(pred[r])),
                             log_spread=float(spread[r]) if spread is not None else None,
                             floor_s=float(floors[j]))
        if tuned:
            rows = np.flatnonzero(owner == j)
            b = int(rows[np.argmin(pred[rows])])     # the default (row r) is among them: never above it
            k.tuned = SchedulePrediction(TUNED, progs[b][1], float(pred[b]), candidates=len(rows))
            counted[j] = b
            if spread is not None:
                k.log_spread = float(spread[b])
        kernels.append(k)
    target = sampler_target(spec, dom)
    if save_schedules is not None:
        _save_schedules(Path(save_schedules), name, kernels,
                        [scheduled_module(t, target, k.pick.sample) for t, k in zip(tasks, kernels)])
    res = NetworkPrediction(
        model=name, device=spec, domain=dom, predictor=type(est).__name__, weights=str(weights or SHIPPED_MODEL),
        trained_on=known, kernels=kernels, not_predicted=dict(gaps), tuned=tuned, zero_shot=check.zero_shot,
        outside_learnt=check.outside, same_device_as=check.same_as, warning=check.warning,
        member_total_s=(np.exp(logs[:, counted]) @ np.array([k.calls for k in kernels], np.float64)).tolist()
        if logs is not None else None,   # the whole model as each member alone predicts it: a range
        schedules_dir=Path(save_schedules) if save_schedules is not None else None,
        featurize_s=t1 - t0, predict_s=t2 - t1)
    _floor_check(res)
    if res.floor_warning and log:
        log(f"warning: {res.floor_warning}")
    if res.unscheduled and is_gpu and log:   # a loop nest without thread binding is no CUDA program at all
        log(f"warning: no valid CUDA schedule in {GPU_SAMPLE_TRIES} draws for {', '.join(res.unscheduled[:5])}"
            f"{' ...' if len(res.unscheduled) > 5 else ''}: predicted from the plain loop nest, not a GPU program")
    if threads is not None:
        t3 = time.perf_counter()
        _time_kernels(tasks, kernels, threads, progress, log, time_module,
                      tvm.target.Target({"kind": "llvm", "num-cores": threads}), target)
        res.measured = measured_summary(kernels, threads)
        res.measured.measure_s = time.perf_counter() - t3
    return res


def _time_kernels(tasks, kernels: list[KernelPrediction], threads: int, progress: bool, log, time_module, target,
                  sampler) -> None:
    """Compile and time each kernel's default program (and its pick, under `tuned`) here, filling
    in the schedules' measured fields; the programs are rebuilt from their draw (`sampler`'s
    target, `scheduled_module`)."""
    def timed(s: SchedulePrediction, mod, task) -> None:
        r = time_module(mod, task, target, [threads], **MEASURE_TIMER)
        if isinstance(r, str):
            s.measure_error = r
        else:
            s.measured_s, s.measured_cov = r[threads].median_s, r[threads].cov

    with progress_bar("compile + time", len(tasks), progress) as advance:
        for k, t in zip(kernels, tasks):
            timed(k.default, scheduled_module(t, sampler, k.default.sample), t)
            if k.default.measure_error and log:
                log(f"{t.name}: not measured ({k.default.measure_error})")
            if k.tuned is not None and k.tuned.sample == k.default.sample:       # the default schedule is the pick
                k.tuned.measured_s, k.tuned.measured_cov = k.default.measured_s, k.default.measured_cov
                k.tuned.measure_error = k.default.measure_error
            elif k.tuned is not None:
                timed(k.tuned, scheduled_module(t, sampler, k.tuned.sample), t)
            advance()
