"""ONNX import: real models (onnx.helper and torch exports), folding, overrides, errors."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from conftest import assert_close
from tensorplan.errors import ModelImportError, TensorplanError, UnsupportedOperatorError
from tensorplan.zoo.specs import load
from tensorplan import zoo
from tensorplan.ir.analysis import graph_flops, min_bytes, node_bytes, node_flops, param_count, roofline_ms
from tensorplan.ir.onnx_import import import_onnx, parse_input_shapes
from tensorplan.ir.reference import random_feeds, rel_error, run_reference
from tensorplan.ir.to_onnx import graph_to_onnx, run_onnxruntime

TOL = 1e-4


class ViewNet(torch.nn.Module):
    """conv -> bn -> relu -> pool -> x.view(x.shape[0], -1) -> linear -> softmax."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.nn.functional.max_pool2d(y, 2)
        y = y.view(y.shape[0], -1)
        return torch.softmax(self.fc(y), dim=-1)


def export_torch(module, args, path: Path, opset: int, dynamic: dict | None = None) -> Path:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, str(path), opset_version=opset, dynamo=False,
                          input_names=["x"], output_names=["y"], dynamic_axes=dynamic,
                          do_constant_folding=False)
    return path


def make_model(nodes, inputs, outputs, inits=(), opset=17, ir=8):
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir
    return m


def vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


@pytest.fixture(scope="module")
def dynamic_view_model(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("m") / "viewnet.onnx"
    return export_torch(ViewNet(), (torch.randn(2, 3, 8, 8),), path, 13, {"x": {0: "batch"}})


# ---------------------------------------------------------------- folding and overrides
@pytest.mark.parametrize("opset", [11, 13, 17])
def test_torch_view_shape_chain_is_folded(tmp_path, opset):
    torch.manual_seed(0)
    path = export_torch(ViewNet(), (torch.randn(2, 3, 8, 8),), tmp_path / "v.onnx", opset,
                        {"x": {0: "batch"}})
    raw_ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert "Shape" in raw_ops  # the export really has the shape sub-graph
    g = import_onnx(path, {"x": (3, 3, 8, 8)})
    ops = set(g.op_counts())
    assert not ops & {"Shape", "Gather", "Concat", "Unsqueeze", "Constant"}, ops
    assert g.tensors["y"].shape == (3, 10)
    reshape = next(n for n in g.nodes if n.op == "Reshape")
    assert list(g.tensors[reshape.inputs[1]].data) == [3, -1]
    g.validate()
    feeds = random_feeds(g, seed=3)
    ref = run_reference(g, feeds)["y"]
    assert rel_error(ref, run_onnxruntime(onnx.load(str(path)), feeds)["y"]) <= TOL
    assert rel_error(ref, run_onnxruntime(g, feeds)["y"]) <= TOL  # exported graph runs too


def test_symbolic_dim_error_names_input_and_dim(dynamic_view_model):
    with pytest.raises(ModelImportError) as e:
        import_onnx(dynamic_view_model)
    msg = str(e.value)
    assert "'x'" in msg and "batch" in msg and "index 0" in msg and "--input-shape x=BATCH," in msg


def test_unknown_dim_without_name_is_reported():
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [None, 4])], [vi("y", None)])
    with pytest.raises(ModelImportError, match=r"'x'.*unknown.*index 0.*--input-shape x=D0,4, giving D0 the sizes"):
        import_onnx(m)
    g = import_onnx(m, {"x": (5, 4)})
    assert g.tensors["y"].shape == (5, 4)


def test_override_errors_name_inputs(dynamic_view_model):
    with pytest.raises(ModelImportError, match=r"\['nope'\].*\['x'\]"):
        import_onnx(dynamic_view_model, {"nope": (1, 3, 8, 8)})
    with pytest.raises(ModelImportError, match="rank 2"):
        import_onnx(dynamic_view_model, {"x": (1, 3)})


def test_parse_input_shapes():
    assert parse_input_shapes(["x=1,3,224,224", "ids=1x128"]) == {"x": (1, 3, 224, 224), "ids": (1, 128)}
    assert parse_input_shapes([]) == {}
    assert parse_input_shapes(["s="]) == {"s": ()}
    for bad in ["x", "x=1,a", "=1,2"]:
        with pytest.raises(ModelImportError):
            parse_input_shapes([bad])


def test_constant_subgraph_folds_completely():
    """Range/ConstantOfShape/Equal/Where/Cast/Slice chain on constants becomes one constant."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["d"], axis=0),
        helper.make_node("Range", ["zero", "d", "one"], ["r"]),
        helper.make_node("ConstantOfShape", ["s1"], ["ones"],
                         value=numpy_helper.from_array(np.array([1], np.int64))),
        helper.make_node("Equal", ["r", "ones"], ["eq"]),
        helper.make_node("Cast", ["eq"], ["eqf"], to=TensorProto.FLOAT),
        helper.make_node("Where", ["eq", "eqf", "r_f"], ["w"]),
        helper.make_node("Cast", ["r"], ["r_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "w"], ["y"]),
    ]
    nodes = [nodes[i] for i in (0, 1, 2, 3, 4, 5, 7, 6, 8)]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("one", 1), ("zero", 0))]
    inits.append(numpy_helper.from_array(np.array([5], np.int64), "s1"))
    m = make_model(nodes, [vi("x", [2, 5])], [vi("y", [2, 5])], inits)
    g = import_onnx(m)
    assert [n.op for n in g.nodes] == ["Add"]
    np.testing.assert_array_equal(g.tensors[g.nodes[0].inputs[1]].data, [0, 1, 2, 3, 4])
    x = np.ones((2, 5), np.float32)
    assert rel_error(run_reference(g, {"x": x})["y"], run_onnxruntime(m, {"x": x})["y"]) == 0


def test_constant_if_is_inlined_and_dynamic_if_rejected():
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t_out"])], "then", [],
                               [vi("t_out", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e_out"])], "else", [],
                               [vi("e_out", [2, 3])])
    cond = numpy_helper.from_array(np.array(False), "cond")
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")
    m = make_model([node], [vi("x", [2, 3])], [vi("y", [2, 3])], [cond])
    g = import_onnx(m)
    assert "If" not in g.op_counts() and "Neg" in g.op_counts()
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(run_reference(g, {"x": x})["y"], -x)
    m2 = make_model([node], [vi("x", [2, 3]), vi("cond", [], TensorProto.BOOL)], [vi("y", [2, 3])])
    with pytest.raises(ModelImportError, match=r"'branch' \(If\).*constant"):
        import_onnx(m2)


def test_data_dependent_shape_is_rejected():
    m = make_model([helper.make_node("Range", ["s", "lim", "d"], ["y"], name="rng")],
                   [vi("s", [], TensorProto.INT64)], [vi("y", None, TensorProto.INT64)],
                   [numpy_helper.from_array(np.array(9, np.int64), "lim"),
                    numpy_helper.from_array(np.array(1, np.int64), "d")])
    with pytest.raises(ModelImportError, match=r"'rng' \(Range\).*data-dependent"):
        import_onnx(m)


def test_node_names_made_unique_and_non_empty():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="same"),
             helper.make_node("Neg", ["a"], ["b"], name="same"),
             helper.make_node("Abs", ["b"], ["c"], name=""),
             helper.make_node("Exp", ["c"], ["y"])]
    g = import_onnx(make_model(nodes, [vi("x", [3])], [vi("y", [3])]))
    names = [n.name for n in g.nodes]
    assert all(names) and len(set(names)) == 4 and "same" in names


def test_attributes_become_python_values():
    nodes = [helper.make_node("Pad", ["x", "p"], ["a"], mode="reflect"),
             helper.make_node("Transpose", ["a"], ["b"], perm=[1, 0]),
             helper.make_node("LeakyRelu", ["b"], ["y"], alpha=0.25)]
    p = numpy_helper.from_array(np.array([1, 1, 1, 1], np.int64), "p")
    g = import_onnx(make_model(nodes, [vi("x", [3, 4])], [vi("y", None)], [p]))
    attrs = {n.op: n.attrs for n in g.nodes}
    assert attrs["Pad"]["mode"] == "reflect" and isinstance(attrs["Pad"]["mode"], str)
    assert attrs["Transpose"]["perm"] == [1, 0]
    assert attrs["LeakyRelu"]["alpha"] == pytest.approx(0.25)
    assert g.tensors["y"].shape == (6, 5)


def test_initializers_listed_as_inputs_are_constants():
    w = numpy_helper.from_array(np.ones((4, 2), np.float32), "w")
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [vi("x", [3, 4]), vi("w", [4, 2])], [vi("y", [3, 2])], [w], ir=3)
    g = import_onnx(m)
    assert g.inputs == ["x"] and g.tensors["w"].is_constant


# ---------------------------------------------------------------- errors
def test_unsupported_operators_listed_all_at_once():
    # Det and LpNormalization have no numpy rule but ONNX Runtime runs them (foreign nodes);
    # Upsample (removed after opset 9) and an unknown op run nowhere: listed together.
    nodes = [helper.make_node("Det", ["x"], ["d"], name="det_node"),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("LpNormalization", ["r"], ["y"], name="lpn"),
             helper.make_node("Upsample", ["x", "sc"], ["u"], name="ups"),
             helper.make_node("Frobnicate", ["x"], ["f"], name="frob")]
    m = make_model(nodes, [vi("x", [2, 3, 3])], [vi("d", [2]), vi("y", [2, 3, 3]), vi("u", [2, 3, 3]),
                                                vi("f", [2, 3, 3])])
    m.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "sc"))
    with pytest.raises(UnsupportedOperatorError) as e:
        import_onnx(m)
    assert {op for _, op in e.value.ops} == {"Upsample", "Frobnicate"}
    assert "ups" in str(e.value) and "frob" in str(e.value)
    del m.graph.node[-1], m.graph.output[-1]       # an op with no shape inference cannot be shaped
    g = import_onnx(m, allow_unsupported=True)  # inspect mode keeps the rest
    assert {"Det", "LpNormalization", "Upsample"} <= set(g.op_counts())


def test_non_default_domain_runs_in_onnxruntime_or_is_rejected_by_name():
    node = helper.make_node("FusedGemm", ["x", "x"], ["y"], domain="com.microsoft", name="fg",
                            activation="Relu")
    m = make_model([node], [vi("x", [2, 2])], [vi("y", [2, 2])])
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    g = import_onnx(m)
    x = np.array([[1, -2], [3, 4]], np.float32)
    assert np.allclose(run_reference(g, {"x": x})["y"], np.maximum(x @ x, 0))
    node = helper.make_node("FusedThing", ["x"], ["y"], domain="acme.ops", name="ft")
    m = make_model([node], [vi("x", [2, 2])], [vi("y", [2, 2])])
    m.opset_import.append(helper.make_opsetid("acme.ops", 1))
    with pytest.raises(ModelImportError, match=r"'ft' \(acme\.ops::FusedThing\)"):
        import_onnx(m)


@pytest.mark.parametrize("opset", [0, 27, 28])
def test_opset_out_of_range(opset):
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])],
                   opset=opset)
    with pytest.raises(ModelImportError, match=f"opset {opset} .*1..26"):
        import_onnx(m)


def test_truncated_and_non_onnx_files_name_the_file(dynamic_view_model, tmp_path):
    data = dynamic_view_model.read_bytes()
    trunc = tmp_path / "trunc.onnx"
    trunc.write_bytes(data[: len(data) // 3])
    with pytest.raises(ModelImportError, match="trunc.onnx"):
        import_onnx(trunc, {"x": (1, 3, 8, 8)})
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n" * 10)
    with pytest.raises(ModelImportError, match="notes.onnx"):
        import_onnx(text)
    with pytest.raises(ModelImportError, match="missing.onnx: no such file"):
        import_onnx(tmp_path / "missing.onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ModelImportError, match="empty.onnx"):
        import_onnx(empty)


def test_missing_external_data_names_the_file(tmp_path):
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", [2, 64])],
                   [vi("y", [2, 64])], [w])
    path = tmp_path / "ext.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="ext_weights.bin",
                    size_threshold=0)
    g = import_onnx(path)  # present: loads fine
    assert g.tensors["w"].data.shape == (64, 64)
    (tmp_path / "ext_weights.bin").unlink()
    with pytest.raises(ModelImportError, match="ext_weights.bin"):
        import_onnx(path)


def test_undefined_tensor_named():
    m = make_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")],
                   [vi("x", [2])], [vi("y", [2])])
    with pytest.raises(ModelImportError, match=r"'adder'.*'ghost'"):
        import_onnx(m)


def test_all_errors_are_tensorplan_errors():
    assert issubclass(UnsupportedOperatorError, TensorplanError)
    with pytest.raises(TensorplanError):
        import_onnx(onnx.ModelProto())


# ---------------------------------------------------------------- analysis + load
def test_analysis_counts_on_viewnet(tmp_path):
    torch.manual_seed(0)
    path = export_torch(ViewNet(), (torch.randn(1, 3, 8, 8),), tmp_path / "v.onnx", 17)
    g = load(str(path))
    conv = next(n for n in g.nodes if n.op == "Conv")
    # 2 * N*Cout*H*W * Cin*kh*kw + bias
    assert node_flops(g, conv) == 2 * 8 * 8 * 8 * 3 * 9 + 8 * 8 * 8
    gemm = next(n for n in g.nodes if n.op == "Gemm")
    assert node_flops(g, gemm) == 2 * 10 * 128 + 10
    assert node_bytes(g, conv) == 4 * (3 * 64 + 8 * 27 + 8 + 8 * 64)
    assert graph_flops(g) >= node_flops(g, conv) + node_flops(g, gemm)
    assert param_count(g) == sum(p.numel() for p in ViewNet().parameters()) + 16  # + BN stats
    assert min_bytes(g) == 4 * (param_count(g) + 3 * 64 + 10) + 16  # + int64 reshape target
    assert roofline_ms(2e9, 1e6, 100, 10) == pytest.approx(20.0)
    assert roofline_ms(1e6, 1e9, 100, 10) == pytest.approx(100.0)


def test_load_errors(tmp_path):
    with pytest.raises(ModelImportError, match="no such file"):
        load(str(tmp_path / "none.onnx"))
    with pytest.raises(TensorplanError, match="zoo"):
        load("definitely-not-a-model")


# ---------------------------------------------------------------- zoo tiny models vs ORT
def _tiny_names():
    return [e.name for e in zoo.list_models(tag="tiny")]


@pytest.mark.parametrize("opset", [17, 11])
@pytest.mark.parametrize("name", _tiny_names())
def test_zoo_tiny_models_match_onnxruntime(name, opset):
    path = zoo.export(name, opset)
    g = load(name, opset=opset)
    assert g.opset == opset
    g.validate()
    feeds = random_feeds(g, seed=0)
    ref = run_reference(g, feeds)
    ort = run_onnxruntime(onnx.load(str(path)), feeds)
    assert_close(ref, ort, TOL, g.outputs, what=name)
    # and the graph exported back to ONNX runs in ORT with the same result
    back = run_onnxruntime(graph_to_onnx(g), feeds)
    assert_close(back, ort, TOL, g.outputs, what=f"{name} exported back")


def test_zoo_subgraph_exports_and_runs():
    g = load("tiny-cnn")
    names = [n.name for n in g.nodes[1:4]]
    sub = g.subgraph(names)
    feeds = random_feeds(sub, seed=1)
    ref = run_reference(sub, feeds)
    ort = run_onnxruntime(sub, feeds)
    assert_close(ref, ort, TOL, sub.outputs)


def test_loop_is_rejected_clearly():
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["v_in", "v_in"], ["v_out"])],
        "body", [vi("i", [], TensorProto.INT64), vi("cond_in", [], TensorProto.BOOL), vi("v_in", [2])],
        [vi("cond_out", [], TensorProto.BOOL), vi("v_out", [2])])
    node = helper.make_node("Loop", ["n", "", "x"], ["y"], body=body, name="the_loop")
    m = make_model([node], [vi("x", [2]), vi("n", [], TensorProto.INT64)], [vi("y", [2])])
    with pytest.raises(ModelImportError, match=r"'the_loop' \(Loop\)"):
        import_onnx(m)


def test_constant_and_passthrough_outputs():
    c = numpy_helper.from_array(np.arange(3, dtype=np.float32), "c")
    m = make_model([helper.make_node("Neg", ["c"], ["k"]), helper.make_node("Relu", ["x"], ["y"])],
                   [vi("x", [3])], [vi("k", [3]), vi("y", [3]), vi("x", [3])], [c])
    g = import_onnx(m)
    assert g.outputs == ["k", "y", "x"] and g.tensors["k"].is_constant
    x = np.ones(3, np.float32)
    ref, ort = run_reference(g, {"x": x}), run_onnxruntime(g, {"x": x})
    for o in g.outputs:
        np.testing.assert_array_equal(ref[o], ort[o])


def test_graph_to_onnx_handles_hand_built_primitive_graphs():
    """Attributes as loose python values and opset-agnostic forms still export validly."""
    from tensorplan.ir.graph import Graph, Node, Tensor

    g = Graph("prim", opset=18)
    g.add_tensor(Tensor("x", (2, 6)))
    g.inputs = ["x"]
    g.add_node(Node("lr", "LeakyRelu", ["x"], ["a"], {"alpha": 1}))  # int for a float attr
    g.add_node(Node("rs", "ReduceSum", ["a"], ["s"], {"axes": [1], "keepdims": 1}))  # attr form
    g.add_node(Node("sp", "Split", ["a"], ["p", "q"], {"axis": 1}))  # no sizes at opset 18
    g.add_node(Node("tr", "Transpose", ["p"], ["t"], {"perm": (1, 0)}))
    g.add_node(Node("pad", "Pad", ["q", "pads"], ["z"], {"mode": "constant"}))
    g.add_tensor(Tensor("pads", (4,), "int64", np.array([0, 1, 0, 1], np.int64)))
    for name, shape in {"a": (2, 6), "s": (2, 1), "p": (2, 3), "q": (2, 3), "t": (3, 2), "z": (2, 5)}.items():
        g.add_tensor(Tensor(name, shape))
    g.outputs = ["s", "t", "z"]
    g.validate()
    model = graph_to_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    ref, ort = run_reference(g, {"x": x}), run_onnxruntime(model, {"x": x})
    assert_close(ref, ort, TOL, g.outputs)
    back = import_onnx(model)  # and it imports again
    assert back.op_counts() == g.op_counts()


# ---------------------------------------------------------------- validation as strict as ONNX Runtime
def _ort_refuses(m: onnx.ModelProto) -> str | None:
    """ONNX Runtime's reason when it refuses to load the model or fails running it on ones."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:
        return str(e)
    np_of = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int8)": np.int8}
    feeds = {i.name: np.ones(i.shape, np_of[i.type]) for i in sess.get_inputs()}
    try:
        sess.run(None, feeds)
    except Exception as e:
        return str(e)
    return None


def _w(name, *shape, dtype=np.float32):
    return numpy_helper.from_array(np.ones(shape, dtype), name)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def test_float_axis_attribute_is_refused_like_onnxruntime():
    node = helper.make_node("Concat", ["a", "b"], ["y"], name="cat")
    node.attribute.append(helper.make_attribute("axis", 1.0))  # a FLOAT where INT is required
    m = make_model([node], [vi("a", [2, 3]), vi("b", [2, 3])], [vi("y", [2, 6])])
    with pytest.raises(ModelImportError) as e:
        import_onnx(m)
    assert re.search(r"node 'cat' \(Concat\): invalid model: attribute 'axis' has type FLOAT, "
                     r"but the operator requires INT", str(e.value)), str(e.value)
    assert "Mismatched attribute type" in _ort_refuses(m)
    # a nameless node is named as tensorplan names it
    m.graph.node[0].ClearField("name")
    with pytest.raises(ModelImportError, match=r"node 'Concat_0' \(Concat\)"):
        import_onnx(m)


# (case, nodes, inputs, initializers, expected message) - each refused by ONNX Runtime too
_BAD = {
    "conv_channels": ([helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")], [vi("x", [1, 3, 8, 8])],
                      [_w("w", 4, 2, 3, 3)],
                      r"node 'conv1' \(Conv\): invalid model: weight 'w' \(4, 2, 3, 3\) expects 2 input "
                      r"channels .* but input 'x' \(1, 3, 8, 8\) has 3"),
    "conv_group": ([helper.make_node("Conv", ["x", "w"], ["y"], name="c", group=2)], [vi("x", [1, 4, 8, 8])],
                   [_w("w", 3, 2, 3, 3)], r"'c' \(Conv\).*3 output channels, not divisible by group 2"),
    "conv_bias": ([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="c")], [vi("x", [1, 3, 8, 8])],
                  [_w("w", 4, 3, 3, 3), _w("b", 5)], r"'c' \(Conv\).*bias 'b' has shape \(5,\), expected \(4,\)"),
    "conv_kernel_shape": ([helper.make_node("Conv", ["x", "w"], ["y"], name="c", kernel_shape=[3, 3])],
                          [vi("x", [1, 3, 8, 8])], [_w("w", 4, 3, 2, 3)],
                          r"'c' \(Conv\).*kernel_shape \[3, 3\] does not match"),
    "convtranspose_channels": ([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="ct")],
                               [vi("x", [1, 3, 8, 8])], [_w("w", 4, 3, 3, 3)],
                               r"'ct' \(ConvTranspose\).*expects 4 input channels"),
    "reshape_count": ([helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")], [vi("x", [2, 12])],
                      [_i64("s", [5, 5])],
                      r"node 'rs' \(Reshape\): invalid model: reshapes input 'x' \(2, 12\) \(24 elements\) "
                      r"to \(5, 5\) \(25 elements\)"),
    "reshape_infer": ([helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")], [vi("x", [2, 12])],
                      [_i64("s", [5, -1])], r"node 'rs' \(Reshape\): invalid model"),
    "instancenorm_scale": ([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="in")],
                           [vi("x", [1, 3, 4, 4])], [_w("s", 4), _w("b", 4)],
                           r"'in' \(InstanceNormalization\).*scale 's' has shape \(4,\), expected \(3,\)"),
    "layernorm_scale": ([helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln")],
                        [vi("x", [2, 3])], [_w("s", 4)], r"'ln' \(LayerNormalization\).*scale 's'"),
    "layernorm_axis": ([helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln", axis=6)],
                       [vi("x", [2, 3])], [_w("s", 3)], r"'ln' \(LayerNormalization\).*axis 6 is out of range"),
    "prelu_slope": ([helper.make_node("PRelu", ["x", "s"], ["y"], name="pr")], [vi("x", [1, 3, 4])],
                    [_w("s", 5)], r"'pr' \(PRelu\).*slope 's' \(5,\) does not broadcast"),
    "gather_index": ([helper.make_node("Gather", ["x", "i"], ["y"], name="ga")], [vi("x", [2, 3])],
                     [_i64("i", [5])], r"'ga' \(Gather\).*index 5 .* out of range"),
    "gemm_bias": ([helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="gm")], [vi("x", [2, 3])],
                  [_w("w", 3, 4), _w("c", 5)], r"'gm' \(Gemm\).*C 'c' \(5,\) does not broadcast"),
    "gemm_k": ([helper.make_node("Gemm", ["x", "w"], ["y"], name="gm")], [vi("x", [2, 3])],
               [_w("w", 4, 5)], r"'gm' \(Gemm\): invalid model"),
    "dequantize_axis": ([helper.make_node("DequantizeLinear", ["x", "s"], ["y"], name="dq", axis=1)],
                        [vi("x", [2, 3], TensorProto.INT8)], [_w("s", 4)],
                        r"'dq' \(DequantizeLinear\).*per-axis scale 's' has 4 values"),
    "matmul_k": ([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", [2, 3])],
                 [_w("w", 4, 5)], r"'mm' \(MatMul\): invalid model: Incompatible dimensions"),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_models_onnxruntime_refuses_are_refused_naming_node_and_op(case):
    nodes, inputs, inits, pattern = _BAD[case]
    m = make_model(nodes, inputs, [vi("y", None)], inits)
    with pytest.raises(ModelImportError) as e:
        import_onnx(m)
    assert re.search(pattern, str(e.value)), str(e.value)
    assert len(str(e.value).splitlines()) == 1
    assert _ort_refuses(m), f"{case}: ONNX Runtime accepts it"


def test_declared_shapes_that_contradict_computed_ones_are_refused():
    relu = helper.make_node("Relu", ["x"], ["y"], name="r")
    for declared, pattern in (([3, 2], r"in dimension 0: computed 2, declared 3"),
                              ([2, 3, 1], r"in rank: computed 2, declared 3")):
        m = make_model([relu], [vi("x", [2, 3])], [vi("y", declared)])
        with pytest.raises(ModelImportError) as e:
            import_onnx(m)
        assert re.search(r"node 'r' \(Relu\): invalid model: the shape it computes contradicts the "
                         r"shape the model declares for its output 'y' " + pattern, str(e.value)), str(e.value)
    # an intermediate value_info counts too
    m = make_model([helper.make_node("Relu", ["x"], ["h"], name="r"),
                    helper.make_node("Neg", ["h"], ["y"], name="n")],
                   [vi("x", [2, 3])], [vi("y", [2, 3])])
    m.graph.value_info.append(vi("h", [2, 4]))
    with pytest.raises(ModelImportError, match=r"node 'r' \(Relu\).*output 'h' in dimension 1: "
                                               r"computed 3, declared 4"):
        import_onnx(m)
    # a declared element type too (ONNX Runtime refuses this one as well)
    m = make_model([relu], [vi("x", [2, 3])], [vi("y", [2, 3], TensorProto.INT64)])
    with pytest.raises(ModelImportError, match=r"'r' \(Relu\).*element type .* computed FLOAT, "
                                               r"declared INT64"):
        import_onnx(m)
    assert _ort_refuses(m)
    # symbolic or missing declarations are not contradictions
    for declared in (["n", 3], None):
        g = import_onnx(make_model([relu], [vi("x", [2, 3])], [vi("y", declared)]))
        assert g.tensors["y"].shape == (2, 3)


def test_what_onnxruntime_accepts_stays_accepted():
    # nodes out of topological order (ONNX Runtime sorts them; the checker alone would not)
    m = make_model([helper.make_node("Neg", ["h"], ["y"], name="n"),
                    helper.make_node("Relu", ["x"], ["h"], name="r")],
                   [vi("x", [2, 3])], [vi("y", [2, 3])])
    assert _ort_refuses(m) is None
    assert import_onnx(m).op_counts() == {"Relu": 1, "Neg": 1}
    # a function operator whose expansion onnx's strict inference trips on (ORT loads it)
    m = make_model([helper.make_node("MeanVarianceNormalization", ["x"], ["y"], name="mvn")],
                   [vi("x", [2, 3, 4, 4])], [vi("y", [2, 3, 4, 4])], opset=13)
    assert _ort_refuses(m) is None
    g = import_onnx(m)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    assert_close(run_reference(g, {"x": x}), run_onnxruntime(m, {"x": x}), TOL, ["y"])


def test_foreign_node_onnxruntime_refuses_is_refused_with_its_reason():
    # LSTM runs in ONNX Runtime for tensorplan; its CPU kernel refuses layout=1
    node = helper.make_node("LSTM", ["x", "W", "R"], ["Y"], hidden_size=2, layout=1, name="lstm")
    m = make_model([node], [vi("x", [1, 4, 3])], [vi("Y", None)],
                   [_w("W", 1, 8, 3), _w("R", 1, 8, 2)], opset=22)
    with pytest.raises(ModelImportError, match=r"node 'lstm' \(LSTM\): invalid model: ONNX Runtime.*"
                                               r"layout"):
        import_onnx(m)
    assert _ort_refuses(m)


# ---------------------------------------------------------------- current opsets
def test_max_opset_is_what_onnxruntime_loads():
    from tensorplan.ir.onnx_import import MAX_OPSET
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    assert _ort_refuses(make_model(relu, [vi("x", [2])], [vi("y", [2])], opset=MAX_OPSET, ir=10)) is None
    assert "opset" in _ort_refuses(make_model(relu, [vi("x", [2])], [vi("y", [2])],
                                              opset=MAX_OPSET + 1, ir=10)).lower()


def _newest_opset_model(opset):
    """Ops whose versions changed after opset 21 (Conv 22, Cast 24, TopK 24, Shape/Reshape/
    Flatten/Pad/Squeeze/Unsqueeze/Transpose 25, ...) in one model."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             _i64("axes", [2, 3]), _i64("pads", [0, 0, 1, 1, 0, 0, 1, 1]), _i64("k", [2]),
             _i64("sq", [0]), _i64("tail", [-1])]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Elu", ["c"], ["e"], alpha=0.5),
             helper.make_node("Pad", ["e", "pads"], ["p"], mode="reflect"),
             helper.make_node("MaxPool", ["p"], ["mp"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("HardSwish", ["mp"], ["hs"]),
             helper.make_node("ReduceMean", ["hs", "axes"], ["r"], keepdims=0),
             helper.make_node("TopK", ["r", "k"], ["tv", "ti"], axis=-1),
             helper.make_node("Cast", ["ti"], ["tf"], to=TensorProto.FLOAT),
             helper.make_node("Shape", ["hs"], ["shp"], start=1),
             helper.make_node("Cast", ["shp"], ["shpf"], to=TensorProto.FLOAT),
             helper.make_node("Flatten", ["hs"], ["fl"], axis=1),
             helper.make_node("Softplus", ["fl"], ["sp"]),
             helper.make_node("Unsqueeze", ["sp", "sq"], ["us"]),
             helper.make_node("Squeeze", ["us", "sq"], ["sq2"]),
             helper.make_node("Transpose", ["sq2"], ["t"], perm=[1, 0]),
             helper.make_node("Reshape", ["t", "tail"], ["y"]),
             helper.make_node("Round", ["tv"], ["tr"])]
    return make_model(nodes, [vi("x", [1, 3, 8, 8])],
                      [vi("y", [4 * 5 * 5]), vi("tr", [1, 2]), vi("tf", [1, 2]), vi("shpf", [3])],
                      inits, opset=opset, ir=10)


@pytest.mark.parametrize("opset", [22, 24, 25, 26])
def test_newest_opsets_import_and_match_onnxruntime(opset):
    m = _newest_opset_model(opset)
    g = import_onnx(m)
    assert g.opset == opset
    feeds = random_feeds(g, seed=0)
    ref = run_reference(g, feeds)
    assert_close(ref, run_onnxruntime(m, feeds), TOL, g.outputs, what=f"opset {opset}")
    assert_close(run_onnxruntime(graph_to_onnx(g), feeds), ref, TOL, g.outputs,
                 what=f"opset {opset} exported back")


def test_newer_operator_versions_than_implemented_are_refused_by_name(monkeypatch):
    from tensorplan.ir import onnx_import
    monkeypatch.setattr(onnx_import, "_REVIEWED_OPSET", 21)
    m = _newest_opset_model(22)
    with pytest.raises(ModelImportError, match=r"node 'conv' \(Conv\): Conv version 22 \(opset 22\) "
                                               r"is newer than tensorplan implements"):
        import_onnx(m)


def test_unhonoured_attributes_of_newer_versions_are_refused():
    x = vi("x", [2, 4], TensorProto.INT8)
    blocked = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], axis=1, block_size=2, name="dq")
    m = make_model([blocked], [x], [vi("y", [2, 4])], [_w("s", 2, 2)], opset=21, ir=10)
    with pytest.raises(ModelImportError, match=r"node 'dq' \(DequantizeLinear\): DequantizeLinear "
                                               r"version 21 attribute block_size=2 .* not supported"):
        import_onnx(m)
    typed = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], output_dtype=TensorProto.FLOAT16,
                             name="dq")
    m = make_model([typed], [x], [vi("y", [2, 4], TensorProto.FLOAT16)], [_w("s")], opset=23, ir=10)
    with pytest.raises(ModelImportError, match=r"'dq' \(DequantizeLinear\).*version 23 attribute "
                                               r"output_dtype"):
        import_onnx(m)


def test_reference_can_declare_the_versions_it_implements(monkeypatch):
    from tensorplan.ir import reference
    monkeypatch.setattr(reference, "OP_VERSIONS", {"TopK": (1, 11)}, raising=False)
    with pytest.raises(ModelImportError, match=r"\(TopK\): TopK version 24 \(opset 24\) is newer than "
                                               r"tensorplan implements \(TopK up to version 11\)"):
        import_onnx(_newest_opset_model(24))
    assert import_onnx(_newest_opset_model(22)).opset == 22  # TopK 11 there


# ---------------------------------------------------------------- older opsets (converted to 11)
def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


_R = np.random.default_rng(0)
_BN = [_init(k, _R.random(3).astype(np.float32) + (0.5 if k == "var" else 0)) for k in ("s", "b", "mu", "var")]
_X = [vi("x", [2, 3, 4, 5])]
_N = helper.make_node
#: name -> (opset, nodes, inputs, outputs, initializers): each operator version that differs from
#: its opset-11 version and that import converts (`onnx_import._UPGRADES`), in its old form.
OLD_FORMS = {
    "upsample7_nearest": (7, [_N("Upsample", ["x"], ["y"], mode="nearest", scales=[1., 1., 2., 3.])], _X, [vi("y", [2, 3, 8, 15])], []),
    "upsample7_linear": (7, [_N("Upsample", ["x"], ["y"], mode="linear", scales=[1., 1., 1.5, 2.5])], _X, [vi("y", [2, 3, 6, 12])], []),
    "upsample9_nearest": (9, [_N("Upsample", ["x", "s"], ["y"], mode="nearest")], _X, [vi("y", [2, 3, 13, 8])], [_init("s", np.float32([1, 1, 3.3, 1.7]))]),
    "upsample9_linear": (9, [_N("Upsample", ["x", "s"], ["y"], mode="linear")], _X, [vi("y", [2, 3, 8, 10])], [_init("s", np.float32([1, 1, 2, 2]))]),
    # scales computed in the graph and the result used inside it: the converter renames the values
    "upsample9_linear_computed_scales": (9, [_N("Concat", ["one", "two"], ["sc"], axis=0), _N("Upsample", ["x", "sc"], ["u"], mode="linear"), _N("Relu", ["u"], ["y"])], _X, [vi("y", [2, 3, 8, 10])], [_init("one", np.float32([1, 1])), _init("two", np.float32([2, 2]))]),
    "resize10_nearest_down_computed_scales": (10, [_N("Concat", ["one", "down"], ["sc"], axis=0), _N("Resize", ["x", "sc"], ["u"], mode="nearest"), _N("Neg", ["u"], ["y"])], _X, [vi("y", [2, 3, 2, 4])], [_init("one", np.float32([1, 1])), _init("down", np.float32([0.6, 0.8]))]),
    "resize10_nearest_up": (10, [_N("Resize", ["x", "s"], ["y"], mode="nearest")], _X, [vi("y", [2, 3, 6, 12])], [_init("s", np.float32([1, 1, 1.5, 2.5]))]),
    "resize10_nearest_down": (10, [_N("Resize", ["x", "s"], ["y"], mode="nearest")], _X, [vi("y", [2, 3, 2, 4])], [_init("s", np.float32([1, 1, 0.6, 0.8]))]),
    "resize10_linear_down": (10, [_N("Resize", ["x", "s"], ["y"], mode="linear")], _X, [vi("y", [2, 3, 2, 4])], [_init("s", np.float32([1, 1, 0.6, 0.8]))]),
    "slice1": (9, [_N("Slice", ["x"], ["y"], starts=[1, -4], ends=[3, 1000], axes=[1, 3])], _X, [vi("y", [2, 2, 4, 4])], []),
    "slice1_no_axes": (9, [_N("Slice", ["x"], ["y"], starts=[0, 1], ends=[1, 3])], _X, [vi("y", [1, 2, 4, 5])], []),
    "slice10_steps": (10, [_N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], _X, [vi("y", [2, 3, 2, 5])], [_init("st", np.int64([3])), _init("en", np.int64([0])), _init("ax", np.int64([2])), _init("sp", np.int64([-2]))]),
    "pad2_constant": (9, [_N("Pad", ["x"], ["y"], pads=[0, 1, 0, 2, 0, 0, 1, 1], value=1.5)], _X, [vi("y", [2, 4, 5, 8])], []),
    "pad2_reflect": (9, [_N("Pad", ["x"], ["y"], pads=[0, 0, 1, 2, 0, 0, 1, 1], mode="reflect")], _X, [vi("y", [2, 3, 6, 8])], []),
    "pad2_edge": (10, [_N("Pad", ["x"], ["y"], pads=[0, 0, 1, 2, 0, 0, 1, 1], mode="edge")], _X, [vi("y", [2, 3, 6, 8])], []),
    "dropout7_ratio": (7, [_N("Dropout", ["x"], ["y"], ratio=0.3)], _X, [vi("y", [2, 3, 4, 5])], []),
    "batchnorm7_spatial": (7, [_N("BatchNormalization", ["x", "s", "b", "mu", "var"], ["y"], epsilon=1e-3, spatial=1)], _X, [vi("y", [2, 3, 4, 5])], _BN),
    "topk1_k_attr": (9, [_N("TopK", ["x"], ["v", "i"], k=2, axis=2)], _X, [vi("v", [2, 3, 2, 5]), vi("i", [2, 3, 2, 5], TensorProto.INT64)], []),
    "topk10_k_input": (10, [_N("TopK", ["x", "k"], ["v", "i"], axis=-1)], _X, [vi("v", [2, 3, 4, 3]), vi("i", [2, 3, 4, 3], TensorProto.INT64)], [_init("k", np.int64([3]))]),
    "clip6_attrs": (9, [_N("Clip", ["x"], ["y"], min=-0.5, max=0.7)], _X, [vi("y", [2, 3, 4, 5])], []),
    "clip6_max_only": (9, [_N("Clip", ["x"], ["y"], max=0.2)], _X, [vi("y", [2, 3, 4, 5])], []),
    "reducemean1_axes_attr": (9, [_N("ReduceMean", ["x"], ["y"], axes=[1, -1], keepdims=0)], _X, [vi("y", [2, 4])], []),
    "reducesum1_all": (9, [_N("ReduceSum", ["x"], ["y"])], _X, [vi("y", [1, 1, 1, 1])], []),
    "split2_attr": (9, [_N("Split", ["x"], ["a", "b"], axis=3, split=[2, 3])], _X, [vi("a", [2, 3, 4, 2]), vi("b", [2, 3, 4, 3])], []),
    "squeeze1_unsqueeze1": (9, [_N("Unsqueeze", ["x"], ["u"], axes=[0, 3]), _N("Squeeze", ["u"], ["y"], axes=[0])], _X, [vi("y", [2, 3, 1, 4, 5])], []),
    "gemm7": (7, [_N("Gemm", ["a", "b", "c"], ["y"], alpha=0.5, beta=2.0, transB=1)], [vi("a", [3, 4])], [vi("y", [3, 6])], [_init("b", _R.random((6, 4)).astype(np.float32)), _init("c", _R.random(6).astype(np.float32))]),
    "maxpool1": (7, [_N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[1, 2])], _X, [vi("y", [2, 3, 3, 2])], []),
    "maxpool10_ceil": (10, [_N("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)], _X, [vi("y", [2, 3, 2, 2])], []),
    "averagepool7_pads": (7, [_N("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)], _X, [vi("y", [2, 3, 4, 5])], []),
    "conv1_convtranspose1": (9, [_N("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], strides=[1, 2]), _N("ConvTranspose", ["c", "wt"], ["y"], strides=[2, 2], output_padding=[1, 0])], _X, [vi("y", [2, 2, 10, 7])], [_init("w", _R.random((4, 3, 3, 3)).astype(np.float32)), _init("wt", _R.random((4, 2, 3, 3)).astype(np.float32))]),
    "convtranspose1_same_upper_output_shape": (9, [_N("ConvTranspose", ["x", "wt"], ["a"], strides=[2, 2], auto_pad="SAME_UPPER"), _N("ConvTranspose", ["x", "wt"], ["b"], strides=[2, 2], output_shape=[9, 11])], _X, [vi("a", [2, 2, 8, 10]), vi("b", [2, 2, 9, 11])], [_init("wt", _R.random((3, 2, 3, 3)).astype(np.float32))]),
    "pools7_same_lower": (7, [_N("AveragePool", ["x"], ["a"], kernel_shape=[2, 3], auto_pad="SAME_LOWER"), _N("MaxPool", ["x"], ["b"], kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER"), _N("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2])], _X, [vi("a", [2, 3, 4, 5]), vi("b", [2, 3, 2, 3]), vi("c", [2, 4, 2, 3])], [_init("w", _R.random((4, 3, 2, 2)).astype(np.float32))]),
    "softmax1_logsoftmax1_hardmax1": (9, [_N("Softmax", ["x"], ["a"], axis=2), _N("LogSoftmax", ["x"], ["b"]), _N("Hardmax", ["x"], ["c"], axis=2)], _X, [vi("a", [2, 3, 4, 5]), vi("b", [2, 3, 4, 5]), vi("c", [2, 3, 4, 5])], []),
    "flatten9_concat4_gather1": (9, [_N("Flatten", ["x"], ["f"], axis=2), _N("Concat", ["f", "f"], ["c"], axis=1), _N("Gather", ["c", "i"], ["y"], axis=1)], _X, [vi("y", [6, 2])], [_init("i", np.int64([2, 30]))]),
    "argmax1_depthtospace1": (9, [_N("ArgMax", ["x"], ["a"], axis=2, keepdims=0), _N("DepthToSpace", ["x"], ["d"], blocksize=1)], _X, [vi("a", [2, 3, 5], TensorProto.INT64), vi("d", [2, 3, 4, 5])], []),
    "cast6_compare7": (7, [_N("Cast", ["x"], ["c"], to=TensorProto.INT32), _N("Greater", ["x", "z"], ["g"]), _N("Less", ["x", "z"], ["l"]), _N("Equal", ["c", "zi"], ["e"])], _X, [vi("c", [2, 3, 4, 5], TensorProto.INT32), vi("g", [2, 3, 4, 5], TensorProto.BOOL), vi("l", [2, 3, 4, 5], TensorProto.BOOL), vi("e", [2, 3, 4, 5], TensorProto.BOOL)], [_init("z", np.float32([0.1])), _init("zi", np.int32([0]))]),
    "max6_mean6_min6_sum6": (7, [_N("Max", ["x", "z"], ["a"]), _N("Mean", ["x", "z"], ["b"]), _N("Min", ["x", "z"], ["c"]), _N("Sum", ["x", "z", "x"], ["d"])], _X, [vi("a", [2, 3, 4, 5]), vi("b", [2, 3, 4, 5]), vi("c", [2, 3, 4, 5]), vi("d", [2, 3, 4, 5])], [_init("z", _R.random((2, 3, 4, 5)).astype(np.float32))]),
    "prelu7_matmul1": (7, [_N("PRelu", ["x", "s"], ["p"]), _N("MatMul", ["p", "w"], ["y"])], _X, [vi("y", [2, 3, 4, 2])], [_init("s", _R.random((3, 1, 1)).astype(np.float32)), _init("w", _R.random((5, 2)).astype(np.float32))]),
    "onehot9_constant9": (9, [_N("Constant", [], ["i"], value=_init("iv", np.int64([[0, 3, 1], [2, 2, 0]]))), _N("OneHot", ["i", "d", "v"], ["y"], axis=-1)], [], [vi("y", [2, 3, 4])], [_init("d", np.int64([4])), _init("v", np.float32([0, 1]))]),
    "scatter9": (9, [_N("Scatter", ["x", "i", "u"], ["y"], axis=1)], [vi("x", [3, 3])], [vi("y", [3, 3])], [_init("i", np.int64([[1, 0, 2], [0, 2, 1]])), _init("u", np.float32([[1, 1.1, 1.2], [2, 2.1, 2.2]]))]),
    "maxunpool9_lppool2_compress9": (9, [_N("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2]), _N("MaxUnpool", ["p", "i"], ["u"], kernel_shape=[2, 2], strides=[2, 2]), _N("LpPool", ["u"], ["l"], kernel_shape=[2, 2], p=2), _N("Compress", ["l", "k"], ["y"], axis=1)], [vi("x", [2, 3, 4, 4])], [vi("y", [2, 2, 3, 3])], [_init("k", np.array([True, False, True]))]),
    "scan8_batched_reverse": (8, [_N("Scan", ["", "s0", "x"], ["s", "y"], num_scan_inputs=1, directions=[1],
                                     body=helper.make_graph([_N("Add", ["si", "xi"], ["so"]), _N("Relu", ["so"], ["yo"])], "body", [vi("si", [4]), vi("xi", [4])], [vi("so", [4]), vi("yo", [4])]))],
                              [vi("s0", [2, 4]), vi("x", [2, 3, 4])], [vi("s", [2, 4]), vi("y", [2, 3, 4])], []),
    "scan9_reverse": (9, [_N("Scan", ["s0", "x"], ["s", "y"], num_scan_inputs=1, scan_input_axes=[1], scan_input_directions=[1], scan_output_directions=[1],
                             body=helper.make_graph([_N("Add", ["si", "xi"], ["so"]), _N("Relu", ["so"], ["yo"])], "body", [vi("si", [2, 4]), vi("xi", [2, 4])], [vi("so", [2, 4]), vi("yo", [2, 4])]))],
                      [vi("s0", [2, 4]), vi("x", [2, 3, 4])], [vi("s", [2, 4]), vi("y", [3, 2, 4])], []),
}


def _old_model(name):
    opset, nodes, ins, outs, inits = OLD_FORMS[name]
    m = make_model(nodes, ins, outs, inits, opset=opset, ir=5)
    return m, random_feeds(import_onnx(m), seed=1)


@pytest.mark.parametrize("name", sorted(OLD_FORMS))
def test_older_opsets_are_converted_and_match_onnxruntime(name):
    """ONNX Runtime runs the model at its own opset; tensorplan converts it to opset 11 first."""
    m, feeds = _old_model(name)
    g = import_onnx(m)
    assert g.opset == 11
    got = run_reference(g, feeds)
    ort_out = run_onnxruntime(m, feeds)
    for o in m.graph.output:
        want = ort_out[o.name]
        assert got[o.name].shape == want.shape and got[o.name].dtype == want.dtype, o.name
        assert np.allclose(got[o.name], want, rtol=1e-5, atol=1e-5), f"{name}: output {o.name}"


def test_old_upsample_becomes_an_asymmetric_resize():
    g = import_onnx(_old_model("upsample9_nearest")[0])
    (node,) = [n for n in g.nodes if n.op == "Resize"]
    assert node.attrs["coordinate_transformation_mode"] == "asymmetric"
    assert node.attrs["nearest_mode"] == "floor"


@pytest.mark.parametrize("nodes,inits,outs,opset,match", [
    ([_N("BatchNormalization", ["x", "s", "b", "mu", "var"], ["y"], spatial=0, name="bn")],
     [_init(k, np.ones((3, 4, 5), np.float32)) for k in ("s", "b", "mu", "var")], [vi("y", [2, 3, 4, 5])], 7,
     r"node 'bn' \(BatchNormalization\): BatchNormalization version 7 with spatial=0"),
    ([_N("Resize", ["x", "sc"], ["y"], mode="nearest", name="rs")], [_init("sc", np.float32([1, 1, 2, 0.8]))],
     [vi("y", [2, 3, 8, 4])], 10, r"node 'rs' \(Resize\): Resize version 10 in nearest mode upsamples"),
    ([_N("Scan", ["len", "x"], ["y"], num_scan_inputs=1, name="sc8",
         body=helper.make_graph([_N("Neg", ["xi"], ["yi"])], "b", [vi("xi", [4, 5])], [vi("yi", [4, 5])]))],
     [_init("len", np.int64([3, 2]))], [vi("y", [2, 3, 4, 5])], 8,
     r"node 'sc8' \(Scan\): Scan version 8 with sequence_lens"),
    ([_N("Relu", ["x"], ["y"], name="relu1")], [], [vi("y", [2, 3, 4, 5])], 5,
     r"node 'relu1' \(Relu\): Relu version 1 \(opset 5\) is older than tensorplan implements"),
])
def test_old_operator_versions_without_an_exact_conversion_are_refused_by_name(nodes, inits, outs, opset, match):
    m = make_model(nodes, _X, outs, inits, opset=opset, ir=5)
    with pytest.raises(ModelImportError, match=match):
        import_onnx(m)


def test_old_model_is_validated_at_its_own_opset():
    # Split's sizes became an input at opset 13; at opset 9 a second input is invalid
    m = make_model([_N("Split", ["x", "sp"], ["a", "b"], axis=3, name="sp9")], _X,
                   [vi("a", [2, 3, 4, 2]), vi("b", [2, 3, 4, 3])], [_init("sp", np.int64([2, 3]))], opset=9, ir=5)
    assert _ort_refuses(m)
    with pytest.raises(ModelImportError, match=r"sp9"):
        import_onnx(m)


def test_model_with_only_ai_onnx_ml_operators_runs_in_onnxruntime():
    node = _N("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.25)
    g = helper.make_graph([node], "ml", [vi("x", [2, 3])], [vi("y", [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    m.ir_version = 8
    x = np.float32([[0, 0.3, 1], [-1, 0.25, 0.2]])
    assert np.array_equal(run_reference(import_onnx(m), {"x": x})["y"], (x > 0.25).astype(np.float32))


def test_default_domain_nodes_need_a_default_opset():
    g = helper.make_graph([_N("Relu", ["x"], ["y"])], "m", [vi("x", [2])], [vi("y", [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    with pytest.raises(ModelImportError, match="declares no default-domain opset"):
        import_onnx(m)


# ---------------------------------------------------------------- control flow known at import
def _loop_model(opset, trips, cond_out):
    body_nodes = [_N("Cast", ["i"], ["fi"], to=TensorProto.FLOAT), _N("Mul", ["acc_in", "w"], ["m"]),
                  _N("Add", ["m", "fi"], ["acc_out"]), _N("Relu", ["acc_out"], ["sc"])]
    body_nodes.append(_N("Identity", ["c_in"], ["c_out"]) if cond_out == "same" else
                      _N("Constant", [], ["c_out"], value=_init("cv", np.array(False))))
    scan = [vi("sc", [2, 3])] if trips else []
    body = helper.make_graph(body_nodes, "body", [vi("i", [], TensorProto.INT64), vi("c_in", [], TensorProto.BOOL),
                                                  vi("acc_in", [2, 3])],
                             [vi("c_out", [], TensorProto.BOOL), vi("acc_out", [2, 3])] + scan)
    loop = _N("Loop", ["M", "C", "x"], ["y"] + (["s"] if trips else []), body=body, name="lp")
    return make_model([loop], [vi("x", [2, 3])], [vi("y", [2, 3])] + ([vi("s", [None, 2, 3])] if trips else []),
                      [_init("M", np.array(trips, np.int64)), _init("C", np.array(True)),
                       _init("w", np.float32([[1, 2, 3], [4, 5, 6]]) * 0.5)], opset=opset, ir=7)


@pytest.mark.parametrize("opset,trips,cond_out", [(9, 3, "same"), (11, 4, "same"), (13, 3, "false"), (17, 5, "same"),
                                                  (17, 0, "same")])
def test_loop_with_constant_trip_count_is_unrolled(opset, trips, cond_out):
    m = _loop_model(opset, trips, cond_out)
    g = import_onnx(m)
    assert "Loop" not in g.op_counts()
    runs = 0 if trips == 0 else (1 if cond_out == "false" else trips)
    assert g.op_counts().get("Relu", 0) == runs
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    got = run_reference(g, {"x": x})
    ort_out = run_onnxruntime(m, {"x": x})
    for o in m.graph.output:
        want = ort_out[o.name]
        assert got[o.name].shape == want.shape
        assert np.allclose(got[o.name], want, rtol=1e-5, atol=1e-6), o.name


def test_old_if_with_old_ops_in_its_branches_is_converted_and_inlined():
    """If-1 at opset 9 with Slice-1 in both branches: the converter rewrites the sub-graphs, import
    inlines the branch its constant condition takes."""
    then = helper.make_graph([_N("Slice", ["x"], ["t"], starts=[1], ends=[3], axes=[1])], "then", [], [vi("t", None)])
    other = helper.make_graph([_N("Slice", ["x"], ["e"], starts=[0], ends=[2], axes=[1])], "else", [], [vi("e", None)])
    for cond in (True, False):
        m = make_model([_N("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if9")],
                       [vi("x", [2, 3])], [vi("y", [2, 2])], [_init("c", np.array(cond))], opset=9, ir=5)
        g = import_onnx(m)
        assert "If" not in g.op_counts()
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        assert np.array_equal(run_reference(g, {"x": x})["y"], run_onnxruntime(m, {"x": x})["y"])


def test_loop_with_runtime_trip_count_is_refused_by_name():
    m = _loop_model(13, 3, "same")
    m.graph.input.append(vi("M", [], TensorProto.INT64))
    m.graph.initializer.remove(next(t for t in m.graph.initializer if t.name == "M"))
    with pytest.raises(ModelImportError, match=r"'lp' \(Loop\)"):
        import_onnx(m)


def test_scan_is_unrolled_over_its_static_length():
    body = helper.make_graph([_N("Add", ["si", "xi"], ["so"]), _N("Mul", ["so", "xi"], ["yo"])], "body",
                             [vi("si", [2]), vi("xi", [2])], [vi("so", [2]), vi("yo", [2])])
    scan = _N("Scan", ["s0", "x"], ["s", "y"], num_scan_inputs=1, scan_output_axes=[-1], body=body, name="scan")
    m = make_model([scan], [vi("s0", [2]), vi("x", [5, 2])], [vi("s", [2]), vi("y", [2, 5])], opset=17)
    g = import_onnx(m)
    assert "Scan" not in g.op_counts() and g.op_counts()["Add"] == 5
    feeds = random_feeds(g, seed=4)
    got = run_reference(g, feeds)
    ort_out = run_onnxruntime(m, feeds)
    for o in m.graph.output:
        want = ort_out[o.name]
        assert np.allclose(got[o.name], want, rtol=1e-5, atol=1e-6), o.name


class OldOpsetNet(torch.nn.Module):
    """Exported at opset 9 / 10 it holds Upsample / Resize-10 (nearest and linear, scales computed in
    the graph), Pad-2, Slice-1/10, Clip-6, TopK-1/10, BatchNormalization-9 and Gemm: the forms
    import converts."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2)
        y = (torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest")
             + torch.nn.functional.interpolate(y, scale_factor=2, mode="bilinear"))
        y = torch.clamp(torch.nn.functional.pad(y, (1, 1, 0, 0))[:, :, :, 1:-1], 0, 3)
        y = y.view(y.shape[0], -1)
        return torch.softmax(self.fc(y), -1), torch.topk(y, 3)[0]


@pytest.mark.parametrize("opset", [9, 10])
def test_torch_export_at_old_opset_matches_onnxruntime(tmp_path, opset):
    path = tmp_path / f"old{opset}.onnx"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(OldOpsetNet().eval(), (torch.randn(2, 3, 8, 8),), str(path), opset_version=opset,
                          dynamo=False, input_names=["x"], output_names=["p", "top"], do_constant_folding=False)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert ("Upsample" if opset == 9 else "Resize") in ops and {"Pad", "Slice", "Clip", "TopK"} <= ops
    g = import_onnx(path)
    assert g.opset == 11
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    assert_close(run_reference(g, {"x": x}), run_onnxruntime(onnx.load(str(path)), {"x": x}), TOL,
                 ["p", "top"], what=f"opset {opset}")


def test_stft_without_onesided_uses_the_schema_default():
    """onnx's shape inference reads an absent onesided as 0; the operator's default is 1."""
    stft = _N("STFT", ["sig", "step", "", "len"], ["y"], name="stft")
    m = make_model([stft], [vi("sig", [1, 64, 1])], [vi("y", [1, 7, 9, 2])],
                   [_init("step", np.int64(8)), _init("len", np.int64(16))], opset=17)
    g = import_onnx(m)
    assert g.tensors["y"].shape == (1, 7, 9, 2)
    sig = np.random.default_rng(5).standard_normal((1, 64, 1)).astype(np.float32)
    assert_close(run_reference(g, {"sig": sig}), run_onnxruntime(m, {"sig": sig}), TOL, ["y"], what="STFT")
