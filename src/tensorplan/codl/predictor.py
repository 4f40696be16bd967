"""CoDL-style latency predictor and its two baselines, behind one estimator interface.

CoDL (MobiSys'22) predicts a kernel's latency as ``n_units × t_unit``: the number of
basic units on the busiest core is *analytic* (block sizes, thread tiling, warps),
so the staircase non-linearity of real kernels is captured exactly, and only
``t_unit`` is learned, as a tiny linear model on a few shape features per kernel
class (processor, kind, K, S). Co-execution latency adds data-sharing terms
(transform and map, each linear in bytes) and a measured sync constant.

Baselines, trained on the same samples:
  * `FlopsLinear` — µLayer-like: latency linear in FLOPs, one model per processor (8 B).
  * `RandomForestPredictor` — nn-Meter-style random forest per (processor, kind).

Every estimator has the same face: ``fit(samples) -> self``, ``predict(samples) ->
np.ndarray`` (seconds), ``save(path)``, ``load(path)`` (classmethod), ``nbytes()``.

Unit formulas live here too (pure functions): `units_onednn` for this CPU's
oneDNN kernels, `units_cuda` for cuDNN-like implicit GEMM, and the MACE formulas
(`mace_cpu_units`, `mace_gpu_units`) for the paper's mobile processors, used by
the SoC simulator.
"""
from __future__ import annotations

import json
import pickle
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from tensorplan.errors import TensorplanError

# --------------------------------------------------------------------------------------
# Operator shapes
# --------------------------------------------------------------------------------------

KINDS = ("conv", "pool", "fc")


@dataclass(frozen=True)
class OpShape:
    """One partitionable operator (or one processor's part of it), batch 1, fp32.

    Heights/widths are of the *unpadded* input; ``pt, pb, pl, pr`` are the zero (or,
    for max-pooling, -inf) pads. For ``fc``: ``ic`` = input features, ``oc`` = outputs,
    ``ih = iw = k = s = 1``.
    """

    kind: str
    ih: int
    iw: int
    ic: int
    oc: int
    k: int = 1
    s: int = 1
    pt: int = 0
    pb: int = 0
    pl: int = 0
    pr: int = 0
    pool: str = "max"  # "max" | "avg" (pool only)
    g: int = 1         # conv groups: 1 or depthwise (g == ic == oc)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise TensorplanError(f"OpShape.kind must be one of {KINDS}, got {self.kind!r}")
        if min(self.ih, self.iw, self.ic, self.oc, self.k, self.s) < 1:
            raise TensorplanError(f"OpShape has a non-positive dimension: {self}")
        if self.kind != "fc" and (self.ih + self.pt + self.pb < self.k or self.iw + self.pl + self.pr < self.k):
            raise TensorplanError(f"OpShape input {self.ih}x{self.iw} (+pads) is smaller than kernel {self.k}")
        if self.g != 1 and not (self.kind == "conv" and self.g == self.ic == self.oc):
            raise TensorplanError(f"OpShape: only dense (g=1) or depthwise (g=ic=oc) convs, got {self}")

    @property
    def per_channel(self) -> bool:
        """Each output channel reads only its own input channel (pooling, depthwise conv)."""
        return self.kind == "pool" or self.g > 1

    @property
    def oh(self) -> int:
        return (self.ih + self.pt + self.pb - self.k) // self.s + 1

    @property
    def ow(self) -> int:
        return (self.iw + self.pl + self.pr - self.k) // self.s + 1

    @property
    def flops(self) -> int:
        """2×MACs for conv/fc; one op per window element for pooling."""
        if self.kind == "conv":
            return 2 * self.oh * self.ow * self.oc * (self.ic // self.g) * self.k * self.k
        if self.kind == "fc":
            return 2 * self.ic * self.oc
        return self.oh * self.ow * self.oc * self.k * self.k

    @property
    def in_bytes(self) -> int:
        return 4 * self.ih * self.iw * self.ic

    @property
    def out_bytes(self) -> int:
        return 4 * self.oh * self.ow * self.oc

    @property
    def params(self) -> int:
        if self.kind == "conv":
            return self.oc * (self.ic // self.g) * self.k * self.k + self.oc
        if self.kind == "fc":
            return self.oc * self.ic + self.oc
        return 0

    def replace(self, **kw) -> "OpShape":
        d = asdict(self)
        d.update(kw)
        return OpShape(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "OpShape":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def short(self) -> str:
        if self.kind == "fc":
            return f"fc<{self.ic}->{self.oc}>"
        kind = "dwconv" if self.g > 1 else self.kind
        return f"{kind}<{self.ih},{self.iw},{self.ic},{self.oc}>k{self.k}s{self.s}"


@dataclass
class KernelSample:
    """One measured (or to-be-predicted) kernel execution: `op` (a part) on `proc`."""

    op: OpShape
    proc: str
    latency_s: float = float("nan")
    cov: float = 0.0
    spread: float = 0.0  # (2nd fastest − fastest) / fastest repeat: is the minimum reproducible?
    model: str = ""      # zoo model the full operator came from (for leave-one-model-out)
    dim: str = ""        # partition dimension of the part ("H" | "OC" | "")
    ratio: float = 1.0   # share of the full op this part is

    def to_dict(self) -> dict:
        d = asdict(self)
        d["op"] = self.op.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "KernelSample":
        d = dict(d)
        d["op"] = OpShape.from_dict(d["op"])
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def _roundup(a: int, b: int) -> int:
    return _cdiv(a, b) * b


# --------------------------------------------------------------------------------------
# Basic-unit formulas
# --------------------------------------------------------------------------------------

# This CPU: oneDNN (AVX-512 fp32) blocks output channels by 16 (one zmm of fp32) and the
# output width by a register tile; work items (oc-block, output row) are spread over the
# threads; a basic unit is one (16 oc × WBLK ow) register tile reduced over IC·K².
ONEDNN = {"cblk": 16, "wblk": 8, "threads": 1}


def units_onednn(op: OpShape, threads: int = 1, cblk: int = 16, wblk: int = 8) -> tuple[int, dict]:
    """(units on the busiest thread, unit descriptors) for oneDNN conv/pool/fc."""
    if op.kind == "fc":
        items = _cdiv(op.oc, cblk)
        per_thread = _cdiv(items, threads)
        return per_thread * _cdiv(op.ic, 64), {"wtile": 64}
    ocb = _cdiv(op.oc, cblk)
    items = ocb * op.oh
    per_thread = _cdiv(items, threads)
    nwb = _cdiv(op.ow, wblk)
    return per_thread * nwb, {"wtile": op.ow / nwb}


def units_cuda(op: OpShape, sms: int = 132, tile_m: int = 128, tile_n: int = 64, tile_k: int = 32
               ) -> tuple[int, dict]:
    """Implicit-GEMM conv on a CUDA GPU: waves of CTAs × k-steps per CTA.

    M = OH·OW (output pixels), N = OC, K = IC·K²; one CTA computes a tile_m × tile_n
    output tile; a basic unit is one k-step of one wave."""
    if op.kind == "pool":
        m, n, kk = op.oh * op.ow, op.oc, op.k * op.k
        ctas = _cdiv(m * n, 256)
        return _cdiv(ctas, sms * 8) * max(1, kk // 4), {"wtile": 256}
    if op.kind == "fc":
        m, n, kk = 1, op.oc, op.ic
    else:
        m, n, kk = op.oh * op.ow, op.oc, op.ic * op.k * op.k
    ctas = _cdiv(m, tile_m) * _cdiv(n, tile_n)
    waves = _cdiv(ctas, sms)
    return waves * _cdiv(kk, tile_k), {"wtile": min(m, tile_m)}


# ---- MACE (the paper's runtime) — used by the SoC simulator ------------------------------

def _tiling1d(items: int, threads: int) -> tuple[int, int]:
    dtc = threads * 2 if threads > 1 else 1
    tile = max(1, items // dtc)
    tile_count = _cdiv(items, tile)
    return tile, _cdiv(tile_count, threads)


def _tiling2d(n: int, step: int, threads: int) -> tuple[int, int]:
    dtc = threads * 2 if threads > 1 else 1
    items1 = _cdiv(n, step)
    tile1 = max(1, items1 // dtc)
    return tile1, _cdiv(_cdiv(items1, tile1), threads)


def mace_cpu_algo(op: OpShape) -> str:
    """MACE's CPU conv algorithm choice (`GetConv2dCpuImplType`)."""
    if op.kind != "conv":
        return op.kind
    if op.g > 1:
        return "depthwise"
    if op.k == 1 and op.s == 1:
        return "gemm"
    if op.k == 3 and op.s == 1 and op.ic >= 8 and op.oc >= 8:
        return "winograd"
    return "direct"


def mace_cpu_units(op: OpShape, threads: int = 4) -> dict[str, int]:
    """Sub-kernel → units on the busiest thread for MACE's ARM NEON fp32 kernels (reference §1.3)."""
    algo = mace_cpu_algo(op)
    if algo == "depthwise":
        tile, mt = _tiling2d(op.oc, 4, threads)
        return {"depthwise": mt * tile * 4 * op.oh * op.ow * (2 * op.k * op.k + 1)}
    if algo == "direct":
        opi = 2 if (op.k == 3 and op.s == 1) else (1 if (op.k == 3 and op.s == 2) else 4)
        tile, mt = _tiling2d(op.oc, opi, threads)
        flops_per_oc = op.oh * op.ow * (2 * op.k * op.k * op.ic + 1)
        return {"direct": mt * tile * opi * flops_per_oc}
    if algo == "gemm":
        m, k, n = op.oc, op.ic, op.ih * op.iw
        mb, nb, kb = _cdiv(m, 8), _cdiv(n, 8), _cdiv(k, 4)
        t, mtt = _tiling1d(mb, threads)
        t2, mtt2 = _tiling1d(nb, threads)
        return {"gemm_pack_rhs": t2 * mtt2 * kb, "gemm_comp": t * mtt * kb * nb}
    if algo == "winograd":
        ot = 6 if (op.ih > 16 and op.iw > 16) else 2
        poh, pow_ = _roundup(op.oh, ot), _roundup(op.ow, ot)
        tiles = poh * pow_ // (ot * ot)
        ti, mti = _tiling2d(op.ic, 1, threads)
        to, mto = _tiling2d(op.oc, 1, threads)
        mb, nb, kb = _cdiv(op.oc, 8), _cdiv(tiles, 8), _cdiv(op.ic, 4)
        t, mtt = _tiling1d(mb, threads)
        return {f"wino{ot}_tr_in": ti * mti * tiles, f"wino{ot}_gemm": t * mtt * nb * kb * (ot + 2) ** 2,
                f"wino{ot}_tr_out": to * mto * tiles}
    if algo == "fc":
        hb, wb = _cdiv(op.oc, 4), _cdiv(op.ih * op.iw * op.ic, 8)
        t, mt = _tiling2d(hb, 1, threads)
        return {"gemv": t * mt * wb}
    # pooling: a single size feature, spread over threads
    return {"pool": _cdiv(op.ih * op.iw * op.ic, threads)}


def _lws_k3(gws, kwg, cache, cu, kcache):
    base = min(max(cache // 16384, 1), 4)
    l1 = min(gws[1], kwg)
    l0 = min(gws[0], base, max(kwg // l1, 1))
    l2 = min(_roundup(max(cache // kcache // (l0 * l1) // max(cu // 2, 1), 0), base), gws[2])
    if l2 == 0:
        l2 = min(gws[2], base)
    l2 = max(min(l2, kwg // (l0 * l1)), 1)
    return [l0, l1, l2]


def _lws_k1(gws, kwg, cache, cu, kcache):
    base = max(cache // 16384, 1)
    l1 = min(gws[1], kwg)
    if l1 >= base:
        l0 = min(gws[0], base)
    elif 1 < l1 < base and gws[0] >= 128:
        l0 = min(gws[0], base)
    else:
        l0 = gws[0] // 8
        if l0 < base:
            l0 = max(gws[0] // 4, base)
    l0 = max(min(l0, kwg // l1), 1)
    l2 = min((cache // kcache // (l0 * l1) // cu) * 8, gws[2])
    if l2 == 0:
        l2 = min(gws[2], min(base, 4))
    l2 = max(min(l2, kwg // (l0 * l1)), 1)
    return [l0, l1, l2]


def _lws_general(gws, kwg, cache, cu, kcache, k):
    base = min(max(cache // 16384, 1), 4)
    l1 = min(gws[1], kwg)
    l0 = gws[0] // 4 or gws[0]
    l0 = max(min(l0, kwg // l1), 1)
    l2 = min((cache // kcache // k // (l0 * l1) // cu) * 8, gws[2])
    if l2 == 0:
        l2 = gws[2] if gws[2] < 20 else base
    l2 = max(min(l2, kwg // (l0 * l1)), 1)
    return [l0, l1, l2]


def _n_warp(gws, lws, cu, warp):
    wgs = _cdiv(int(np.prod(gws)), int(np.prod(lws)))
    return _cdiv(wgs, cu) * _cdiv(int(np.prod(lws)), warp)


def mace_gpu_units(op: OpShape, cu: int, warp: int, kwg: int, cache: int, adreno: bool = True
                   ) -> dict[str, int]:
    """Sub-kernel → units for MACE's OpenCL image kernels (direct conv, FC, pooling)."""
    if op.kind == "conv" and op.g > 1:
        gws = [_cdiv(op.oc, 4), _cdiv(op.ow, 4), op.oh]
        lws = _lws_general(gws, kwg, cache, cu, (4 + 4 + 4) * 16, op.k)
        return {f"gpu_depthwise_k{op.k}": _n_warp(gws, lws, cu, warp) * op.k * op.k}
    if op.kind == "conv":
        owblk = 4 if op.k == 1 else (5 if op.k == 3 else 4)
        owb, icb, ocb = _cdiv(op.ow, owblk), _cdiv(op.ic, 4), _cdiv(op.oc, 4)
        gws = [ocb, owb, op.oh]
        kcache = (owblk + 4 + owblk) * 16
        if op.k == 1:
            lws = _lws_k1(gws, kwg, cache, cu, kcache)
        elif op.k == 3:
            lws = _lws_k3(gws, kwg, cache, cu, kcache)
        else:
            lws = _lws_general(gws, kwg, cache, cu, kcache, op.k)
        return {f"gpu_direct_k{op.k}": _n_warp(gws, lws, cu, warp) * icb}
    if op.kind == "fc":
        ocb, icb = _cdiv(op.oc, 4), _cdiv(op.ic, 4)
        gws = [4, warp // 4 if adreno else 8, ocb]
        lws = [gws[0], gws[1], max(kwg // (gws[0] * gws[1]), 1)]
        # our fc input is flattened to (1, 1, IC): IH = IW = 1
        iwb_size = _cdiv(1, gws[1])
        blocks = icb if iwb_size == 1 else iwb_size * icb
        return {"gpu_fc": _n_warp(gws, lws, cu, warp) * blocks}
    gws = [_cdiv(op.oc, 4), op.ow, op.oh]
    return {"gpu_pool": _n_warp(gws, [min(gws[0], 4), min(gws[1], 16), 1], cu, warp) * op.k * op.k}


# --------------------------------------------------------------------------------------
# Tiny linear model (CoDL's stored form: means, stds, coefs, intercept)
# --------------------------------------------------------------------------------------

@dataclass
class LinearModel:
    """``y = Σ (x_i − mean_i)/std_i · coef_i + inter`` (CoDL's stored JSON form)."""

    features: list[str]
    means: list[float]
    stds: list[float]
    coefs: list[float]
    inter: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        z = (x - np.asarray(self.means)) / np.asarray(self.stds)
        return z @ np.asarray(self.coefs) + self.inter

    @classmethod
    def fit(cls, features: list[str], x: np.ndarray, y: np.ndarray, relative: bool = True,
            ridge: float = 1e-6) -> "LinearModel":
        """Closed-form (weighted) least squares on z-scored features; `relative` weights
        each row by 1/y so the fit minimises relative error (what ±10% accuracy scores)."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        y = np.asarray(y, dtype=np.float64)
        mean, std = x.mean(0), x.std(0)
        std[std == 0] = 1.0
        z = (x - mean) / std
        a = np.hstack([z, np.ones((len(z), 1))])
        w = 1.0 / np.maximum(np.abs(y), 1e-30) if relative else np.ones_like(y)
        w = w / w.mean()
        aw, yw = a * w[:, None], y * w
        scale = float(np.abs(yw).mean()) or 1.0  # solve in O(1) units, then scale back
        theta, *_ = np.linalg.lstsq(aw, yw / scale, rcond=None)
        theta = theta * scale
        return cls(list(features), mean.tolist(), std.tolist(), theta[:-1].tolist(), float(theta[-1]))

    def nbytes(self) -> int:
        """Bytes as CoDL stores it on the device: fp32 means, stds, coefs and intercept."""
        return 4 * (3 * len(self.features) + 1)

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------
# Processor descriptions for measured devices
# --------------------------------------------------------------------------------------

# The two "processors" of this CPU-only machine (each one core, one thread) and a CUDA GPU.
# `layout` is the layout that processor runs fastest with; the tensors' home is the
# second processor's layout (CoDL keeps them in the GPU-friendly type).
PROCESSORS: dict[str, dict[str, Any]] = {
    "cpu": {"family": "onednn", "layout": "nchw", "threads": 1, "cblk": 16, "wblk": 8},
    "cpu2": {"family": "onednn", "layout": "nhwc", "threads": 1, "cblk": 16, "wblk": 8},
    "cuda": {"family": "cuda", "layout": "nhwc", "sms": 132},
}


def processor(name: str) -> dict[str, Any]:
    try:
        return PROCESSORS[name]
    except KeyError:
        raise TensorplanError(f"unknown processor '{name}'; known: {', '.join(PROCESSORS)}") from None


def units_for(op: OpShape, proc: str) -> tuple[int, dict]:
    p = processor(proc)
    if p["family"] == "onednn":
        return units_onednn(op, p["threads"], p["cblk"], p["wblk"])
    return units_cuda(op, p.get("sms", 132))


def channel_block(proc: str) -> int:
    """Output-channel split granularity of a processor (oneDNN: 16 fp32 lanes; GPUs: 4 per texel)."""
    p = processor(proc)
    return p.get("cblk", 4) if p["family"] == "onednn" else 4


# --------------------------------------------------------------------------------------
# Estimators
# --------------------------------------------------------------------------------------

def explicit_pad_bytes(op: OpShape) -> int:
    """Bytes of the padded input copy a part's kernel makes before computing (0 if none).

    torch/oneDNN convolutions take only symmetric padding, so an H-split part with uneven pads
    (its halo side has none) is padded by an explicit copy; pooling pads by copy whenever it pads
    (max-pooling pads with -inf). `codl_data.PartKernel` decides with this same function."""
    if op.kind == "fc":
        return 0
    symmetric = op.pt == op.pb and op.pl == op.pr
    needs_copy = bool(op.pt or op.pb or op.pl or op.pr) if op.kind == "pool" else not symmetric
    return 4 * (op.ih + op.pt + op.pb) * (op.iw + op.pl + op.pr) * op.ic if needs_copy else 0


def kernel_class(op: OpShape) -> str:
    """The per-implementation class a t_unit model is learned for (a kernel that first copies its
    input to pad it is a different implementation: suffix ``_pad``)."""
    if op.kind == "fc":
        return "fc"
    kind = "dw" if op.g > 1 else op.kind
    return f"{kind}_k{op.k}s{op.s}" + ("_pad" if explicit_pad_bytes(op) else "")


def _codl_features(op: OpShape, units: int, info: dict) -> tuple[list[str], list[float]]:
    """Shape features of t_unit. `inv_units` lets the intercept-per-op (dispatch cost) be
    expressed in the per-unit form (t·units = a·units + … + c); the bytes-per-unit terms carry
    the layout reorders oneDNN does around the compute, the explicit pad copy, and (for
    per-channel ops, which are memory-bound) `inv_cblocks` the per-pixel overhead that a
    16-channel vector amortises only when there are many channels."""
    per_unit = [op.in_bytes / units, op.out_bytes / units, explicit_pad_bytes(op) / units]
    io = ["in_bytes_pu", "out_bytes_pu", "pad_bytes_pu"]
    if op.kind == "conv" and op.g == 1:
        return (["ic", "wtile", "ic_x_wtile", "iw_ic", "inv_units", *io],
                [op.ic, info["wtile"], op.ic * info["wtile"], op.iw * op.ic, 1.0 / units, *per_unit])
    if op.kind in ("pool", "conv"):  # pooling and depthwise conv: per-channel windows
        return (["wtile", "k2", "iw", "inv_units", *io, "inv_cblocks"],
                [info["wtile"], op.k * op.k, op.iw, 1.0 / units, *per_unit, 1.0 / _cdiv(op.oc, 16)])
    return (["ic", "oc", "inv_units", *io], [op.ic, op.oc, 1.0 / units, *per_unit])


def _kernel_samples(samples: Iterable[KernelSample]) -> list[KernelSample]:
    out = [s for s in samples if np.isfinite(s.latency_s) and s.latency_s > 0]
    if not out:
        raise TensorplanError("no samples with a positive measured latency to fit on")
    return out


POOLED = ("conv", "dwconv", "pool", "fc")


def _pool_key(op: OpShape) -> str:
    """Fallback model key pooling every K, S of one op kind."""
    return "dwconv" if op.g > 1 else op.kind


class CodlPredictor:
    """CoDL-style kernel predictor: analytic units × linear t_unit per (proc, class).

    Classes with fewer than `min_class_samples` training rows fall back to a model
    pooled over the processor and op kind (reported in `fallbacks`)."""

    name = "codl"

    def __init__(self, min_class_samples: int = 8):
        self.min_class_samples = min_class_samples
        self.models: dict[str, LinearModel] = {}
        self.fallbacks: list[str] = []

    @staticmethod
    def _key(proc: str, cls: str) -> str:
        return f"{proc}/{cls}"

    def fit(self, samples: Sequence[KernelSample]) -> "CodlPredictor":
        samples = _kernel_samples(samples)
        groups: dict[str, list[tuple[list[float], float]]] = {}
        feats: dict[str, list[str]] = {}
        for s in samples:
            n, info = units_for(s.op, s.proc)
            names, x = _codl_features(s.op, n, info)
            for key in (self._key(s.proc, kernel_class(s.op)), self._key(s.proc, _pool_key(s.op))):
                groups.setdefault(key, []).append((x, s.latency_s / n))
                feats[key] = names
        self.models = {}
        for key, rows in groups.items():
            is_pooled = key.split("/")[1] in POOLED
            if not is_pooled and len(rows) < self.min_class_samples:
                continue
            x = np.array([r[0] for r in rows])
            y = np.array([r[1] for r in rows])
            self.models[key] = LinearModel.fit(feats[key], x, y)
        return self

    def unit_time(self, op: OpShape, proc: str) -> tuple[int, float]:
        n, info = units_for(op, proc)
        _, x = _codl_features(op, n, info)
        key = self._key(proc, kernel_class(op))
        m = self.models.get(key) or self.models.get(self._key(proc, _pool_key(op)))
        if m is None:
            raise TensorplanError(f"CodlPredictor has no model for {proc}/{kernel_class(op)}; "
                                  "fit it on samples of that processor and op kind")
        return n, float(m(np.array(x))[0])

    def kernel_time(self, op: OpShape, proc: str) -> float:
        """Predicted seconds of `op` (a part) alone on `proc`."""
        n, t = self.unit_time(op, proc)
        return max(n * t, 1e-7)

    def predict(self, samples: Sequence[KernelSample]) -> np.ndarray:
        return np.array([self.kernel_time(s.op, s.proc) for s in samples])

    def nbytes(self) -> int:
        return sum(m.nbytes() for m in self.models.values())

    def to_dict(self) -> dict:
        return {"type": self.name, "min_class_samples": self.min_class_samples,
                "models": {k: m.to_dict() for k, m in self.models.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> "CodlPredictor":
        p = cls(d.get("min_class_samples", 8))
        p.models = {k: LinearModel(**m) for k, m in d["models"].items()}
        return p

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "CodlPredictor":
        return cls.from_dict(_read_json(path, cls.name))


class FlopsLinear:
    """µLayer-like baseline: ``T = a·FLOPs + b`` per processor (two fp32 numbers = 8 B)."""

    name = "flops-lr"

    def __init__(self):
        self.coef: dict[str, tuple[float, float]] = {}

    def fit(self, samples: Sequence[KernelSample]) -> "FlopsLinear":
        samples = _kernel_samples(samples)
        by_proc: dict[str, list[KernelSample]] = {}
        for s in samples:
            by_proc.setdefault(s.proc, []).append(s)
        for proc, rows in by_proc.items():
            f = np.array([s.op.flops for s in rows], dtype=np.float64)
            y = np.array([s.latency_s for s in rows])
            a = np.stack([f, np.ones_like(f)], 1)
            theta, *_ = np.linalg.lstsq(a, y, rcond=None)  # plain least squares, as µLayer
            self.coef[proc] = (float(theta[0]), float(theta[1]))
        return self

    def kernel_time(self, op: OpShape, proc: str) -> float:
        if proc not in self.coef:
            raise TensorplanError(f"FlopsLinear has no model for processor '{proc}'")
        a, b = self.coef[proc]
        return max(a * op.flops + b, 1e-7)

    def predict(self, samples: Sequence[KernelSample]) -> np.ndarray:
        return np.array([self.kernel_time(s.op, s.proc) for s in samples])

    def nbytes(self) -> int:
        return 8 * len(self.coef)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"type": self.name, "coef": self.coef}))

    @classmethod
    def load(cls, path: str | Path) -> "FlopsLinear":
        d = _read_json(path, cls.name)
        p = cls()
        p.coef = {k: tuple(v) for k, v in d["coef"].items()}
        return p


# nn-Meter's selected hyper-parameters for CPU predictors (max_depth, n_estimators, max_features)
NNMETER_RF = {"conv": (70, 320, 6), "dwconv": (50, 240, 6), "fc": (50, 370, 2), "pool": (70, 320, 5)}


def _rf_kind(op: OpShape) -> str:
    return "dwconv" if op.g > 1 else op.kind


def _rf_features(op: OpShape) -> list[float]:
    if op.kind == "conv":
        return [op.ih * op.iw, op.ih, op.iw, op.ic, op.oc, op.k, op.s, op.flops / 2e6, op.params / 1e6,
                float(op.g > 1)]
    if op.kind == "fc":
        return [op.ic, op.oc, op.flops / 2e6, op.flops / 1e6]
    return [op.ih * op.iw, op.ih, op.iw, op.ic, op.oc, op.k, op.s]


class RandomForestPredictor:
    """nn-Meter-style baseline: one sklearn RandomForestRegressor per (processor, op kind),
    with nn-Meter's CPU hyper-parameters and features (plus IH, IW separately, since
    partition parts are not square)."""

    name = "nnmeter-rf"

    def __init__(self, n_estimators: int | None = None, seed: int = 10):
        self.n_estimators = n_estimators
        self.seed = seed
        self.forests: dict[str, Any] = {}

    def fit(self, samples: Sequence[KernelSample]) -> "RandomForestPredictor":
        from sklearn.ensemble import RandomForestRegressor

        samples = _kernel_samples(samples)
        groups: dict[str, list[KernelSample]] = {}
        for s in samples:
            groups.setdefault(f"{s.proc}/{_rf_kind(s.op)}", []).append(s)
        for key, rows in groups.items():
            depth, n_est, max_feat = NNMETER_RF[key.split("/")[1]]
            x = np.array([_rf_features(s.op) for s in rows])
            y = np.array([s.latency_s for s in rows])
            rf = RandomForestRegressor(n_estimators=self.n_estimators or n_est, max_depth=depth,
                                       max_features=min(max_feat, x.shape[1]), min_samples_leaf=1,
                                       min_samples_split=2, random_state=self.seed, n_jobs=1)
            self.forests[key] = rf.fit(x, y)
        return self

    def predict(self, samples: Sequence[KernelSample]) -> np.ndarray:
        out = np.empty(len(samples))
        idx: dict[str, list[int]] = {}
        for i, s in enumerate(samples):
            idx.setdefault(f"{s.proc}/{_rf_kind(s.op)}", []).append(i)
        for key, ii in idx.items():
            if key not in self.forests:
                raise TensorplanError(f"RandomForestPredictor has no forest for '{key}'")
            out[ii] = self.forests[key].predict(np.array([_rf_features(samples[i].op) for i in ii]))
        return out

    def kernel_time(self, op: OpShape, proc: str) -> float:
        return float(self.predict([KernelSample(op, proc)])[0])

    def nbytes(self) -> int:
        return len(pickle.dumps(self.forests, protocol=pickle.HIGHEST_PROTOCOL))

    # No save/load: sklearn forests persist only through pickle, which runs code from the file;
    # this baseline is refitted from data/codl/ in seconds wherever it is compared.


def _read_json(path: str | Path, kind: str) -> dict:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise TensorplanError(f"cannot read model file {path}: {e}") from None
    if d.get("type") != kind:
        raise TensorplanError(f"{path}: model type {d.get('type')!r}, expected {kind!r}")
    return d


# --------------------------------------------------------------------------------------
# Data-sharing model
# --------------------------------------------------------------------------------------

SHARING_TERMS = ("map_in", "trans_in", "trans_out", "map_out")


@dataclass
class SharingModel:
    """Each sharing term ``T = a + b·bytes`` (clamped ≥ 0) and a constant sync cost."""

    terms: dict[str, tuple[float, float]] = field(default_factory=dict)
    sync_s: float = 0.0

    def fit(self, rows: Sequence[dict]) -> "SharingModel":
        """rows: {"term": one of SHARING_TERMS or "sync", "bytes": int, "latency_s": float}."""
        for term in SHARING_TERMS:
            r = [(x["bytes"], x["latency_s"]) for x in rows if x["term"] == term]
            if len(r) < 2:
                raise TensorplanError(f"sharing fit needs ≥2 '{term}' measurements, got {len(r)}")
            b = np.array([v[0] for v in r], dtype=np.float64)
            y = np.array([v[1] for v in r])
            a = np.stack([np.ones_like(b), b], 1) / y[:, None]  # relative-error least squares
            theta, *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
            self.terms[term] = (float(theta[0]), float(theta[1]))
        syncs = [x["latency_s"] for x in rows if x["term"] == "sync"]
        if not syncs:
            raise TensorplanError("sharing fit needs 'sync' measurements")
        self.sync_s = float(np.median(syncs))
        return self

    def time(self, term: str, nbytes: int) -> float:
        if nbytes <= 0:
            return 0.0
        a, b = self.terms[term]
        return max(a + b * nbytes, 0.0)

    def to_dict(self) -> dict:
        return {"terms": self.terms, "sync_s": self.sync_s}

    @classmethod
    def from_dict(cls, d: dict) -> "SharingModel":
        return cls({k: tuple(v) for k, v in d["terms"].items()}, float(d["sync_s"]))

    def nbytes(self) -> int:
        return 4 * (2 * len(self.terms) + 1)


# --------------------------------------------------------------------------------------
# Evaluation harness (one protocol for every estimator)
# --------------------------------------------------------------------------------------

def accuracy_metrics(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """±5/±10% accuracy (share of samples) and RMSPE, as CoDL/nn-Meter report them."""
    rel = (np.asarray(pred) - np.asarray(true)) / np.asarray(true)
    return {"acc10": float(np.mean(np.abs(rel) <= 0.10)), "acc5": float(np.mean(np.abs(rel) <= 0.05)),
            "rmspe": float(np.sqrt(np.mean(rel ** 2))), "n": int(len(rel))}


def evaluate(estimator, train: Sequence[KernelSample], test: Sequence[KernelSample],
             timing_samples: int = 200) -> dict[str, Any]:
    """Fit on `train`, score on `test`: accuracy, RMSPE, model bytes, fit seconds and
    µs per single prediction (one call per sample, as a planner would call it)."""
    t0 = time.perf_counter()
    estimator.fit(train)
    fit_s = time.perf_counter() - t0
    pred = estimator.predict(test)
    true = np.array([s.latency_s for s in test])
    res = accuracy_metrics(pred, true)
    sub = list(test)[:timing_samples]
    t0 = time.perf_counter()
    for s in sub:
        estimator.predict([s])
    us = (time.perf_counter() - t0) / max(len(sub), 1) * 1e6
    res.update({"estimator": estimator.name, "model_bytes": int(estimator.nbytes()), "fit_s": fit_s,
                "us_per_prediction": us, "n_train": len(train)})
    by_proc: dict[str, Any] = {}
    for proc in sorted({s.proc for s in test}):
        ii = [i for i, s in enumerate(test) if s.proc == proc]
        by_proc[proc] = accuracy_metrics(pred[ii], true[ii])
    res["by_proc"] = by_proc
    by_kind: dict[str, Any] = {}
    for kind in sorted({s.op.kind for s in test}):
        ii = [i for i, s in enumerate(test) if s.op.kind == kind]
        by_kind[kind] = accuracy_metrics(pred[ii], true[ii])
    res["by_kind"] = by_kind
    return res


def random_split(samples: Sequence[KernelSample], frac: float = 0.7, seed: int = 66
                 ) -> tuple[list[KernelSample], list[KernelSample]]:
    """CoDL's protocol: a 70/30 random split (pandas `sample(frac=0.7, random_state=66)`-like)."""
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(samples))
    cut = int(round(frac * len(samples)))
    return [samples[i] for i in idx[:cut]], [samples[i] for i in idx[cut:]]


def leave_one_model_out(samples: Sequence[KernelSample], model: str
                        ) -> tuple[list[KernelSample], list[KernelSample]]:
    """Train on every other model's shapes, test on `model`'s (less optimistic than random)."""
    return [s for s in samples if s.model != model], [s for s in samples if s.model == model]
