"""Analytic time estimates of a program on its device, from its leaf features and FLOP count.

Why: a learnt model carries to unseen kernels and devices better when it predicts latency relative
to an estimate that already scales with FLOPs, bytes, peak and bandwidth (CDMPP's `base`, the
trees' `base`, `RooflineLinear`). Everything here reads a `arrays.ProgramArrays`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from tensorplan.errors import TensorplanError

if TYPE_CHECKING:
    from tensorplan.cdmpp.arrays import ProgramArrays


# Ansor per-store layout (reference §1.3): 5 buffer slots of 18 starting at 57; within a slot, field 3
# is `bytes`, 4 `unique_bytes` (after the 3-way acc_type one-hot) and 9 the no-reuse flag of the
# reuse-type one-hot. Values are slog-scaled.
_BUF0, _BUF_W, _N_BUF, _BYTES, _UNIQUE_BYTES, _NO_REUSE = 57, 18, 5, 3, 4, 9


def _inv_slog(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * (np.power(2.0, np.abs(x)) - 1.0)


def program_bytes(arr: ProgramArrays) -> np.ndarray:
    """Unique bytes touched per program: sum over stores and buffer slots (de-slogged)."""
    return _per_program(arr, _buffer_field(arr, _UNIQUE_BYTES).sum(1))


def _buffer_cols(field: int) -> list[int]:
    """Leaf-feature columns of one per-buffer field (offset within a slot), one per slot."""
    return [_BUF0 + _BUF_W * j + field for j in range(_N_BUF)]


def _buffer_field(arr: ProgramArrays, field: int) -> np.ndarray:
    """[n_leaves, 5] de-slogged values of one per-buffer field."""
    return _inv_slog(arr.leaf_data[:, _buffer_cols(field)].astype(np.float64)).clip(min=0)


def _per_program(arr: ProgramArrays, per_leaf: np.ndarray) -> np.ndarray:
    """Sum a per-leaf quantity over each program's leaves."""
    return np.add.reduceat(per_leaf, arr.offsets[:-1]) if len(arr) else np.zeros(0)


def program_footprint_traffic(arr: ProgramArrays) -> tuple[np.ndarray, np.ndarray]:
    """(footprint, traffic) bytes per program, summed over stores and buffer slots.

    Traffic is Ansor's `bytes`: every access counted, reuse included. Footprint counts each buffer's
    bytes once: `bytes` where the access has no reuse (each element touched once, so the count is
    the buffer's extent), `unique_bytes` otherwise. Ansor's `unique_bytes` alone is taken at the
    innermost loop for accesses without reuse, which makes a 1.1 MB slice look like 1 KB.
    """
    traffic = _buffer_field(arr, _BYTES)
    no_reuse = arr.leaf_data[:, _buffer_cols(_NO_REUSE)] > 0.5
    footprint = np.where(no_reuse, traffic, _buffer_field(arr, _UNIQUE_BYTES))
    return _per_program(arr, footprint.sum(1)), _per_program(arr, traffic.sum(1))


def hierarchy_parts(arr: ProgramArrays) -> np.ndarray:
    """[n, 3] seconds per program on its device: FLOPs / peak, footprint / DRAM bandwidth, traffic /
    DRAM bandwidth. `hierarchy_seconds` weighs the last by the cache-to-DRAM bandwidth ratio."""
    if arr.flops is None:
        raise TensorplanError("cdmpp: a roofline-relative target needs the records' FLOP counts (column 'flops')")
    peak, bw = device_peak_bw(arr)
    footprint, traffic = program_footprint_traffic(arr)
    return np.stack([np.maximum(arr.flops, 0.0) / peak, footprint / bw, traffic / bw], axis=1)


def hierarchy_seconds(parts: np.ndarray, cache_ratio: float) -> np.ndarray:
    """Memory-hierarchy time estimate: compute + DRAM footprint + all traffic at `cache_ratio` x the
    DRAM bandwidth. Not a lower bound (timed kernels run on warm caches) but a tighter normaliser
    than `roofline_seconds`: it counts each buffer's footprint and its re-reads separately."""
    return np.maximum(parts[:, 0] + parts[:, 1] + parts[:, 2] / cache_ratio, 1e-9)


class TaskSpread:
    """How uniform log(latency / estimate) is across tasks: the std of the per-task medians. The
    grouping of records by task is done once, so many estimates can be scored cheaply."""

    def __init__(self, latency_s: np.ndarray, task_key: Sequence[str] | None):
        self.lat = np.asarray(latency_s, np.float64)
        keys = np.asarray(task_key) if task_key is not None else np.arange(len(self.lat))
        _, inv = np.unique(keys, return_inverse=True)
        self.groups = np.split(np.argsort(inv, kind="stable"), np.cumsum(np.bincount(inv))[:-1])

    def __call__(self, estimate_s: np.ndarray) -> float:
        lr = np.log(self.lat / estimate_s)
        return float(np.std([np.median(lr[g]) for g in self.groups]))


def fit_cache_ratio(parts: np.ndarray, latency_s: np.ndarray, task_key: Sequence[str] | None,
                    grid: Sequence[float] = (1, 2, 4, 8, 16, 32)) -> float:
    """The cache-to-DRAM bandwidth ratio that makes log(latency / estimate) most uniform across tasks
    (`TaskSpread`; per record when tasks are unknown), chosen on training data only."""
    spread = TaskSpread(latency_s, task_key)
    return float(min(grid, key=lambda k: spread(hierarchy_seconds(parts, float(k)))))


def device_peak_bw(arr: ProgramArrays) -> tuple[np.ndarray, np.ndarray]:
    """(peak FLOP/s, memory bytes/s) of each record's device, from its device vector (the spec
    recorded with the data, so a domain is described by the machine that measured it)."""
    from tensorplan.devices.spec import FEATURE_NAMES

    peak = (10.0 ** arr.device[:, FEATURE_NAMES.index("log10_peak_gflops")].astype(np.float64) - 1) * 1e9
    bw = (10.0 ** arr.device[:, FEATURE_NAMES.index("log10_mem_bw_gbs")].astype(np.float64) - 1) * 1e9
    return np.maximum(peak, 1.0), np.maximum(bw, 1.0)


def roofline_seconds(arr: ProgramArrays) -> np.ndarray:
    """Roofline lower bound per program on its device: max(FLOPs / peak, bytes / bandwidth).

    Bytes: the larger of the features' unique bytes and, when the records carry it, the size of the
    task's output (`task_io[0]`, fp32): Ansor's unique bytes of an access without reuse are one
    innermost row (a 1 MB slice counts 1 KB), but every kernel writes its whole output. The inputs'
    sizes are not a bound: a slice reads only part of its input. `hierarchy_seconds` counts the
    bytes properly (`program_footprint_traffic`)."""
    if arr.flops is None:
        raise TensorplanError("cdmpp: a roofline-relative target needs the records' FLOP counts (column 'flops')")
    peak, bw = device_peak_bw(arr)
    nbytes = program_bytes(arr)
    if arr.task_io is not None:
        out_bytes = 4.0 * (np.power(2.0, arr.task_io[:, 0].astype(np.float64)) - 1.0)
        nbytes = np.maximum(nbytes, out_bytes)
    t = np.maximum(np.maximum(arr.flops, 0.0) / peak, nbytes / bw)
    return np.maximum(t, 1e-9)

