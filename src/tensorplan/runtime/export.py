"""A plan (or a model) as one standalone ONNX file that stock ONNX Runtime runs.

Why: users deploy with ONNX Runtime, not with tensorplan. Every exact rewrite a plan relies on
(tensorplan.rewrite) is an ONNX-to-ONNX change, and when all of a plan's kernels run in ONNX
Runtime (on the Korch benchmark models the race keeps one region session over the whole
rewritten graph) the rewritten model *is* the plan: `pip install onnxruntime` is all it needs.
Where the plan also has TVM, PyTorch or Inductor kernels the file is the rewritten model without
them, and the result says so. Precision: a plan whose one kernel is an int8 ONNX Runtime region
over the whole rewritten model exports as that kernel's quantized (QDQ) model, which is the plan
itself; reduced-precision kernels an ONNX file cannot carry faithfully (bf16/fp16, which ONNX
Runtime's CPU provider has no kernels for; OpenVINO's int8 IR; int8 regions of a plan of several
kernels) are not carried: the file is the fp32 rewritten model and the result says so. Either
way the file is checked against ONNX Runtime on the original model and timed against it,
interleaved, so it ships with its measured proof; the session options it was timed with are
stored in the file's metadata.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tensorplan.devices import usable_cores
from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph

if TYPE_CHECKING:  # the plan module calls this one (Plan.export), not the other way round
    from tensorplan.runtime.plan import Plan

META_PREFIX = "tensorplan."


@dataclass
class ExportResult:
    """What was written, how it relates to the plan, and its check and timing against the original."""

    model: str
    path: str
    source: str                      # "plan" (a plan) or "model" (rewrites only)
    exact: bool                      # the file computes exactly what the plan runs, the same way
    relation: str                    # one line: what the file is with respect to the plan
    kernels: int                     # kernels of the plan (0 without one)
    outside_ort: dict[str, int]      # plan kernels the file does not carry: backend -> count
    rewrites: dict[str, int]
    nodes: tuple[int, int]           # operators: original, exported
    gflop: tuple[float, float]
    bytes: int
    session: dict[str, Any]          # ONNX Runtime options it was checked and timed with
    max_rel_err: float | None = None
    tol: float = 1e-4
    timing: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    reference: str = ""              # the original ONNX Runtime ran: the model file as given

    @property
    def ok(self) -> bool:
        return self.max_rel_err is None or self.max_rel_err <= self.tol

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _plan_relation(plan: "Plan", source_nodes: set[str]) -> tuple[bool, str, dict[str, int], dict[str, Any]]:
    """(exact, relation, kernels the file does not carry by backend (and precision, when not fp32),
    session options of its regions)."""
    from tensorplan.runtime.executor import DEFAULT_BACKEND
    outside: dict[str, int] = {}
    spinning = False
    covered: set[str] = set()
    for k in plan.kernels:
        backend = k.backend or DEFAULT_BACKEND.get(k.kind, "ort")
        if backend == "ort":
            spinning = spinning or bool(k.schedule.get("spinning", False))
            covered |= set(k.schedule.get("operators") or ())
        if backend != "ort" or k.precision != "fp32":
            key = backend if k.precision == "fp32" else f"{backend} {k.precision}"
            outside[key] = outside.get(key, 0) + 1
    n = len(plan.kernels)
    whole = n == 1 and plan.kernels[0].kind == "region" and covered == source_nodes
    if whole and plan.kernels[0].precision == "int8" and set(outside) == {"ort int8"}:
        return True, ("the plan itself: its one kernel, ONNX Runtime's int8 (QDQ) model of the whole rewritten "
                      "model"), {}, {"spinning": spinning}
    if not outside and whole:
        return True, "the plan itself: one ONNX Runtime session over the whole rewritten model", {}, \
            {"spinning": spinning}
    reduced = {b: c for b, c in outside.items() if " " in b}
    if reduced:
        parts = ", ".join(f"{c} {b}" for b, c in sorted(reduced.items()))
        return False, (f"the rewritten model at fp32 only: {sum(reduced.values())} of the plan's {n} kernels run "
                       f"at reduced precision ({parts}), which one ONNX file for ONNX Runtime does not carry "
                       "faithfully (ONNX Runtime's CPU provider has no bf16/fp16 kernels, OpenVINO's int8 model "
                       "is OpenVINO IR, and only an int8 plan of one ONNX Runtime kernel is one QDQ model); "
                       "`tensorplan run PLAN` runs the plan itself"), outside, {"spinning": spinning}
    if not outside:
        return False, (f"the plan's {n} ONNX Runtime kernels as one session over the rewritten model "
                       "(same operators, fewer kernel boundaries)"), {}, {"spinning": spinning}
    parts = ", ".join(f"{c} {b}" for b, c in sorted(outside.items()))
    m = sum(outside.values())
    what = ("the plan's only kernel runs" if n == 1 else f"all {n} of the plan's kernels run" if m == n else
            f"{m} of the plan's {n} kernels run")
    return False, (f"the rewritten model only: {what} outside ONNX Runtime ({parts}), which this file "
                   "does not carry; `tensorplan run PLAN` runs the plan itself"), outside, {"spinning": spinning}


def export_plan(plan: "Plan", out: str | Path, *, threads: int | None = None, check: bool = True,
                tol: float | None = None, rounds: int = 15, spinning: bool | None = None,
                log: Callable[[str], None] | None = None) -> ExportResult:
    """`Plan.export`: the plan's rewritten model as one ONNX file, checked and timed (module docstring).
    The plan is verified against its model first (`Plan.check`), and the check runs ONNX Runtime on
    the model file as given."""
    plan.check()
    original = plan.model_graph()
    reference = plan.reference_model() if (check or rounds > 0) else None
    graph = plan.source_graph()
    rewrites: dict[str, int] = {}
    for rule, _ in plan.source.get("rewrites") or []:
        rewrites[rule] = rewrites.get(rule, 0) + 1
    exact, relation, outside, sess_opts = _plan_relation(plan, {n.name for n in graph.nodes})
    model = None
    if exact and plan.kernels[0].precision == "int8":   # the plan's own quantized model
        import onnx
        q = plan.quantized_model(plan.kernels[0].id)
        if q is None:
            raise TensorplanError(f"kernel '{plan.kernels[0].id}' is int8 but has no quantized model yet: quantize "
                                  "it (Plan.with_precision(..., calibration=FEEDS)) before exporting the plan")
        model = onnx.load_model_from_string(q.model)
        tol = plan.accuracy_tolerance() if tol is None else tol
    return _write(original, graph, out, source="plan", spec=str(plan.source.get("model")), model=model,
                  opset=int(plan.source.get("opset", 17)), exact=exact, relation=relation, outside=outside,
                  rewrites=rewrites, kernels=len(plan.kernels), spinning=sess_opts["spinning"] if spinning is None
                  else bool(spinning), fingerprint=str(plan.source.get("fingerprint", "")), threads=threads,
                  check=check, tol=tol, rounds=rounds, log=log, reference=reference)


def export_model(original: Graph, out: str | Path, *, threads: int | None = None, check: bool = True,
                 tol: float | None = None, rounds: int = 15, spinning: bool | None = None,
                 log: Callable[[str], None] | None = None) -> ExportResult:
    """A model with tensorplan's exact rewrites only (no plan), as one ONNX file, checked and timed."""
    from tensorplan.rewrite import rewrite
    rr = rewrite(original)
    relation = ("the model with tensorplan's exact rewrites" if rr.counts else
                "the model re-exported: no exact rewrite applies to it")
    return _write(original, rr.graph, out, source="model", spec=original.source or original.name,
                  opset=int(original.opset),
                  exact=False, relation=relation, outside={}, rewrites=dict(rr.counts), kernels=0,
                  spinning=True if spinning is None else bool(spinning), fingerprint=None, threads=threads,
                  check=check, tol=tol, rounds=rounds, log=log)


def _write(original: Graph, graph: Graph, out: str | Path, *, source: str, spec: str, opset: int, exact: bool,
           relation: str, outside: dict[str, int], rewrites: dict[str, int], kernels: int, spinning: bool,
           fingerprint: str | None, threads: int | None, check: bool, tol: float | None, rounds: int,
           log: Callable[[str], None] | None, reference: tuple[bytes, str] | None = None,
           model=None) -> ExportResult:
    """Write `graph` (the rewritten `original`; or `model`, an ONNX model of it such as its int8
    quantization) with its provenance in the metadata; check and time it."""
    from tensorplan import __version__
    from tensorplan.ir.analysis import graph_flops
    from tensorplan.ir.reference import default_tolerance
    from tensorplan.ir.to_onnx import graph_to_onnx
    from tensorplan.paths import atomic_write

    say = log or (lambda msg: None)
    t_all = time.perf_counter()
    threads = int(threads or usable_cores())
    if list(graph.inputs) != list(original.inputs) or list(graph.outputs) != list(original.outputs):
        raise TensorplanError(f"{spec}: the rewritten graph's inputs/outputs {graph.inputs} -> {graph.outputs} differ "
                              f"from the model's {original.inputs} -> {original.outputs}; it would not be a drop-in "
                              "replacement (re-run `tensorplan orchestrate`)")
    say(f"{spec}: {relation}")
    int8 = model is not None
    model = graph_to_onnx(graph) if model is None else model
    session = {"intra_op_num_threads": threads, "inter_op_num_threads": 1,
               "graph_optimization_level": "ORT_ENABLE_ALL",
               "session.intra_op.allow_spinning": "1" if spinning else "0"}
    meta = {"source": spec, "exact": json.dumps(exact), "relation": relation,
            "rewrites": json.dumps(rewrites, sort_keys=True), "ort_session": json.dumps(session, sort_keys=True)}
    if fingerprint is not None:
        meta["plan_fingerprint"] = fingerprint
    meta["precision"] = "int8" if int8 else "fp32"
    meta["version"] = __version__
    for k, v in meta.items():
        p = model.metadata_props.add()
        p.key, p.value = META_PREFIX + k, v
    data = model.SerializeToString()
    out = Path(out)
    if out.is_dir():
        raise TensorplanError(f"-o {out} is a directory; name the ONNX file to write, e.g. {out / 'model.onnx'}")
    atomic_write(out, data)
    say(f"wrote {out} ({len(data) / 2**20:.1f} MiB, {len(model.graph.node)} operators)")

    res = ExportResult(model=spec, path=str(out), source=source, exact=exact, relation=relation, kernels=kernels,
                       outside_ort=outside, rewrites=rewrites,
                       nodes=(len(original.nodes), len(model.graph.node) if int8 else len(graph.nodes)),
                       gflop=(graph_flops(original) / 1e9, graph_flops(graph) / 1e9), bytes=len(data),
                       session=session, tol=default_tolerance(original) if tol is None else tol)
    if check or rounds > 0:
        _check_and_time(res, original, opset, model, threads, spinning, check, rounds, say, reference)
    res.seconds = time.perf_counter() - t_all
    return res


def _check_and_time(res: ExportResult, original: Graph, opset: int, exported, threads: int, spinning: bool,
                    check: bool, rounds: int, say: Callable[[str], None],
                    reference: tuple[bytes, str] | None = None) -> None:
    """Fill `res.max_rel_err` (exported vs original, both in ONNX Runtime) and `res.timing`. The
    original is `reference` (ONNX bytes, where from): the model file as given."""
    import onnx

    from tensorplan.ir.reference import random_feeds, rel_error
    from tensorplan.ir.to_onnx import ort_session
    from tensorplan.measure.timer import interleaved, pinned_threads
    from tensorplan.zoo.specs import onnx_bytes

    feeds = random_feeds(original, seed=0)
    data, where = reference if reference is not None else (onnx_bytes(original, opset), original.source or "")
    try:
        orig_model = onnx.load_model_from_string(data)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise TensorplanError(f"the original model {where} does not parse as ONNX: {e}") from None
    res.reference = where
    with pinned_threads(threads):
        s_orig = ort_session(orig_model, threads, spinning=spinning)
        s_new = ort_session(exported, threads, spinning=spinning)
        orig_in = {i.name for i in s_orig.get_inputs()}
        f_orig = {k: v for k, v in feeds.items() if k in orig_in}
        names = [o.name for o in s_orig.get_outputs()]
        if check:
            want = dict(zip(names, _ort_run(s_orig, names, f_orig, f"the original model {where}")))
            got = dict(zip(names, _ort_run(s_new, names, feeds, f"the exported file {res.path}")))
            missing = [n for n in names if n not in got]
            if missing:
                raise TensorplanError(f"the exported file {res.path} lacks the original's output(s) {missing[:3]}")
            res.max_rel_err = max(rel_error(got[n], want[n]) for n in names)
            say(f"max relative error vs ONNX Runtime on the original: {res.max_rel_err:.2e}")
        if rounds > 0:
            times = interleaved({"original": lambda: _ort_run(s_orig, names, f_orig, f"the original model {where}"),
                                 "exported": lambda: _ort_run(s_new, names, feeds, f"the exported file {res.path}")},
                                rounds=rounds, burst_s=0.03)
            med = {k: float(np.median(v)) for k, v in times.items()}
            cov = {k: float(np.std(v) / np.mean(v)) for k, v in times.items()}
            res.timing = {"original_ms": med["original"] * 1e3, "exported_ms": med["exported"] * 1e3,
                          "speedup": med["original"] / med["exported"], "cov": cov, "rounds": rounds,
                          "threads": threads,
                          "method": "ONNX Runtime, both sessions in one process, interleaved in random order; "
                                    "per round one untimed call then a ~30 ms burst, its median kept; "
                                    "median over rounds"}
            say(f"ONNX Runtime: original {res.timing['original_ms']:.2f} ms, exported "
                f"{res.timing['exported_ms']:.2f} ms ({res.timing['speedup']:.2f}x)")


def _ort_run(sess, names: list[str], feeds: dict[str, np.ndarray], what: str) -> list:
    """`sess.run`, with ONNX Runtime's run-time failures as one clear TensorplanError."""
    try:
        return sess.run(names, feeds)
    except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own exception types
        raise TensorplanError(f"ONNX Runtime failed running {what}: {str(e).strip()[:300]}") from None


__all__ = ["ExportResult", "META_PREFIX", "export_model", "export_plan"]
