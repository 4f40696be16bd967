"""`PlanTimeModel`: what a kernel costs inside a running plan, not alone (issue #59).

The BLP adds solo kernel timings, but a plan pays more than that sum: the executor's dispatch per
kernel (a Python call into TVM, an ONNX Runtime session, an OpenVINO request), the hand-offs where
consecutive kernels run on different backends or thread pools (waking another pool, ORT reordering
its input into NCHWc and back), and a constant per run; and less where a producer's output is still
in cache. This model writes a plan's measured time as

    T = c0 + sum_k a[backend_k] * solo_s_k + sum_k d[backend_k]
           + sum_{k: backend changes before k} (h + g * in_bytes_k)

with every term >= 0 and every scale `a[b]` >= `SCALE_FLOOR` (below 1: hot caches), fitted by
non-negative least squares on relative error (Huber-weighted), ridge-shrunk to today's objective
(every a = 1, the rest 0), from plans measured end to end (`record_plan_run`, program kind
`plan_run` in the store). The scale is per backend class because a pool that other threads
contend for slows in proportion to its work (measured: OpenVINO and ONNX Runtime regions ran 3-9x
their solo time inside plans on the loaded 2-core machine), while dispatch is a fixed cost per call.

The BLP's objective is one number per candidate, so `overhead(prim, cand, backend, schedule)` spreads
the terms over the candidate: its backend's dispatch, plus the hand-off cost weighted by how often a
kernel of that backend followed another backend in the measured plans, plus `(a[b] - 1) * solo_s`.
`predict(plan)` uses the plan's actual order instead.

Layering: this module reads `Plan` objects (runtime/, a higher layer) by their fields only; it
never imports them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph

if TYPE_CHECKING:
    from tensorplan.korch.candidates import Candidate

PROGRAM_KIND = "plan_run"
MODEL_KIND = "plan_time_model"
RUN_VERSION = 1    # the `plan_run` payload's format
MODEL_VERSION = 2  # the saved model's terms (2: a scale per backend class)

#: Backend classes with their own dispatch term: what the executor calls differs for each
#: (TVM packed function, ORT session with its own pool, a one-thread session, OpenVINO request...).
BACKENDS = ("tvm", "tvm-serial", "ort", "ort-1t", "openvino", "torch", "reference")
#: the least a backend's in-plan scale may be: a producer's output still in cache can make a kernel
#: faster than timed alone, but not by half
SCALE_FLOOR = 0.5


def backend_class(backend: str, schedule: dict[str, Any] | None) -> str:
    """The dispatch class of a kernel: its backend, split by whether it uses the shared pool."""
    s = schedule or {}
    b = (backend or "").lower()
    if b == "tvm":
        return "tvm-serial" if s.get("parallel") is False else "tvm"
    if b == "ort":
        return "ort-1t" if int(s.get("threads", 0) or 0) == 1 else "ort"
    if b.startswith("torch"):
        return "torch"
    if b in BACKENDS:
        return b
    return "reference"


@dataclass(frozen=True)
class KernelRun:
    """One kernel of a measured plan, as the model sees it."""

    kind: str
    backend: str          # `backend_class`
    solo_s: float         # the kernel's predicted (solo) seconds
    in_bytes: int         # non-constant inputs
    out_bytes: int


@dataclass
class PlanRun:
    """A plan timed end to end: its kernels in execution order and the measured median."""

    model: str
    label: str
    kernels: list[KernelRun]
    measured_s: float
    cov: float = 0.0
    threads: int = 0

    @property
    def solo_sum_s(self) -> float:
        """Today's objective: the plain sum of solo costs."""
        return float(sum(k.solo_s for k in self.kernels))

    def to_payload(self, fingerprint: str) -> dict[str, Any]:
        return {"version": RUN_VERSION, "model": self.model, "label": self.label, "fingerprint": fingerprint,
                "threads": self.threads, "kernels": [asdict(k) for k in self.kernels]}


def plan_kernels(plan: Any, prim: Graph | None = None) -> list[KernelRun]:
    """The `KernelRun`s of a `Plan` in execution order (bytes from its primitive graph)."""
    prim = prim if prim is not None else plan.primitive_graph()
    consts = prim.constants()
    out = []
    for k in plan.ordered_kernels():
        ib = sum(prim.tensors[i].nbytes for i in k.inputs if i in prim.tensors and i not in consts)
        ob = sum(prim.tensors[o].nbytes for o in k.outputs if o in prim.tensors)
        out.append(KernelRun(kind=k.kind, backend=backend_class(k.backend, k.schedule), solo_s=float(k.predicted_s),
                             in_bytes=int(ib), out_bytes=int(ob)))
    return out


def plan_run(plan: Any, measured_s: float, cov: float = 0.0, label: str = "", prim: Graph | None = None,
             threads: int | None = None) -> PlanRun:
    """A `PlanRun` of `plan` (a `Plan`) measured at `measured_s` seconds per run."""
    s = float(measured_s)
    if not (s > 0 and math.isfinite(s)):
        raise TensorplanError(f"plan_run: plan of '{plan.source.get('model', '?')}' ({label or 'unlabelled'}) was "
                              f"given {measured_s!r} seconds; pass its measured median per run (> 0, finite)")
    return PlanRun(model=str(plan.source.get("model", "")), label=label, kernels=plan_kernels(plan, prim),
                   measured_s=s, cov=float(cov), threads=int(threads or plan.options.get("threads") or 0))


def record_plan_run(store: Any, device_spec: Any, plan: Any, median_s: float, cov: float = 0.0, *,
                    label: str = "", prim: Graph | None = None, threads: int | None = None,
                    repeats: list[float] | None = None) -> PlanRun:
    """Keep a plan measured end to end in the store (program kind `plan_run`: per kernel its kind,
    backend class, solo seconds and bytes, plus the model fingerprint; measurement: the median).
    Call it wherever a whole plan is timed: the race (every finalist), the optimize loop's checks."""
    from tensorplan.measure.store import Store
    from tensorplan.measure.timer import Timing
    st = store if isinstance(store, Store) else Store(store)
    run = plan_run(plan, median_s, cov, label, prim, threads)
    fp = str(plan.source.get("prim_fingerprint") or plan.source.get("fingerprint") or "")
    pk = st.put_program(PROGRAM_KIND, run.to_payload(fp))
    dk = st.put_device(device_spec)
    reps = [float(x) for x in repeats] if repeats else [run.measured_s]
    t = Timing.from_repeats(reps, method="plan_run")
    t.median_s = run.measured_s      # the caller's median is the figure (repeats may be bursts' medians)
    t.cov = float(cov) if cov else t.cov
    st.put_measurement(pk, dk, t, "", {"model": run.model, "label": label, "kernels": len(run.kernels)})
    return run


def load_runs(store: Any, device: Any = None) -> list[PlanRun]:
    """Every `plan_run` in the store (for one device: a key, a name or a `DeviceSpec`)."""
    from tensorplan.measure.store import Store
    st = store if isinstance(store, Store) else Store(store)
    dev = device.key() if hasattr(device, "key") else device
    out = []
    for rec in st.measurements(kind=PROGRAM_KIND, device=dev):
        pl = rec["payload"]
        if int(pl.get("version", -1)) != RUN_VERSION:
            continue
        ks = [KernelRun(**{f: k[f] for f in ("kind", "backend", "solo_s", "in_bytes", "out_bytes")})
              for k in pl["kernels"]]
        out.append(PlanRun(model=pl.get("model", ""), label=pl.get("label", ""), kernels=ks,
                           measured_s=float(rec["median_s"]), cov=float(rec["cov"]), threads=int(pl.get("threads", 0))))
    return out


@dataclass
class PlanTimeModel:
    """Plan time = plan constant + per-backend scaled solo sums + per-kernel dispatch + hand-offs
    (module docstring).

    Defaults are today's objective (the plain sum of solo costs); `fit` learns the terms."""

    constant_s: float = 0.0
    scale: dict[str, float] = field(default_factory=lambda: {b: 1.0 for b in BACKENDS})
    dispatch_s: dict[str, float] = field(default_factory=lambda: {b: 0.0 for b in BACKENDS})
    handoff_s: float = 0.0
    handoff_s_per_byte: float = 0.0
    change_rate: dict[str, float] = field(default_factory=dict)   # P(previous kernel on another class)
    fitted_on: int = 0
    models: list[str] = field(default_factory=list)

    # -- fitting --------------------------------------------------------------------------
    def fit(self, records: Iterable[PlanRun], ridge: float = 2.0, huber: float = 0.15) -> "PlanTimeModel":
        """Fit the terms on measured plans (non-negative least squares on relative error, each term
        pulled toward today's objective by `ridge`; plans off by more than `huber` (relative) weigh
        less). Returns self."""
        from scipy.optimize import nnls
        runs = [r for r in records if r.kernels and r.measured_s > 0]
        if not runs:
            raise TensorplanError("PlanTimeModel.fit: no measured plans; record some with record_plan_run "
                                  "(orchestrate with race=True times its finalists)")
        X = np.stack([_design(r) for r in runs])
        y = np.array([r.measured_s for r in runs])
        A = X / y[:, None]                            # relative error: every plan counts alike
        # scale_b = SCALE_FLOOR + u_b, u_b >= 0 (hot caches may make it < 1, never below the floor);
        # every other term is >= 0
        sc = list(range(_SCALE, _SCALE + len(BACKENDS)))
        b = 1.0 - SCALE_FLOOR * A[:, sc].sum(axis=1)
        # the ridge acts on each term's typical share of a plan's time, pulling toward a = 1, rest 0
        share = np.abs(A).mean(axis=0)
        share[share == 0] = 1.0
        reg = math.sqrt(ridge) * np.diag(share)
        target = np.zeros(A.shape[1])
        target[sc] = math.sqrt(ridge) * share[sc] * (1.0 - SCALE_FLOOR)
        w = np.ones(len(runs))
        for _ in range(4):      # Huber reweighting: a plan timed in another job's burst counts less
            coef, _ = nnls(np.vstack([A * w[:, None], reg]), np.concatenate([b * w, target]), maxiter=5000)
            res = np.abs(A @ coef - b)
            w = np.sqrt(np.where(res <= huber, 1.0, huber / np.maximum(res, 1e-12)))
        theta = coef.copy()
        theta[sc] += SCALE_FLOOR
        self.constant_s = float(theta[_CONST])
        self.scale = {bk: float(theta[_SCALE + j]) for j, bk in enumerate(BACKENDS)}
        self.dispatch_s = {bk: float(theta[_DISP + j]) for j, bk in enumerate(BACKENDS)}
        self.handoff_s = float(theta[_HAND])
        self.handoff_s_per_byte = float(theta[_HBYTES])
        self.change_rate = _change_rates(runs)
        self.fitted_on = len(runs)
        self.models = sorted({r.model for r in runs})
        return self

    # -- using it -------------------------------------------------------------------------
    def predict_run(self, run: PlanRun) -> float:
        """Predicted seconds of a recorded plan (its kernels in order)."""
        return float(_design(run) @ self._theta())

    def predict(self, plan: Any, prim: Graph | None = None) -> float:
        """Predicted seconds per run of a whole `Plan` (its kernels' `predicted_s` as solo costs)."""
        return self.predict_run(PlanRun(model="", label="", kernels=plan_kernels(plan, prim), measured_s=1.0))

    def overhead(self, prim: Graph, cand: "Candidate", backend: str, schedule: dict[str, Any] | None = None,
                 solo_s: float = 0.0) -> float:
        """Seconds to add to `cand`'s solo cost in the BLP objective: its backend's dispatch, the expected
        hand-off (how often that backend followed another one in the measured plans, times the hand-off
        cost of the candidate's input bytes) and `(scale[backend] - 1) * solo_s`. Negative only through
        the scale term, and never below `-solo_s / 2` (the objective stays > 0)."""
        cls = backend_class(backend, schedule)
        consts = prim.constants()
        ib = sum(prim.tensors[i].nbytes for i in cand.inputs if i not in consts)
        p = self.change_rate.get(cls, 0.5)
        extra = self.dispatch_s.get(cls, 0.0) + p * (self.handoff_s + self.handoff_s_per_byte * ib)
        return float(extra + max(self.scale.get(cls, 1.0) - 1.0, -0.5) * float(solo_s))

    def overheads(self, prim: Graph, cands: list["Candidate"], costs: Any, info: Any = None) -> np.ndarray:
        """`overhead` for every candidate, as the array the BLP adds to `costs` (orchestrate's
        `Problem.overhead`); `info(prim, cand) -> {"backend", "schedule"}` is the cost model's
        `kernel_info` (default: ONNX Runtime for linear, opaque and region kernels, TVM for memory)."""
        out = np.zeros(len(cands))
        for j, (c, s) in enumerate(zip(cands, costs)):
            if not math.isfinite(float(s)):
                continue
            got = info(prim, c) if callable(info) else {}
            backend = str(got.get("backend") or ("tvm" if c.kind == "memory" else "ort"))
            out[j] = self.overhead(prim, c, backend, got.get("schedule") or {}, float(s))
        return out

    def _theta(self) -> np.ndarray:
        th = np.zeros(_NCOL)
        th[_CONST] = self.constant_s
        for j, bk in enumerate(BACKENDS):
            th[_SCALE + j] = self.scale.get(bk, 1.0)
        for j, bk in enumerate(BACKENDS):
            th[_DISP + j] = self.dispatch_s.get(bk, 0.0)
        th[_HAND] = self.handoff_s
        th[_HBYTES] = self.handoff_s_per_byte
        return th

    # -- persistence ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": MODEL_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PlanTimeModel":
        if int(d.get("version", -1)) != MODEL_VERSION:
            raise TensorplanError(f"PlanTimeModel: saved model has version {d.get('version')!r}, this code reads "
                                  f"{MODEL_VERSION}; refit it with PlanTimeModel.load(store, device, refit=True)")
        return cls(constant_s=float(d["constant_s"]), scale={str(k): float(v) for k, v in d["scale"].items()},
                   dispatch_s={str(k): float(v) for k, v in d["dispatch_s"].items()},
                   handoff_s=float(d["handoff_s"]), handoff_s_per_byte=float(d["handoff_s_per_byte"]),
                   change_rate={str(k): float(v) for k, v in d.get("change_rate", {}).items()},
                   fitted_on=int(d.get("fitted_on", 0)), models=list(d.get("models", [])))

    def save(self, store: Any, device: Any) -> str:
        """Keep the fitted terms in the store (one row per device, replaced on every save; the row's seconds
        are the plan constant, the terms are in its `extra`)."""
        from tensorplan.measure.store import Store
        from tensorplan.measure.timer import Timing
        st = store if isinstance(store, Store) else Store(store)
        spec = _spec(device)
        dk = st.put_device(spec)
        pk = st.put_program(MODEL_KIND, {"version": MODEL_VERSION, "device": dk})
        st.put_measurement(pk, dk, Timing.from_repeats([max(self.constant_s, 1e-12)], method=MODEL_KIND), "",
                           {"model": self.to_dict()})
        return pk

    @classmethod
    def load(cls, store: Any, device: Any, refit: bool = False) -> "PlanTimeModel":
        """The model saved for `device`, else (or with `refit`) one fitted on the store's `plan_run`
        records, else today's objective (no plan measured yet)."""
        from tensorplan.measure.store import Store
        st = store if isinstance(store, Store) else Store(store)
        spec = _spec(device)
        dk = st.put_device(spec)
        if not refit:
            rec = st.get_measurement(st.put_program(MODEL_KIND, {"version": MODEL_VERSION, "device": dk}), dk)
            if rec is not None and (rec.get("extra") or {}).get("model"):
                return cls.from_dict(rec["extra"]["model"])
        runs = load_runs(st, dk)
        return cls().fit(runs) if runs else cls()


_CONST, _SCALE = 0, 1
_DISP = _SCALE + len(BACKENDS)
_HAND = _DISP + len(BACKENDS)
_HBYTES = _HAND + 1
_NCOL = _HBYTES + 1


def _design(r: PlanRun) -> np.ndarray:
    """[1, solo sum per backend class..., kernels per backend class..., backend changes, bytes read
    across changes]."""
    x = np.zeros(_NCOL)
    x[_CONST] = 1.0
    prev = None
    for k in r.kernels:
        j = BACKENDS.index(k.backend) if k.backend in BACKENDS else BACKENDS.index("reference")
        x[_SCALE + j] += k.solo_s
        x[_DISP + j] += 1.0
        if prev is not None and k.backend != prev:
            x[_HAND] += 1.0
            x[_HBYTES] += k.in_bytes
        prev = k.backend
    return x


def _change_rates(runs: list[PlanRun]) -> dict[str, float]:
    """Per backend class: the share of its kernels (after the first of a plan) whose predecessor ran
    on another class; the BLP's stand-in for the neighbours it cannot see."""
    seen: dict[str, list[int]] = {}
    for r in runs:
        for a, b in zip(r.kernels, r.kernels[1:]):
            s = seen.setdefault(b.backend, [0, 0])
            s[0] += int(a.backend != b.backend)
            s[1] += 1
    return {k: v[0] / v[1] for k, v in seen.items() if v[1]}


def _spec(device: Any):
    from tensorplan import devices
    return devices.device(device)


__all__ = ["BACKENDS", "KernelRun", "PROGRAM_KIND", "PlanRun", "PlanTimeModel", "backend_class", "load_runs",
           "plan_kernels", "plan_run", "record_plan_run"]
