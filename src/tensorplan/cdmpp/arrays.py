"""The programs every latency model reads: a dataset's leaves packed in flat arrays (`ProgramArrays`),
each program's device vector, and the leaf-feature scaler the neural models share.

Built once from a `dataset.Dataset` (or compact ASTs), so a model gathers a batch with numpy
indexing instead of Python loops over records.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from tensorplan.errors import TensorplanError

LEAF_DIM = 164


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
            from tensorplan.cdmpp.analytic import hierarchy_parts

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
    """Accept a `ProgramArrays` or a `dataset.Dataset` (records + aligned leaves/positions)."""
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


def labelled_latency(arr: ProgramArrays, what: str) -> np.ndarray:
    """The measured latencies of `arr` (seconds), checked finite and > 0; `what` names the caller."""
    if arr.latency_s is None:
        raise TensorplanError(f"{what}: the data has no measured latencies")
    y = arr.latency_s
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise TensorplanError(f"{what}: latencies must be finite and > 0")
    return y


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

