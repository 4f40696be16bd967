"""Reference executor vs ONNX Runtime, one single-op model per case (random inputs).

Each case is a real ONNX model built with onnx.helper; it goes through the importer
(so attribute conversion and folding are exercised too) and must agree with ORT to
max|ref-ort| / max(max|ort|, eps) <= 1e-4.
"""
from __future__ import annotations

import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_close, onnx_model
from tensorplan.ir.onnx_import import import_onnx
from tensorplan.ir.reference import OPS, rel_error, run_reference
from tensorplan.ir.to_onnx import graph_to_onnx, run_onnxruntime

TOL = 1e-4
F = "float32"


class In:
    """A graph input: random data of `shape` (positive / ints in [lo, hi) when asked)."""

    def __init__(self, shape, dtype=F, positive=False, lo=0, hi=4):
        self.shape, self.dtype, self.positive, self.lo, self.hi = tuple(shape), dtype, positive, lo, hi

    def sample(self, rng):
        if self.dtype == "bool":
            return rng.random(self.shape) < 0.5
        if self.dtype.startswith("int"):
            return rng.integers(self.lo, self.hi, self.shape).astype(self.dtype)
        x = rng.standard_normal(self.shape).astype(self.dtype)
        return np.abs(x) + 0.5 if self.positive else x


def i64(*v):
    return np.array(v, dtype=np.int64)


def f32(*v):
    return np.array(v, dtype=np.float32)


# (id, op, inputs, attrs, opset, n_outputs)
CASES = [
    # elementwise unary
    *[(op, op, [In((2, 3, 4, 5))], {}, 17, 1) for op in
      ["Exp", "Tanh", "Sigmoid", "Relu", "Neg", "Abs", "Floor", "Ceil", "Sin", "Cos", "Erf",
       "Softplus", "Identity", "Round", "Sign", "HardSwish"]],
    ("Sqrt", "Sqrt", [In((3, 7), positive=True)], {}, 17, 1),
    ("Log", "Log", [In((3, 7), positive=True)], {}, 17, 1),
    ("Reciprocal", "Reciprocal", [In((3, 7), positive=True)], {}, 17, 1),
    ("Mish", "Mish", [In((2, 9))], {}, 18, 1),
    ("LeakyRelu", "LeakyRelu", [In((4, 6))], {"alpha": 0.1}, 17, 1),
    ("Elu", "Elu", [In((4, 6))], {"alpha": 0.7}, 17, 1),
    ("Selu", "Selu", [In((4, 6))], {}, 17, 1),
    ("HardSigmoid", "HardSigmoid", [In((4, 6))], {"alpha": 0.3, "beta": 0.4}, 17, 1),
    ("Gelu", "Gelu", [In((4, 6))], {}, 20, 1),
    ("Gelu-tanh", "Gelu", [In((4, 6))], {"approximate": "tanh"}, 20, 1),
    ("Clip-11", "Clip", [In((4, 6)), f32(-0.5), f32(0.7)], {}, 11, 1),
    ("Clip-min-only", "Clip", [In((4, 6)), f32(-0.2)], {}, 13, 1),
    ("Cast-int", "Cast", [In((4, 6))], {"to": TensorProto.INT64}, 17, 1),
    ("Cast-bool", "Cast", [In((4, 6))], {"to": TensorProto.BOOL}, 17, 1),
    ("Not", "Not", [In((4, 6), "bool")], {}, 17, 1),
    # binary with broadcasting
    *[(op, op, [In((2, 3, 4)), In((3, 1))], {}, 17, 1) for op in ["Add", "Sub", "Mul", "Max", "Min"]],
    ("Div", "Div", [In((2, 3, 4)), In((4,), positive=True)], {}, 17, 1),
    ("Div-int", "Div", [In((2, 5), "int64", lo=-9, hi=9), i64(2, 3, -4, 5, 7)], {}, 17, 1),
    ("Pow", "Pow", [In((2, 3), positive=True), In((2, 3))], {}, 17, 1),
    ("Pow-const", "Pow", [In((2, 3)), f32(2.0)], {}, 13, 1),
    ("PRelu", "PRelu", [In((2, 3, 4, 4)), np.array([[[0.1]], [[0.2]], [[0.3]]], np.float32)], {}, 17, 1),
    ("Equal", "Equal", [In((3, 4), "int64"), In((4,), "int64")], {}, 17, 1),
    ("Less", "Less", [In((3, 4)), In((4,))], {}, 17, 1),
    ("Greater", "Greater", [In((3, 4)), In((4,))], {}, 17, 1),
    ("And", "And", [In((3, 4), "bool"), In((3, 4), "bool")], {}, 17, 1),
    ("Where", "Where", [In((3, 4), "bool"), In((3, 4)), In((4,))], {}, 17, 1),
    ("Sum3", "Sum", [In((3, 4)), In((3, 4)), In((4,))], {}, 17, 1),
    # reductions / normalisation
    ("ReduceSum-11", "ReduceSum", [In((2, 3, 4))], {"axes": [1], "keepdims": 1}, 11, 1),
    ("ReduceSum-13", "ReduceSum", [In((2, 3, 4)), i64(-1)], {"keepdims": 0}, 13, 1),
    ("ReduceMean-13", "ReduceMean", [In((2, 3, 4))], {"axes": [1, 2]}, 13, 1),
    ("ReduceMean-18", "ReduceMean", [In((2, 3, 4)), i64(1, 2)], {}, 18, 1),
    ("ReduceMax-18", "ReduceMax", [In((2, 3, 4)), i64(0)], {"keepdims": 0}, 18, 1),
    ("ReduceMin", "ReduceMin", [In((2, 3, 4))], {"axes": [2]}, 17, 1),
    ("ReduceProd", "ReduceProd", [In((2, 3, 4))], {"axes": [2]}, 17, 1),
    ("ReduceL2", "ReduceL2", [In((2, 3, 4))], {"axes": [1]}, 17, 1),
    ("ReduceSum-all", "ReduceSum", [In((2, 3, 4))], {}, 17, 1),
    ("ArgMax", "ArgMax", [In((2, 3, 4))], {"axis": 1, "keepdims": 0}, 17, 1),
    ("Softmax-11-axis1", "Softmax", [In((2, 3, 4))], {"axis": 1}, 11, 1),
    ("Softmax-11-default", "Softmax", [In((2, 3, 4))], {}, 11, 1),
    ("Softmax-13-axis1", "Softmax", [In((2, 3, 4))], {"axis": 1}, 13, 1),
    ("Softmax-13-default", "Softmax", [In((2, 3, 4))], {}, 13, 1),
    ("LogSoftmax", "LogSoftmax", [In((2, 3, 4))], {"axis": -1}, 17, 1),
    ("LayerNorm", "LayerNormalization", [In((2, 5, 8)), In((8,)), In((8,))], {"epsilon": 1e-5}, 17, 1),
    ("LayerNorm-axis", "LayerNormalization", [In((2, 5, 8)), In((5, 8)), In((5, 8))],
     {"axis": 1}, 17, 1),
    ("InstanceNorm", "InstanceNormalization", [In((2, 3, 5, 5)), In((3,)), In((3,))], {}, 17, 1),
    ("GroupNorm", "GroupNormalization", [In((2, 6, 4, 4)), In((6,)), In((6,))], {"num_groups": 3}, 21, 1),
    ("BatchNorm", "BatchNormalization",
     [In((2, 3, 4, 4)), In((3,)), In((3,)), In((3,)), In((3,), positive=True)], {}, 15, 1),
    ("Expand", "Expand", [In((3, 1)), i64(2, 3, 4)], {}, 17, 1),
    # layout
    ("Transpose", "Transpose", [In((2, 3, 4))], {"perm": [2, 0, 1]}, 17, 1),
    ("Reshape", "Reshape", [In((2, 3, 4)), i64(0, -1)], {}, 17, 1),
    ("Flatten", "Flatten", [In((2, 3, 4))], {"axis": 2}, 17, 1),
    ("Squeeze-11", "Squeeze", [In((2, 1, 4))], {"axes": [1]}, 11, 1),
    ("Squeeze-13", "Squeeze", [In((2, 1, 4)), i64(1)], {}, 13, 1),
    ("Unsqueeze-11", "Unsqueeze", [In((2, 4))], {"axes": [0, 3]}, 11, 1),
    ("Unsqueeze-13", "Unsqueeze", [In((2, 4)), i64(-1, 0)], {}, 13, 1),
    ("Concat", "Concat", [In((2, 3)), In((2, 5))], {"axis": 1}, 17, 1),
    ("Split-11", "Split", [In((2, 6))], {"axis": 1, "split": [2, 4]}, 11, 2),
    ("Split-13", "Split", [In((2, 6)), i64(1, 5)], {"axis": 1}, 13, 2),
    ("Split-18", "Split", [In((2, 7))], {"axis": 1, "num_outputs": 3}, 18, 3),
    ("Slice", "Slice", [In((4, 6, 5)), i64(1, -4), i64(100, -1), i64(0, 1), i64(1, 2)], {}, 17, 1),
    ("Slice-neg-step", "Slice", [In((4, 6)), i64(-1), i64(-100), i64(1), i64(-2)], {}, 17, 1),
    ("Gather", "Gather", [In((5, 4)), In((2, 3), "int64", lo=-5, hi=5)], {"axis": 0}, 17, 1),
    ("Gather-axis1", "Gather", [In((3, 5, 4)), i64(4, 0)], {"axis": 1}, 17, 1),
    ("Pad-constant", "Pad", [In((1, 2, 3, 3)), i64(0, 0, 1, 2, 0, 0, 2, 1), f32(0.5)],
     {"mode": "constant"}, 17, 1),
    ("Pad-reflect", "Pad", [In((1, 2, 4, 4)), i64(0, 0, 1, 2, 0, 0, 2, 1)], {"mode": "reflect"}, 17, 1),
    ("Pad-edge", "Pad", [In((1, 2, 4, 4)), i64(0, 0, 1, 2, 0, 0, 2, 1)], {"mode": "edge"}, 11, 1),
    ("DepthToSpace-DCR", "DepthToSpace", [In((1, 8, 2, 3))], {"blocksize": 2}, 17, 1),
    ("DepthToSpace-CRD", "DepthToSpace", [In((1, 8, 2, 3))], {"blocksize": 2, "mode": "CRD"}, 17, 1),
    ("SpaceToDepth", "SpaceToDepth", [In((1, 2, 4, 6))], {"blocksize": 2}, 17, 1),
    ("Tile", "Tile", [In((2, 3)), i64(2, 2)], {}, 17, 1),
    ("Shape", "Shape", [In((2, 3, 4))], {"start": 1}, 17, 1),
    # linear
    ("MatMul", "MatMul", [In((2, 3, 8)), In((8, 5))], {}, 17, 1),
    ("MatMul-batched", "MatMul", [In((2, 1, 3, 8)), In((4, 8, 5))], {}, 17, 1),
    ("Gemm", "Gemm", [In((3, 8)), In((5, 8)), In((5,))], {"transB": 1, "alpha": 0.5, "beta": 2.0}, 17, 1),
    ("Einsum", "Einsum", [In((2, 3, 4)), In((2, 4, 5))], {"equation": "bij,bjk->bik"}, 17, 1),
    ("Conv", "Conv", [In((1, 4, 9, 9)), In((6, 4, 3, 3)), In((6,))],
     {"pads": [1, 0, 2, 1], "strides": [2, 1]}, 17, 1),
    ("Conv-group-dil", "Conv", [In((1, 4, 9, 9)), In((4, 2, 3, 3))],
     {"group": 2, "dilations": [2, 2], "pads": [2, 1, 2, 2]}, 11, 1),
    ("Conv-same-upper", "Conv", [In((1, 4, 9, 8)), In((4, 4, 4, 3))],
     {"auto_pad": "SAME_UPPER", "strides": [2, 3]}, 17, 1),
    ("Conv-depthwise", "Conv", [In((1, 4, 8, 8)), In((4, 1, 3, 3))],
     {"group": 4, "pads": [1, 1, 1, 1], "strides": [2, 2]}, 17, 1),
    ("Conv1d", "Conv", [In((2, 3, 10)), In((4, 3, 3))], {"auto_pad": "SAME_LOWER", "strides": [2]}, 17, 1),
    ("ConvTranspose", "ConvTranspose", [In((1, 4, 5, 5)), In((4, 3, 3, 3)), In((3,))],
     {"strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]}, 17, 1),
    ("ConvTranspose-group", "ConvTranspose", [In((1, 4, 5, 5)), In((4, 1, 4, 4))],
     {"strides": [2, 2], "group": 2, "pads": [1, 0, 1, 2]}, 17, 1),
    # pooling
    ("MaxPool", "MaxPool", [In((1, 3, 9, 9))], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                 "pads": [1, 1, 1, 1]}, 17, 1),
    ("MaxPool-ceil", "MaxPool", [In((1, 3, 8, 8))], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                      "ceil_mode": 1}, 17, 1),
    ("MaxPool-same", "MaxPool", [In((1, 3, 7, 7))], {"kernel_shape": [2, 2], "strides": [2, 2],
                                                      "auto_pad": "SAME_UPPER"}, 11, 1),
    ("AveragePool", "AveragePool", [In((1, 3, 9, 9))],
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 17, 1),
    ("AveragePool-incl", "AveragePool", [In((1, 3, 9, 9))],
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}, 17, 1),
    ("AveragePool-ceil", "AveragePool", [In((1, 3, 8, 8))],
     {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, 17, 1),
    ("GlobalAveragePool", "GlobalAveragePool", [In((2, 3, 5, 4))], {}, 17, 1),
    ("GlobalMaxPool", "GlobalMaxPool", [In((2, 3, 5, 4))], {}, 17, 1),
    # resize (opset 11 needs roi; 13+ may omit it)
    ("Resize-nearest-asym", "Resize", [In((1, 2, 3, 4)), f32(), f32(1, 1, 2, 2)],
     {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, 11, 1),
    ("Resize-nearest-half", "Resize", [In((1, 2, 3, 4)), "", f32(1, 1, 2.5, 1.5)],
     {"mode": "nearest"}, 13, 1),
    ("Resize-linear-half", "Resize", [In((1, 2, 5, 4)), "", f32(1, 1, 2, 3)],
     {"mode": "linear"}, 13, 1),
    ("Resize-linear-align", "Resize", [In((1, 2, 5, 4)), "", "", i64(1, 2, 9, 7)],
     {"mode": "linear", "coordinate_transformation_mode": "align_corners"}, 13, 1),
    ("Resize-linear-pytorch", "Resize", [In((1, 2, 5, 4)), f32(), f32(1, 1, 0.5, 2)],
     {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, 11, 1),
    ("Resize-linear-down", "Resize", [In((1, 2, 8, 8)), "", "", i64(1, 2, 3, 5)],
     {"mode": "linear"}, 18, 1),
    ("Resize-cubic", "Resize", [In((1, 2, 5, 4)), "", f32(1, 1, 2, 2)],
     {"mode": "cubic"}, 13, 1),
]


def _onnx_type(dtype: str) -> int:
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


def build_case(op, inputs, attrs, opset, n_out):
    """A one-node ModelProto: `In`s become graph inputs, arrays initializers, "" omitted."""
    g_inputs, inits, names = [], [], []
    for k, spec in enumerate(inputs):
        if isinstance(spec, str) and spec == "":
            names.append("")
        elif isinstance(spec, In):
            names.append(f"in{k}")
            g_inputs.append(helper.make_tensor_value_info(f"in{k}", _onnx_type(spec.dtype), list(spec.shape)))
        else:
            names.append(f"c{k}")
            inits.append(numpy_helper.from_array(np.asarray(spec), f"c{k}"))
    outs = [f"out{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, name="", **attrs)  # empty name on purpose
    graph = helper.make_graph([node], "case", g_inputs,
                              [helper.make_tensor_value_info(o, 0, None) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    # declare output types (ORT needs elem types on graph outputs)
    by_name = {vi.name: vi for vi in model.graph.value_info}
    for o in model.graph.output:
        if o.name in by_name:
            o.CopyFrom(by_name[o.name])
        elif not o.type.tensor_type.elem_type:  # ops that infer nothing: same type as input 0
            o.type.tensor_type.elem_type = g_inputs[0].type.tensor_type.elem_type
    return model


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_onnxruntime(case):
    cid, op, inputs, attrs, opset, n_out = case
    assert op in OPS
    model = build_case(op, inputs, attrs, opset, n_out)
    graph = import_onnx(model)
    assert graph.opset == opset
    assert all(n.name for n in graph.nodes)
    rng = np.random.default_rng(zlib.crc32(cid.encode()))  # str hash() is salted per process: flaky inputs
    feeds = {f"in{k}": s.sample(rng) for k, s in enumerate(inputs) if isinstance(s, In)}
    ref = run_reference(graph, feeds)
    ort = run_onnxruntime(model, feeds)
    for name in graph.outputs:
        assert ref[name].shape == ort[name].shape, (cid, name)
        assert tuple(graph.tensors[name].shape) == ort[name].shape, "inferred shape is wrong"
        assert ref[name].dtype == ort[name].dtype, (cid, ref[name].dtype, ort[name].dtype)
        err = rel_error(ref[name], ort[name])
        assert err <= TOL, f"{cid}: {name} rel error {err:.3g}"


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in {
    "Conv", "Softmax-11-axis1", "ReduceMean-13", "Split-11", "Resize-linear-half", "Gelu",
    "Squeeze-11", "LayerNorm", "Pad-edge", "MatMul-batched"}], ids=lambda c: c[0])
def test_graph_to_onnx_roundtrip(case):
    """Import then export back: ORT runs the exported model and agrees with the original."""
    cid, op, inputs, attrs, opset, n_out = case
    model = build_case(op, inputs, attrs, opset, n_out)
    graph = import_onnx(model)
    exported = graph_to_onnx(graph)
    assert exported.ir_version == 9
    onnx.checker.check_model(exported, full_check=True)
    rng = np.random.default_rng(1)
    feeds = {f"in{k}": s.sample(rng) for k, s in enumerate(inputs) if isinstance(s, In)}
    a = run_onnxruntime(model, feeds)
    b = run_onnxruntime(exported, feeds)
    assert_close(b, a, TOL, graph.outputs, what=cid)


def test_graph_to_onnx_converts_axes_forms_between_opsets():
    """A primitive graph written with opset-11 attribute axes exports at opset 18 (inputs)."""
    model = build_case("ReduceMean", [In((2, 3, 4))], {"axes": [1], "keepdims": 1}, 11, 1)
    graph = import_onnx(model)
    up = graph_to_onnx(graph, opset=18)
    node = up.graph.node[0]
    assert len(node.input) == 2 and not any(a.name == "axes" for a in node.attribute)
    feeds = {"in0": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}
    assert rel_error(run_onnxruntime(up, feeds)["out0"], run_reference(graph, feeds)["out0"]) <= TOL
    # and back down: an axes input that is a constant becomes the attribute again
    down = graph_to_onnx(import_onnx(up), opset=13)
    assert any(a.name == "axes" for a in down.graph.node[0].attribute)
    assert rel_error(run_onnxruntime(down, feeds)["out0"], run_reference(graph, feeds)["out0"]) <= TOL


def test_softmax_opset11_semantics_differ_from_13():
    """Opset 11 Softmax(axis=1) normalises over all of dims 1.. (flattened); 13 over dim 1 only."""
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    g11 = import_onnx(build_case("Softmax", [In((2, 3, 4))], {"axis": 1}, 11, 1))
    g13 = import_onnx(build_case("Softmax", [In((2, 3, 4))], {"axis": 1}, 13, 1))
    y11 = run_reference(g11, {"in0": x})["out0"]
    y13 = run_reference(g13, {"in0": x})["out0"]
    np.testing.assert_allclose(y11.reshape(2, -1).sum(1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(y13.sum(1), 1.0, rtol=1e-5)
    assert not np.allclose(y11, y13)


def test_rel_error_definition():
    b = np.array([1.0, -4.0, 2.0], np.float32)
    a = b + np.array([0.0, 0.004, 0.0], np.float32)
    assert rel_error(a, b) == pytest.approx(0.001, rel=1e-3)
    assert rel_error(np.zeros(3), np.zeros(3)) == 0.0
    assert rel_error(np.array([np.nan]), np.array([1.0])) == float("inf")
    assert rel_error(np.zeros((2, 3)), np.zeros((3, 2))) == float("inf")


def test_rel_error_handles_scalar_outputs():
    from tensorplan.ir.reference import rel_error
    assert rel_error(np.float32(2.0), np.float32(2.0)) == 0.0
    assert rel_error(np.array(1.0, dtype=np.float32), np.array(2.0, dtype=np.float32)) == pytest.approx(0.5)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_maxpool_on_quantized_tensors_matches_onnxruntime(dtype):
    """Quantized models (QOperator format) max-pool int8/uint8 tensors; padding must not be -inf."""
    et = TensorProto.INT8 if dtype == np.int8 else TensorProto.UINT8
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    m = onnx_model([node], {"x": [1, 4, 9, 9]}, ["y"], name="g", elem_type=et)
    info = np.iinfo(dtype)
    x = np.random.default_rng(0).integers(info.min, info.max, (1, 4, 9, 9)).astype(dtype)
    got = run_reference(import_onnx(m), {"x": x})["y"]
    assert got.dtype == dtype and np.array_equal(got, run_onnxruntime(m, {"x": x})["y"])
