"""Reduced precision inside an optimized plan: per kernel, the fastest (backend, precision) that keeps
the model's outputs within a tolerance of the fp32 reference on calibration inputs.

Why after the fp32 plan is chosen, and why this way: the fp32 solve decides how the model is cut into
kernels; a reduced precision changes what each kept kernel costs, and what it costs in accuracy can
only be seen at the model's outputs (errors compound through later kernels, and a classifier's
argmax forgives what a regression head does not). So the search re-prices the kept kernels, the
heaviest first (kernels that compute the same, a model's repeated layers, as one): every (backend, precision) variant a kernel builds (OpenVINO fp32/bf16/fp16/int8,
ONNX Runtime fp32/int8, PyTorch fp32/bf16) is swapped into the plan accumulated so far, the whole
plan runs on the calibration set and is compared with ONNX Runtime on the model as given
(`precision.accuracy.compare`), and the variants of one kernel are timed end to end against each
other, interleaved (`workflows.peers.time_interleaved`). The fastest variant within the tolerance is
kept (greedy over kernels). The final combination is rebuilt from its plan data alone (as `tensorplan
run` would: int8 kernels without their calibration) and checked again; if it breaks the tolerance,
the last change is backed off until it holds. Every variant tried is recorded with its accuracy and
time (`PrecisionSearch`, kept in `plan.stats["precision"]`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.runtime.plan import Plan

if TYPE_CHECKING:
    from tensorplan.precision.accuracy import Accuracy
    from tensorplan.precision.calibration import CalibrationSet

#: What `--precision` accepts: one precision, or `auto` (every precision that may beat fp32 on this device:
#: the native ones, and int8 through integer SIMD without dot-product units).
CHOICES = ("fp32", "bf16", "fp16", "int8", "auto")
#: The backends each kernel is tried on, at the precisions each builds (`kernels.vendor.BACKEND_PRECISIONS`;
#: a variant that still does not build, e.g. torch on a kernel that is not one linear primitive, is
#: recorded as not built).
BACKENDS = ("openvino", "ort", "torch")
#: Kernels searched: the heaviest, until they cover this share of the plan's solo time, at most MAX_KERNELS.
COVER = 0.90
MAX_KERNELS = 6
#: A variant replaces the kernel's current choice only when faster by this share (timing noise).
MIN_GAIN = 0.03
#: Interleaved rounds timing the variants of one kernel.
ROUNDS = 7
#: The name the plan before the search is timed under, beside the kept plan (`optimize`'s peers run).
FP32_RUNNER = "tensorplan-fp32"


@dataclass
class VariantResult:
    """One (backend, precision) tried for one kernel: the whole plan with it, on the calibration set.

    `status`: "baseline" (the kernel as the fp32 plan has it), "kept" (chosen), "within" (within the
    tolerance but not faster), "over tolerance", "not built", "fell back" (its backend built another
    backend's kernel instead), "failed" (built but did not run) or "budget" (not tried: time ran out).
    `median_ms`: the plan with this variant, median of interleaved rounds against the kernel's other
    variants; `accuracy`: the plan's outputs vs ONNX Runtime fp32 on the model as given."""

    kernel: str
    backend: str
    precision: str
    status: str
    median_ms: float | None = None
    cov: float | None = None
    accuracy: "Accuracy | None" = None
    note: str | None = None
    alike: list[str] = field(default_factory=list)   # kernels computing the same (same canonical hash), changed with it

    @property
    def label(self) -> str:
        """The kernel, and how many alike kernels the variant changed with it ("k3 +11")."""
        return self.kernel + (f" +{len(self.alike)}" if self.alike else "")

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "alike": list(self.alike), "backend": self.backend,
                "precision": self.precision, "status": self.status, "median_ms": self.median_ms, "cov": self.cov,
                "accuracy": self.accuracy.to_dict() if self.accuracy is not None else None, "note": self.note}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VariantResult":
        return cls(kernel=d["kernel"], backend=d["backend"], precision=d["precision"], status=d["status"],
                   median_ms=d.get("median_ms"), cov=d.get("cov"), accuracy=accuracy_from_dict(d.get("accuracy")),
                   note=d.get("note"), alike=list(d.get("alike") or []))


@dataclass
class PrecisionSearch:
    """What the precision search tried and kept (`plan.stats["precision"]`, `OptimizeSummary.precision`).

    `precisions`: those tried (fp32 always); `native`: per precision of `precision.native.PRECISIONS`,
    whether this device runs it natively and how; `warnings`: a requested precision this device would
    emulate; `calibration_warning`: set when the samples were random; `chosen`: kernel -> "backend/precision" as kept; `final`: the kept plan rebuilt
    from its data and run on the calibration set; `fp32`: the fp32 plan on the same samples;
    `baseline_ms` / `final_ms`: the fp32 plan and the kept plan in the search's timing rounds."""

    requested: str
    tolerance: float
    precisions: list[str]
    native: dict[str, str]
    calibration: str
    samples: int
    calibration_warning: str | None = None
    warnings: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)          # every kernel searched
    groups: list[list[str]] = field(default_factory=list)     # ... as searched: alike kernels decided together
    variants: list[VariantResult] = field(default_factory=list)
    chosen: dict[str, str] = field(default_factory=dict)
    fp32: "Accuracy | None" = None
    final: "Accuracy | None" = None
    baseline_ms: float | None = None
    final_ms: float | None = None
    backed_off: list[str] = field(default_factory=list)
    stop: str = "done"                    # "done" | "budget"
    search_s: float = 0.0

    @property
    def reduced(self) -> dict[str, str]:
        """The kept kernels that run below fp32: kernel -> "backend/precision"."""
        return {k: v for k, v in self.chosen.items() if not v.endswith("/fp32")}

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "variants":
                v = [x.to_dict() for x in v]
            elif f.name in ("fp32", "final"):
                v = v.to_dict() if v is not None else None
            elif isinstance(v, (list, dict)):
                v = type(v)(v)
            d[f.name] = v
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PrecisionSearch":
        if not isinstance(d, dict):
            raise TensorplanError(f"precision search record must be an object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["variants"] = [VariantResult.from_dict(v) for v in d.get("variants") or []]
        kw["fp32"] = accuracy_from_dict(d.get("fp32"))
        kw["final"] = accuracy_from_dict(d.get("final"))
        return cls(**kw)


def accuracy_from_dict(d: dict[str, Any] | None) -> "Accuracy | None":
    """An `Accuracy` read back from its `to_dict()` (None where a figure was not finite becomes inf/NaN)."""
    if d is None:
        return None
    from tensorplan.precision.accuracy import Accuracy
    nan_means = {"error": math.inf, "max_abs": math.inf, "max_rel": math.inf, "cosine": math.nan}
    kw = {f.name: d.get(f.name) for f in fields(Accuracy)}
    for k, fill in nan_means.items():
        if kw.get(k) is None:
            kw[k] = fill
    return Accuracy(**kw)


# ------------------------------------------------------------------------------------------------
# arguments
# ------------------------------------------------------------------------------------------------
def check_arguments(precision: str, tolerance: float) -> None:
    """A clear TensorplanError for a precision outside CHOICES or a tolerance that is not a finite
    number >= 0 (checked before any time is spent)."""
    if precision not in CHOICES:
        raise TensorplanError(f"precision '{precision}': choose one of {', '.join(CHOICES)}")
    try:
        tol = float(tolerance)
    except (TypeError, ValueError):
        raise TensorplanError(f"tolerance '{tolerance}': give a number >= 0 (a share of the outputs' range, "
                              "e.g. 0.02)") from None
    if not (math.isfinite(tol) and tol >= 0):
        raise TensorplanError(f"tolerance {tolerance}: give a finite number >= 0 (a share of the outputs' range, "
                              "e.g. 0.02)")


def precisions_to_try(precision: str, spec: Any = None) -> tuple[list[str], dict[str, str], list[str]]:
    """(precisions tried, native support per precision as text, warnings) for `--precision`: `auto` is
    every precision that may beat fp32 here (`PrecisionSupport.may_gain`; fp32 always); a named one is fp32 and that one, with
    `check_precision`'s warning when it would be emulated; `fp32` is fp32 only."""
    from tensorplan.precision.native import PRECISIONS, check_precision, native_precisions
    check_arguments(precision, 0.0)
    support = native_precisions(spec)
    native = {p: ("native" if s.native else "emulated") + (f" via {s.via}" if s.via else "")
              + (f" ({s.note})" if s.note else "") for p, s in support.items()}
    if precision == "auto":
        return [p for p in PRECISIONS if p == "fp32" or support[p].may_gain], native, []
    if precision == "fp32":
        return ["fp32"], native, []
    warn = check_precision(precision, spec)
    return ["fp32", precision], native, [warn] if warn else []


# ------------------------------------------------------------------------------------------------
# the search
# ------------------------------------------------------------------------------------------------
def kernels_to_search(plan: Plan) -> list[list[str]]:
    """Groups of the plan's kernels to search, heaviest first (solo time, `predicted_s`, summed over a
    group) until they cover COVER of the plan's total, at most MAX_KERNELS groups: where a cheaper
    precision can pay back its search. Kernels that compute the same (one canonical hash and backend:
    BERT's 12 layers) form one group and get one decision, so a repeated block is searched once."""
    groups: dict[tuple[str, str], list] = {}
    for k in plan.ordered_kernels():
        key = (k.canonical_hash or f"kernel:{k.id}", k.backend)
        groups.setdefault(key, []).append(k)
    ranked = sorted(groups.values(), key=lambda g: -sum(k.predicted_s for k in g))
    total = sum(k.predicted_s for k in plan.kernels)
    out: list[list[str]] = []
    covered = 0.0
    for g in ranked:
        if len(out) >= MAX_KERNELS or (out and total > 0 and covered >= COVER * total):
            break
        out.append([k.id for k in g])
        covered += sum(k.predicted_s for k in g)
    return out


def search_precision(plan: Plan, calibration: "CalibrationSet", *, precision: str, tolerance: float,
                     threads: int, deadline: float | None = None, spec: Any = None, rounds: int = ROUNDS,
                     progress: bool = False, say: Callable[[str], None] | None = None
                     ) -> tuple[Plan, PrecisionSearch]:
    """The plan with, per searched kernel, the fastest (backend, precision) whose whole-plan outputs on
    `calibration` stay within `tolerance` (normalised max error, `Accuracy.error`) of ONNX Runtime fp32
    on the model as given; and the record of every variant tried. `deadline` (perf_counter seconds)
    stops trying new variants; what was kept until then stays."""
    from tensorplan.measure.timer import pinned_threads
    from tensorplan.precision.accuracy import compare
    from tensorplan.progress import progress_bar
    from tensorplan.runtime.executor import PlanExecutor, run_original

    say = say or (lambda msg: None)
    t_start = time.perf_counter()
    check_arguments(precision, tolerance)
    tried, native, warnings = precisions_to_try(precision, spec)
    rec = PrecisionSearch(requested=precision, tolerance=float(tolerance), precisions=tried, native=native,
                          calibration=calibration.source, samples=len(calibration.feeds),
                          calibration_warning=calibration.warning, warnings=list(warnings))
    prim = plan.check()
    source = plan.source_graph() if any(k.kind == "region" for k in plan.kernels) else None
    data, where = plan.reference_model()
    feeds = calibration.feeds
    ref = [run_original(data, where, f, threads=threads) for f in feeds]
    names = [o for o in prim.outputs if o in ref[0]]
    if not names:
        raise TensorplanError(f"precision search: none of the plan's outputs {list(prim.outputs)} is an output of "
                              f"the reference model {where}")
    reference = [{n: r[n] for n in names} for r in ref]

    with pinned_threads(threads):
        ex = PlanExecutor(plan, prim, threads=threads, source=source)
        index = {s.kernel.id: i for i, s in enumerate(ex.slots)}

        def outputs_of(calls: list) -> list[dict[str, np.ndarray]]:
            outs = []
            for f in feeds:
                ex.set_inputs(f)
                for c in calls:
                    c()
                outs.append({n: ex.tensors[n].numpy().copy() for n in names})
            return outs

        base_calls = list(ex.calls)
        rec.fp32 = compare(reference, outputs_of(base_calls))
        say(f"precision: fp32 plan on {len(feeds)} calibration samples: {rec.fp32.short()}")
        if tried == ["fp32"]:
            rec.search_s = time.perf_counter() - t_start
            return plan, rec
        groups = kernels_to_search(plan)
        rec.groups = groups
        rec.kernels = [k for g in groups for k in g]
        needs_int8 = "int8" in tried
        captured = ex.capture(feeds, rec.kernels) if needs_int8 else {}
        current, calls = plan, list(base_calls)
        history: list[tuple[str, Plan]] = []       # (kernel changed, plan before the change)
        from tensorplan.kernels.vendor import BACKEND_PRECISIONS
        # reduced precisions first (where the time is won), fp32 on the other backends last
        order = [p for p in tried if p != "fp32"] + ["fp32"]
        pairs = [(b, p) for p in order for b in BACKENDS if p in BACKEND_PRECISIONS.get(b, ())]
        total = len(groups) * len(pairs)
        with progress_bar(f"precision: {len(groups)} kernels x {len(pairs)} variants", total, progress) as advance:
            for group in groups:
                kid, alike = group[0], group[1:]
                k0 = current.kernel(kid)
                if deadline is not None and time.perf_counter() >= deadline:
                    rec.variants += [VariantResult(kid, b, p, "budget", alike=alike) for b, p in pairs
                                     if (b, p) != (k0.backend, k0.precision)]
                    rec.stop = "budget"
                    advance(len(pairs))
                    continue
                base_name = f"{k0.backend or 'default'}/{k0.precision}"
                base = VariantResult(kid, k0.backend, k0.precision, "baseline",
                                     accuracy=compare(reference, outputs_of(calls)), alike=alike)
                results: list[VariantResult] = [base]
                built: dict[str, tuple[VariantResult, Plan, list]] = {base_name: (base, current, calls)}
                for backend, prec in pairs:
                    advance()
                    name = f"{backend}/{prec}"
                    if name == base_name:
                        continue
                    if deadline is not None and time.perf_counter() >= deadline:
                        results.append(VariantResult(kid, backend, prec, "budget", alike=alike))
                        rec.stop = "budget"
                        continue
                    v, vplan, vcalls = _try_variant(current, prim, source, ex, index, calls, group, backend, prec,
                                                    threads, captured)
                    results.append(v)
                    if vplan is None:
                        continue
                    try:
                        v.accuracy = compare(reference, outputs_of(vcalls))
                    except (TensorplanError, RuntimeError) as e:
                        v.status, v.note = "failed", f"did not run: {_first_line(e)}"
                        continue
                    v.status = "within" if v.accuracy.within(tolerance) else "over tolerance"
                    built[name] = (v, vplan, vcalls)
                if len(built) > 1:
                    ex.set_inputs(feeds[0])
                    _time_variants(built, rounds)
                keep = _pick(built, base_name, tolerance)
                if keep != base_name:
                    history.append((base.label, current))
                    _, current, calls = built[keep]
                    built[keep][0].status = "kept"
                    say(f"precision: kernel {base.label}: {keep} ({built[keep][0].median_ms:.3f} ms vs "
                        f"{base.median_ms:.3f} ms at {base_name}; {built[keep][0].accuracy.short()})")
                else:
                    say(f"precision: kernel {base.label}: kept {base_name}"
                        + (f" ({base.median_ms:.3f} ms)" if base.median_ms is not None else ""))
                if rec.baseline_ms is None and group is groups[0]:
                    rec.baseline_ms = base.median_ms
                rec.variants += results
        # the kept combination, rebuilt from its data alone, checked end to end; back off what breaks it
        rec.final, rec.final_ms = rec.fp32, rec.baseline_ms
        while history:
            fresh = PlanExecutor(current, prim, threads=threads, source=source)
            outs = []
            for f in feeds:
                outs.append({n: v for n, v in fresh.run(f).items() if n in names})
            rec.final = compare(reference, outs)
            if rec.final.within(tolerance):
                break
            label, before = history.pop()
            rec.backed_off.append(label)
            say(f"precision: the kept combination is over the tolerance ({rec.final.short()}): backing off "
                f"kernel {label}")
            current = before
            rec.final = rec.fp32 if not history else rec.final
            for v in rec.variants:
                if v.label == label and v.status == "kept":
                    v.status, v.note = "within", "backed off: the combination broke the tolerance"
        if history:
            ex.set_inputs(feeds[0])
            fresh.set_inputs(feeds[0])
            from tensorplan.workflows.peers import time_interleaved
            t = time_interleaved({"fp32": ex.run_bound, "kept": fresh.run_bound}, rounds=rounds)
            rec.baseline_ms, rec.final_ms = t.runners["fp32"].median_ms, t.runners["kept"].median_ms
    rec.chosen = {k.id: f"{k.backend or 'default'}/{k.precision}" for k in current.kernels if k.id in rec.kernels}
    rec.search_s = time.perf_counter() - t_start
    if rec.reduced:       # what `tensorplan run` checks the plan's outputs against (Plan.accuracy_tolerance)
        current.options["tolerance"] = float(tolerance)
    current.stats["precision"] = rec.to_dict()
    return current, rec


def _try_variant(current: Plan, prim: Any, source: Any, ex: Any, index: dict[str, int], calls: list,
                 group: list[str], backend: str, prec: str, threads: int, captured: dict[str, list]
                 ) -> tuple[VariantResult, Plan | None, list | None]:
    """Build every kernel of `group` (alike kernels) of `current` on `backend` at `prec` and bind each to
    the executor's buffers in place of the current one: (record, the plan with them, the plan's calls),
    or (record, None, None) when one does not build as asked. An int8 kernel is quantized on its own
    inputs inside the plan (`captured`, from `PlanExecutor.capture`)."""
    from tensorplan.kernels.vendor import make_kernel
    from tensorplan.runtime.executor import kernel_graph

    v = VariantResult(group[0], backend, prec, "not built", alike=list(group[1:]))
    vplan, vcalls = current, list(calls)
    for kid in group:
        try:
            vplan = vplan.with_precision(kid, prec, backend)
            k = vplan.kernel(kid)
            sub = kernel_graph(prim, k, source)
            sched = {x: y for x, y in k.schedule.items() if x not in ("operators", "quantized")} or None
            compiled = make_kernel(sub, list(k.outputs), backend, threads=threads, schedule=sched, precision=prec,
                                   calibration=captured.get(kid) if prec == "int8" else None)
        except TensorplanError as e:
            v.note = _first_line(e) + (f" (kernel {kid})" if kid != group[0] else "")
            return v, None, None
        if getattr(compiled, "backend", backend) != backend:
            v.status, v.note = "fell back", f"built on {compiled.backend}, not {backend}"
            return v, None, None
        if prec == "int8":     # its quantized model: what rebuilds it without calibration data (Plan.save)
            made = getattr(compiled, "quantized", None)
            if made is None:
                v.note = f"{backend} built an int8 kernel without a quantized model to keep"
                return v, None, None
            vplan = vplan.with_precision(kid, prec, backend, quantized=made)
        try:
            vcalls[index[kid]] = compiled.bind([ex.tensors[n] for n in compiled.input_names],
                                               [ex.tensors[n] for n in compiled.output_names])
        except (TensorplanError, KeyError) as e:
            v.status, v.note = "failed", f"could not bind to the plan's buffers: {_first_line(e)}"
            return v, None, None
    return v, vplan, vcalls


def _time_variants(built: dict[str, tuple[VariantResult, Plan, list]], rounds: int) -> None:
    """Time the plan with each built variant of one kernel, interleaved (sets median_ms and cov)."""
    from tensorplan.workflows.peers import time_interleaved

    def runner(calls: list) -> Callable[[], None]:
        def run() -> None:
            for c in calls:
                c()
        return run
    t = time_interleaved({name: runner(c) for name, (_, _, c) in built.items()}, rounds=rounds)
    for name, (v, _, _) in built.items():
        v.median_ms, v.cov = t.runners[name].median_ms, t.runners[name].cov


def _pick(built: dict[str, tuple[VariantResult, Plan, list]], base_name: str, tolerance: float) -> str:
    """The fastest variant within the tolerance, if it beats the current choice by MIN_GAIN; else the
    current choice."""
    base = built[base_name][0]
    ok = [(v.median_ms, n) for n, (v, _, _) in built.items()
          if n != base_name and v.median_ms is not None and v.accuracy is not None and v.accuracy.within(tolerance)]
    if not ok or base.median_ms is None:
        return base_name
    ms, name = min(ok)
    return name if ms < base.median_ms * (1 - MIN_GAIN) else base_name


def _first_line(e: BaseException) -> str:
    """An error's first line, without the "kernel 'k0': " prefix the record's kernel column already says."""
    import re
    lines = str(e).strip().splitlines()
    return re.sub(r"^kernel '[^']*'(:| \([^)]*\):)\s*", "", lines[0] if lines else type(e).__name__)[:300]


__all__ = ["BACKENDS", "CHOICES", "FP32_RUNNER", "PrecisionSearch", "VariantResult", "accuracy_from_dict", "check_arguments",
           "kernels_to_search", "precisions_to_try", "search_precision"]
