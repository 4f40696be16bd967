"""`FittedCost`: predicted latency for the candidates CDMPP cannot price (issue #59).

Linear kernels (ONNX Runtime MLAS convolutions and matrix products), opaque operators and region
candidates (several original operators as one ONNX Runtime / OpenVINO session) do not lower to
TIR, so CDMPP has no loop nest to read; the optimize loop still needs a number for each of them
before anything is timed, and a better one after every kernel it times. Memory kernels are
priced too, as a fallback.

Model, per kind and, for linear kernels, per op family (conv, pointwise, depthwise, grouped,
convtranspose, matmul, gemm): `log t = log prior + r(x)`, where the prior is the roofline
(`AnalyticalCost` with the device's `DeviceSpec`) and, for a region, the sum of its member
primitives' current estimates; `r` is a ridge regression on work features (log FLOPs, log bytes
moved, log primitives, log operators) fitted on the measured points. Each level shrinks to the one
above (family -> kind -> all kernels -> 0), so with no point the model *is* the roofline and a
family with two points only moves as far as two points justify. Residuals are clipped (Huber
weights) so one timing taken in another job's burst does not drag its family.

Points persist in the store under program kind `fitted_point` (payload = the features, kind,
family, canonical hash, threads; measurement = seconds), so a later run on any model starts warm;
`observe_store` also adopts the `MeasuredCost` timings (`korch_kernel`) of a model's candidates.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from tensorplan.cost import AnalyticalCost, node_flops
from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.korch.fission import category

if TYPE_CHECKING:
    from tensorplan.korch.candidates import Candidate

PROGRAM_KIND = "fitted_point"
FEATURE_VERSION = 1  # bump when `KernelFeatures` changes meaning, so old points are not mixed in
KINDS = ("memory", "linear", "opaque", "region")
LINEAR_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")


@dataclass(frozen=True)
class KernelFeatures:
    """What the regression sees of one kernel: work, size and its priors (seconds).

    `prior_s` is the roofline (for a region, the sum of its members' estimates at the time the
    point was made); `members_s` the members' sum for regions (0 otherwise). Kept in the store
    with each point because the graph the kernel came from is gone by the next run."""

    kind: str
    family: str
    flops: float
    bytes: float
    primitives: int
    operators: int
    roofline_s: float
    members_s: float = 0.0

    def vector(self) -> np.ndarray:
        """Regression inputs, centred near typical small-kernel values so the ridge's pull on the
        intercept and on the slopes is comparable."""
        return np.array([1.0, math.log1p(self.flops) / 10.0 - 1.5, math.log(max(self.bytes, 1.0)) / 10.0 - 1.2,
                         math.log(max(self.primitives, 1)), math.log(max(self.operators, 1))])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "KernelFeatures":
        return cls(kind=str(d["kind"]), family=str(d["family"]), flops=float(d["flops"]), bytes=float(d["bytes"]),
                   primitives=int(d["primitives"]), operators=int(d["operators"]),
                   roofline_s=float(d["roofline_s"]), members_s=float(d.get("members_s", 0.0)))


@dataclass(frozen=True)
class FittedPoint:
    """One measured kernel: its features and seconds (what `observe` adds and the store keeps)."""

    canonical_hash: str
    features: KernelFeatures
    seconds: float


@dataclass
class _Level:
    """One ridge model (coefficients on `KernelFeatures.vector`) and how many points it saw."""

    coef: np.ndarray
    points: int


def linear_family(prim: Graph, node) -> str:
    """Op family of a linear primitive: MLAS picks different code paths for each, so each gets its
    own correction (a depthwise conv runs far below a dense conv's FLOP rate)."""
    if node.op == "Conv":
        w = prim.tensors[node.inputs[1]].shape
        group = int(node.attrs.get("group", 1))
        if group > 1:
            cin = prim.tensors[node.inputs[0]].shape[1] if len(prim.tensors[node.inputs[0]].shape) > 1 else group
            return "depthwise" if group == cin and w[1] == 1 else "grouped"
        return "pointwise" if all(int(k) == 1 for k in w[2:]) else "conv"
    return {"ConvTranspose": "convtranspose", "MatMul": "matmul", "Gemm": "gemm"}.get(node.op, node.op.lower())


class FittedCost:
    """A KernelCost for linear, opaque and region candidates (and memory ones as a fallback), fitted
    on the kernels measured so far (module docstring). `device`: a name or `DeviceSpec` (the roofline
    prior); `store`: a `Store` or path to keep and reload points (None: in memory only); `threads`:
    the thread count the points were timed at (default: the device's)."""

    name = "fitted"
    supports_regions = True   # prices region candidates (the prior is the members' sum)

    def __init__(self, device: Any = "local", store: Any = None, threads: int | None = None, *,
                 ridge: float = 4.0, huber: float = 1.0, use_observed: bool = True):
        from tensorplan import devices
        self.spec = devices.device(device)
        self.threads = int(threads or devices.default_threads(self.spec))
        self.roofline = AnalyticalCost(self.spec)
        self.ridge = float(ridge)
        self.huber = float(huber)
        self.use_observed = bool(use_observed)
        self.store = None
        self.dev_key = ""
        if store is not None:
            from tensorplan.measure.store import Store
            self.store = store if isinstance(store, Store) else Store(store)
            self.dev_key = self.store.put_device(self.spec)
        self.points: dict[str, FittedPoint] = {}
        self._levels: dict[tuple[str, ...], _Level] = {}
        if self.store is not None:
            self._load_points()
        self.refit()

    # -- protocol -------------------------------------------------------------------------
    def cost(self, prim: Graph, cand: "Candidate") -> float:
        return self.cost_many(prim, [cand])[0]

    def cost_many(self, prim: Graph, cands: list["Candidate"], progress: bool = False) -> list[float]:
        """Seconds per candidate: the observed time where its hash was measured, else the model."""
        out = []
        singles: dict[str, float] = {}
        for c in cands:
            hit = self.points.get(c.canonical_hash) if self.use_observed else None
            if hit is not None and hit.features.kind == c.kind:
                out.append(hit.seconds)
                continue
            out.append(self.predict_features(self.features(prim, c, singles)))
        return out

    def features(self, prim: Graph, cand: "Candidate", _singles: dict[str, float] | None = None) -> KernelFeatures:
        """Work features of a candidate; for a region, its members' (primitives') current estimates
        summed into `members_s`."""
        if cand.kind not in KINDS:
            raise TensorplanError(f"FittedCost: candidate {cand.id} has kind '{cand.kind}'; expected one of "
                                  f"{', '.join(KINDS)}")
        idx = _index(prim)
        nodes = [idx[x] for x in cand.nodes]
        flops = float(sum(node_flops(prim, n) for n in nodes))
        consts = cand.const_inputs
        nbytes = float(sum(prim.tensors[i].nbytes for i in (*cand.inputs, *consts))
                       + sum(prim.tensors[o].nbytes for o in cand.outputs))
        family = cand.kind
        if cand.kind == "linear":
            lin = [n for n in nodes if category(n.op) == "linear"]
            family = linear_family(prim, lin[0]) if lin else "linear"
        operators = len(cand.source.nodes) if cand.kind == "region" and cand.source is not None else len(nodes)
        if cand.kind == "region":
            singles = _singles if _singles is not None else {}
            members = 0.0
            for n in nodes:
                if n.name not in singles:
                    singles[n.name] = self.predict_features(self._node_features(prim, n))
                members += singles[n.name]
            roof = max(flops / self.roofline.peak_flops, nbytes / self.roofline.bandwidth) + self.roofline.launch_s
            return KernelFeatures("region", "region", flops, nbytes, len(nodes), operators, roof, members)
        roof = max(flops / self.roofline.peak_flops, nbytes / self.roofline.bandwidth) + self.roofline.launch_s
        return KernelFeatures(cand.kind, family, flops, nbytes, len(nodes), operators, roof)

    def _node_features(self, prim: Graph, n) -> KernelFeatures:
        """A region member alone: what its primitive would cost as a singleton kernel."""
        cat = category(n.op)
        kind = "linear" if cat == "linear" else "memory" if cat in ("elementwise", "reduce", "layout") else "opaque"
        nbytes = float(sum(prim.tensors[i].nbytes for i in set(n.inputs) if i)
                       + sum(prim.tensors[o].nbytes for o in n.outputs if o))
        flops = float(node_flops(prim, n))
        roof = max(flops / self.roofline.peak_flops, nbytes / self.roofline.bandwidth) + self.roofline.launch_s
        family = linear_family(prim, n) if kind == "linear" else kind
        return KernelFeatures(kind, family, flops, nbytes, 1, 1, roof)

    def predict_features(self, f: KernelFeatures) -> float:
        """Seconds for a kernel with features `f` under the current fit (finite, > 0)."""
        prior = f.members_s if f.kind == "region" and f.members_s > 0 else f.roofline_s
        lev = self._level_for(f)
        r = float(lev.coef @ f.vector()) if lev is not None else 0.0
        r = min(max(r, -_CLIP), _CLIP)   # a wild extrapolation never leaves [prior/e^6, prior*e^6]
        return float(max(prior, 1e-9) * math.exp(r))

    # -- learning -------------------------------------------------------------------------
    def observe(self, prim: Graph, cand: "Candidate", seconds: float) -> FittedPoint:
        """Add a measured point (kept in the store when there is one); call `refit` to use it for
        unmeasured kernels (the observed hash itself is priced at `seconds` at once)."""
        s = float(seconds)
        if not (s > 0 and math.isfinite(s)):
            raise TensorplanError(f"FittedCost.observe: candidate {cand.id} (nodes {list(cand.nodes)[:3]}) was given "
                                  f"{seconds!r} seconds; pass the measured latency of one run (> 0, finite)")
        p = FittedPoint(cand.canonical_hash, self.features(prim, cand), s)
        self.points[p.canonical_hash] = p
        if self.store is not None:
            self._save_points([p])
        return p

    def observe_many(self, prim: Graph, pairs: Iterable[tuple["Candidate", float]]) -> int:
        """`observe` for many (candidate, seconds) pairs in one store transaction; returns how many."""
        pts = []
        singles: dict[str, float] = {}
        for c, s in pairs:
            s = float(s)
            if s > 0 and math.isfinite(s):
                pts.append(FittedPoint(c.canonical_hash, self.features(prim, c, singles), s))
        for p in pts:
            self.points[p.canonical_hash] = p
        if self.store is not None and pts:
            self._save_points(pts)
        return len(pts)

    def observe_store(self, prim: Graph, cands: Iterable["Candidate"], store: Any = None,
                      statistic: str = "min") -> int:
        """Adopt the `MeasuredCost` timings (program kind `korch_kernel`, this device and thread count)
        of those of `cands` the store already holds (default: this model's store). Why: those records
        keep no features, but with the candidates at hand the features are recomputed here."""
        from tensorplan.cost.measured import PROGRAM_KIND as MEASURED
        from tensorplan.measure.store import Store
        st = store if isinstance(store, Store) else (Store(store) if store is not None else self.store)
        if st is None:
            raise TensorplanError("FittedCost.observe_store: no store (pass store= here or to FittedCost)")
        dev = st.put_device(self.spec)
        key = "min_s" if statistic == "min" else "median_s"
        timed: dict[tuple[str, str], float] = {}
        for rec in st.measurements(kind=MEASURED, device=dev):
            pl, ex = rec["payload"], rec.get("extra") or {}
            if ex.get("failed") or int(pl.get("threads", -1)) != self.threads:
                continue
            timed[(pl.get("canonical_hash", ""), pl.get("kind", ""))] = float(rec[key])
        pairs, seen = [], set()
        for c in cands:
            s = timed.get((c.canonical_hash, c.kind))
            if s is not None and c.canonical_hash not in seen:
                seen.add(c.canonical_hash)
                pairs.append((c, s))
        return self.observe_many(prim, pairs)

    def refit(self) -> None:
        """Fit every level (all kernels, each kind, each family) on the points, each shrunk to the one
        above; with no points every level is zero (the roofline / members' sum)."""
        pts = list(self.points.values())
        dim = len(_ZERO)
        self._levels = {}
        root = self._fit([p for p in pts if p.features.kind != "region"], _ZERO)
        self._levels[()] = root
        for kind in KINDS:
            sub = [p for p in pts if p.features.kind == kind]
            base = root.coef if kind != "region" else np.zeros(dim)   # regions: their prior is another sum
            lk = self._fit(sub, base)
            self._levels[(kind,)] = lk
            for fam in sorted({p.features.family for p in sub}):
                if fam != kind:
                    self._levels[(kind, fam)] = self._fit([p for p in sub if p.features.family == fam], lk.coef)

    def _fit(self, pts: list[FittedPoint], target: np.ndarray) -> _Level:
        """Ridge toward `target` on log residuals, with Huber reweighting (3 passes)."""
        if not pts:
            return _Level(target.copy(), 0)
        X = np.stack([p.features.vector() for p in pts])
        y = np.array([math.log(p.seconds) - math.log(max(_prior(p.features), 1e-9)) for p in pts])
        w = np.ones(len(pts))
        lam = self.ridge * np.ones(X.shape[1])
        lam[0] = self.ridge / 4.0    # the intercept (a constant factor) is the cheapest thing to learn
        coef = target.copy()
        for _ in range(3):
            A = X.T @ (X * w[:, None]) + np.diag(lam)
            b = X.T @ (w * y) + lam * target
            coef = np.linalg.solve(A, b)
            res = np.abs(y - X @ coef)
            w = np.where(res <= self.huber, 1.0, self.huber / np.maximum(res, 1e-12))
        return _Level(coef, len(pts))

    def _level_for(self, f: KernelFeatures) -> _Level | None:
        return self._levels.get((f.kind, f.family)) or self._levels.get((f.kind,)) or self._levels.get(())

    # -- store ----------------------------------------------------------------------------
    def _payload(self, p: FittedPoint) -> dict[str, Any]:
        return {"canonical_hash": p.canonical_hash, "threads": self.threads, "version": FEATURE_VERSION,
                "features": p.features.to_dict()}

    def _save_points(self, pts: list[FittedPoint]) -> None:
        from tensorplan.measure.timer import Timing
        keys = self.store.put_programs([(PROGRAM_KIND, self._payload(p)) for p in pts])
        self.store.put_measurements([(k, self.dev_key, Timing.from_repeats([p.seconds], method="fitted_point"))
                                     for k, p in zip(keys, pts)])

    def _load_points(self) -> None:
        for rec in self.store.measurements(kind=PROGRAM_KIND, device=self.dev_key):
            pl = rec["payload"]
            if int(pl.get("version", -1)) != FEATURE_VERSION or int(pl.get("threads", -1)) != self.threads:
                continue
            try:
                f = KernelFeatures.from_dict(pl["features"])
            except (KeyError, TypeError, ValueError) as e:
                raise TensorplanError(f"store '{self.store.path}': fitted_point {rec['prog_key'][:12]} has no "
                                      f"valid features ({e}); delete that program or bump FEATURE_VERSION") from None
            self.points[str(pl["canonical_hash"])] = FittedPoint(str(pl["canonical_hash"]), f, float(rec["median_s"]))

    def describe(self) -> dict[str, Any]:
        """Name, device, threads and per level the points it was fitted on and its coefficients."""
        return {"name": self.name, "device": self.spec.name, "threads": self.threads, "points": len(self.points),
                "store": str(self.store.path) if self.store is not None else None,
                "levels": {"/".join(k) or "all": {"points": v.points, "coef": [round(float(x), 4) for x in v.coef]}
                           for k, v in self._levels.items()}}


_ZERO = np.zeros(5)
_CLIP = 6.0


def _prior(f: KernelFeatures) -> float:
    return f.members_s if f.kind == "region" and f.members_s > 0 else f.roofline_s


_IDX: dict[int, tuple[int, dict]] = {}


def _index(prim: Graph) -> dict:
    key = id(prim)
    hit = _IDX.get(key)
    if hit is None or hit[0] != len(prim.nodes):
        hit = (len(prim.nodes), {n.name: n for n in prim.nodes})
        _IDX[key] = hit
    return hit[1]


def log_errors(pred: Iterable[float], meas: Iterable[float]) -> dict[str, float]:
    """Accuracy of predicted vs measured seconds: MAPE, mean |log error|, Spearman rank correlation
    and the point count (what the issue's evaluation reports)."""
    p = np.asarray(list(pred), dtype=float)
    m = np.asarray(list(meas), dtype=float)
    ok = np.isfinite(p) & np.isfinite(m) & (p > 0) & (m > 0)
    p, m = p[ok], m[ok]
    if len(p) == 0:
        return {"n": 0, "mape": math.nan, "mean_abs_log": math.nan, "spearman": math.nan}
    from scipy.stats import spearmanr
    rho = float(spearmanr(p, m).statistic) if len(p) > 2 else math.nan
    return {"n": int(len(p)), "mape": float(np.mean(np.abs(p - m) / m)),
            "mean_abs_log": float(np.mean(np.abs(np.log(p / m)))), "spearman": rho}


__all__ = ["FittedCost", "FittedPoint", "KernelFeatures", "PROGRAM_KIND", "linear_family", "log_errors"]
