"""Every fission rule vs ONNX Runtime on random inputs (several shapes / axes / opsets),
and whole zoo models after fission vs ONNX Runtime on the original model."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import onnx_model, ort_outputs
from tensorplan.errors import TensorplanError
from tensorplan.korch.fission import CATEGORY, category, fission, reduce_axes
from tensorplan.ir.onnx_import import import_onnx
from tensorplan.ir.reference import rel_error, run_reference
from tensorplan.ir.to_onnx import graph_to_onnx

TOL = 1e-4


def check(model: onnx.ModelProto, absent: set[str] = frozenset(), seed: int = 0, scale: float = 1.0,
          feeds=None):
    """Fission the model, run the primitive graph through the reference executor AND ORT, and
    compare both with ORT on the original. Returns the FissionResult."""
    g = import_onnx(model)
    rng = np.random.default_rng(seed)
    if feeds is None:
        feeds = {i: (rng.standard_normal(g.tensors[i].shape) * scale).astype(np.float32) for i in g.inputs}
    want = ort_outputs(model, feeds)
    fr = fission(g)
    prim = fr.graph
    prim.validate()
    ops = {n.op for n in prim.nodes}
    assert not (ops & set(absent)), f"rule did not fire: {ops & set(absent)} still present"
    for n in prim.nodes:
        if (n.name, n.op) not in fr.opaque:
            assert category(n.op) != "opaque"
            assert len([o for o in n.outputs if o]) == 1
    got_ref = run_reference(prim, feeds)
    got_ort = ort_outputs(graph_to_onnx(prim), feeds)
    for o, w, go in zip(prim.outputs, want, got_ort):
        assert rel_error(got_ref[o], w) <= TOL, (o, rel_error(got_ref[o], w))
        assert rel_error(go, w) <= TOL, (o, rel_error(go, w))
    assert set(fr.origin) == {n.name for n in prim.nodes}
    return fr


def one(op, shape, attrs=None, opset=17, extra_inputs=None, inits=None, absent=None, scale=1.0, n_out=1):
    ins = ["x"] + list(extra_inputs or [])
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, ins, outs, **(attrs or {}))
    return check(onnx_model([node], {"x": shape}, outs, inits, opset), absent={op} if absent is None else absent,
                 scale=scale)


def _ops(fr) -> set[str]:
    return {n.op for n in fr.graph.nodes}


# -- softmax family ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis,opset", [((2, 5, 7), -1, 17), ((2, 5, 7), 1, 17), ((3, 4), 0, 13),
                                              ((2, 3, 4, 5), 2, 17), ((2, 5, 7), 1, 11), ((2, 5, 7), 2, 11),
                                              ((4, 6), 1, 11)])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_axes_and_opsets(op, shape, axis, opset):
    assert op not in _ops(one(op, shape, {"axis": axis}, opset=opset))


def test_softmax_large_logits_needs_max_subtraction():
    fr = one("Softmax", (2, 16), {"axis": -1}, scale=200.0)  # exp(200) overflows fp32 without max-sub
    assert "ReduceMax" in {n.op for n in fr.graph.nodes}


def test_softmax_default_axis_opset11_is_flatten_at_1():
    assert "Softmax" not in _ops(one("Softmax", (2, 3, 4), {}, opset=11))


# -- normalisations -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis,bias", [((2, 6, 16), -1, True), ((2, 6, 16), -2, True), ((4, 32), -1, False)])
def test_layernorm(shape, axis, bias):
    r = np.random.default_rng(1)
    norm = shape[axis:] if axis != -1 else shape[-1:]
    inits = {"s": r.standard_normal(norm).astype(np.float32)}
    ins = ["s"]
    if bias:
        inits["b"] = r.standard_normal(norm).astype(np.float32)
        ins.append("b")
    fr = one("LayerNormalization", shape, {"axis": axis, "epsilon": 1e-5}, extra_inputs=ins, inits=inits)
    assert "LayerNormalization" not in _ops(fr) and "ReduceSum" in _ops(fr)


@pytest.mark.parametrize("shape", [(1, 4, 8, 8), (2, 3, 10)])
def test_instancenorm(shape):
    r = np.random.default_rng(2)
    C = shape[1]
    fr = one("InstanceNormalization", shape, {"epsilon": 1e-5}, extra_inputs=["s", "b"],
             inits={"s": r.standard_normal(C).astype(np.float32), "b": r.standard_normal(C).astype(np.float32)})
    assert "InstanceNormalization" not in _ops(fr)


@pytest.mark.parametrize("opset,groups", [(21, 2), (21, 4)])
def test_groupnorm(opset, groups):
    r = np.random.default_rng(3)
    C = 8
    pshape = C
    fr = one("GroupNormalization", (2, C, 5, 5), {"num_groups": groups, "epsilon": 1e-5}, opset=opset,
             extra_inputs=["s", "b"], inits={"s": r.standard_normal(pshape).astype(np.float32),
                                             "b": r.standard_normal(pshape).astype(np.float32)})
    assert "GroupNormalization" not in _ops(fr)


def test_groupnorm_18_is_refused_as_onnxruntime_refuses_it():
    """GroupNormalization-18 is deprecated (its scale/bias were per group); ONNX Runtime will not
    load it, so import refuses it too, naming the node and the reason."""
    r = np.random.default_rng(3)
    with pytest.raises(TensorplanError, match="GroupNormalization.*deprecated"):
        one("GroupNormalization", (2, 8, 5, 5), {"num_groups": 2, "epsilon": 1e-5}, opset=18,
            extra_inputs=["s", "b"], inits={"s": r.standard_normal(2).astype(np.float32),
                                           "b": r.standard_normal(2).astype(np.float32)})


def test_batchnorm_constant_params_fold():
    r = np.random.default_rng(4)
    C = 6
    inits = {"s": r.random(C).astype(np.float32) + 0.5, "b": r.standard_normal(C).astype(np.float32),
             "m": r.standard_normal(C).astype(np.float32), "v": r.random(C).astype(np.float32) + 0.5}
    fr = one("BatchNormalization", (2, C, 4, 4), {"epsilon": 1e-3}, extra_inputs=list(inits), inits=inits)
    assert [n.op for n in fr.graph.nodes] == ["Mul", "Add"]


def test_batchnorm_runtime_params():
    C = 5
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], epsilon=1e-5)
    m = onnx_model([node], {"x": (2, C, 3), "s": (C,), "b": (C,), "m": (C,), "v": (C,)}, ["y"])
    r = np.random.default_rng(5)
    feeds = {k: r.standard_normal(s).astype(np.float32) for k, s in
             {"x": (2, C, 3), "s": (C,), "b": (C,), "m": (C,)}.items()}
    feeds["v"] = r.random(C).astype(np.float32) + 0.5
    check(m, absent={"BatchNormalization"}, feeds=feeds)


# -- activations --------------------------------------------------------------------------------

@pytest.mark.parametrize("approx", ["none", "tanh"])
def test_gelu(approx):
    assert "Gelu" not in _ops(one("Gelu", (3, 17), {"approximate": approx}, opset=20, scale=3.0))


def test_hardswish_hardsigmoid_mish():
    assert "HardSwish" not in _ops(one("HardSwish", (4, 33), opset=14, scale=4.0))
    assert "HardSigmoid" not in _ops(one("HardSigmoid", (4, 33), {"alpha": 0.3, "beta": 0.4}, opset=14, scale=4.0))
    assert "Mish" not in _ops(one("Mish", (4, 33), opset=18, scale=3.0))


def test_swish_vs_numpy():
    """Swish is opset 24, beyond the importer and ORT here: build the IR directly, compare to numpy."""
    from tensorplan.ir.graph import Graph, Node, Tensor
    g = Graph("swish", opset=21)
    g.add_tensor(Tensor("x", (3, 8)))
    g.add_tensor(Tensor("y", (3, 8)))
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_node(Node("sw", "Swish", ["x"], ["y"], {"alpha": 1.5}))
    fr = fission(g)
    prim = fr.graph
    assert [n.op for n in prim.nodes] == ["Mul", "Sigmoid", "Mul"] and fr.rules_applied == {"Swish": 1}
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32) * 3
    y = run_reference(prim, {"x": x})["y"]
    np.testing.assert_allclose(y, x / (1 + np.exp(-1.5 * x)), rtol=1e-5, atol=1e-6)
    y2 = ort_outputs(graph_to_onnx(prim), {"x": x})[0]
    np.testing.assert_allclose(y2, y, rtol=1e-5, atol=1e-6)


# -- Gemm ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tA,tB,alpha,beta,cshape", [(0, 0, 1.0, 1.0, (7,)), (1, 0, 0.5, 2.0, (5, 7)),
                                                     (0, 1, 1.0, 1.0, None), (1, 1, 2.0, 0.5, (1, 7))])
def test_gemm_constant_weight(tA, tB, alpha, beta, cshape):
    r = np.random.default_rng(6)
    M, K, N = 5, 4, 7
    xshape = (K, M) if tA else (M, K)
    B = r.standard_normal((N, K) if tB else (K, N)).astype(np.float32)
    inits = {"B": B}
    ins = ["B"]
    if cshape:
        inits["C"] = r.standard_normal(cshape).astype(np.float32)
        ins.append("C")
    fr = one("Gemm", xshape, {"transA": tA, "transB": tB, "alpha": alpha, "beta": beta},
             extra_inputs=ins, inits=inits)
    ops = [n.op for n in fr.graph.nodes]
    assert "MatMul" in ops and ops.count("Transpose") == tA  # constant B is transposed at fission time


def test_gemm_runtime_operands():
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.7, beta=1.3)
    m = onnx_model([node], {"x": (3, 4), "w": (6, 4), "c": (3, 6)}, ["y"])
    check(m, absent={"Gemm"})


# -- layout / reduce ----------------------------------------------------------------------------

@pytest.mark.parametrize("opset,mode", [(11, "attr"), (13, "input"), (17, "equal"), (18, "num_outputs")])
def test_split(opset, mode):
    x = (4, 9, 3)
    attrs, ins, inits, n_out = {"axis": 1}, [], {}, 3
    if mode == "attr":
        attrs["split"] = [2, 3, 4]
    elif mode == "input":
        ins, inits = ["sp"], {"sp": np.array([4, 4, 1], np.int64)}
    elif mode == "num_outputs":
        attrs["num_outputs"] = 3
    fr = one("Split", x, attrs, opset=opset, extra_inputs=ins, inits=inits, n_out=n_out)
    assert sum(n.op == "Slice" for n in fr.graph.nodes) == 3


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
                                "ReduceLogSumExp"])
@pytest.mark.parametrize("opset,keepdims,axes", [(13, 1, [1]), (17, 0, [0, 2]), (18, 1, [-1]), (18, 0, [1])])
def test_reduce_composites(op, opset, keepdims, axes):
    attrs, ins, inits = {"keepdims": keepdims}, [], {}
    if opset >= 18:
        ins, inits = ["ax"], {"ax": np.array(axes, np.int64)}
    else:
        attrs["axes"] = axes
    shape = (3, 4, 5)
    if op == "ReduceLogSum":  # needs positive inputs
        node = helper.make_node("Abs", ["x"], ["a"])
        red = helper.make_node(op, ["a"] + ins, ["y"], **attrs)
        check(onnx_model([node, red], {"x": shape}, ["y"], inits, opset), absent={op})
    else:
        one(op, shape, attrs, opset=opset, extra_inputs=ins, inits=inits)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op):
    assert op not in _ops(one(op, (1, 3, 5, 6)))


def test_pools_stay_reduce_primitives():
    fr = one("MaxPool", (1, 2, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
             absent=set())
    assert [n.op for n in fr.graph.nodes] == ["MaxPool"] and CATEGORY["MaxPool"] == "reduce"
    one("AveragePool", (1, 2, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}, absent=set())


def test_flatten_squeeze_unsqueeze_become_reshape():
    assert _ops(one("Flatten", (2, 3, 4), {"axis": 2})) == {"Reshape"}
    assert _ops(one("Squeeze", (2, 1, 4), extra_inputs=["ax"], inits={"ax": np.array([1], np.int64)})) == {"Reshape"}
    assert _ops(one("Unsqueeze", (2, 4), extra_inputs=["ax"], inits={"ax": np.array([0, 3], np.int64)})) == {"Reshape"}


def test_variadic_sum_mean_max():
    for op in ("Sum", "Mean", "Max"):
        node = helper.make_node(op, ["x", "a", "b"], ["y"])
        fr = check(onnx_model([node], {"x": (2, 3), "a": (3,), "b": (2, 1)}, ["y"]),
                   absent=set() if op == "Max" else {op})
        assert all(len(n.inputs) == 2 for n in fr.graph.nodes if n.op in ("Add", "Max"))
        assert len(fr.graph.nodes) >= 2


@pytest.mark.parametrize("opset,ctm,nm,scales", [(13, "asymmetric", "floor", [1, 1, 2, 2]),
                                                 (17, "asymmetric", "round_prefer_floor", [1, 1, 2, 2]),
                                                 (17, "asymmetric", "floor", [1, 1, 3, 2])])
def test_resize_nearest_integer_becomes_layout(opset, ctm, nm, scales):
    node = helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="nearest",
                            coordinate_transformation_mode=ctm, nearest_mode=nm)
    m = onnx_model([node], {"x": (1, 2, 3, 4)}, ["y"], {"sc": np.array(scales, np.float32)}, opset)
    fr = check(m, absent={"Resize"})
    assert {n.op for n in fr.graph.nodes} == {"Reshape", "Expand"}


def test_resize_linear_stays_primitive():
    node = helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="linear")
    m = onnx_model([node], {"x": (1, 2, 3, 4)}, ["y"], {"sc": np.array([1, 1, 2, 2], np.float32)})
    fr = check(m)
    assert [n.op for n in fr.graph.nodes] == ["Resize"] and not fr.opaque


def test_expand_into_broadcasting_add_is_dropped():
    e = helper.make_node("Expand", ["b", "shp"], ["be"])
    a = helper.make_node("Add", ["x", "be"], ["y"])
    m = onnx_model([e, a], {"x": (2, 3, 4), "b": (3, 1)}, ["y"], {"shp": np.array([2, 3, 4], np.int64)})
    fr = check(m, absent={"Expand"})
    assert [n.op for n in fr.graph.nodes] == ["Add"]


def test_expand_kept_when_it_changes_the_shape():
    e = helper.make_node("Expand", ["x", "shp"], ["y"])
    r = helper.make_node("Relu", ["y"], ["z"])
    m = onnx_model([e, r], {"x": (3, 1)}, ["z"], {"shp": np.array([2, 3, 4], np.int64)})
    fr = check(m)
    assert "Expand" in {n.op for n in fr.graph.nodes}


def test_unknown_op_is_opaque():
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1)
    m = onnx_model([node, helper.make_node("Relu", ["v"], ["y"])], {"x": [2, 6]}, ["y"],
                   {"k": np.array([3], np.int64)})
    fr = check(m)
    assert [op for _, op in fr.opaque] == ["TopK"]


def test_reduce_axes_reads_both_forms():
    node = helper.make_node("ReduceMax", ["x"], ["y"], axes=[-1], keepdims=1)
    g = import_onnx(onnx_model([node], {"x": (2, 3)}, ["y"], opset=13))
    assert reduce_axes(g, g.nodes[0]) == (1,)
    node = helper.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=0)
    g = import_onnx(onnx_model([node], {"x": (2, 3, 4)}, ["y"], {"ax": np.array([0, -1], np.int64)}, opset=13))
    assert reduce_axes(g, g.nodes[0]) == (0, 2)


# -- whole models -------------------------------------------------------------------------------

def _zoo_check(name: str, opset: int = 17):
    zoo = pytest.importorskip("tensorplan.zoo")
    from tensorplan.zoo.specs import load
    from tensorplan.ir.reference import random_feeds
    path = zoo.export(name, opset)
    g = load(name, opset=opset)
    fr = fission(g)
    feeds = random_feeds(g, 0)
    want = ort_outputs(path, feeds)
    got = run_reference(fr.graph, feeds)
    for o, w in zip(fr.graph.outputs, want):
        assert rel_error(got[o], w) <= TOL, (name, o, rel_error(got[o], w))
    return fr


@pytest.mark.parametrize("name", ["tiny-cnn", "tiny-attention", "tiny-convnext-ish", "tiny-linear-attention",
                                  "tiny-mlp", "tiny-style"])
def test_zoo_tiny_models_after_fission_match_ort(name):
    fr = _zoo_check(name)
    assert fr.rules_applied  # each tiny model exercises at least one rule


@pytest.mark.slow
@pytest.mark.parametrize("name,opset", [("candy", 17), ("yolox-nano", 17), ("tiny-attention", 11)])
def test_zoo_real_models_after_fission_match_ort(name, opset):
    fr = _zoo_check(name, opset)
    assert not fr.opaque
