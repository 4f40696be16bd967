"""Operators tensorplan has no rule for (LSTM, TopK's neighbours, com.microsoft contrib ops) still
import, plan and run: ONNX Runtime runs them one node at a time (`graph.ort_node`), fission keeps
them opaque, and every output still matches ONNX Runtime on the whole model. Ops neither side
implements fail at import with the node named."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from typer.testing import CliRunner

from conftest import assert_close
from tensorplan.errors import ModelImportError
from tensorplan.zoo.specs import load
from tensorplan.ir.reference import random_feeds, rel_error, run_reference
from tensorplan.ir.to_onnx import graph_to_onnx, run_onnxruntime


def _model(tmp_path, nodes, inits, out_types, name="m", domains=(("com.microsoft", 1),)):
    g = h.make_graph(nodes, name, [h.make_tensor_value_info("x", T.FLOAT, [2, 16, 32])],
                     [h.make_tensor_value_info(o, t, None) for o, t in out_types], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)] + [h.make_opsetid(d, v) for d, v in domains])
    m.ir_version = 8
    p = tmp_path / f"{name}.onnx"
    onnx.save(m, str(p))
    return p


def _mixed(tmp_path):
    """MatMul -> com.microsoft BiasGelu -> LSTM (seq-major) -> Softmax -> TopK -> Erf."""
    rng = np.random.default_rng(0)
    hid = 24
    inits = [nh.from_array((rng.standard_normal((32, 48)) * 0.2).astype(np.float32), "W"),
             nh.from_array((rng.standard_normal(48) * 0.1).astype(np.float32), "B"),
             nh.from_array((rng.standard_normal((1, 4 * hid, 48)) * 0.2).astype(np.float32), "LW"),
             nh.from_array((rng.standard_normal((1, 4 * hid, hid)) * 0.2).astype(np.float32), "LR"),
             nh.from_array((rng.standard_normal((1, 8 * hid)) * 0.1).astype(np.float32), "LB"),
             nh.from_array(np.array([5], np.int64), "K")]
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             h.make_node("BiasGelu", ["m", "B"], ["g"], name="bias_gelu", domain="com.microsoft"),
             h.make_node("LSTM", ["g", "LW", "LR", "LB"], ["y", "", "yc"], name="lstm", hidden_size=hid),
             h.make_node("Softmax", ["y"], ["s"], name="sm", axis=-1),
             h.make_node("TopK", ["s", "K"], ["v", "i"], name="topk"),
             h.make_node("Erf", ["v"], ["out"], name="erf")]
    return _model(tmp_path, nodes, inits, [("out", T.FLOAT), ("i", T.INT64), ("yc", T.FLOAT)], "mixed")


def test_foreign_nodes_import_and_the_reference_matches_onnxruntime(tmp_path):
    path = _mixed(tmp_path)
    g = load(str(path))
    assert {n.op for n in g.nodes} >= {"LSTM", "BiasGelu"}
    assert g.domain_opsets == {"com.microsoft": 1}
    assert g.tensors["yc"].shape == (1, 16, 24)    # shapes of a foreign node's outputs are known
    feeds = random_feeds(g, seed=1)
    want = run_onnxruntime(onnx.load(str(path)), feeds)
    got = run_reference(g, feeds)
    assert_close(got, want, 1e-5, ("out", "yc"))
    assert np.array_equal(got["i"], want["i"])
    # a Graph with a contrib node goes back to ONNX with its domain imported
    proto = graph_to_onnx(g)
    assert {(o.domain, o.version) for o in proto.opset_import} == {("", 17), ("com.microsoft", 1)}


def test_plan_with_foreign_kernels_runs_and_matches_onnxruntime(tmp_path):
    from tensorplan.workflows.orchestrate import orchestrate
    plan = orchestrate(str(_mixed(tmp_path)), cost="analytical", time_limit=20, race=False)
    opaque = {n for k in plan.kernels if k.kind == "opaque" for n in k.nodes}
    assert any("lstm" in p for p in opaque) and any("bias_gelu" in p for p in opaque), opaque
    res = plan.run(repeats=3)
    assert res.ok and res.max_rel_err <= 1e-4, (res.max_rel_err, res.fallbacks)
    assert "tvm" in res.backends


def test_inspect_lists_foreign_and_truly_unsupported_nodes(tmp_path):
    from tensorplan.cli import app
    ok = _mixed(tmp_path)
    r = CliRunner().invoke(app, ["inspect", str(ok), "--check", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert not rep["unsupported"]
    assert {f["op"] for f in rep["foreign"]} == {"LSTM", "BiasGelu"}
    assert rep["check"]["passed"]
    # an op of a domain nobody implements: one clear error naming node and op at import ...
    bad = _model(tmp_path, [h.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="acme.ops")], [],
                 [("y", T.FLOAT)], "bad", domains=(("acme.ops", 1),))
    with pytest.raises(ModelImportError, match=r"'frob' \(acme.ops::Frobnicate\)"):
        load(str(bad))
    # ... and a default-domain op ONNX Runtime has no kernel for at this opset
    old = _model(tmp_path, [h.make_node("Upsample", ["x"], ["y"], name="up")], [], [("y", T.FLOAT)], "old")
    with pytest.raises(ModelImportError, match="Upsample"):
        load(str(old))


def test_multihead_attention_module_exports_and_a_failed_export_is_one_clear_error(capfd):
    from tensorplan.zoo.from_torch import from_torch

    class Att(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x):
            return self.a(x, x, x, need_weights=False)[0]

    torch.manual_seed(0)
    x = torch.randn(1, 8, 32)
    m = Att().eval()
    g = load(str(from_torch(m, (x,), name="mha")))
    with torch.no_grad():
        want = m(x).numpy()
    assert rel_error(run_reference(g, {g.inputs[0]: x.numpy()})[g.outputs[0]], want) <= 1e-5
    assert torch.backends.mha.get_fastpath_enabled()           # restored after the export

    class Eig(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.eigh(x @ x.T)[0]

    capfd.readouterr()
    with pytest.raises(ModelImportError, match="linalg_eigh.*export the model to ONNX yourself"):
        from_torch(Eig(), (torch.randn(4, 4),), name="eig")
    assert "Torch IR graph" not in "".join(capfd.readouterr())


def test_predict_names_operators_left_outside_every_kernel(tmp_path):
    from tensorplan.cdmpp.tasks import network_tasks_and_gaps
    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             h.make_node("TopK", ["m", "K"], ["v", "i"], name="topk"),
             h.make_node("Relu", ["v"], ["out"], name="relu")]
    inits = [nh.from_array(rng.standard_normal((32, 32)).astype(np.float32), "W"),
             nh.from_array(np.array([4], np.int64), "K")]
    p = _model(tmp_path, nodes, inits, [("out", T.FLOAT), ("i", T.INT64)], "topk", domains=())
    tasks, gaps = network_tasks_and_gaps(p, "topk")
    assert gaps == {"relax.topk": 1}
    assert tasks and all("topk" not in t.name for t in tasks)


@pytest.mark.parametrize("fmt", ["dynamic", "qoperator"])
def test_int8_quantized_model_plans_with_regions_and_matches_onnxruntime(tmp_path, fmt):
    """ONNX Runtime's own quantizer on a zoo model: ConvInteger/MatMulInteger/DynamicQuantizeLinear
    (dynamic) or QLinearConv/QGemm/com.microsoft QLinearGlobalAveragePool (QOperator) are foreign
    nodes; quantized convolutions still cut regions, so the plan may keep ONNX Runtime's fused session."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic,
                                          quantize_static)

    from tensorplan.zoo.specs import resolve_model_path
    from tensorplan.workflows.orchestrate import orchestrate
    from tensorplan.korch.regions import enumerate_regions
    from tensorplan.korch.fission import fission
    src = str(resolve_model_path("tiny-cnn"))
    out = tmp_path / f"q_{fmt}.onnx"
    if fmt == "dynamic":
        quantize_dynamic(src, str(out), weight_type=QuantType.QInt8)
    else:
        g0 = load(src)
        name, shape = g0.inputs[0], g0.tensors[g0.inputs[0]].shape

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.left = [{name: np.random.default_rng(k).standard_normal(shape).astype(np.float32)}
                             for k in range(4)]

            def get_next(self):
                return self.left.pop() if self.left else None
        quantize_static(src, str(out), Reader(), quant_format=QuantFormat.QOperator)
    g = load(str(out))
    ops = {n.op for n in g.nodes}
    assert ops & {"ConvInteger", "QLinearConv"}
    assert enumerate_regions(g, fission(g), 0)              # quantized convolutions cut regions
    plan = orchestrate(str(out), cost="analytical", time_limit=20, race=False)
    res = plan.run(repeats=3)
    assert res.ok and res.max_rel_err <= 1e-4, (res.max_rel_err, res.fallbacks)
