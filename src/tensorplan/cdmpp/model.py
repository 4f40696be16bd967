"""CDMPP latency predictor (EuroSys'24), re-implemented for tensorplan.

A tensor program is its compact AST: only the leaves (BufferStores) carry the
164-d Ansor per-store features (`predict.features`). The model is

    leaves --min-max--> +PE(position) --Linear--> TransformerEncoder (key-padding mask)
           --masked mean|sum pooling [| summed/max-pooled leaves, option flat_skip]--> MLP_emb = z
    device features --MLP_dev--> zd ;  z = N0(z) + N0(zd)   (shared non-affine LayerNorm)
    z --MLP_reg--> r (tanh, the domain-alignment embedding) --Linear--> Box-Cox-standardised latency

trained with `w_mse*MSE(normalised) + w_mape*MAPE(seconds)` plus `alpha*CMD(r_src, r_tgt)`
towards unlabelled target-domain programs (§2.3-2.4 of reference/cdmpp.md).

Deviations from the released code, with reasons:
- padding + key-padding mask + pooling instead of one flatten layer per leaf count, so one model
  serves every program (reference §7.3);
- the MAPE term is computed on de-normalised seconds: on a standardised target it divides by
  values near 0 and is ill-defined;
- the embedding used for CMD ends in tanh, so its moments are bounded as CMD assumes (the reference
  uses unbounded ReLU features with a bound of 1);
- normalisers (features, target) are fitted on the training split only.

This module also holds the pieces every latency estimator shares (the `Estimator` face, the
`ProgramArrays` view of a dataset, metrics), so `baselines.py` and `evaluate.py` stay small.
"""
from __future__ import annotations

import abc
import functools
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.tasks import TASK_IO_DIM

LEAF_DIM = 164
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
SHIPPED_MODEL = WEIGHTS_DIR / "cdmpp-local.pt"


# --------------------------------------------------------------------------------------------
# Data view shared by all estimators
# --------------------------------------------------------------------------------------------

def device_features(name: str, specs: "dict | None" = None) -> np.ndarray:
    """Numeric device vector for domain `name` (`DeviceSpec.feature_vector()`, already log-scaled).

    `specs`: a dataset's recorded devices ({name: {"spec": DeviceSpec dict}}, `Dataset.devices`);
    a domain recorded there is described by the machine that measured it, not by whatever machine
    runs this code (`local-1t` of the committed dataset is the CPU it was collected on). Other
    names resolve through `tensorplan.devices.resolve`. Used as is, without a fitted scaler: with
    one training device a fitted scaler would be degenerate.
    """
    from tensorplan.devices.spec import DeviceSpec

    rec = (specs or {}).get(name) or {}
    if not rec.get("spec"):
        return _resolved_features(name)
    try:
        return np.asarray(DeviceSpec.from_dict(rec["spec"]).feature_vector(), dtype=np.float32)
    except Exception as e:  # noqa: BLE001 - a damaged meta.json
        raise TensorplanError(f"device '{name}': its recorded spec cannot be read ({e}); re-export the dataset") from e


@functools.lru_cache(maxsize=64)
def _resolved_features(name: str) -> np.ndarray:
    from tensorplan.devices import resolve  # devices sits below predict in the layering

    try:
        v = np.asarray(resolve(name).feature_vector(), dtype=np.float64)
    except TensorplanError:
        raise
    except Exception as e:  # pragma: no cover - depends on the devices helper
        raise TensorplanError(f"device '{name}': cannot build its feature vector ({e})") from e
    return v.astype(np.float32)


@dataclass
class ProgramArrays:
    """Flat, index-able view of a set of programs: leaves packed in one array plus offsets.

    This is what models consume; it is built once from a `dataset.Dataset` (or a list of compact
    ASTs) so batches are gathered with numpy fancy indexing instead of Python loops.
    """

    leaf_data: np.ndarray            # [total_leaves, 164] float32
    pos_data: np.ndarray             # [total_leaves] int64
    offsets: np.ndarray              # [N+1] int64
    device: np.ndarray               # [N, D] float32
    device_name: np.ndarray          # [N] object
    task_key: np.ndarray             # [N] object
    latency_s: np.ndarray | None     # [N] float64 or None (unlabelled)
    flops: np.ndarray | None = None  # [N] float64
    trace: list | None = None        # per program: schedule trace (JSON-able) or None
    record_id: np.ndarray | None = None
    task_io: np.ndarray | None = None  # [N, TASK_IO_DIM] float32: log2 buffer sizes of the task

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def n_leaves(self) -> np.ndarray:
        return np.diff(self.offsets)

    def on_device(self, vec) -> "ProgramArrays":
        """The same programs (leaf arrays shared) with every row's device vector set to `vec`: how a
        model predicts them for one device (a calibration's source CPU, or this one)."""
        import dataclasses
        return dataclasses.replace(self, device=np.repeat(np.asarray(vec, np.float32)[None], len(self), axis=0))

    def _hierarchy_cache(self) -> tuple[np.ndarray, np.ndarray]:
        """(`hierarchy_parts`, their log), computed once per array (models read them per batch and
        per fit step) and again when the FLOP counts, device vectors or leaves are replaced."""
        key = (self.flops, self.device, self.leaf_data)
        cached = self.__dict__.get("_parts")
        if cached is None or any(a is not b for a, b in zip(cached[0], key)):
            parts = hierarchy_parts(self)
            cached = self.__dict__["_parts"] = (key, parts, np.log(np.maximum(parts, 1e-10)))
        return cached[1], cached[2]

    @property
    def cached_hierarchy_parts(self) -> np.ndarray:
        """[N, 3] `hierarchy_parts` (seconds) of these programs, cached."""
        return self._hierarchy_cache()[0]

    @property
    def log_hierarchy_parts(self) -> np.ndarray:
        """[N, 3] log of `hierarchy_parts` (seconds, floored at 0.1 ns), cached."""
        return self._hierarchy_cache()[1]

    def leaves(self, i: int) -> np.ndarray:
        return self.leaf_data[self.offsets[i]:self.offsets[i + 1]]

    def task_domains(self) -> np.ndarray:
        """[N] object: 'task@device' per program, the group whose schedules are compared
        (ranking, within-task spearman, per-task factors, task-relative spacing)."""
        return np.array([f"{t}@{d}" for t, d in zip(self.task_key, self.device_name)], dtype=object)

    def program_ids(self) -> np.ndarray:
        """[N] uint64: a hash of each program's task and leaves (features and positions), the same
        for one schedule timed on several devices (and for schedules of one task the features cannot
        tell apart), so a model can tell which programs it was trained on. Computed once per array
        (a model asks on every predict call), again when the leaves or task keys are replaced."""
        import hashlib

        key = (self.leaf_data, self.pos_data, self.offsets, self.task_key)
        cached = self.__dict__.get("_program_ids")
        if cached is not None and all(a is b for a, b in zip(cached[0], key)):
            return cached[1]
        o = self.offsets
        ids = np.array([int.from_bytes(hashlib.blake2b(str(self.task_key[i]).encode()
                                                       + self.leaf_data[o[i]:o[i + 1]].tobytes()
                                                       + self.pos_data[o[i]:o[i + 1]].tobytes(),
                                                       digest_size=8).digest(), "little")
                        for i in range(len(self))], dtype=np.uint64)
        self.__dict__["_program_ids"] = (key, ids)
        return ids

    def subset(self, idx: Sequence[int] | np.ndarray) -> "ProgramArrays":
        idx = np.asarray(idx, dtype=np.int64).reshape(-1)
        n = self.n_leaves[idx]
        if len(idx) == 0:
            n = np.zeros(0, np.int64)
        starts = self.offsets[:-1][idx]
        gather = (np.repeat(starts - (np.cumsum(n) - n), n)
                  + np.arange(int(n.sum())))
        return ProgramArrays(
            leaf_data=self.leaf_data[gather], pos_data=self.pos_data[gather],
            offsets=np.concatenate([[0], np.cumsum(n)]).astype(np.int64),
            device=self.device[idx], device_name=self.device_name[idx], task_key=self.task_key[idx],
            latency_s=None if self.latency_s is None else self.latency_s[idx],
            flops=None if self.flops is None else self.flops[idx],
            trace=None if self.trace is None else [self.trace[i] for i in idx],
            record_id=None if self.record_id is None else self.record_id[idx],
            task_io=None if self.task_io is None else self.task_io[idx])

    def padded(self, idx: np.ndarray, max_leaves: int | None = None):
        """Gather programs `idx` into ([B,L,164] leaves, [B,L] positions, [B,L] valid mask)."""
        n = self.n_leaves[idx]
        if max_leaves is not None:
            n = np.minimum(n, max_leaves)
        L = max(int(n.max()), 1)
        ar = np.arange(L)
        valid = ar[None, :] < n[:, None]
        gi = np.where(valid, self.offsets[:-1][idx][:, None] + ar[None, :], 0)
        x = self.leaf_data[gi]
        x[~valid] = 0.0
        p = np.where(valid, self.pos_data[gi], 0)
        return x, p, valid

    @staticmethod
    def concat(parts: Iterable["ProgramArrays"]) -> "ProgramArrays":
        parts = [p for p in parts if len(p)]
        if not parts:
            raise TensorplanError("cannot concatenate an empty list of program sets")
        offs, base = [np.zeros(1, np.int64)], 0
        for p in parts:
            offs.append(p.offsets[1:] + base)
            base += int(p.offsets[-1])

        def cat(name):
            vals = [getattr(p, name) for p in parts]
            return None if any(v is None for v in vals) else np.concatenate(vals)

        traces = None if any(p.trace is None for p in parts) else sum((list(p.trace) for p in parts), [])
        return ProgramArrays(
            leaf_data=np.concatenate([p.leaf_data for p in parts]),
            pos_data=np.concatenate([p.pos_data for p in parts]),
            offsets=np.concatenate(offs), device=np.concatenate([p.device for p in parts]),
            device_name=np.concatenate([p.device_name for p in parts]),
            task_key=np.concatenate([p.task_key for p in parts]), latency_s=cat("latency_s"),
            flops=cat("flops"), trace=traces, record_id=cat("record_id"), task_io=cat("task_io"))

    @classmethod
    def from_programs(cls, leaves: Sequence[np.ndarray], positions: Sequence[np.ndarray],
                      device: str | Sequence[str], task_key: Sequence[str] | None = None,
                      latency_s: Sequence[float] | None = None, flops: Sequence[float] | None = None,
                      trace: Sequence | None = None, specs: dict | None = None,
                      task_io: Sequence[Sequence[float]] | None = None) -> "ProgramArrays":
        """Build from per-program leaf matrices (e.g. `features.compact_ast(f).leaf_features`);
        `specs`: recorded device specs by name (see `device_features`); `task_io`: per program,
        `tasks.task_io_of` (what a roofline-relative or task-size-aware CDMPP reads)."""
        N = len(leaves)
        names = np.array([device] * N if isinstance(device, str) else list(device), dtype=object)
        for i, lf in enumerate(leaves):
            if lf.ndim != 2 or lf.shape[1] != LEAF_DIM or lf.shape[0] == 0:
                raise TensorplanError(f"program {i}: leaf features must be [n>=1, {LEAF_DIM}], got {lf.shape}")
        n = np.array([len(lf) for lf in leaves], dtype=np.int64)
        vec = {d: device_features(d, specs) for d in set(names.tolist())}
        return cls(
            leaf_data=np.concatenate([np.asarray(lf, np.float32) for lf in leaves]) if N else
            np.zeros((0, LEAF_DIM), np.float32),
            pos_data=np.concatenate([np.asarray(p, np.int64).reshape(-1) for p in positions]) if N else
            np.zeros(0, np.int64),
            offsets=np.concatenate([[0], np.cumsum(n)]).astype(np.int64),
            device=np.stack([vec[d] for d in names]) if N else np.zeros((0, 1), np.float32),
            device_name=names,
            task_key=np.array(list(task_key) if task_key is not None else [""] * N, dtype=object),
            latency_s=None if latency_s is None else np.asarray(latency_s, np.float64),
            flops=None if flops is None else np.asarray(flops, np.float64),
            trace=None if trace is None else list(trace),
            task_io=None if task_io is None else np.asarray(task_io, np.float32).reshape(N, -1))


def as_arrays(data: Any) -> ProgramArrays:
    """Accept a `ProgramArrays` or a `predict.dataset.Dataset` (records + aligned leaves/positions)."""
    if isinstance(data, ProgramArrays):
        return data
    cached = getattr(data, "_tp_arrays", None)
    if cached is not None:
        return cached
    recs = getattr(data, "records", None)
    if recs is None or not hasattr(data, "leaves"):
        raise TensorplanError(f"expected a Dataset or ProgramArrays, got {type(data).__name__}")
    cols = set(recs.columns)
    dev_col = "device" if "device" in cols else "device_name"
    lat = recs["latency_s"].to_numpy(np.float64) if "latency_s" in cols else None
    if lat is not None and np.isnan(lat).all():
        lat = None
    arr = ProgramArrays.from_programs(
        list(data.leaves), list(data.positions), device=list(recs[dev_col]),
        task_key=list(recs["task_key"]), latency_s=lat,
        flops=recs["flops"].to_numpy(np.float64) if "flops" in cols else None,
        trace=list(recs["trace"]) if "trace" in cols else None, specs=getattr(data, "devices", None))
    if "record_id" in cols:
        arr.record_id = recs["record_id"].to_numpy()
    if "task_io" in cols:
        arr.task_io = np.asarray(list(recs["task_io"]), np.float32).reshape(len(recs), -1)
    try:
        object.__setattr__(data, "_tp_arrays", arr)
    except Exception:
        pass
    return arr


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
    DRAM bandwidth. Not a lower bound (timed kernels run on warm caches) but a tighter normaliser:
    across the CPU dataset's tasks log(latency / estimate) spreads about a third less than with
    `roofline_seconds` (`python bench/cdmpp_bases.py`)."""
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


class torch_threads:
    """Run torch with `n` intra-op threads inside the block, then restore the previous count.

    Default 1: on this shared 2-core machine, 2 torch threads under contention made a training step
    20-40x slower (spinning OpenMP workers), 1 thread stays fast; small models gain little from 2.
    """

    def __init__(self, n: int | None):
        self.n = n or 1

    def __enter__(self):
        import torch

        self.prev = torch.get_num_threads()
        if self.prev != self.n:
            torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        import torch

        if torch.get_num_threads() != self.prev:
            torch.set_num_threads(self.prev)
        return False


# --------------------------------------------------------------------------------------------
# Metrics (used by every model and the harness)
# --------------------------------------------------------------------------------------------

def regression_metrics(pred_s: np.ndarray, true_s: np.ndarray) -> dict[str, float]:
    """MAPE (%), RMSE (ms) and accuracy within ±10% / ±20% APE, on seconds."""
    pred_s, true_s = np.asarray(pred_s, np.float64), np.asarray(true_s, np.float64)
    ape = np.abs(pred_s - true_s) / true_s
    return {
        "n": int(len(true_s)),
        "mape_pct": float(100 * ape.mean()),
        "rmse_ms": float(1e3 * np.sqrt(np.mean((pred_s - true_s) ** 2))),
        "acc10_pct": float(100 * (ape <= 0.10).mean()),
        "acc20_pct": float(100 * (ape <= 0.20).mean()),
        "median_ape_pct": float(100 * np.median(ape)),
        "mean_abs_log_ratio": float(np.mean(np.abs(np.log(pred_s / true_s)))),
    }


def within_task_spearman(pred_s: np.ndarray, true_s: np.ndarray, task_key: np.ndarray,
                         min_programs: int = 5) -> float:
    """Mean over tasks of Spearman's rho between predicted and measured latency of its schedules.

    Tasks where either side is constant (rho undefined) are left out."""
    from scipy.stats import spearmanr

    rhos = []
    for t in np.unique(task_key):
        m = task_key == t
        if m.sum() < min_programs or np.ptp(true_s[m]) == 0 or np.ptp(pred_s[m]) == 0:
            continue
        r = spearmanr(pred_s[m], true_s[m]).statistic
        if np.isfinite(r):
            rhos.append(r)
    return float(np.mean(rhos)) if rhos else float("nan")


# --------------------------------------------------------------------------------------------
# Estimator face (scikit-learn style) shared with baselines
# --------------------------------------------------------------------------------------------

class Estimator(abc.ABC):
    """Every latency model: params in `__init__`, `fit`, `predict` (seconds), `save`, `load`.

    `fit(train, val=None, target=None)`: `target` is optional unlabelled target-domain data that a
    domain-adaptive model may use (CDMPP's CMD); other models ignore it.
    `finetune(data)`: adapt to a few labelled target samples; the default refits on nothing new
    and must be overridden by models that can adapt.
    """

    name = "estimator"
    #: True for models whose `finetune` adapts the trained model itself (CDMPP); the others refit.
    adapts_by_finetune = False

    def get_params(self) -> dict[str, Any]:
        import inspect

        sig = inspect.signature(type(self).__init__)
        return {k: getattr(self, k) for k in sig.parameters if k != "self"}

    @abc.abstractmethod
    def fit(self, train, val=None, target=None) -> "Estimator":
        """Fit on `train` (validation `val` for model selection, unlabelled `target` for CMD)."""

    @abc.abstractmethod
    def predict(self, records) -> np.ndarray:
        """Latency in seconds per program."""

    def finetune(self, data, base=None) -> "Estimator":
        """Adapt to labelled target-domain `data`; default: refit on `base` + `data`."""
        if base is None:
            raise TensorplanError(f"{self.name}: finetune needs the base training set")
        return self.fit(ProgramArrays.concat([as_arrays(base), as_arrays(data)]))

    # state <-> bytes; subclasses implement _state/_set_state
    @abc.abstractmethod
    def _state(self) -> dict[str, Any]:
        """Everything `save` must keep (arrays, weights, normalisers)."""

    @abc.abstractmethod
    def _set_state(self, state: dict[str, Any]) -> None:
        """Restore what `_state` returned."""

    def save(self, path: str | Path) -> Path:
        import torch

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = {"format": "tensorplan-estimator/1", "class": type(self).__name__,
                "params": self.get_params(), "state": self._state(),
                "domains": list(getattr(self, "domains_", None) or []),
                "domain_features": dict(getattr(self, "domain_features_", None) or {})}
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(blob, tmp)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Estimator":
        import torch

        path = Path(path)
        if not path.exists():
            raise TensorplanError(f"model file '{path}' does not exist")
        hint = "pass a file written by `tensorplan predictor train` (or leave out --weights for the shipped model)"
        try:
            blob = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - pickle, zip and torch errors for a truncated or foreign file
            raise TensorplanError(f"'{path}' is not a readable tensorplan model file "
                                  f"({type(e).__name__}: {str(e)[:120]}); {hint}") from None
        if not isinstance(blob, dict) or blob.get("format") != "tensorplan-estimator/1":
            raise TensorplanError(f"'{path}' is not a tensorplan model file; {hint}")
        klass = _REGISTRY.get(blob["class"])
        if klass is None:
            raise TensorplanError(f"'{path}': unknown model class {blob['class']}")
        if cls is not Estimator and not issubclass(klass, cls):
            raise TensorplanError(f"'{path}' holds a {blob['class']}, not a {cls.__name__}")
        obj = klass(**blob["params"])
        obj._set_state(blob["state"])
        obj.domains_ = list(blob.get("domains") or [])  # [] = not recorded (a model saved before they were)
        obj.domain_features_ = dict(blob.get("domain_features") or {})  # the device vector each was learnt with
        return obj


class WrappedEstimator(Estimator):
    """A model built around one base model (`self.base`), which its saved state nests with
    `estimator_blob`, so its own constructor takes no saved parameters."""

    base: Estimator | None = None
    # attributes `fit` sets from the validation split (task_relative's mix): results record them
    chosen_on_validation: tuple[str, ...] = ()

    def get_params(self) -> dict[str, Any]:
        return {}

    def _need_base(self, what: str) -> Estimator:
        if self.base is None:
            raise TensorplanError(f"{self.name}.{what}: no base model")
        return self.base


def wrapped_layers(model: Estimator) -> list[Estimator]:
    """The model and the bases it wraps, outermost first (`xgboost-deep-rel-mape`: MapePoint,
    TaskRelative, TenSetXGB)."""
    layers = [model]
    while isinstance(layers[-1], WrappedEstimator) and layers[-1].base is not None:
        layers.append(layers[-1].base)
    return layers


def validation_choices(model: Estimator) -> dict[str, Any]:
    """What each wrapper layer of `model` chose on the validation split, merged into one dict, so a
    result file says e.g. which `mix` a `-rel` model ran with."""
    return {k: getattr(layer, k) for layer in wrapped_layers(model)
            for k in getattr(layer, "chosen_on_validation", ())}


_REGISTRY: dict[str, type] = {}


def register(klass):
    _REGISTRY[klass.__name__] = klass
    return klass


def estimator_blob(m: Estimator) -> dict:
    """A model nested inside another one's saved state (ensemble members, a calibrated base)."""
    return {"class": type(m).__name__, "params": m.get_params(), "state": m._state()}


def estimator_from_blob(b: dict, owner: str) -> Estimator:
    """Rebuild what `estimator_blob` kept; `owner` names the enclosing model in the error."""
    klass = _REGISTRY.get(b["class"])
    if klass is None:
        raise TensorplanError(f"{owner}: unknown model class {b['class']}")
    m = klass(**b["params"])
    m._set_state(b["state"])
    return m


def load_estimator(path: str | Path) -> Estimator:
    """Load any saved tensorplan estimator (CDMPP or a baseline)."""
    from tensorplan.cdmpp import baselines, calibrate, ensemble, leaf_experts, mape_point, task_relative  # noqa: F401  (registers the other estimator classes)

    return Estimator.load(path)


def _labelled(arr: ProgramArrays, what: str) -> np.ndarray:
    if arr.latency_s is None:
        raise TensorplanError(f"{what}: the data has no measured latencies")
    y = arr.latency_s
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise TensorplanError(f"{what}: latencies must be finite and > 0")
    return y


# --------------------------------------------------------------------------------------------
# Normalisers (fitted on the training split only)
# --------------------------------------------------------------------------------------------

@dataclass
class FeatureScaler:
    """Per-dimension min-max over the valid leaves of the training set (padding excluded)."""

    lo: np.ndarray = field(default_factory=lambda: np.zeros(LEAF_DIM, np.float32))
    scale: np.ndarray = field(default_factory=lambda: np.ones(LEAF_DIM, np.float32))
    clip: float = 3.0

    @classmethod
    def fit(cls, leaf_data: np.ndarray) -> "FeatureScaler":
        lo, hi = leaf_data.min(0), leaf_data.max(0)
        rng = hi - lo
        return cls(lo=lo.astype(np.float32), scale=np.where(rng > 1e-9, rng, 1.0).astype(np.float32))

    def transform(self, x: np.ndarray) -> np.ndarray:
        return np.clip((x - self.lo) / self.scale, -self.clip, 1.0 + self.clip).astype(np.float32)

    def to_dict(self) -> dict:
        return {"lo": self.lo.tolist(), "scale": self.scale.tolist(), "clip": self.clip}

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureScaler":
        return cls(lo=np.asarray(d["lo"], np.float32), scale=np.asarray(d["scale"], np.float32),
                   clip=float(d["clip"]))


@dataclass
class TargetTransform:
    """Latency (s) -> Box-Cox(latency in µs) -> standardised; `kind='log'` uses log instead.

    The inverse clips to the training range widened by half its width on each side: with λ < 0 the
    Box-Cox inverse diverges as λ·b+1 -> 0, and an untrained or extrapolating net must not answer
    "infinite latency".
    """

    kind: str = "boxcox"
    lam: float = 0.0
    mean: float = 0.0
    std: float = 1.0
    b_lo: float = -math.inf
    b_hi: float = math.inf

    @classmethod
    def fit(cls, latency_s: np.ndarray, kind: str = "boxcox") -> "TargetTransform":
        from scipy.stats import boxcox

        us = np.asarray(latency_s, np.float64) * 1e6
        if kind == "boxcox":
            _, lam = boxcox(us)
            lam = float(np.clip(lam, -1.0, 1.0))
        elif kind == "log":
            lam = 0.0
        else:
            raise TensorplanError(f"target transform '{kind}': use 'boxcox' or 'log'")
        t = cls(kind=kind, lam=lam)
        b = t._bc(us)
        t.mean, t.std = float(b.mean()), float(max(b.std(), 1e-9))
        w = float(b.max() - b.min())
        lo, hi = float(b.min()) - 0.5 * w, float(b.max()) + 0.5 * w
        if lam < 0:  # stay inside the domain of the inverse: lam*b + 1 > 0  <=>  b < -1/lam
            hi = min(hi, 0.999 * (-1.0 / lam))
        elif lam > 0:
            lo = max(lo, 0.999 * (-1.0 / lam))
        t.b_lo, t.b_hi = lo, hi
        return t

    def _bc(self, us):
        return np.log(us) if abs(self.lam) < 1e-12 else (np.power(us, self.lam) - 1.0) / self.lam

    def transform(self, latency_s: np.ndarray) -> np.ndarray:
        return ((self._bc(np.asarray(latency_s, np.float64) * 1e6) - self.mean) / self.std).astype(np.float32)

    def inverse(self, z: np.ndarray) -> np.ndarray:
        b = np.clip(np.asarray(z, np.float64) * self.std + self.mean, self.b_lo, self.b_hi)
        if abs(self.lam) < 1e-12:
            us = np.exp(b)
        else:
            us = np.power(np.maximum(self.lam * b + 1.0, 1e-12), 1.0 / self.lam)
        return us * 1e-6

    def inverse_torch(self, z):
        """Differentiable inverse, for the MAPE term of the loss (returns seconds)."""
        import torch

        b = torch.clamp(z.double() * self.std + self.mean, self.b_lo, self.b_hi)
        if abs(self.lam) < 1e-12:
            us = torch.exp(b)
        else:
            us = torch.clamp(self.lam * b + 1.0, min=1e-12) ** (1.0 / self.lam)
        return us * 1e-6

    def to_dict(self) -> dict:
        return {"kind": self.kind, "lam": self.lam, "mean": self.mean, "std": self.std,
                "b_lo": self.b_lo, "b_hi": self.b_hi}

    @classmethod
    def from_dict(cls, d: dict) -> "TargetTransform":
        return cls(**d)


# --------------------------------------------------------------------------------------------
# CMD
# --------------------------------------------------------------------------------------------

def cmd(x, y, k: int = 5):
    """Central moment discrepancy between samples x [n,d] and y [m,d] (Zellinger et al.; §2.4).

    ||mean(x)-mean(y)|| + sum_{j=2..k} ||E[(x-mx)^j] - E[(y-my)^j]||, bound factor 1.
    """
    mx, my = x.mean(0), y.mean(0)
    sx, sy = x - mx, y - my
    d = (mx - my).norm()
    px, py = sx, sy
    for _ in range(2, k + 1):
        px, py = px * sx, py * sy
        d = d + (px.mean(0) - py.mean(0)).norm()
    return d


# --------------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------------

def sinusoidal_table(max_pos: int, dim: int = LEAF_DIM) -> np.ndarray:
    """Transformer sinusoidal PE table [max_pos, dim]; row p encodes pre-order position p."""
    try:  # the data helper's definition wins when present, so features and model agree
        from tensorplan.cdmpp.features import positional_encoding

        t = np.asarray(positional_encoding(np.arange(max_pos), dim), np.float32)
        if t.shape == (max_pos, dim):
            return t
    except Exception:
        pass
    pos = np.arange(max_pos)[:, None].astype(np.float64)
    i = np.arange(dim)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / dim)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


def _build_net(leaf_dim: int, dev_dim: int, d_model: int, n_layers: int, n_heads: int, d_ff: int,
               dropout: float, emb_dim: int, hidden: int, max_pos: int, use_pe: bool, emb_norm: str = "layer",
               flat_skip: bool = False, io_dim: int = 0):
    import torch
    from torch import nn

    class CDMPPNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("pe", torch.from_numpy(sinusoidal_table(max_pos, leaf_dim)))
            self.use_pe = use_pe
            self.embed = nn.Linear(leaf_dim, d_model)
            layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
            # per-sample LayerNorm by default (no train/eval mismatch; equal to batch norm when measured)
            norm = nn.BatchNorm1d(hidden) if emb_norm == "batch" else nn.LayerNorm(hidden)
            self.flat_skip = flat_skip
            self.io_dim = io_dim
            n_in = 2 * d_model + (2 * leaf_dim + 1 if flat_skip else 0) + io_dim
            self.mlp_emb = nn.Sequential(nn.Linear(n_in, hidden), norm, nn.ReLU(),
                                         nn.Linear(hidden, emb_dim))
            self.mlp_dev = nn.Sequential(nn.Linear(dev_dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                                         nn.Linear(64, emb_dim))
            # shared non-affine normalisation of both branches, then add (reference: BatchNorm1d). Per
            # sample (LayerNorm), because a batch of one device has constant zd, which batch norm
            # maps to exactly 0 in training and to something else in eval mode.
            self.norm0 = nn.LayerNorm(emb_dim, elementwise_affine=False)
            self.mlp_reg = nn.Sequential(nn.Linear(emb_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                         nn.Tanh())
            self.head = nn.Linear(hidden, 1)

        def embedding(self, x, pos, valid, dev, layer: str = "r", io=None):
            """Returns r, the last hidden layer (where CMD aligns domains), or with layer="z" the
            program + device embedding that feeds the regressor. `io`: per-program inputs next to the
            pooled leaves, scaled by the caller (`CDMPP._io`; only when the net was built with io_dim > 0)."""
            vm = valid.unsqueeze(-1).to(x.dtype)
            cnt = vm.sum(1).clamp(min=1.0)
            flat = None
            if self.flat_skip:  # the program's summed and max-pooled leaf features, as TenSet sees it
                flat = torch.cat([(x * vm).sum(1) / 4.0, x.masked_fill(~valid.unsqueeze(-1), -1e4).amax(1),
                                  torch.log2(cnt)], dim=1)
            if self.use_pe:
                x = x + self.pe[pos.clamp(max=self.pe.shape[0] - 1)]
            x = x * vm                                   # padded leaves contribute nothing
            h = self.encoder(self.embed(x), src_key_padding_mask=~valid)
            h = h * vm
            s = h.sum(1)
            pooled = torch.cat([s / cnt, s / 8.0], dim=1)  # mean | scaled sum over valid leaves
            if flat is not None:
                pooled = torch.cat([pooled, flat], dim=1)
            if self.io_dim:
                pooled = torch.cat([pooled, io], dim=1)
            z = self.mlp_emb(pooled)
            z = self.norm0(z) + self.norm0(self.mlp_dev(dev))
            return z if layer == "z" else self.mlp_reg(z)

        def forward(self, x, pos, valid, dev, layer: str = "r", io=None):
            """(normalised prediction, the `layer` embedding)."""
            z = self.embedding(x, pos, valid, dev, layer="z", io=io)
            r = self.mlp_reg(z)
            return self.head(r).squeeze(-1), (z if layer == "z" else r)

    return CDMPPNet()


@register
class CDMPP(Estimator):
    """CDMPP: Transformer over compact-AST leaves + device MLP, hybrid loss, optional CMD."""

    name = "cdmpp"
    adapts_by_finetune = True

    def __init__(self, d_model: int = 64, n_layers: int = 1, n_heads: int = 4, d_ff: int = 128,
                 dropout: float = 0.05, emb_dim: int = 64, hidden: int = 192, max_leaves: int = 64,
                 max_pos: int = 1024, use_pe: bool = True, target: str = "log", emb_norm: str = "layer",
                 flat_skip: bool = False, task_io: bool = False, base: str = "none", parts_input: bool = False,
                 lr: float = 1e-3, weight_decay: float = 1.307e-5, batch_size: int = 128,
                 epochs: int = 60, max_time_s: float | None = None, cycle_epochs: float = 10.0,
                 w_mse: float = 1.0, w_mape: float = 0.1, ape_cap: float = 1.0, w_rank: float = 0.0,
                 rank_group: int = 8, rank_temp: float = 0.25, cmd_alpha: float = 1.0, cmd_k: int = 5,
                 cmd_batch: int = 256, cmd_layer: str = "r", grad_clip: float = 2.0, finetune_steps: int = 300,
                 finetune_lr: float = 3e-4, finetune_scope: str = "head", seed: int = 0, threads: int | None = None,
                 verbose: bool = False):
        self.d_model, self.n_layers, self.n_heads, self.d_ff = d_model, n_layers, n_heads, d_ff
        self.dropout, self.emb_dim, self.hidden = dropout, emb_dim, hidden
        self.max_leaves, self.max_pos, self.use_pe, self.target = max_leaves, max_pos, use_pe, target
        if emb_norm not in ("batch", "layer"):
            raise TensorplanError(f"cdmpp: emb_norm must be 'batch' or 'layer', got {emb_norm!r}")
        self.emb_norm, self.flat_skip, self.task_io = emb_norm, flat_skip, task_io
        if base not in ("none", "roofline", "hierarchy"):
            raise TensorplanError(f"cdmpp: base must be 'none', 'roofline' or 'hierarchy', got {base!r}")
        self.base = base
        self.cache_ratio: float | None = None   # fitted on the training split (base="hierarchy")
        self.parts_input = parts_input
        self.parts_norm: tuple[list, list] | None = None  # mean, std of log hierarchy parts (training split)
        self.lr, self.weight_decay, self.batch_size, self.epochs = lr, weight_decay, batch_size, epochs
        self.max_time_s, self.cycle_epochs = max_time_s, cycle_epochs
        self.ape_cap = ape_cap
        if w_rank < 0 or rank_group < 2 or rank_temp <= 0:
            raise TensorplanError(f"cdmpp: need w_rank >= 0, rank_group >= 2 and rank_temp > 0, got "
                                  f"{w_rank}, {rank_group}, {rank_temp}")
        self.w_rank, self.rank_group, self.rank_temp = w_rank, rank_group, rank_temp
        self.w_mse, self.w_mape, self.cmd_alpha, self.cmd_k, self.cmd_batch = w_mse, w_mape, cmd_alpha, cmd_k, cmd_batch
        self.grad_clip, self.finetune_steps, self.finetune_lr = grad_clip, finetune_steps, finetune_lr
        if cmd_layer not in ("r", "z"):
            raise TensorplanError(f"cdmpp: cmd_layer must be 'r' (last hidden layer) or 'z' (program embedding), "
                                  f"got {cmd_layer!r}")
        self.cmd_layer = cmd_layer
        self.finetune_scope = finetune_scope
        self.seed, self.threads, self.verbose = seed, threads, verbose
        self.net = None
        self.scaler: FeatureScaler | None = None
        self.ytf: TargetTransform | None = None
        self.dev_dim: int | None = None
        self.history: list[dict] = []
        self.train_time_s: float = 0.0

    # ---------------------------------------------------------------- helpers
    def _tensors(self, arr: ProgramArrays, idx: np.ndarray):
        import torch

        x, p, v = arr.padded(idx, self.max_leaves)
        x = self.scaler.transform(x) * v[..., None]
        return (torch.from_numpy(x), torch.from_numpy(p), torch.from_numpy(v),
                torch.from_numpy(arr.device[idx]))

    @property
    def io_dim(self) -> int:
        return (TASK_IO_DIM if self.task_io else 0) + (3 if self.parts_input else 0)

    def _io(self, arr: ProgramArrays, idx: np.ndarray):
        """Per-program inputs beside the pooled leaves, or None.

        `task_io=True`: log2 buffer element counts of each record's task (/16). `parts_input=True`: the
        program's log compute, DRAM-footprint and cache-traffic seconds on its device (`hierarchy_parts`),
        standardised on the training split: the sums over stores that the Transformer's per-leaf
        attention does not form by itself, and the device's peak and bandwidth folded in.
        """
        if not self.io_dim:
            return None
        import torch
        cols = []
        if self.task_io:
            if arr.task_io is None:
                raise TensorplanError("cdmpp: this model reads the task's buffer sizes (task_io=True), but the "
                                      "records carry none; load them with `predict.dataset.load_dataset`")
            cols.append(arr.task_io[idx, :TASK_IO_DIM] / 16.0)
        if self.parts_input:
            mean, std = (np.asarray(v) for v in self.parts_norm)
            cols.append((arr.log_hierarchy_parts[idx] - mean) / std)
        return torch.from_numpy(np.ascontiguousarray(np.hstack(cols), np.float32))

    def _base(self, arr: ProgramArrays) -> np.ndarray:
        """What the target is relative to: 1 s, or (`base="roofline"`) the program's roofline bound on
        its device, so the net learns an efficiency factor that carries over to kernel families and
        devices it has not seen (the bound scales with FLOPs, bytes, peak and bandwidth).
        `base="hierarchy"`: compute + DRAM footprint + cache traffic (`hierarchy_seconds`), with the
        cache-to-DRAM ratio fitted on the training split."""
        if self.base == "roofline":
            return roofline_seconds(arr)
        if self.base == "hierarchy":
            if self.cache_ratio is None:
                raise TensorplanError("cdmpp: base='hierarchy' but no cache ratio was fitted; train the model first")
            return hierarchy_seconds(arr.cached_hierarchy_parts, self.cache_ratio)
        return np.ones(len(arr))

    def _check_dev(self, arr: ProgramArrays):
        if arr.device.shape[1] != self.dev_dim:
            raise TensorplanError(f"device feature width {arr.device.shape[1]} != model's {self.dev_dim}")

    def _loss(self, pred, y_norm, y_s, base_s=1.0):
        import torch

        mse = torch.mean((pred - y_norm) ** 2)
        if self.w_mape:
            p_s = self.ytf.inverse_torch(pred) * base_s
            # APE capped at `ape_cap`: an over-prediction by 100x must not outweigh everything else
            # (MSE in the normalised space already pulls such outliers in)
            mape = torch.mean(torch.clamp(torch.abs(p_s - y_s) / y_s, max=self.ape_cap)).float()
            return self.w_mse * mse + self.w_mape * mape
        return self.w_mse * mse

    def _rank_loss(self, pred, y_s, base_s, piece):
        """Pairwise (RankNet) loss over programs of one (task, device) `piece` of the batch.

        Why: MSE over all records is mostly spent on the spread *between* tasks (latencies span
        five decades); the spread between schedules of one task, which decides what a tuner picks,
        is a small part of it. Each pair's logistic loss is on the difference of predicted log
        seconds over `rank_temp`, weighted by the measured log ratio (capped at 1), so near-ties
        (under 5 %, inside the timer's noise) count for nothing and clear orderings most.
        """
        import torch

        logp = torch.log(self.ytf.inverse_torch(pred) * base_s)
        logy = torch.log(y_s)
        same = piece[:, None] == piece[None, :]
        dy = logy[:, None] - logy[None, :]
        w = torch.where(same & (dy > 0.05), torch.clamp(dy, max=1.0), torch.zeros_like(dy))
        if float(w.sum()) == 0.0:
            return pred.sum() * 0.0
        dp = (logp[:, None] - logp[None, :]) / self.rank_temp  # should be > 0 where dy > 0
        return (torch.nn.functional.softplus(-dp) * w).sum() / w.sum()

    def _ranked_batches(self, codes: np.ndarray, rng, bs: int) -> list[np.ndarray]:
        """One epoch of batches built from `rank_group`-program pieces of one (task, device) each
        (`codes`: each record's group), so every batch holds within-task pairs for `_rank_loss`;
        every record still appears once."""
        perm = rng.permutation(len(codes))
        perm = perm[np.argsort(codes[perm], kind="stable")]           # shuffled within each group
        cuts = np.flatnonzero(np.diff(codes[perm])) + 1
        pieces = [c for g in np.split(perm, cuts) for c in np.array_split(g, max(1, len(g) // self.rank_group))]
        chunks = np.array_split(rng.permutation(len(pieces)), max(1, len(pieces) * self.rank_group // bs))
        return [np.concatenate([pieces[j] for j in c]) for c in chunks]

    # ---------------------------------------------------------------- fit
    def fit(self, train, val=None, target=None) -> "CDMPP":
        """Fit normalisers on `train`, then train; `target` (unlabelled) enables CMD."""
        with torch_threads(self.threads):
            return self._fit(train, val, target)

    def _fit(self, train, val, target) -> "CDMPP":
        import torch

        t0 = time.perf_counter()
        tr = as_arrays(train)
        y = _labelled(tr, "cdmpp.fit")
        torch.manual_seed(self.seed)
        self.scaler = FeatureScaler.fit(tr.leaf_data)
        if self.base == "hierarchy":
            self.cache_ratio = fit_cache_ratio(tr.cached_hierarchy_parts, y, tr.task_key)
        self.ytf = TargetTransform.fit(y / self._base(tr), self.target)
        if self.parts_input:
            lp = tr.log_hierarchy_parts
            self.parts_norm = (lp.mean(0).tolist(), np.maximum(lp.std(0), 1e-6).tolist())
        self.dev_dim = tr.device.shape[1]
        self.net = _build_net(LEAF_DIM, self.dev_dim, self.d_model, self.n_layers, self.n_heads, self.d_ff,
                              self.dropout, self.emb_dim, self.hidden, self.max_pos, self.use_pe, self.emb_norm,
                              self.flat_skip, self.io_dim)
        steps_per_epoch = max(1, math.ceil(len(tr) / self.batch_size))
        self._train_loop(tr, val=as_arrays(val) if val is not None else None,
                         target=as_arrays(target) if target is not None else None,
                         lr=self.lr, total_steps=steps_per_epoch * self.epochs,
                         cycle_steps=max(2, int(self.cycle_epochs * steps_per_epoch)),
                         max_time_s=self.max_time_s, eval_every=steps_per_epoch, batch_size=self.batch_size)
        self.train_time_s = time.perf_counter() - t0
        return self

    def finetune(self, data, base=None, steps: int | None = None, target=None) -> "CDMPP":
        """Few-shot adaptation: keep normalisers, train a few steps on `data`.

        `finetune_scope="head"` (default) trains only what follows the program embedding (device MLP,
        regressor, head): a device change moves latencies, not program structure, and a few dozen
        samples overfit the encoder. "all" trains every weight. `base` (the source training set), when
        given, is replayed: half of every batch comes from it, so a few dozen target samples adapt the
        model without erasing what the source taught it. CMD is off while fine-tuning (`target` is
        accepted and ignored): the labelled samples and the pool are the same domain, and aligning a
        few dozen embeddings with the whole pool distorts them (measured: median APE 34% -> 70%).
        """
        if self.net is None:
            raise TensorplanError("cdmpp.finetune: the model is not trained (fit or load it first)")
        ft = as_arrays(data)
        _labelled(ft, "cdmpp.finetune")
        self._check_dev(ft)
        steps = steps or self.finetune_steps
        bs = min(self.batch_size, len(ft))
        if self.finetune_scope not in ("head", "all"):
            raise TensorplanError(f"cdmpp: finetune_scope must be 'head' or 'all', got {self.finetune_scope!r}")
        frozen = [] if self.finetune_scope == "all" else [
            p for mod in (self.net.embed, self.net.encoder, self.net.mlp_emb) for p in mod.parameters()]
        for p in frozen:
            p.requires_grad_(False)
        try:
            with torch_threads(self.threads):
                if base is not None:
                    b = as_arrays(base)
                    both = ProgramArrays.concat([ft, b])
                    w = np.concatenate([np.full(len(ft), 0.5 / len(ft)), np.full(len(b), 0.5 / len(b))])
                    self._train_loop(both, val=None, target=None, lr=self.finetune_lr, total_steps=steps,
                                     cycle_steps=max(2, steps // 2), max_time_s=None, eval_every=None,
                                     batch_size=min(self.batch_size, 2 * len(ft)), weights=w)
                else:
                    self._train_loop(ft, val=None, target=None, lr=self.finetune_lr, total_steps=steps,
                                     cycle_steps=max(2, steps // 2), max_time_s=None, eval_every=None,
                                     batch_size=bs)
        finally:
            for p in frozen:
                p.requires_grad_(True)
        return self

    def _train_loop(self, tr: ProgramArrays, val, target, lr, total_steps, cycle_steps, max_time_s,
                    eval_every, batch_size, weights: np.ndarray | None = None):
        import torch

        net = self.net
        rng = np.random.default_rng(self.seed)
        opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=lr,
                               weight_decay=self.weight_decay)
        # CyclicLR as in §2.5 (base lr/10 .. max lr, triangular, stepped every batch)
        sched = torch.optim.lr_scheduler.CyclicLR(opt, base_lr=lr / 10, max_lr=lr, step_size_up=cycle_steps // 2,
                                                  mode="triangular", cycle_momentum=False)
        base = np.asarray(self._base(tr), np.float64)
        base_all = torch.from_numpy(base)
        y_norm_all = torch.from_numpy(np.array(self.ytf.transform(tr.latency_s / base)))
        y_s_all = torch.from_numpy(np.array(tr.latency_s, np.float64))
        use_cmd = target is not None and len(target) > 1 and self.cmd_alpha > 0
        if use_cmd:
            self._check_dev(target)
        if self.w_rank:   # which (task, device) each record belongs to, for the ranking pairs
            grp = np.unique(tr.task_domains(), return_inverse=True)[1]
        best, best_state = math.inf, None
        t0, step, batches = time.perf_counter(), 0, []
        bs = max(2, min(batch_size, len(tr)))
        while step < total_steps:
            if weights is not None:  # weighted sampling (fine-tuning with replay)
                idx = rng.choice(len(tr), size=bs, replace=True, p=weights)
            else:
                if not batches:  # a new epoch: shuffled, near-equal batches (none too small for a norm layer)
                    batches = (self._ranked_batches(grp, rng, bs) if self.w_rank else
                               np.array_split(rng.permutation(len(tr)), max(1, len(tr) // bs)))
                idx = batches.pop()
            net.train()
            x, p, v, d = self._tensors(tr, idx)
            pred, r = net(x, p, v, d, self.cmd_layer, self._io(tr, idx))
            it = torch.from_numpy(idx)
            loss = self._loss(pred, y_norm_all[it], y_s_all[it], base_all[it])
            if self.w_rank and weights is None:
                loss = loss + self.w_rank * self._rank_loss(pred, y_s_all[it], base_all[it],
                                                             torch.from_numpy(grp[idx]))
            dval = 0.0
            if use_cmd:
                tidx = rng.choice(len(target), size=min(self.cmd_batch, len(target)), replace=False)
                xt, pt, vt, dt = self._tensors(target, tidx)
                _, rt = net(xt, pt, vt, dt, self.cmd_layer, self._io(target, tidx))
                dist = cmd(r, rt, self.cmd_k)
                loss = loss + self.cmd_alpha * dist
                dval = float(dist.detach())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), self.grad_clip)
            opt.step()
            sched.step()
            step += 1
            if eval_every and (step % eval_every == 0 or step == total_steps):
                rec = {"step": step, "loss": float(loss.detach()), "cmd": dval, "time_s": time.perf_counter() - t0}
                if val is not None and len(val):
                    # model selection on the symmetric log error: selecting on MAPE rewards models
                    # that under-predict everything (APE <= 1 below, unbounded above)
                    vmet = regression_metrics(self.predict(val), val.latency_s)
                    vm = vmet["mean_abs_log_ratio"]
                    rec["val_mape_pct"] = vmet["mape_pct"]
                    rec["val_log_err"] = vm
                    if vm < best:
                        best = vm
                        best_state = {k: t.detach().clone() for k, t in net.state_dict().items()}
                self.history.append(rec)
                if self.verbose:
                    print(rec, flush=True)
            if max_time_s is not None and time.perf_counter() - t0 > max_time_s:
                break
        if best_state is not None:
            net.load_state_dict(best_state)
        net.eval()

    # ---------------------------------------------------------------- predict
    def embed(self, records, batch: int = 4096) -> np.ndarray:
        """Last-hidden-layer embeddings r (the CMD space), [N, hidden]."""
        return self._run(records, batch, want_embedding=True)

    def predict(self, records, batch: int = 4096) -> np.ndarray:
        """Predicted latency in seconds for every program in `records`."""
        z = self._run(records, batch, want_embedding=False)
        return self.ytf.inverse(z) * self._base(as_arrays(records))

    def _run(self, records, batch, want_embedding):
        import torch

        if self.net is None:
            raise TensorplanError("cdmpp: the model is not trained (fit or load it first)")
        arr = as_arrays(records)
        self._check_dev(arr)
        self.net.eval()
        n = len(arr)
        order = np.argsort(arr.n_leaves, kind="stable")  # similar lengths share a batch: less padding
        out = np.empty((n, self.hidden) if want_embedding else n, np.float32)
        with torch.inference_mode(), torch_threads(self.threads):
            for s in range(0, n, batch):
                idx = order[s:s + batch]
                pred, r = self.net(*self._tensors(arr, idx), "r", self._io(arr, idx))
                out[idx] = (r if want_embedding else pred).numpy()
        return out

    # ---------------------------------------------------------------- state
    def normalisers(self) -> dict:
        nm = {"features": self.scaler.to_dict(), "target": self.ytf.to_dict(), "dev_dim": self.dev_dim}
        if self.cache_ratio is not None:
            nm["cache_ratio"] = self.cache_ratio
        if self.parts_norm is not None:
            nm["parts_norm"] = self.parts_norm
        return nm

    def _state(self):
        if self.net is None:
            raise TensorplanError("cdmpp.save: the model is not trained")
        return {"net": {k: v.detach().clone() for k, v in self.net.state_dict().items()},
                "normalisers": self.normalisers(), "history": self.history, "train_time_s": self.train_time_s}

    def _set_state(self, st):
        nm = st["normalisers"]
        self.scaler = FeatureScaler.from_dict(nm["features"])
        self.ytf = TargetTransform.from_dict(nm["target"])
        self.dev_dim = int(nm["dev_dim"])
        self.cache_ratio = float(nm["cache_ratio"]) if "cache_ratio" in nm else None
        self.parts_norm = nm.get("parts_norm")
        self.net = _build_net(LEAF_DIM, self.dev_dim, self.d_model, self.n_layers, self.n_heads, self.d_ff,
                              self.dropout, self.emb_dim, self.hidden, self.max_pos, self.use_pe, self.emb_norm,
                              self.flat_skip, self.io_dim)
        try:
            self.net.load_state_dict(st["net"])
        except RuntimeError as e:
            first = str(e).strip().splitlines()[:2]
            raise TensorplanError("cdmpp: the saved weights do not fit this version's network (saved by an older "
                                  f"tensorplan?); retrain with `tensorplan predictor train`. {' '.join(first)}") from None
        self.net.eval()
        self.history = list(st.get("history", []))
        self.train_time_s = float(st.get("train_time_s", 0.0))

    def save(self, path: str | Path) -> Path:
        """Save weights (.pt) and, next to it, the normalisers as readable JSON (`<name>.norm.json`)."""
        path = super().save(path)
        path.with_suffix(".norm.json").write_text(json.dumps(self.normalisers(), indent=1))
        return path


def load_shipped() -> Estimator:
    """The model trained on this machine's domains and shipped with the package."""
    if not SHIPPED_MODEL.exists():
        raise TensorplanError(f"shipped model '{SHIPPED_MODEL}' is missing; run `tensorplan predictor train --ship`")
    return load_estimator(SHIPPED_MODEL)   # a CDMPP or an ensemble of them (`train --members`)


# --------------------------------------------------------------------------------------------
# KernelCost adapter (optional; used by the planner when the kernel lowering exists)
# --------------------------------------------------------------------------------------------

class CDMPPCost:
    """Planner cost model (`tensorplan.cost.KernelCost` protocol): predicted kernel latency.

    `cost(prim, cand)`: lower the candidate (`program.lower`), apply the default schedule
    (`program.schedule`), featurise its compact AST and ask CDMPP; cached per canonical hash, so a
    plan's thousands of candidates cost milliseconds each instead of a compile-and-time. Candidates
    that cannot be lowered to TIR (opaque ops, unsupported primitives) go to `fallback` (another
    KernelCost, e.g. `cost.AnalyticalCost`; predict sits below cost, so it is passed in) or get
    `math.inf` when none is given (a singleton without fallback is an error: the planner needs it).
    """

    name = "cdmpp"

    def __init__(self, model: "CDMPP | str | Path | None" = None, device: str = "local", fallback=None,
                 threads: int = 2):
        self.model = load_shipped() if model is None else (
            model if isinstance(model, Estimator) else load_estimator(model))
        self.device = resolve_domain(device)
        self.fallback = fallback
        self.threads = threads
        self._cache: dict[str, float] = {}
        self.stats = {"predicted": 0, "fallback": 0, "featurize_s": 0.0}

    def _ast(self, prim, cand):
        """(compact AST, task_io) of the candidate's default-scheduled kernel, or None."""
        from tensorplan.kernels.lower import lower
        from tensorplan.kernels.schedule import default_schedule
        from tensorplan.cdmpp.features import compact_ast
        from tensorplan.cdmpp.tasks import task_io_of

        if getattr(cand, "kind", "") == "opaque":
            return None
        try:
            lowered = lower(cand.graph(prim), list(cand.outputs))
            sch = default_schedule(lowered, threads=self.threads)
            return compact_ast(sch), task_io_of(sch)
        except Exception:  # noqa: BLE001 - not lowerable: fallback
            return None

    def cost(self, prim, cand) -> float:
        return self.cost_many(prim, [cand])[0]

    def cost_many(self, prim, cands, progress: bool = False) -> list[float]:
        todo = [c for c in cands if c.canonical_hash not in self._cache]
        asts, ios, keep = [], [], []
        t0 = time.perf_counter()
        for c in todo:
            got = self._ast(prim, c)
            a, io = got if got is not None else (None, None)
            if a is None or a.n_leaves == 0:
                if self.fallback is not None:
                    self._cache[c.canonical_hash] = float(self.fallback.cost(prim, c))
                elif len(c.nodes) == 1:
                    raise TensorplanError(f"cdmpp cost: primitive {c.nodes[0]} cannot be lowered to TIR; "
                                          "pass fallback=AnalyticalCost(...)")
                else:
                    self._cache[c.canonical_hash] = math.inf
                self.stats["fallback"] += 1
                continue
            asts.append(a)
            ios.append(io)
            keep.append(c)
        self.stats["featurize_s"] += time.perf_counter() - t0
        if asts:
            arr = ProgramArrays.from_programs([a.leaf_features for a in asts], [a.positions for a in asts],
                                              device=self.device, flops=[a.flops for a in asts], task_io=ios)
            for c, v in zip(keep, self.model.predict(arr)):
                self._cache[c.canonical_hash] = float(v)
            self.stats["predicted"] += len(asts)
        return [self._cache[c.canonical_hash] for c in cands]

    def describe(self) -> dict:
        return {"name": self.name, "device": self.device, "model": type(self.model).__name__, **self.stats}


# --------------------------------------------------------------------------------------------
# Python API behind the CLI
# --------------------------------------------------------------------------------------------

def resolve_domain(device: str) -> str:
    """'local' means this CPU with all its threads: the `local-<n>t` domain the model knows."""
    if device == "local":
        import os

        return f"local-{min(os.cpu_count() or 1, 2)}t"
    return device


def train(data=None, *, devices: Sequence[str] | None = None, out: str | Path | None = None,
          max_cov: float = 0.01, stability: str = "mad", log=None, members: int = 1,
          make: Callable[[int], Estimator] | None = None, leaf_experts: bool = False, workers: int = 1,
          **params) -> tuple[Estimator, dict]:
    """Train CDMPP on every stable record of `devices` (default: all) of a dataset; save to `out`.

    Stability: repeat spread <= max_cov, measured as MAD/median by default (`stability="mad"`): on a
    shared machine one preempted repeat inflates the CoV of an otherwise well-measured program.
    `members > 1` trains an `ensemble.Ensemble` of that many seeds (each with the full budget).
    `make(seed)` builds another estimator instead of CDMPP(**params) (e.g. a baseline from
    `evaluate.make_model`); `params` are then not used. `leaf_experts` wraps each CDMPP in
    `leaf_experts.LeafExperts` (copies fine-tuned per common leaf count). `workers` > 1 trains that
    many ensemble members at once (`Ensemble.fit`, spawned processes: a script calling this needs
    the `if __name__ == "__main__":` guard)."""
    from tensorplan.cdmpp.dataset import load_dataset

    ds = load_dataset(data) if data is None or isinstance(data, (str, Path)) else data
    if devices:
        ds = ds.only_devices(devices)
    ds = ds.filter_stable(max_cov=max_cov, metric=stability)
    if len(ds) == 0:
        raise TensorplanError(f"train: no stable records for devices {devices or 'any'} in '{ds.path}'")
    arr = as_arrays(ds)
    seed = params.get("seed", 0)
    rng = np.random.default_rng(seed)
    val_m = rng.random(len(arr)) < 0.05
    build = make or (lambda s: CDMPP(**{**params, "seed": s}))
    if leaf_experts:
        from tensorplan.cdmpp.leaf_experts import LeafExperts

        cdmpp_of = build
        build = lambda s: LeafExperts(cdmpp_of(s))   # noqa: E731
    if members > 1:
        from tensorplan.cdmpp.ensemble import Ensemble

        model = Ensemble.of(build, members, seed=seed)
    else:
        model = build(seed)
    t0 = time.perf_counter()
    if members > 1:
        model.fit(arr.subset(np.flatnonzero(~val_m)), val=arr.subset(np.flatnonzero(val_m)), workers=workers)
        parts = model.members          # after fitting: members fitted side by side come back as new objects
    else:
        model.fit(arr.subset(np.flatnonzero(~val_m)), val=arr.subset(np.flatnonzero(val_m)))
        parts = [model]
    val = arr.subset(np.flatnonzero(val_m))
    model.domains_ = sorted(set(arr.device_name))  # saved with it: `predict` says when a device is not among them
    model.domain_features_ = {d: device_features(d, ds.devices).tolist() for d in model.domains_}
    if leaf_experts:   # a leaf-experts model: its all-leaves CDMPP (`CDMPP.base` is the target's base kind)
        cores = [m.base for m in parts]
    else:
        cores = parts
    epochs = [len(getattr(m, "history", [])) for m in cores]
    info = {"records": len(arr), "stability": f"{stability} <= {max_cov}", "devices": sorted(set(arr.device_name)),
            "model": type(parts[0]).__name__, "members": len(parts),
            "train_time_s": time.perf_counter() - t0,
            "val": regression_metrics(model.predict(val), val.latency_s),
            "epochs_run": epochs if members > 1 else epochs[0]}
    if out is not None:
        p = model.save(out)
        info["path"] = str(p)
        info["size_mb"] = p.stat().st_size / 1e6
    return model, info
