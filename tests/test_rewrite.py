"""Exact algebraic rewrites (graph/rewrite.py): each rule fires where it should, not where it
must not, and the rewritten graph gives ONNX Runtime's output of the original model."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorplan.errors import PlanError, TensorplanError
from tensorplan.graph import analysis
from tensorplan.graph.onnx_import import import_onnx
from tensorplan.graph.reference import rel_error
from tensorplan.graph.rewrite import rewrite
from tensorplan.graph.to_onnx import graph_to_onnx, run_onnxruntime

TOL = 1e-5


def _resize(name, x, y, mode="linear", ctm="half_pixel", scales=None, sizes=None):
    ins = [x, "", scales or "", sizes or ""]
    while ins and not ins[-1]:
        ins.pop()
    return helper.make_node("Resize", ins, [y], name=name, mode=mode, coordinate_transformation_mode=ctm,
                            nearest_mode="floor")


def decoder_model(kernel: int = 1, down: bool = False):
    """A SegFormer/FPN-style head: [hi-res map, bilinear x4 of a low map, nearest x2 (sizes) of a mid
    map, identity resize of another hi map] -> Concat -> Conv(kernel) + bias -> Relu."""
    rng = np.random.default_rng(0)
    c, h = 8, 16
    lo = h // 4 if not down else h * 2
    inits = {
        "w": rng.standard_normal((6, 4 * c, kernel, kernel)).astype(np.float32),
        "b": rng.standard_normal(6).astype(np.float32),
        "s4": np.array([1, 1, h / lo, h / lo], np.float32),
        "sz2": np.array([1, c, h, h], np.int64),
        "s1": np.array([1, 1, 1, 1], np.float32),
    }
    nodes = [
        _resize("up4", "lo", "lo_up", scales="s4"),
        _resize("up2", "mid", "mid_up", mode="nearest", ctm="asymmetric", sizes="sz2"),
        _resize("same", "hi2", "hi2_same", scales="s1"),
        helper.make_node("Concat", ["hi", "lo_up", "mid_up", "hi2_same"], ["cat"], axis=1, name="cat"),
        helper.make_node("Conv", ["cat", "w", "b"], ["conv"], name="fuse",
                         pads=[kernel // 2] * 4, kernel_shape=[kernel, kernel]),
        helper.make_node("Relu", ["conv"], ["y"], name="relu"),
    ]
    inputs = {"hi": (1, c, h, h), "lo": (1, c, lo, lo), "mid": (1, c, h // 2, h // 2), "hi2": (1, c, h, h)}
    g = helper.make_graph(
        nodes, "decoder",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _feeds(g, seed=0):
    rng = np.random.default_rng(seed)
    return {i: rng.standard_normal(g.tensors[i].shape).astype(np.float32) for i in g.inputs}


def _same_outputs(a, b, feeds, tol=TOL):
    want = run_onnxruntime(a, feeds)
    got = run_onnxruntime(b, feeds)
    assert set(got) == set(want)
    for k in want:
        assert rel_error(got[k], want[k]) <= tol, (k, rel_error(got[k], want[k]))


def test_decoder_head_is_rewritten_exactly_and_loses_flops():
    g = import_onnx(decoder_model())
    r = rewrite(g)
    assert r.counts == {"identity_resize": 1, "split_concat_conv": 1, "conv_before_resize": 2}
    ops = [n.op for n in r.graph.nodes]
    assert "Concat" not in ops and ops.count("Conv") == 4 and ops.count("Add") == 3 and ops.count("Resize") == 2
    # two of the four parts' convolutions now run at 1/16 and 1/4 of the pixels (592/1024 of the MACs)
    assert analysis.graph_flops(r.graph) < 0.7 * analysis.graph_flops(g)
    # the nearest resize had a `sizes` input: its channel count now is the conv's output channels
    rs = [n for n in r.graph.nodes if n.op == "Resize" and n.attrs.get("mode") in (b"nearest", "nearest")][0]
    assert r.graph.tensors[rs.inputs[3]].data.tolist() == [1, 6, 16, 16]
    _same_outputs(g, r.graph, _feeds(g))
    assert r.graph is not g and len(g.nodes) == 6  # the input graph is left alone


def test_rules_do_not_fire_where_they_would_be_wrong():
    # a 3x3 convolution mixes neighbouring pixels: it does not commute with upsampling
    g3 = import_onnx(decoder_model(kernel=3))
    assert rewrite(g3).counts == {"identity_resize": 1}
    # a downsampling resize loses information: the conv must stay after it
    gd = import_onnx(decoder_model(down=True))
    r = rewrite(gd)
    assert r.counts.get("conv_before_resize", 0) == 1  # only the nearest x2 part
    _same_outputs(gd, r.graph, _feeds(gd))
    # rules can be switched off one by one; unknown names are rejected
    g = import_onnx(decoder_model())
    assert rewrite(g, rules=("identity_resize",)).counts == {"identity_resize": 1}
    assert rewrite(g, rules=()).applied == []
    with pytest.raises(TensorplanError, match="unknown rewrite rule"):
        rewrite(g, rules=("fold_everything",))


def test_segformer_decoder_rewrite_matches_onnxruntime():
    from tensorplan.graph import load_model
    g = load_model("segformer-b0")
    r = rewrite(g)
    assert r.counts == {"identity_resize": 1, "split_concat_conv": 1, "conv_before_resize": 3}
    assert analysis.graph_flops(r.graph) < 0.7 * analysis.graph_flops(g)
    _same_outputs(g, r.graph, _feeds(g), tol=1e-4)


def test_plan_records_rewrites_runs_them_and_rejects_a_mismatch(tmp_path):
    from tensorplan.plan import orchestrate
    from tensorplan.plan.plan import Plan
    from tensorplan.runtime.executor import run_plan
    path = tmp_path / "decoder.onnx"
    path.write_bytes(decoder_model().SerializeToString())
    plan = orchestrate(str(path), cost="analytical")
    assert [r for r, _ in plan.source["rewrites"]].count("conv_before_resize") == 2
    off = orchestrate(str(path), cost="analytical", rewrite=False)
    assert off.source["rewrites"] == [] and off.source["num_primitives"] != plan.source["num_primitives"]
    saved = plan.save(tmp_path / "plan.json")
    res = run_plan(saved, repeats=3)  # checks against ONNX Runtime on the *original* model
    assert res.max_rel_err is not None and res.max_rel_err <= 1e-4
    bad = Plan.load(saved)
    bad.source["rewrites"] = bad.source["rewrites"][:1]
    with pytest.raises(PlanError, match="rewrites"):
        bad.primitive_graph()
