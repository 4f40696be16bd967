"""Exact algebraic rewrites (tensorplan.rewrite): each rule fires where it should, not
where it must not, and the rewritten graph gives ONNX Runtime's output of the original model."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from conftest import assert_close, onnx_model
from tensorplan.errors import PlanError, TensorplanError
from tensorplan.ir import analysis
from tensorplan.ir.onnx_import import import_onnx
from tensorplan.ir.reference import random_feeds
from tensorplan.ir.to_onnx import run_onnxruntime
from tensorplan.rewrite import output_phase_factor, rewrite

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
    return onnx_model(nodes, inputs, ["y"], inits, name="decoder")


def _same_outputs(a, b, feeds, tol=TOL):
    """Graphs `a` and `b` give the same outputs in ONNX Runtime."""
    want, got = run_onnxruntime(a, feeds), run_onnxruntime(b, feeds)
    assert set(got) == set(want)
    assert_close(got, want, tol)


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
    _same_outputs(g, r.graph, random_feeds(g))
    assert r.graph is not g and len(g.nodes) == 6  # the input graph is left alone


def test_rules_do_not_fire_where_they_would_be_wrong():
    # a 3x3 convolution mixes neighbouring pixels: it does not commute with upsampling
    g3 = import_onnx(decoder_model(kernel=3))
    assert rewrite(g3).counts == {"identity_resize": 1}
    # a downsampling resize loses information: the conv must stay after it
    gd = import_onnx(decoder_model(down=True))
    r = rewrite(gd)
    assert r.counts.get("conv_before_resize", 0) == 1  # only the nearest x2 part
    _same_outputs(gd, r.graph, random_feeds(gd))
    # rules can be switched off one by one; unknown names are rejected
    g = import_onnx(decoder_model())
    assert rewrite(g, rules=("identity_resize",)).counts == {"identity_resize": 1}
    assert rewrite(g, rules=()).applied == []
    with pytest.raises(TensorplanError, match="unknown rewrite rule"):
        rewrite(g, rules=("fold_everything",))


@pytest.mark.parametrize("model, counts, flops_below", [
    # the decoder's 1x1 fuse convolution split per stage, moved below the upsampling and folded
    # into each stage's token projection: 17.1 -> 8.6 GFLOP; each of the 8 Mix-FFNs runs fc1 and
    # fc2 as 1x1 convolutions on the narrow side of its token <-> image layout changes
    ("segformer-b0", {"identity_resize": 1, "split_concat_conv": 1, "conv_before_resize": 3,
                      "token_linear_conv": 4, "token_linear_as_conv": 16}, 0.55),
    # candy's two upsampling convolutions are 3.7 of 15.5 GFLOP; 2.25x fewer saves 2.0; its 9x9
    # 32->3 output layer as 4x4 phases adds 0.6 GFLOP of zero taps (but 3x fewer lane-padded ones)
    ("candy", {"upsample_conv_phases": 2, "conv_output_phases": 1}, 0.95),
])
def test_zoo_decoder_rewrites_match_onnxruntime(model, counts, flops_below):
    from tensorplan.zoo.specs import load_model
    g = load_model(model)
    r = rewrite(g)
    assert r.counts == counts
    assert analysis.graph_flops(r.graph) < flops_below * analysis.graph_flops(g)
    _same_outputs(g, r.graph, random_feeds(g), tol=1e-4)


def _orchestrate(tmp_path, model, **kw):
    """The analytical plan of `model`, given as an ONNX file the way a user passes one."""
    from tensorplan.workflows.orchestrate import orchestrate
    path = tmp_path / f"{model.graph.name}.onnx"
    path.write_bytes(model.SerializeToString())
    return orchestrate(str(path), cost="analytical", **kw)


def _runs_like_onnxruntime(plan, tmp_path):
    """Save `plan`, run it as loaded back (which re-derives the rewritten graph) and check it
    against ONNX Runtime on the *original* model; returns the saved file."""
    from tensorplan.runtime.plan import load_plan
    saved = plan.save(tmp_path / "plan.json")
    res = load_plan(saved).run(repeats=3)
    assert res.max_rel_err is not None and res.max_rel_err <= 1e-4
    return saved


def test_plan_records_rewrites_runs_them_and_rejects_a_mismatch(tmp_path):
    from tensorplan.runtime.plan import Plan
    plan = _orchestrate(tmp_path, decoder_model())
    assert [r for r, _ in plan.source["rewrites"]].count("conv_before_resize") == 2
    off = _orchestrate(tmp_path, decoder_model(), rewrite=False)
    assert off.source["rewrites"] == [] and off.source["num_primitives"] != plan.source["num_primitives"]
    saved = _runs_like_onnxruntime(plan, tmp_path)
    bad = Plan.load(saved)
    bad.source["rewrites"] = bad.source["rewrites"][:1]
    with pytest.raises(PlanError, match="rewrites"):
        bad.primitive_graph()


def upsample_conv_model(opset=17, mode="nearest", ctm="asymmetric", nearest_mode="floor", scale=2,
                        border="reflect", pad=1, pad_value=0.0, stride=1, use_sizes=False):
    """Nearest x`scale` upsampling -> one-pixel border (a Pad node of `border` mode, or the
    Conv's own zero pads when border='conv') -> Conv3x3 + bias -> Relu, as in style-transfer
    decoders (candy) and GAN generators."""
    rng = np.random.default_rng(1)
    c, k, h = 5, 7, 6
    inits = {"w": rng.standard_normal((k, c, 3, 3)).astype(np.float32),
             "b": rng.standard_normal(k).astype(np.float32)}
    if use_sizes:
        inits["sz"] = np.array([1, c, h * scale, h * scale], np.int64)
        up_ins = ["x", "", "", "sz"]
    else:
        inits["sc"] = np.array([1, 1, scale, scale], np.float32)
        up_ins = ["x", "", "sc"]
    nodes = [helper.make_node("Resize", up_ins, ["u"], name="up", mode=mode,
                              coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)]
    conv_in, conv_pads = "u", [pad] * 4
    if border != "conv":
        inits["pads"] = np.array([0, 0, pad, pad, 0, 0, pad, pad], np.int64)
        ins = ["u", "pads"]
        if border == "constant":
            inits["pv"] = np.array(pad_value, np.float32)
            ins.append("pv")
        nodes.append(helper.make_node("Pad", ins, ["p"], name="pad", mode=border))
        conv_in, conv_pads = "p", [0] * 4
    nodes += [helper.make_node("Conv", [conv_in, "w", "b"], ["conv"], name="conv", pads=conv_pads,
                               kernel_shape=[3, 3], strides=[stride, stride]),
              helper.make_node("Relu", ["conv"], ["y"], name="relu")]
    return onnx_model(nodes, {"x": [1, c, h, h]}, ["y"], inits, name="upconv", opset=opset)


@pytest.mark.parametrize("kw", [
    {},                                                    # candy: asymmetric/floor, reflect Pad
    {"border": "edge"},
    {"border": "constant"},                                # a zero Pad node
    {"border": "conv", "ctm": "half_pixel", "nearest_mode": "round_prefer_floor", "use_sizes": True},
    {"opset": 13, "border": "conv"},
])
def test_upsample_conv_phases_is_exact_and_saves_flops(kw):
    g = import_onnx(upsample_conv_model(**kw))
    r = rewrite(g)
    assert r.counts == {"upsample_conv_phases": 1}
    ops = [n.op for n in r.graph.nodes]
    assert "Resize" not in ops and "Upsample" not in ops and ops.count("DepthToSpace") == 1
    conv = next(n for n in r.graph.nodes if n.op == "Conv")
    assert r.graph.tensors[conv.inputs[1]].shape == (28, 5, 2, 2)
    # 16 multiply-adds per low-res pixel instead of 36 (times (7/6)^2: the phase grid is (h+1)^2)
    assert analysis.graph_flops(r.graph) < 0.65 * analysis.graph_flops(g)
    _same_outputs(g, r.graph, random_feeds(g))


@pytest.mark.parametrize("kw", [
    {"scale": 3},                       # three copies per pixel: windows see up to three sources
    {"mode": "linear"},                 # interpolated pixels are not copies
    {"ctm": "half_pixel", "nearest_mode": "ceil"},  # the grid shifts: i -> ceil(i/2 - 1/4)
    {"pad": 2, "border": "conv"},       # 3x3 with pads 2 is not the same window
    {"border": "reflect", "pad": 2},
    {"border": "constant", "pad_value": 1.0},
    {"stride": 2, "border": "conv"},
])
def test_upsample_conv_phases_does_not_fire_where_it_would_be_wrong(kw):
    g = import_onnx(upsample_conv_model(**kw))
    assert rewrite(g).applied == []


def test_phase_rewritten_plan_runs_on_compiled_kernels(tmp_path):
    # the new Pad(edge) / Slice / Concat / DepthToSpace primitives go through fission, TVM
    # lowering and the executor; the result is checked against ORT on the *original* model
    plan = _orchestrate(tmp_path, upsample_conv_model())
    assert [r for r, _ in plan.source["rewrites"]] == ["upsample_conv_phases"]
    _runs_like_onnxruntime(plan, tmp_path)


def conv3x3_model(n=1, c=6, k=5, h=9, w=11, pads=(1, 1, 1, 1), bias=True, stride=1, group=1, kernel=3):
    """One Conv (+ Relu) on an n x c x h x w map: the shapes of the Winograd rule's cases."""
    rng = np.random.default_rng(2)
    inits = {"w": rng.standard_normal((k, c // group, kernel, kernel)).astype(np.float32)}
    ins = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(k).astype(np.float32)
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["conv"], name="conv", pads=list(pads), kernel_shape=[kernel, kernel],
                              strides=[stride, stride], group=group),
             helper.make_node("Relu", ["conv"], ["y"], name="relu")]
    return onnx_model(nodes, {"x": [n, c, h, w]}, ["y"], inits, name="conv3x3")


@pytest.mark.parametrize("kw", [
    {},                                             # output 9x11: not whole 4x4 tiles, sliced back
    {"h": 16, "w": 12, "bias": False},              # whole tiles, no Slice, no Add
    {"pads": (0, 0, 0, 0), "h": 10, "w": 14},       # candy: the border comes from a Pad before
    {"pads": (2, 0, 1, 1)},                         # asymmetric pads
    {"n": 2},                                       # batch: GEMM over both images' tiles
])
def test_winograd_is_exact_on_named_convs(kw):
    from tensorplan.rewrite import WINOGRAD, winograd_convs
    g = import_onnx(conv3x3_model(**kw))
    assert [n.name for n in winograd_convs(g)] == ["conv"]
    assert rewrite(g).applied == []                 # only on request
    r = rewrite(g, winograd=["conv"])
    assert r.applied == [(WINOGRAD, "conv")]
    ops = [n.op for n in r.graph.nodes]
    assert ops.count("MatMul") == 2 and ops.count("DepthToSpace") == 1
    gemm = next(n for n in r.graph.nodes if n.op == "MatMul")
    assert r.graph.tensors[gemm.inputs[0]].shape == (36, 5, 6)   # 36 transform points x K x C
    _same_outputs(g, r.graph, random_feeds(g), tol=1e-4)


@pytest.mark.parametrize("kw", [{"stride": 2}, {"group": 2, "k": 6}, {"kernel": 5, "pads": (2, 2, 2, 2)},
                                {"h": 4, "w": 4, "pads": (0, 0, 0, 0)}])  # output 2x2: less than a tile
def test_winograd_refuses_convs_it_cannot_compute(kw):
    from tensorplan.rewrite import winograd_convs
    g = import_onnx(conv3x3_model(**kw))
    assert winograd_convs(g) == []
    with pytest.raises(TensorplanError, match="not an eligible 3x3 convolution"):
        rewrite(g, winograd=["conv"])


def test_winograd_plan_records_the_convs_and_runs(tmp_path):
    plan = _orchestrate(tmp_path, conv3x3_model(h=12, w=12), winograd=True)
    assert plan.source["rewrites"] == [["conv3x3_winograd", "conv"]] and plan.options["winograd"]
    _runs_like_onnxruntime(plan, tmp_path)


def mish_model(as_op: bool = False, shared_tanh: bool = False):
    """Conv -> Mish, written as the ONNX Mish op (opset 18) or as the Softplus -> Tanh -> Mul
    chain exporters emit; `shared_tanh` gives the Tanh a second consumer (the rule must not fire)."""
    rng = np.random.default_rng(1)
    inits = {"w": 4 * rng.standard_normal((6, 3, 3, 3)).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    if as_op:
        nodes.append(helper.make_node("Mish", ["c"], ["y"], name="mish"))
    else:
        nodes += [helper.make_node("Softplus", ["c"], ["sp"], name="sp"),
                  helper.make_node("Tanh", ["sp"], ["t"], name="tanh"),
                  helper.make_node("Mul", ["t", "c"], ["y"], name="mul")]
    outs = ["y", "t"] if shared_tanh else ["y"]
    return onnx_model(nodes, {"x": [1, 3, 12, 12]}, outs, inits, name="mish", opset=18 if as_op else 17)


@pytest.mark.parametrize("as_op", [False, True])
def test_mish_becomes_vectorizable_operators_exactly(as_op):
    g = import_onnx(mish_model(as_op))
    r = rewrite(g)
    assert r.counts == {"mish_sigmoid": 1}
    ops = [n.op for n in r.graph.nodes]
    assert not {"Softplus", "Tanh", "Mish"} & set(ops) and ops.count("Sigmoid") == 1
    # conv outputs span about +-60: both tails (sigmoid saturated, exp underflowed) are hit
    feeds = random_feeds(g)
    assert np.abs(run_onnxruntime(g, feeds)["y"]).max() > 30
    _same_outputs(g, r.graph, feeds, tol=2e-6)


def test_mish_rule_leaves_a_shared_intermediate_alone():
    g = import_onnx(mish_model(shared_tanh=True))
    assert rewrite(g).applied == []


def focus_model(one_slice: bool = False, phases=((0, 0), (1, 0), (0, 1), (1, 1)), stride=1, pads=(1, 1, 1, 1)):
    """YOLOX's Focus stem: four 2x2 phases of the image stacked on channels, then a 3x3 conv
    with bias. Built from two chained Slices per phase (H, then W) as torch exports it, or from
    one Slice over both axes (`one_slice`)."""
    rng = np.random.default_rng(2)
    inits = {"w": rng.standard_normal((5, 4 * 3, 3, 3)).astype(np.float32),
             "b": rng.standard_normal(5).astype(np.float32),
             "end": np.array([1 << 30], np.int64), "end2": np.array([1 << 30, 1 << 30], np.int64),
             "ax2": np.array([2], np.int64), "ax3": np.array([3], np.int64), "ax23": np.array([2, 3], np.int64),
             "st": np.array([2], np.int64), "st2": np.array([2, 2], np.int64)}
    for v in (0, 1):
        inits[f"s{v}"] = np.array([v], np.int64)
        for u in (0, 1):
            inits[f"s{v}{u}"] = np.array([v, u], np.int64)
    nodes, parts = [], []
    for k, (dh, dw) in enumerate(phases):
        if one_slice:
            nodes.append(helper.make_node("Slice", ["x", f"s{dh}{dw}", "end2", "ax23", "st2"], [f"p{k}"], name=f"sl{k}"))
        else:
            nodes += [helper.make_node("Slice", ["x", f"s{dh}", "end", "ax2", "st"], [f"h{k}"], name=f"slh{k}"),
                      helper.make_node("Slice", [f"h{k}", f"s{dw}", "end", "ax3", "st"], [f"p{k}"], name=f"slw{k}")]
        parts.append(f"p{k}")
    nodes += [helper.make_node("Concat", parts, ["cat"], axis=1, name="cat"),
              helper.make_node("Conv", ["cat", "w", "b"], ["y"], name="stem", pads=list(pads), strides=[stride] * 2)]
    return onnx_model(nodes, {"x": [1, 3, 16, 20]}, ["y"], inits, name="focus")


@pytest.mark.parametrize("kw", [{}, {"one_slice": True, "phases": ((1, 1), (0, 0), (0, 1), (1, 0))},
                                {"pads": (0, 1, 2, 1)}])
def test_focus_stem_becomes_one_strided_conv_exactly(kw):
    g = import_onnx(focus_model(**kw))
    r = rewrite(g)
    assert r.counts == {"focus_conv": 1}
    assert [n.op for n in r.graph.nodes] == ["Conv"]
    conv = r.graph.nodes[0]
    assert list(conv.attrs["strides"]) == [2, 2] and list(conv.attrs["kernel_shape"]) == [6, 6]
    assert analysis.graph_flops(r.graph) == pytest.approx(analysis.graph_flops(g), rel=0.01)
    _same_outputs(g, r.graph, random_feeds(g))


@pytest.mark.parametrize("kw", [{"phases": ((0, 0), (1, 0), (0, 1), (0, 1))}, {"stride": 2}])
def test_focus_rule_needs_all_four_phases_and_a_unit_stride(kw):
    assert rewrite(import_onnx(focus_model(**kw))).applied == []


def test_yolox_focus_stem_and_head_rewrite_match_onnxruntime():
    from tensorplan.zoo.specs import load_model
    g = load_model("yolox-nano")
    r = rewrite(g)
    assert r.counts == {"split_concat_conv": 4, "conv_before_resize": 4, "focus_conv": 1}
    assert "Slice" not in {n.op for n in r.graph.nodes if n.name.startswith("/stem")}
    _same_outputs(g, r.graph, random_feeds(g), tol=1e-4)


@pytest.mark.parametrize("kw, s", [
    ({"c": 8, "k": 3, "h": 16, "w": 24, "kernel": 9, "pads": (4, 4, 4, 4)}, 4),
    ({"c": 5, "k": 3, "h": 14, "w": 10, "kernel": 9, "pads": (3, 5, 3, 5), "bias": False}, 4),
    ({"c": 6, "k": 4, "h": 10, "w": 12, "kernel": 3, "pads": (1, 1, 1, 1)}, 2),
    ({"n": 2, "c": 4, "k": 1, "h": 8, "w": 8, "kernel": 3, "pads": (1, 1, 1, 1)}, 4),
])
def test_few_channel_conv_becomes_output_phases_exactly(kw, s):
    g = import_onnx(conv3x3_model(**kw))
    r = rewrite(g)
    assert r.counts == {"conv_output_phases": 1}
    assert [n.op for n in r.graph.nodes] == ["Conv", "DepthToSpace", "Relu"]
    conv, d2s = r.graph.nodes[:2]
    k = kw["kernel"]
    assert list(conv.attrs["strides"]) == [s, s] and list(conv.attrs["kernel_shape"]) == [k + s - 1] * 2
    assert r.graph.tensors[conv.inputs[1]].shape[0] == s * s * kw["k"] and d2s.attrs["blocksize"] == s
    _same_outputs(g, r.graph, random_feeds(g))


@pytest.mark.parametrize("kw", [
    {"c": 8, "k": 16, "h": 16, "w": 16, "kernel": 9, "pads": (4, 4, 4, 4)},   # whole lane blocks already
    {"c": 8, "k": 3, "h": 16, "w": 16, "kernel": 1, "pads": (0, 0, 0, 0)},    # 1x1: phases would not pay
    {"c": 8, "k": 3, "h": 18, "w": 16, "kernel": 9, "pads": (4, 4, 4, 4)},    # 18 rows: not 4-divisible
    {"c": 8, "k": 3, "h": 16, "w": 16, "kernel": 9, "pads": (4, 4, 4, 4), "stride": 2},
    {"c": 8, "k": 4, "h": 16, "w": 16, "kernel": 9, "pads": (4, 4, 4, 4), "group": 2},
])
def test_output_phases_refuse_convs_where_they_would_not_pay_or_fit(kw):
    assert "conv_output_phases" not in rewrite(import_onnx(conv3x3_model(**kw))).counts


def test_output_phase_factor_fills_whole_lane_blocks():
    assert output_phase_factor(3, 9, 9) == 4      # 48 channels, 1296 -> 432 lane-padded taps per pixel
    assert output_phase_factor(4, 3, 3) == 2      # 16 channels, 144 -> 64
    assert output_phase_factor(1, 3, 3) == 4
    assert output_phase_factor(3, 3, 3) is None   # 144 -> 108: under 2x
    assert output_phase_factor(16, 9, 9) is None and output_phase_factor(3, 1, 1) is None


def token_decoder_model(c=6, cm=8, co=5, h=4, w=3, spelling="flatten", share=False, conv_bias=True):
    """NCHW x -> (N, HW, C) tokens -> MatMul + bias -> back to NCHW -> 1x1 Conv (SegFormer's
    decoder head). `spelling` writes the layout chains differently; "hw_swapped" puts tokens
    in W-major order, which the fold must refuse."""
    rng = np.random.default_rng(3)
    inits = {"wp": rng.standard_normal((c, cm)).astype(np.float32), "bp": rng.standard_normal(cm).astype(np.float32),
             "wf": rng.standard_normal((co, cm, 1, 1)).astype(np.float32), "bf": rng.standard_normal(co).astype(np.float32),
             "s3": np.array([1, c, h * w], np.int64), "s4": np.array([1, cm, h, w], np.int64),
             "s_nhwc": np.array([1, h * w, c], np.int64)}
    mk = helper.make_node
    if spelling == "flatten":
        to_tok = [mk("Reshape", ["x", "s3"], ["x3"]), mk("Transpose", ["x3"], ["tok"], perm=[0, 2, 1])]
    elif spelling == "nhwc":
        to_tok = [mk("Transpose", ["x"], ["xt"], perm=[0, 2, 3, 1]), mk("Reshape", ["xt", "s_nhwc"], ["tok"])]
    else:  # hw_swapped
        to_tok = [mk("Transpose", ["x"], ["xt"], perm=[0, 3, 2, 1]), mk("Reshape", ["xt", "s_nhwc"], ["tok"])]
    nodes = to_tok + [mk("MatMul", ["tok", "wp"], ["mm"]), mk("Add", ["bp", "mm"], ["lin"]),
                      mk("Transpose", ["lin"], ["lt"], perm=[0, 2, 1]), mk("Reshape", ["lt", "s4"], ["img"]),
                      mk("Conv", ["img", "wf", "bf"] if conv_bias else ["img", "wf"], ["y"], kernel_shape=[1, 1])]
    outs = ["y", "lin"] if share else ["y"]
    return onnx_model(nodes, {"x": [1, c, h, w]}, outs, inits, name="token_decoder")


@pytest.mark.parametrize("kw", [{}, {"spelling": "nhwc"}, {"conv_bias": False}, {"c": 8, "cm": 8, "co": 8}])
def test_token_projection_and_fuse_conv_fold_into_one_conv(kw):
    g = import_onnx(token_decoder_model(**kw))
    r = rewrite(g)
    assert r.counts == {"token_linear_conv": 1}
    assert [n.op for n in r.graph.nodes] == ["Conv"] and r.graph.nodes[0].inputs[0] == "x"
    assert analysis.graph_flops(r.graph) < analysis.graph_flops(g)
    _same_outputs(g, r.graph, random_feeds(g))


@pytest.mark.parametrize("kw", [{"spelling": "hw_swapped"}, {"share": True},
                                {"c": 16, "cm": 2, "co": 16}])   # a bottleneck: folding adds multiply-adds
def test_token_fold_refuses_wrong_layouts_shared_values_and_bottlenecks(kw):
    assert "token_linear_conv" not in rewrite(import_onnx(token_decoder_model(**kw))).counts


def mix_ffn_model(c=4, cm=12, h=5, w=6, channel_scale=False):
    """SegFormer's Mix-FFN on (1, HW, C) tokens: fc1 (C -> C'), to image, depthwise 3x3, back to
    tokens, erf-GELU, fc2 (C' -> C). `channel_scale` multiplies by a per-channel (C',) constant
    before fc2, which broadcasts differently in image layout: the way back must then stay put."""
    rng = np.random.default_rng(4)
    inits = {"w1": rng.standard_normal((c, cm)).astype(np.float32), "b1": rng.standard_normal(cm).astype(np.float32),
             "dw": rng.standard_normal((cm, 1, 3, 3)).astype(np.float32), "db": rng.standard_normal(cm).astype(np.float32),
             "w2": rng.standard_normal((cm, c)).astype(np.float32), "b2": rng.standard_normal(c).astype(np.float32),
             "s4": np.array([1, cm, h, w], np.int64), "s3": np.array([1, cm, h * w], np.int64),
             "sqrt2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32),
             "half": np.array(0.5, np.float32), "scale": rng.standard_normal(cm).astype(np.float32)}
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "w1"], ["f1"]), mk("Add", ["f1", "b1"], ["a1"]),
             mk("Transpose", ["a1"], ["t1"], perm=[0, 2, 1]), mk("Reshape", ["t1", "s4"], ["img"]),
             mk("Conv", ["img", "dw", "db"], ["dwo"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=cm),
             mk("Reshape", ["dwo", "s3"], ["r3"]), mk("Transpose", ["r3"], ["tok"], perm=[0, 2, 1]),
             mk("Div", ["tok", "sqrt2"], ["d"]), mk("Erf", ["d"], ["e"]), mk("Add", ["e", "one"], ["e1"]),
             mk("Mul", ["tok", "e1"], ["m"]), mk("Mul", ["m", "half"], ["gelu"])]
    last = "gelu"
    if channel_scale:
        nodes.append(mk("Mul", ["gelu", "scale"], ["scaled"]))
        last = "scaled"
    nodes += [mk("MatMul", [last, "w2"], ["f2"]), mk("Add", ["b2", "f2"], ["y"])]
    return onnx_model(nodes, {"x": [1, h * w, c]}, ["y"], inits, name="mix_ffn")


def test_mix_ffn_linears_move_to_the_narrow_side_of_the_layout_changes():
    g = import_onnx(mix_ffn_model())
    r = rewrite(g)
    assert r.counts == {"token_linear_as_conv": 2}
    ops = [n.op for n in r.graph.nodes]
    assert "MatMul" not in ops and ops.count("Conv") == 3
    # every Transpose now moves the 4 narrow channels, not the 12 wide ones
    assert all(4 in r.graph.tensors[n.inputs[0]].shape for n in r.graph.nodes if n.op == "Transpose")
    _same_outputs(g, r.graph, random_feeds(g))


def test_token_linear_as_conv_keeps_per_channel_constants_and_narrowing_fc1_in_token_layout():
    r = rewrite(import_onnx(mix_ffn_model(channel_scale=True)))
    assert r.counts == {"token_linear_as_conv": 1}          # fc1 moves; fc2 stays behind the (C',) scale
    assert [n.op for n in r.graph.nodes].count("MatMul") == 1
    assert rewrite(import_onnx(mix_ffn_model(c=12, cm=4))).applied == []   # fc1 narrows: nothing to gain


def test_linear_attention_runs_channel_major_exactly_and_only_on_the_full_pattern():
    """EfficientViT's 7 LiteMLA blocks drop the token transposes (21 -> 7 Transposes, the 7 left
    are d-channel ones the runtimes fold into the MatMul), outputs unchanged; a block whose
    intermediate is shared, or whose Pad is not the +1 column, is left as it is."""
    from tensorplan.zoo.specs import load_model
    from tensorplan.ir.graph import Tensor
    g = load_model("efficientvit-b1")
    r = rewrite(g)
    assert r.counts.get("linear_attention_channel_major") == 7
    ops = lambda gr: [n.op for n in gr.nodes].count("Transpose")  # noqa: E731
    assert (ops(g), ops(r.graph)) == (21, 7)
    _same_outputs(g, r.graph, random_feeds(g), tol=1e-4)
    h = g.copy()
    relu_k = next(n for n in h.nodes if n.name.endswith("backbone.8/context/Relu_1"))
    h.outputs.append(relu_k.outputs[0])                       # k is now also a graph output
    pad = next(n for n in h.nodes if n.name.endswith("backbone.9/context/Pad"))
    wrong = h.tensors[pad.inputs[1]].data.copy()
    wrong[-1], wrong[3] = 0, 1                                 # the column padded in front instead
    h.tensors["wrong_pads"] = Tensor("wrong_pads", wrong.shape, "int64", wrong)
    pad.inputs[1] = "wrong_pads"
    assert rewrite(h).counts.get("linear_attention_channel_major") == 5
