"""ONNX backend node tests against tensorplan's importer, reference executor and fission.

The installed `onnx` package generates its backend node test cases from its case scripts
(`onnx.backend.test.case.node.collect_testcases()`): each is a small ModelProto plus inputs and
expected outputs. For every case this harness

1. freezes shape-like runtime inputs (axes, sizes, scales, pads, split sizes, slice bounds,
   repeats, Reshape/Expand shapes, ...; see `SHAPE_INPUTS`) as initializers, so the graph is static;
2. imports it (`tensorplan.ir.onnx_import.import_onnx`), runs the reference executor
   (`run_reference`) and, where a fission rule applies, the fissioned primitive graph, and compares
   with the expected outputs at a tolerance per dtype (`tolerance`);
3. imports the *unfrozen* model (shape-like inputs left as runtime inputs): it must pass or give a
   clear `TensorplanError`, never a wrong result;
4. optionally runs ONNX Runtime (CPU provider) on the case as given, for comparison.

Each case is classified `pass` / `error` (a `TensorplanError`: one clear message) / `wrong`
(numbers, shape or dtype differ, or a non-tensorplan exception, i.e. a traceback).

    .venv/bin/python bench/onnx_conformance.py [--ops Add,Conv] [--no-ort] [--out FILE]

writes bench/results/onnx_conformance.json (with the machine description; `summary.ort_only_by_reason`
groups the cases ONNX Runtime passes and tensorplan refuses by reason, `GAP_REASONS`);
tests/test_onnx_conformance.py runs the same functions (without ONNX Runtime) in `make test`.
"""
from __future__ import annotations

import argparse
import functools
import json
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "onnx_conformance.json"

#: op type -> positions of inputs that fix an output *shape* (or are axes): frozen as constants.
SHAPE_INPUTS: dict[str, set[int]] = {
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Slice": {1, 2, 3, 4}, "Pad": {1, 3},
    "Split": {1}, "Resize": {1, 2, 3}, "Upsample": {1}, "Squeeze": {1}, "Unsqueeze": {1},
    "ConstantOfShape": {0}, "Range": {0, 1, 2}, "TopK": {1}, "OneHot": {1}, "CumSum": {1},
    "CenterCropPad": {1, 2}, "Col2Im": {1, 2}, "MaxUnpool": {2}, "Compress": {1},
    "AffineGrid": {1}, "DFT": {1, 2}, "STFT": {1, 3}, "HannWindow": {0}, "HammingWindow": {0},
    "BlackmanWindow": {0}, "MelWeightMatrix": {0, 1, 2, 3, 4}, "Dropout": {1, 2},
    "Trilu": {1}, "NonMaxSuppression": {2, 3, 4}, "SplitToSequence": {1},
    "Loop": {0, 1},  # trip count and first condition: how many iterations, so scan-output shapes
}


def shape_positions(op: str) -> set[int]:
    if op.startswith("Reduce"):
        return {1}
    return SHAPE_INPUTS.get(op, set())


#: family of an ONNX op type, for the table in docs/results.md
FAMILIES: dict[str, list[str]] = {
    "elementwise": """Abs Acos Acosh Add And Asin Asinh Atan Atanh BitShift BitwiseAnd BitwiseNot
        BitwiseOr BitwiseXor Cast CastLike Ceil Celu Clip Cos Cosh Div Elu Equal Erf Exp Floor Gelu
        Greater GreaterOrEqual HardSigmoid HardSwish Identity IsInf IsNaN LeakyRelu Less LessOrEqual
        Log Max Mean Min Mish Mod Mul Neg Not Or Pow PRelu Reciprocal Relu Round Selu Shrink Sigmoid
        Sign Sin Sinh Softplus Softsign Sqrt Sub Sum Swish Tan Tanh ThresholdedRelu Where Xor
        BitCast""".split(),
    "reduce / arg": """ArgMax ArgMin ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax
        ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare CumSum CumProd TopK Hardmax
        Softmax LogSoftmax SoftmaxCrossEntropyLoss NegativeLogLikelihoodLoss Det""".split(),
    "conv / pool": """AveragePool Conv ConvInteger ConvTranspose DeformConv GlobalAveragePool
        GlobalLpPool GlobalMaxPool LpPool MaxPool MaxRoiPool MaxUnpool QLinearConv RoiAlign Col2Im
        """.split(),
    "linear / quant": """Einsum Gemm MatMul MatMulInteger QLinearMatMul DequantizeLinear
        QuantizeLinear DynamicQuantizeLinear""".split(),
    "normalization / nn": """BatchNormalization GroupNormalization InstanceNormalization LRN
        LayerNormalization LpNormalization MeanVarianceNormalization RMSNormalization Dropout
        Attention RotaryEmbedding GRU LSTM RNN GridSample AffineGrid""".split(),
    "shape / layout": """Concat ConstantOfShape DepthToSpace Expand Flatten Gather GatherElements
        GatherND Pad Reshape Resize Upsample Scatter ScatterElements ScatterND Shape Size Slice
        SpaceToDepth Split Squeeze Tile Transpose Unsqueeze Trilu OneHot Range EyeLike CenterCropPad
        Compress NonZero Unique ReverseSequence Constant TensorScatter""".split(),
}
_FAMILY_OF = {op: fam for fam, ops in FAMILIES.items() for op in ops}


def family(op: str) -> str:
    return _FAMILY_OF.get(op, "control / other")


# ------------------------------------------------------------------ cases
@dataclass
class Case:
    name: str
    op: str          # the op type under test (for *_expanded cases: the op whose function body it is)
    model: Any       # onnx.ModelProto
    inputs: list     # one per graph input: np.ndarray, TensorProto, list (sequence) or None
    outputs: list     # one per graph output
    shape_names: tuple = ()  # graph inputs the op under test reads at a shape-like position


@functools.lru_cache(maxsize=1)
def collect_cases() -> tuple[Case, ...]:
    """Every node test case the installed onnx generates (about 1900 with onnx 1.23; ~8 s)."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        raw = collect_testcases()
    op_of, shape_names = {}, {}
    for tc in raw:
        if "_expanded" not in tc.name and len(tc.model.graph.node) == 1:
            node = tc.model.graph.node[0]
            op_of[tc.name] = node.op_type
            shape_names[tc.name] = tuple(node.input[k] for k in sorted(shape_positions(node.op_type))
                                         if k < len(node.input) and node.input[k])
    out = []
    for tc in raw:
        base = tc.name.split("_expanded")[0]
        op = op_of.get(tc.name) or op_of.get(base)
        if op is None:
            op = tc.model.graph.node[0].op_type if len(tc.model.graph.node) else "?"
        ins, outs = tc.data_sets[0]
        out.append(Case(tc.name, op, tc.model, list(ins), list(outs),
                        shape_names.get(tc.name) or shape_names.get(base) or ()))
    return tuple(out)


def _as_array(v):
    from onnx import TensorProto, numpy_helper
    if isinstance(v, TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, np.generic):
        return np.asarray(v)
    return v


def _opset(model) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 0


def freeze(case: Case):
    """(model with shape-like graph inputs turned into initializers, feeds of the rest, frozen names)."""
    import onnx
    from onnx import numpy_helper
    g = case.model.graph
    names = [vi.name for vi in g.input]
    values = dict(zip(names, case.inputs))
    # the op under test's shape-like inputs (also in its *_expanded function body) and any graph
    # input another node reads at a shape-like position
    wanted = set(case.shape_names)
    for n in g.node:
        wanted |= {i for k, i in enumerate(n.input) if k in shape_positions(n.op_type)}
    frozen = [i for i in names if i in wanted
              and isinstance(values[i], (onnx.TensorProto, np.ndarray, np.generic))]
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    if frozen:
        keep = [vi for vi in m.graph.input if vi.name not in frozen]
        del m.graph.input[:]
        m.graph.input.extend(keep)
        for name in frozen:
            v = values[name]
            t = onnx.TensorProto()
            if isinstance(v, onnx.TensorProto):
                t.CopyFrom(v)
            else:
                t = numpy_helper.from_array(np.asarray(v))
            t.name = name
            m.graph.initializer.append(t)
    feeds = {k: _as_array(v) for k, v in values.items() if k not in frozen}
    return m, feeds, frozen


# ------------------------------------------------------------------ comparison
SCALE_ATOL = 1e-5
def tolerance(dtype: np.dtype) -> tuple[float, float]:
    """(rtol, atol) for an output of this dtype: onnx's own rtol 1e-3 for fp32/fp64 (atol 1e-5
    for values near zero), a few ulps for fp16/bf16; integers and bools compare exactly.
    `compare` widens atol to `SCALE_ATOL` x the largest expected magnitude (an FFT's rounding
    near its zeros is relative to the spectrum's peak, as in tensorplan's `rel_error`)."""
    dt = np.dtype(dtype)
    if dt == np.float16:
        return 4e-3, 1e-3
    if dt.kind == "f" and dt.itemsize >= 4:
        return 1e-3, 1e-5
    if dt.kind in "fV" or "bfloat16" in dt.name:
        return 2e-2, 1e-2
    return 0.0, 0.0


def compare(actual, expected) -> str | None:
    """None when `actual` matches `expected`, else why not (one line)."""
    exp = _as_array(expected)
    if isinstance(exp, list) or isinstance(actual, list):
        return "sequence outputs are not compared"
    exp = np.asarray(exp)
    act = np.asarray(actual)
    if act.shape != exp.shape:
        return f"shape {act.shape} != expected {exp.shape}"
    if exp.dtype.kind in "fc" and act.dtype.kind in "fc":
        if exp.dtype != act.dtype and not ("bfloat16" in exp.dtype.name and act.dtype == np.float32):
            return f"dtype {act.dtype} != expected {exp.dtype}"
    elif exp.dtype != act.dtype and exp.dtype.kind in "iub?" :
        return f"dtype {act.dtype} != expected {exp.dtype}"
    if exp.dtype.kind in "iub?" or exp.dtype.kind in "OSU":
        if exp.dtype.kind in "OSU":
            same = exp.tolist() == act.tolist()
        else:
            same = np.array_equal(act, exp)
        return None if same else f"values differ ({int(np.sum(act != exp))} of {exp.size} elements)"
    rtol, atol = tolerance(exp.dtype)
    e = exp.astype(np.float64)
    a = act.astype(np.float64)
    finite = np.abs(e[np.isfinite(e)])
    if finite.size:
        atol = max(atol, SCALE_ATOL * float(finite.max()))
    with np.errstate(all="ignore"):
        ok = np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if ok.all():
        return None
    bad = ~ok
    k = int(np.argmax(bad.reshape(-1)))
    return (f"values differ in {int(bad.sum())} of {exp.size} elements (e.g. {float(a.reshape(-1)[k]):.7g} vs "
            f"expected {float(e.reshape(-1)[k]):.7g}; rtol {rtol:g}, atol {atol:.3g})")


# ------------------------------------------------------------------ running
def _short(e: BaseException) -> str:
    s = str(e).strip().replace("\n", " ")
    return (f"{type(e).__name__}: " + s)[:400]


@dataclass
class Outcome:
    status: str                 # pass | error | wrong
    stage: str = ""             # import | reference | fission | ...
    message: str = ""
    extra: dict = field(default_factory=dict)


def _run_graph(graph, feeds: dict, expected: list, names: list[str], stage: str) -> Outcome:
    from tensorplan.errors import TensorplanError
    from tensorplan.ir.reference import run_reference
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = run_reference(graph, {k: v for k, v in feeds.items() if k in graph.inputs},
                                check_shapes=True)
    except TensorplanError as e:
        return Outcome("error", stage, _short(e))
    except Exception as e:  # a traceback: counts as wrong
        return Outcome("wrong", stage, "traceback: " + _short(e))
    for name, exp in zip(names, expected):
        if name not in got:
            return Outcome("wrong", stage, f"output '{name}' missing")
        why = compare(got[name], exp)
        if why:
            return Outcome("wrong", stage, f"output '{name}': {why}")
    return Outcome("pass", stage)


def run_tensorplan(model, feeds: dict, expected: list, *, do_fission: bool = True) -> Outcome:
    """Import, run the reference executor and (where a rule applies) the fissioned graph."""
    from tensorplan.errors import TensorplanError
    from tensorplan.ir.onnx_import import import_onnx
    names = [vi.name for vi in model.graph.output]
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            graph = import_onnx(model)
    except TensorplanError as e:
        return Outcome("error", "import", _short(e))
    except Exception as e:
        return Outcome("wrong", "import", "traceback: " + _short(e))
    missing = [i for i in graph.inputs if i not in feeds or feeds[i] is None]
    if missing:
        return Outcome("wrong", "import", f"graph inputs {missing} have no value")
    ref = _run_graph(graph, feeds, expected, names, "reference")
    if ref.status != "pass" or not do_fission:
        return ref
    from tensorplan.korch.fission import fission
    try:
        res = fission(graph)
    except TensorplanError as e:
        return Outcome("error", "fission", _short(e))
    except Exception as e:
        return Outcome("wrong", "fission", "traceback: " + _short(e))
    if not res.rules_applied:
        ref.extra["fission"] = "no rule"
        return ref
    out = _run_graph(res.graph, feeds, expected, names, "fission")
    out.extra["fission"] = sorted(res.rules_applied)
    return out


def run_ort(case: Case) -> Outcome:
    """ONNX Runtime (CPU provider) on the case as given."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    try:
        sess = ort.InferenceSession(case.model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        names = [vi.name for vi in case.model.graph.input]
        feeds = {k: _as_array(v) for k, v in zip(names, case.inputs) if v is not None}
        got = sess.run(None, feeds)
    except Exception as e:
        return Outcome("error", "ort", _short(e))
    for k, (a, exp) in enumerate(zip(got, case.outputs)):
        why = compare(a, exp)
        if why:
            return Outcome("fail", "ort", f"output {k}: {why}")
    return Outcome("pass", "ort")


def run_case(case: Case, *, ort: bool = False) -> dict:
    """One case: frozen (static) run, the unfrozen variant where inputs were frozen, ORT."""
    t0 = time.perf_counter()
    model, feeds, frozen = freeze(case)
    res = run_tensorplan(model, feeds, case.outputs)
    row = {"name": case.name, "op": case.op, "family": family(case.op), "opset": _opset(case.model),
           "status": res.status, "stage": res.stage, "message": res.message, "frozen": frozen}
    if "fission" in res.extra:
        row["fission"] = res.extra["fission"]
    if frozen:
        names = [vi.name for vi in case.model.graph.input]
        all_feeds = {k: _as_array(v) for k, v in zip(names, case.inputs)}
        un = run_tensorplan(case.model, all_feeds, case.outputs, do_fission=False)
        row["unfrozen"] = {"status": un.status, "stage": un.stage, "message": un.message}
    if ort:
        o = run_ort(case)
        row["ort"] = o.status
        if o.status != "pass":
            row["ort_message"] = o.message
    row["seconds"] = round(time.perf_counter() - t0, 4)
    return row


def overall(row: dict) -> str:
    """A case's class: `wrong` when the frozen or the unfrozen run is wrong, else its frozen status."""
    if row["status"] == "wrong" or row.get("unfrozen", {}).get("status") == "wrong":
        return "wrong"
    return row["status"]


#: why ONNX Runtime passes a case tensorplan refuses: (group, pattern in tensorplan's message)
GAP_REASONS: list[tuple[str, str]] = [
    ("string tensors", r"element type STRING"),
    ("data-dependent output shape", r"data-dependent shape|depends on input values|shape depends on runtime"),
    ("control flow decided at run time", r"could not be constant-folded"),
    ("old operator version not converted", r"is older than tensorplan implements|opset \d+ is outside"),
]


def gap_reason(row: dict) -> str:
    """The group of a case ONNX Runtime passes and tensorplan refuses (see `GAP_REASONS`)."""
    for group, pattern in GAP_REASONS:
        if re.search(pattern, row.get("message", "")):
            return group
    return "other"


def summarize(rows: list[dict]) -> dict:
    fams: dict[str, dict[str, int]] = {}
    for r in rows:
        f = fams.setdefault(r["family"], {"cases": 0, "pass": 0, "error": 0, "wrong": 0, "ort_pass": 0,
                                          "both_pass": 0, "ort_only": 0})
        f["cases"] += 1
        c = overall(r)
        f[c] += 1
        if r.get("ort") == "pass":
            f["ort_pass"] += 1
            f["both_pass" if c == "pass" else "ort_only"] += 1
    total = {k: sum(f[k] for f in fams.values()) for k in next(iter(fams.values()))} if fams else {}
    gap: dict[str, list[str]] = {}
    for r in rows:
        if r.get("ort") == "pass" and overall(r) != "pass":
            gap.setdefault(gap_reason(r), []).append(r["name"])
    return {"families": fams, "total": total, "ort_only_by_reason": gap}


def _compact(row: dict) -> dict:
    out = {k: v for k, v in row.items() if v not in ("", [], None) and k != "seconds"}
    for k in ("message", "ort_message"):
        if k in out:
            out[k] = out[k][:240]
    if "unfrozen" in out:
        out["unfrozen"] = {k: (v[:240] if isinstance(v, str) else v)
                           for k, v in out["unfrozen"].items() if v not in ("", None)}
    return out


def _dump(doc: dict) -> str:
    """The document indented, each case on one line (the file stays small and diffable)."""
    head = {k: v for k, v in doc.items() if k != "cases"}
    text = json.dumps(head, indent=1, default=str)[:-2]
    cases = ",\n".join("  " + json.dumps(_compact(r), default=str) for r in doc["cases"])
    return f"{text},\n \"cases\": [\n{cases}\n ]\n}}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="", help="comma-separated op types (default: every case)")
    ap.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    import onnx
    import onnxruntime

    from tensorplan.devices.detect import machine_info
    ops = {o for o in args.ops.split(",") if o}
    cases = [c for c in collect_cases() if not ops or c.op in ops]
    t0 = time.time()
    rows = []
    for k, c in enumerate(cases):
        rows.append(run_case(c, ort=not args.no_ort))
        if (k + 1) % 200 == 0:
            print(f"{k + 1}/{len(cases)} cases, {time.time() - t0:.0f} s", flush=True)
    doc = {
        "command": "python bench/onnx_conformance.py" + (f" --ops {args.ops}" if ops else "")
                   + (" --no-ort" if args.no_ort else ""),
        "started": t0, "seconds": round(time.time() - t0, 1),
        "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
        "machine": machine_info(),
        "summary": summarize(rows), "cases": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(_dump(doc))
    s = doc["summary"]["total"]
    print(f"{len(rows)} cases in {doc['seconds']} s: pass {s.get('pass')}, clear error {s.get('error')}, "
          f"wrong {s.get('wrong')}; ONNX Runtime passes {s.get('ort_pass')}  -> {args.out}")
    for r in rows:
        if overall(r) == "wrong":
            m = r["message"] if r["status"] == "wrong" else "unfrozen: " + r["unfrozen"]["message"]
            print(f"  WRONG {r['name']} [{r['stage']}]: {m[:200]}")


if __name__ == "__main__":
    main()
