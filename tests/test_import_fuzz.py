"""Fuzz the importer: truncated and byte-mutated model files, and structurally mutated zoo models
(attributes, attribute types, weight shapes, declared shapes, rewired inputs, op types, opsets).

Whatever the file, `import_onnx` either raises one `TensorplanError` (never a raw exception from
protobuf, onnx or numpy) or returns a valid Graph; and when it returns a Graph, ONNX Runtime loads
and runs the same file and the reference executor agrees with it. Bounded: a fixed number of
derandomized examples on models of a few kB."""
from __future__ import annotations

import functools
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import numpy_helper

from tensorplan import zoo
from tensorplan.errors import TensorplanError
from tensorplan.ir.onnx_import import MAX_OPSET, import_onnx
from tensorplan.ir.reference import random_feeds, run_reference


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        y = y.reshape(y.shape[0], -1)
        return torch.softmax(self.fc(y), -1)


@functools.lru_cache(maxsize=1)
def model_bytes() -> bytes:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = Path(d) / "small.onnx"
        torch.onnx.export(Small().eval(), (torch.randn(1, 3, 8, 8),), str(p), opset_version=13,
                          dynamo=False, input_names=["x"], output_names=["y"],
                          do_constant_folding=False)
        return p.read_bytes()


class OldSmall(torch.nn.Module):
    """At opset 9: Upsample, Pad-2, Slice-1, Clip-6, TopK-1 (forms import converts to opset 11)."""

    def forward(self, x):
        y = torch.nn.functional.interpolate(torch.relu(x), scale_factor=2, mode="bilinear")
        y = torch.clamp(torch.nn.functional.pad(y, (1, 1, 0, 0))[:, :, :, 1:-1], 0, 3)
        return torch.topk(y.reshape(y.shape[0], -1), 3)[0]


@functools.lru_cache(maxsize=1)
def old_opset_bytes() -> bytes:
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = Path(d) / "old.onnx"
        torch.onnx.export(OldSmall().eval(), (torch.randn(1, 2, 4, 4),), str(p), opset_version=9,
                          dynamo=False, input_names=["x"], output_names=["y"], do_constant_folding=False)
        return p.read_bytes()


@functools.lru_cache(maxsize=None)
def zoo_bytes(name: str) -> bytes:
    return zoo.export(name, 17).read_bytes()


_DIR = tempfile.mkdtemp(prefix="tp_fuzz_")


def _ort_outcome(data: bytes, feeds: dict) -> tuple[str, dict | str]:
    """("ok", outputs) when ONNX Runtime loads and runs the bytes, else ("load"|"run", reason)."""
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = 1
    try:
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        return "load", str(e).splitlines()[0][:300]
    try:
        names = [o.name for o in sess.get_outputs()]
        return "ok", dict(zip(names, sess.run(names, {i.name: feeds[i.name] for i in sess.get_inputs()})))
    except Exception as e:
        return "run", str(e).splitlines()[0][:300]


def _agree(got: np.ndarray, want: np.ndarray) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return False
    if got.dtype.kind in "biu" or want.dtype.kind in "biu":
        return np.array_equal(got, want)
    g, w = got.astype(np.float64), want.astype(np.float64)
    scale = float(np.nanmax(np.abs(w[np.isfinite(w)]))) if np.isfinite(w).any() else 1.0
    return bool(np.allclose(g, w, rtol=1e-3, atol=1e-4 * max(scale, 1e-6), equal_nan=True))


def _check(data: bytes) -> str | None:
    """The TensorplanError message if the bytes are rejected; None if they import, in which case
    ONNX Runtime must load and run the same file and agree with the reference executor. Any
    other exception propagates (and fails the test)."""
    p = Path(_DIR) / "fuzz.onnx"
    p.write_bytes(data)
    try:
        g = import_onnx(p)
    except TensorplanError as e:
        assert str(e).strip(), "rejected with an empty error message"
        return str(e)
    g.validate()  # if it imports, it is a well-formed static graph
    feeds = random_feeds(g, seed=3)
    kind, res = _ort_outcome(data, feeds)
    assert kind == "ok", f"tensorplan imported a model ONNX Runtime refuses ({kind}): {res}"
    try:
        ref = run_reference(g, feeds)
    except TensorplanError as e:
        raise AssertionError(f"imported, ONNX Runtime runs it, but the reference executor fails: {e}")
    for o in g.outputs:
        assert o in res, f"output '{o}' missing from ONNX Runtime's outputs"
        assert _agree(ref[o], res[o]), (
            f"output '{o}': tensorplan and ONNX Runtime disagree "
            f"(shapes {np.shape(ref[o])} vs {np.shape(res[o])})")
    return None


def test_original_bytes_import():
    assert _check(model_bytes()) is None
    g = import_onnx(_write(model_bytes()))
    assert g.tensors["y"].shape == (1, 5)


def _write(data: bytes) -> Path:
    p = Path(_DIR) / "orig.onnx"
    p.write_bytes(data)
    return p


FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(cut=st.integers(min_value=0, max_value=10**9))
def test_truncated_bytes_raise_only_tensorplan_errors(cut):
    data = model_bytes()
    _check(data[: cut % len(data)])


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_bytes_raise_only_tensorplan_errors(edits):
    data = bytearray(model_bytes())
    for pos, val in edits:
        data[pos % len(data)] = val
    _check(bytes(data))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=4),
       head=st.integers(0, 400))
def test_mutations_in_structure_raise_only_tensorplan_errors(edits, head):
    """Mutate only outside the big weight blob, where the graph structure lives."""
    data = bytearray(model_bytes())
    # the structure (nodes, attributes, shapes) is mostly in the first and last few hundred bytes
    n = len(data)
    for pos, val in edits:
        idx = pos % (2 * 400)
        idx = idx if idx < 400 else n - 1 - (idx - 400)
        data[(idx + head) % n] = val
    _check(bytes(data))


# ---------------------------------------------------------------- structural mutations of zoo models
_SWAP_OPS = ["Relu", "Sigmoid", "Add", "Mul", "MatMul", "Transpose", "Softmax", "Reshape", "Concat",
             "Conv", "Gemm", "Identity", "ReduceMean", "Flatten", "Squeeze"]


def _mutate(m: onnx.ModelProto, kind: int, a: int, b: int) -> None:
    """One structural edit, chosen by `kind` and placed by `a`, `b` (any integers)."""
    g = m.graph
    nodes = list(g.node)
    node = nodes[a % len(nodes)] if nodes else None
    kind %= 9
    if kind == 0 and node is not None and node.attribute:        # an int / ints attribute value
        at = node.attribute[b % len(node.attribute)]
        delta = [1, -1, 2, -3, 7][b % 5]
        if at.type == onnx.AttributeProto.INT:
            at.i += delta
        elif at.type == onnx.AttributeProto.INTS and at.ints:
            at.ints[b % len(at.ints)] += delta
        elif at.type == onnx.AttributeProto.FLOAT:
            at.f *= -2.0
    elif kind == 1 and node is not None and node.attribute:      # an INT attribute stored as FLOAT
        at = node.attribute[b % len(node.attribute)]
        if at.type == onnx.AttributeProto.INT:
            v = at.i
            at.ClearField("i")
            at.type, at.f = onnx.AttributeProto.FLOAT, float(v)
    elif kind == 2 and g.initializer:                            # a weight with another shape
        t = g.initializer[a % len(g.initializer)]
        arr = numpy_helper.to_array(t)
        shape = list(arr.shape) or [1]
        k = b % len(shape)
        shape[k] = max(1, shape[k] + [1, -1, 2][b % 3])
        new = np.resize(arr.reshape(-1), shape).astype(arr.dtype) if arr.size else np.zeros(shape, arr.dtype)
        t.CopyFrom(numpy_helper.from_array(new, t.name))
    elif kind == 3:                                              # a declared output / value_info dim
        vis = list(g.output) + list(g.value_info)
        vi = vis[a % len(vis)]
        dims = vi.type.tensor_type.shape.dim
        if len(dims):
            d = dims[b % len(dims)]
            d.dim_value = (d.dim_value if d.HasField("dim_value") else 1) + 1 + b % 3
    elif kind == 4 and node is not None and node.input:          # rewire an input
        names = [i.name for i in g.input] + [o for n in nodes for o in n.output] + \
                [t.name for t in g.initializer]
        node.input[b % len(node.input)] = names[(a * 7 + b) % len(names)]
    elif kind == 5 and node is not None:                         # another op type
        node.op_type = _SWAP_OPS[b % len(_SWAP_OPS)]
    elif kind == 6:                                              # another opset
        for o in m.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = 7 + b % (MAX_OPSET - 4)
    elif kind == 7 and node is not None and node.input:          # drop an input
        del node.input[b % len(node.input)]
    elif kind == 8 and g.input:                                  # an input's declared shape
        dims = g.input[a % len(g.input)].type.tensor_type.shape.dim
        if len(dims):
            dims[b % len(dims)].dim_value = 1 + b % 5


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["tiny-cnn", "tiny-attention"]),
       edits=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 10**6), st.integers(0, 10**6)),
                      min_size=1, max_size=3))
def test_mutated_zoo_models_error_cleanly_or_agree_with_onnxruntime(model, edits):
    m = onnx.ModelProto()
    m.ParseFromString(zoo_bytes(model))
    for kind, a, b in edits:
        _mutate(m, kind, a, b)
    _check(m.SerializeToString())


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 10**6), st.integers(0, 10**6)),
                      min_size=1, max_size=3))
def test_mutated_old_opset_model_errors_cleanly_or_agrees_with_onnxruntime(edits):
    """The opset-9 path (validated at opset 9, converted to 11) under the same mutations."""
    m = onnx.ModelProto()
    m.ParseFromString(old_opset_bytes())
    for kind, a, b in edits:
        _mutate(m, kind, a, b)
    _check(m.SerializeToString())


def test_old_opset_model_imports_and_agrees_unmutated():
    assert _check(old_opset_bytes()) is None
    assert import_onnx(_write(old_opset_bytes())).opset == 11


def test_zoo_models_import_and_agree_unmutated():
    for name in ("tiny-cnn", "tiny-attention"):
        assert _check(zoo_bytes(name)) is None, name


def test_fuzz_model_is_small():
    assert len(model_bytes()) < 20_000
    assert all(len(zoo_bytes(n)) < 2_000_000 for n in ("tiny-cnn", "tiny-attention"))
