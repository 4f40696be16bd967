"""`DeviceSpec`: what a cost model needs to know about a processor, with a source for every figure.

A spec is plain data (JSON-able). Cost models read `feature_vector()`; the measurement store keys
records by `key()`, a content hash of the *identity* of the hardware (name, model, core counts,
caches, ISA). Throughput figures (peak FLOP/s, bandwidth) are left out of the key on purpose:
re-measuring this machine's bandwidth must not orphan the latencies already stored for it.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tensorplan.errors import TensorplanError

# ISA / capability flags that get a slot in the feature vector (order is part of the format).
ISA_FLAGS: tuple[str, ...] = ("avx2", "avx512f", "fma", "neon", "sve", "fp16", "bf16", "tensor_cores")

# Order of `DeviceSpec.feature_vector()`; bump FEATURE_VERSION when it changes.
FEATURE_VERSION = 1
FEATURE_NAMES: tuple[str, ...] = (
    "is_gpu",               # 1.0 for a GPU, else 0.0
    "log2_cores",           # log2(1 + cores or SMs)
    "log10_threads",        # log10(1 + threads used; fp32 lanes on GPUs)
    "clock_ghz",            # as is (0.5 .. 4)
    "log10_peak_gflops",    # log10(1 + peak fp32 GFLOP/s)
    "log10_mem_bw_gbs",     # log10(1 + memory bandwidth GB/s)
    "log10_ridge_flop_per_byte",  # log10(1 + peak/bandwidth): the roofline ridge point
    "log10_l1_kb",          # log10(1 + per-core/SM L1 data KiB); 0 = unknown/none
    "log10_l2_kb",          # log10(1 + L2 KiB, per core on CPUs, total on GPUs)
    "log10_l3_kb",          # log10(1 + last-level / system cache KiB)
    "log2_gflops_per_core",  # log2(1 + peak / cores)
    *(f"isa_{f}" for f in ISA_FLAGS),  # 0/1 each
)

# Fields that identify the hardware (used by key()); throughput figures and sources are excluded.
# clock_ghz is excluded too: without cpufreq, /proc/cpuinfo only gives the *current* clock, which drifts.
_IDENTITY_FIELDS = ("name", "kind", "vendor", "model", "cores", "threads", "l1_kb", "l2_kb", "l3_kb", "isa")


@dataclass
class DeviceSpec:
    """One processor (a CPU cluster at a thread count, or a GPU) with its datasheet/measured figures.

    Units: clock in GHz, peak in GFLOP/s (fp32), bandwidth in GB/s (1e9 bytes/s, bytes read+written),
    caches in KiB (L1 = data cache per core/SM; L2 per core for CPUs, total for GPUs; L3 = shared
    last-level or system cache, 0 if none). `sources` maps each figure's field name to where it came
    from (datasheet title + URL, "derived: ...", "/proc/cpuinfo", "measured: ..."). `measured` is true
    when peak/bandwidth were measured on this machine rather than copied from a datasheet.
    """

    name: str
    kind: str  # 'cpu' | 'gpu'
    cores: int
    threads: int
    clock_ghz: float
    peak_fp32_gflops: float
    mem_bw_gbs: float
    l1_kb: float = 0.0
    l2_kb: float = 0.0
    l3_kb: float = 0.0
    isa: list[str] = field(default_factory=list)
    vendor: str = ""
    sources: dict[str, str] = field(default_factory=dict)
    measured: bool = False
    model: str = ""          # full marketing/OS model string, e.g. "AMD EPYC 7763 64-Core Processor"
    mem_gb: float = 0.0      # device memory (GPU) or RAM (CPU), GiB
    aliases: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. copy vs triad bandwidth, GEMM backend

    def __post_init__(self) -> None:
        if self.kind not in ("cpu", "gpu"):
            raise TensorplanError(f"device '{self.name}': field 'kind' must be 'cpu' or 'gpu', got {self.kind!r}")
        self.isa = sorted({str(f).lower() for f in self.isa})

    # ---- identity -------------------------------------------------------------------------
    def key(self) -> str:
        """sha256 of the canonical JSON of the identity fields (not of clock or throughput figures)."""
        ident = {k: getattr(self, k) for k in _IDENTITY_FIELDS}
        blob = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=_json_default)
        return hashlib.sha256(blob.encode()).hexdigest()

    # ---- (de)serialisation ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=_json_default))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DeviceSpec":
        known = {f.name for f in fields(cls)}
        missing = [k for k in ("name", "kind", "cores", "threads", "clock_ghz", "peak_fp32_gflops", "mem_bw_gbs")
                   if k not in d]
        if missing:
            raise TensorplanError(f"device spec {d.get('name', '?')!r} lacks field(s) {missing}; "
                                  "write them (see DeviceSpec in tensorplan.devices.spec)")
        return cls(**{k: v for k, v in d.items() if k in known})

    def save(self, path: str | Path) -> Path:
        """Write this spec as JSON (what `tensorplan.device(path)` reads back): a device measured
        once, or written by hand from a datasheet, can be named by its file."""
        from tensorplan.paths import atomic_write
        path = Path(path)
        atomic_write(path, (json.dumps(self.to_dict(), indent=1) + "\n").encode())
        return path

    @classmethod
    def load(cls, path: str | Path) -> "DeviceSpec":
        """A spec saved by `save` (or written by hand with the same fields)."""
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise TensorplanError(f"device spec file '{path}' does not exist") from None
        except (OSError, ValueError) as e:
            raise TensorplanError(f"device spec file '{path}' is not readable JSON: {e}") from None
        if not isinstance(d, dict):
            raise TensorplanError(f"device spec file '{path}' does not hold a JSON object (one DeviceSpec)")
        return cls.from_dict(d)

    # ---- derived numbers ------------------------------------------------------------------
    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity at which the roofline turns from memory- to compute-bound."""
        return self.peak_fp32_gflops / self.mem_bw_gbs if self.mem_bw_gbs > 0 else 0.0

    def feature_vector(self) -> np.ndarray:
        """Fixed-length float32 vector in FEATURE_NAMES order (log-scaled so devices 1000x apart stay comparable)."""
        peak, bw = max(self.peak_fp32_gflops, 0.0), max(self.mem_bw_gbs, 0.0)
        v = [
            1.0 if self.kind == "gpu" else 0.0,
            math.log2(1 + self.cores),
            math.log10(1 + self.threads),
            float(self.clock_ghz),
            math.log10(1 + peak),
            math.log10(1 + bw),
            math.log10(1 + self.ridge_flop_per_byte),
            math.log10(1 + self.l1_kb),
            math.log10(1 + self.l2_kb),
            math.log10(1 + self.l3_kb),
            math.log2(1 + peak / max(self.cores, 1)),
            *(1.0 if f in self.isa else 0.0 for f in ISA_FLAGS),
        ]
        return np.asarray(v, dtype=np.float32)

    def short(self) -> str:
        """One line for tables and logs."""
        return (f"{self.name}: {self.kind} {self.cores}c/{self.threads}t @{self.clock_ghz:.2f} GHz, "
                f"{self.peak_fp32_gflops:.0f} GFLOP/s, {self.mem_bw_gbs:.1f} GB/s"
                + (" (measured)" if self.measured else ""))


def _natural(name: str) -> tuple[str, Callable[[float], float]]:
    """A feature's name and value in natural units: 'log10_mem_bw_gbs' -> ('mem_bw_gbs', 10**v - 1)."""
    base = 10.0 if name.startswith("log10_") else 2.0 if name.startswith("log2_") else None
    if base is None:
        return name, lambda v: v
    return name.split("_", 1)[1], lambda v: base ** v - 1


def feature_differences(a, b, rtol: float = 0.05) -> list[str]:
    """The entries of two device feature vectors that differ by more than `rtol`, in natural units
    ("mem_bw_gbs 90.6 -> 40"): why a model that learnt one device treats the other as new."""
    out = []
    for name, x, y in zip(FEATURE_NAMES, np.asarray(a, float), np.asarray(b, float)):
        if np.isclose(x, y, rtol=rtol):
            continue
        label, show = _natural(name)
        out.append(f"{label} {show(x):.3g} -> {show(y):.3g}")
    return out


# the throughput and cache figures a model scales its predictions by; counts and flags are left out
RANGE_FEATURES = ("clock_ghz", "log10_peak_gflops", "log10_mem_bw_gbs", "log10_ridge_flop_per_byte",
                  "log10_l2_kb", "log10_l3_kb", "log2_gflops_per_core")


def features_outside(learnt, here, rtol: float = 0.05) -> list[str]:
    """The throughput/cache figures of `here` that lie outside the range of the `learnt` device vectors
    of the same kind (CPU or GPU) by more than `rtol`, in natural units ("mem_bw_gbs 13 (learnt
    31.5-89.5)"): where a model extrapolates, and a zero-shot prediction is least trustworthy."""
    here = np.asarray(here, float)
    gpu = FEATURE_NAMES.index("is_gpu")
    rows = [np.asarray(v, float) for v in learnt]
    rows = [v for v in rows if v[gpu] == here[gpu]]
    if not rows:
        return []
    learnt_arr = np.stack(rows)
    out = []
    for name in RANGE_FEATURES:
        i = FEATURE_NAMES.index(name)
        label, show = _natural(name)
        lo, hi, y = show(learnt_arr[:, i].min()), show(learnt_arr[:, i].max()), show(here[i])
        if y < lo * (1 - rtol) or y > hi * (1 + rtol):
            out.append(f"{label} {y:.3g} (learnt {lo:.3g}-{hi:.3g})")
    return out


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")
