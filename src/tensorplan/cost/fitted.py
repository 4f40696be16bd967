"""`FittedCost`: predicted latency for the candidates CDMPP cannot price (issue #59).

Linear kernels (ONNX Runtime MLAS convolutions and matrix products), opaque operators and region
candidates (several original operators as one ONNX Runtime / OpenVINO session) do not lower to
TIR, so CDMPP has no loop nest to read; the optimize loop still needs a number for each of them
before anything is timed, and a better one after every kernel it times. Memory kernels are
priced too, as a fallback.

Model, per kind and, for linear kernels, per op family (conv, pointwise, depthwise, grouped,
convtranspose, matmul, gemm), in two parts:
- a prior `launch + scale * work`: `work` is the roofline time (`AnalyticalCost` with the device's
  `DeviceSpec`, without its launch cost); for a region, one `launch` per original operator (ONNX
  Runtime dispatches each) plus `scale` times its members' sum (linear/opaque members' current
  estimates, memory members' roofline work). Both terms are fitted by non-negative least squares on
  relative error, pulled toward the level above;
- a correction `log t = log prior + r(x)`, a ridge regression on work features (log FLOPs, log bytes
  moved, log primitives, log operators, log prior) for memory kernels, a constant factor only for
  linear, opaque and region kernels (their points span microseconds to tens of milliseconds, and
  slopes fitted on the small ones extrapolated badly to the large ones).
Each level shrinks to the one above (family -> kind -> all kernels -> roofline), so with no point
the model *is* the roofline and a family with two points moves only as far as two points justify.
Residuals are Huber-weighted, so one timing taken in another job's burst does not drag its family.

Points persist in the store under program kind `fitted_point` (payload = the features, kind,
family, canonical hash, threads; measurement = seconds), so a later run on any model starts warm;
`observe_store` also adopts the `MeasuredCost` timings (`korch_kernel`) of a model's candidates.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from tensorplan.cost import AnalyticalCost, node_flops, node_index
from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.korch.fission import category

if TYPE_CHECKING:
    from tensorplan.korch.candidates import Candidate

PROGRAM_KIND = "fitted_point"
FEATURE_VERSION = 2  # bump when `KernelFeatures` changes meaning, so old points are not mixed in
KINDS = ("memory", "linear", "opaque", "region")
LINEAR_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
#: kinds whose correction is a constant factor only (no slopes on the work features): see `_fit`
FIXED_SHAPE = frozenset({"linear", "opaque", "region"})


@dataclass(frozen=True)
class KernelFeatures:
    """What the regression sees of one kernel: work, size and its priors (seconds).

    `roofline_s` is the roofline; `members_s`, for a region, its members' sum at the time the point
    was made (linear/opaque members' estimates plus memory members' roofline work; 0 otherwise)
    and `operators` the original operators ONNX Runtime dispatches one by one. Kept in the store
    with each point because the graph the kernel came from is gone by the next run."""

    kind: str
    family: str
    flops: float
    bytes: float
    primitives: int
    operators: int
    roofline_s: float
    members_s: float = 0.0

    def vector(self, prior_s: float) -> np.ndarray:
        """Regression inputs, centred near typical small-kernel values so the ridge's pull on the
        intercept and on the slopes is comparable; `prior_s` is the kernel's prior."""
        return np.array([1.0, math.log1p(self.flops) / 10.0 - 1.5, math.log(max(self.bytes, 1.0)) / 10.0 - 1.2,
                         math.log(max(self.primitives, 1)), math.log(max(self.operators, 1)),
                         math.log(max(prior_s, 1e-9)) / 10.0 + 1.2])

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
    """One level of the model: its prior `launch_s + scale * roofline work` and the ridge correction
    on top (coefficients on `KernelFeatures.vector`), and how many points it saw."""

    coef: np.ndarray
    points: int
    launch_s: float = 0.0     # the prior's fixed cost per call (seconds)
    scale: float = 1.0        # the prior's factor on the roofline work


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
                 ridge: float = 16.0, huber: float = 1.0, prior_weight: float = 8.0, use_observed: bool = True):
        from tensorplan import devices
        self.spec = devices.device(device)
        self.threads = int(threads or devices.default_threads(self.spec))
        self.roofline = AnalyticalCost(self.spec)
        self.ridge = float(ridge)
        self.huber = float(huber)
        self.prior_weight = float(prior_weight)
        self.use_observed = bool(use_observed)
        self.store = None
        self.dev_key = ""
        if store is not None:
            from tensorplan.measure.store import Store
            self.store = store if isinstance(store, Store) else Store(store)
            self.dev_key = self.store.put_device(self.spec)
        self.points: dict[str, FittedPoint] = {}
        self.local: set[str] = set()    # hashes observed by this instance (this run's model), not loaded
        self.op_overhead_s = self.roofline.launch_s
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
        """Work features of a candidate; for a region, `members_s` sums its linear and opaque members'
        current estimates and its memory members' roofline work (ONNX Runtime fuses or runs those
        inside its operators, so a per-primitive launch would count LayerNorm's 8 primitives 8 times;
        the per-operator cost is the region level's `launch`, see `prior`)."""
        if cand.kind not in KINDS:
            raise TensorplanError(f"FittedCost: candidate {cand.id} has kind '{cand.kind}'; expected one of "
                                  f"{', '.join(KINDS)}")
        idx = node_index(prim)
        nodes = [idx[x] for x in cand.nodes]
        flops = float(sum(node_flops(prim, n) for n in nodes))
        nbytes = float(sum(prim.tensors[i].nbytes for i in (*cand.inputs, *cand.const_inputs))
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
                    nf = self._node_features(prim, n)
                    singles[n.name] = (self.predict_features(nf) if nf.kind != "memory"
                                       else nf.roofline_s - self.roofline.launch_s)
                members += singles[n.name]
            return KernelFeatures("region", "region", flops, nbytes, len(nodes), operators,
                                  self._roof(flops, nbytes), members)
        return KernelFeatures(cand.kind, family, flops, nbytes, len(nodes), operators, self._roof(flops, nbytes))

    def _roof(self, flops: float, nbytes: float) -> float:
        """`AnalyticalCost`'s roofline (seconds, with its launch cost)."""
        r = self.roofline
        return max(flops / r.peak_flops, nbytes / r.bandwidth) + r.launch_s

    def _node_features(self, prim: Graph, n) -> KernelFeatures:
        """A region member alone: what its primitive would cost as a singleton kernel."""
        cat = category(n.op)
        kind = "linear" if cat == "linear" else "memory" if cat in ("elementwise", "reduce", "layout") else "opaque"
        nbytes = float(sum(prim.tensors[i].nbytes for i in set(n.inputs) if i)
                       + sum(prim.tensors[o].nbytes for o in n.outputs if o))
        flops = float(node_flops(prim, n))
        family = linear_family(prim, n) if kind == "linear" else kind
        return KernelFeatures(kind, family, flops, nbytes, 1, 1, self._roof(flops, nbytes))

    def predict_features(self, f: KernelFeatures) -> float:
        """Seconds for a kernel with features `f` under the current fit (finite, > 0)."""
        lev = self._level_for(f)
        prior = self.prior(f, lev)
        r = float(lev.coef @ f.vector(prior)) if lev is not None else 0.0
        r = min(max(r, -_CLIP), _CLIP)   # a wild extrapolation never leaves [prior/e^6, prior*e^6]
        return float(max(prior, 1e-9) * math.exp(r))

    # -- learning -------------------------------------------------------------------------
    def observe(self, prim: Graph, cand: "Candidate", seconds: float, local: bool = True) -> FittedPoint:
        """Add a measured point (kept in the store when there is one); call `refit` to use it for
        unmeasured kernels (the observed hash itself is priced at `seconds` at once). `local`: the
        kernel belongs to the model being planned now, so it also fits that run's own level."""
        s = float(seconds)
        if not (s > 0 and math.isfinite(s)):
            raise TensorplanError(f"FittedCost.observe: candidate {cand.id} (nodes {list(cand.nodes)[:3]}) was given "
                                  f"{seconds!r} seconds; pass the measured latency of one run (> 0, finite)")
        p = FittedPoint(cand.canonical_hash, self.features(prim, cand), s)
        self.points[p.canonical_hash] = p
        if local:
            self.local.add(p.canonical_hash)
        if self.store is not None:
            self._save_points([p])
        return p

    def observe_many(self, prim: Graph, pairs: Iterable[tuple["Candidate", float]], local: bool = True) -> int:
        """`observe` for many (candidate, seconds) pairs in one store transaction; returns how many."""
        pts = []
        singles: dict[str, float] = {}
        for c, s in pairs:
            s = float(s)
            if s > 0 and math.isfinite(s):
                pts.append(FittedPoint(c.canonical_hash, self.features(prim, c, singles), s))
        for p in pts:
            self.points[p.canonical_hash] = p
            if local:
                self.local.add(p.canonical_hash)
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
        top = _Level(np.zeros(dim), 0, self.roofline.launch_s, 1.0)
        root = self._fit([p for p in pts if p.features.kind != "region"], top)
        self._levels[()] = root
        for kind in KINDS:
            sub = [p for p in pts if p.features.kind == kind]
            # the prior (launch, scale) of a kind starts from the roofline, its correction from all kernels'
            lk = self._fit(sub, _Level(root.coef, 0, top.launch_s, top.scale) if kind != "region" else top)
            self._levels[(kind,)] = lk
            for fam in sorted({p.features.family for p in sub}):
                if fam != kind:
                    self._levels[(kind, fam)] = self._fit([p for p in sub if p.features.family == fam], lk)
            # this run's own kernels (observed here, not loaded): the most specific level, so what the
            # optimize loop has timed of *this* model is not drowned by earlier runs' points
            for fam in sorted({p.features.family for p in sub if p.canonical_hash in self.local}):
                parent = self._levels.get((kind, fam)) or lk
                mine = [p for p in sub if p.features.family == fam and p.canonical_hash in self.local]
                self._levels[(kind, fam, "local")] = self._fit(mine, parent)
        self.op_overhead_s = self._levels[("region",)].launch_s

    def prior(self, f: KernelFeatures, level: _Level | None = None) -> float:
        """The model before its correction: a fixed cost per call plus a factor on the roofline work,
        both fitted per level (no points: the roofline, `AnalyticalCost`); for a region, a cost per
        original operator (ONNX Runtime dispatches each one) plus a factor on its members' sum."""
        lev = level if level is not None else self._level_for(f)
        if lev is None:
            lev = _Level(_ZERO, 0, self.roofline.launch_s, 1.0)
        count, work = self._prior_terms(f)
        return lev.launch_s * count + lev.scale * work

    def _prior_terms(self, f: KernelFeatures) -> tuple[float, float]:
        """(calls, work seconds) of the prior: one call and the roofline work for a kernel; for a region
        one call per original operator and its members' sum."""
        if f.kind == "region":
            return float(f.operators), f.members_s
        return 1.0, max(f.roofline_s - self.roofline.launch_s, 0.0)

    def _fit_prior(self, pts: list[FittedPoint], parent: _Level) -> tuple[float, float]:
        """(launch_s, scale) of `t = launch + scale * work` by non-negative least squares on relative
        error, pulled toward the parent's as if it were `prior_weight` more points, Huber-weighted.
        Why not only the log regression: a kernel's fixed cost adds, it does not multiply, so a
        family's small kernels and large ones need both terms (tiny convs are all launch, ResNet's
        are all work)."""
        from scipy.optimize import nnls
        a0, b0 = max(parent.launch_s, 1e-9), max(parent.scale, 1e-6)
        t = np.array([p.seconds for p in pts])
        terms = np.array([self._prior_terms(p.features) for p in pts])
        A = terms / t[:, None]
        lam = math.sqrt(self.prior_weight)
        t_mid = float(np.median(t / terms[:, 0]))   # the launch's pull is relative to these kernels' times
        R = lam * np.diag([1.0 / t_mid, 1.0 / b0])
        w = np.ones(len(pts))
        x = np.array([a0, b0])
        for _ in range(3):
            x, _ = nnls(np.vstack([A * w[:, None], R]), np.concatenate([w, [lam * a0 / t_mid, lam]]), maxiter=500)
            res = np.abs(A @ x - 1.0)
            w = np.sqrt(np.where(res <= 0.3, 1.0, 0.3 / np.maximum(res, 1e-12)))
        return float(max(x[0], 1e-9)), float(max(x[1], 1e-6))

    def _fit(self, pts: list[FittedPoint], parent: _Level) -> _Level:
        """This level's prior (`_fit_prior`), then a ridge toward the parent's correction on the log
        residuals, with Huber reweighting (3 passes)."""
        target = parent.coef
        if not pts:
            return _Level(target.copy(), 0, parent.launch_s, parent.scale)
        lev = _Level(target.copy(), len(pts), *self._fit_prior(pts, parent))
        priors = [self.prior(p.features, lev) for p in pts]
        X = np.stack([p.features.vector(q) for p, q in zip(pts, priors)])
        y = np.array([math.log(p.seconds) - math.log(max(q, 1e-9)) for p, q in zip(pts, priors)])
        w = np.ones(len(pts))
        lam = self.ridge * np.ones(X.shape[1])
        lam[0] = self.ridge / 4.0    # the intercept (a constant factor) is the cheapest thing to learn
        if pts[0].features.kind in FIXED_SHAPE:
            # few points spread over kernels from microseconds to tens of milliseconds: slopes fitted on
            # the small ones extrapolate badly to the large ones (measured: research/notes/optimize-costs.md),
            # so beyond the prior's two terms only a constant factor is learned
            target = np.where(np.arange(len(target)) == 0, target, 0.0)
            lam[1:] = 1e9
        coef = target.copy()
        for _ in range(3):
            A = X.T @ (X * w[:, None]) + np.diag(lam)
            b = X.T @ (w * y) + lam * target
            coef = np.linalg.solve(A, b)
            res = np.abs(y - X @ coef)
            w = np.where(res <= self.huber, 1.0, self.huber / np.maximum(res, 1e-12))
        lev.coef = coef
        return lev

    def _level_for(self, f: KernelFeatures) -> _Level | None:
        return (self._levels.get((f.kind, f.family, "local")) or self._levels.get((f.kind, f.family))
                or self._levels.get((f.kind,)) or self._levels.get(()))

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
                "op_overhead_s": self.op_overhead_s,
                "store": str(self.store.path) if self.store is not None else None,
                "levels": {"/".join(k) or "all": {"points": v.points, "launch_s": v.launch_s, "scale": v.scale,
                                                  "coef": [round(float(x), 4) for x in v.coef]}
                           for k, v in self._levels.items()}}


_ZERO = np.zeros(6)
_CLIP = 6.0



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
