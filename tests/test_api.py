"""The public API end to end on a bundled model, the way the README shows it:
`tp.load` -> `tp.orchestrate` (race included) -> `plan.save` -> `tp.load_plan` -> `plan.run`
(outputs agree with ONNX Runtime) -> `plan.export` (a file stock ONNX Runtime runs)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import tensorplan as tp
from tensorplan.ir.reference import random_feeds, rel_error
from tensorplan.ir.to_onnx import run_onnxruntime


def test_load_orchestrate_save_load_run_export(tmp_path):
    graph = tp.load("tiny-attention")
    assert isinstance(graph, tp.Graph) and graph.source == "tiny-attention"
    device = tp.device("local")
    assert isinstance(device, tp.DeviceSpec) and device.kind == "cpu"

    plan = tp.orchestrate(graph, device=device, cost="analytical", race_rounds=3, race_inductor=False)
    assert isinstance(plan, tp.Plan) and plan.source["model"] == "tiny-attention"
    assert plan.primitive_graph() is plan.primitive_graph()        # held, not derived again
    assert plan.model_graph() is graph                             # the graph it was given
    race = plan.stats["race"]                                      # raced, as the CLI does
    assert race["chosen"] in race["median_ms"] and len(plan.kernels) == race["kernels"][race["chosen"]]

    saved = plan.save(tmp_path / "attn.plan.json")
    back = tp.load_plan(saved)
    assert back.to_dict() == plan.to_dict()

    feeds = random_feeds(graph, seed=7)
    res = back.run(feeds, repeats=3)
    assert isinstance(res, tp.RunResult) and res.ok and res.kernels == len(plan.kernels)
    want = run_onnxruntime(onnx.load(str(tp.zoo.export("tiny-attention"))), feeds)
    for name, value in want.items():
        assert rel_error(np.asarray(res.outputs[name]), value) <= 1e-4

    out = back.export(tmp_path / "attn.onnx", rounds=0)
    assert isinstance(out, tp.ExportResult) and out.ok and out.source == "plan"
    got = run_onnxruntime(onnx.load(str(out.path)), feeds)
    assert max(rel_error(got[k], want[k]) for k in want) <= 1e-4


def test_device_names_and_saved_specs(tmp_path):
    h100 = tp.device("H100")
    assert tp.device(h100) is h100
    path = h100.save(tmp_path / "gpu.json")
    assert tp.device(path).to_dict() == h100.to_dict() == tp.device(str(path)).to_dict()
    with pytest.raises(tp.TensorplanError, match="unknown device"):
        tp.device("tpu-v9")
    with pytest.raises(tp.TensorplanError, match="does not exist"):
        tp.device(tmp_path / "missing.json")


def test_a_plan_for_another_device_is_not_raced_here():
    plan = tp.orchestrate("tiny-mlp", device="h100", cost="analytical")
    assert "race" not in plan.stats and plan.device["name"] == "h100-sxm"


def test_public_names_resolve():
    for name in ("load", "device", "orchestrate", "load_plan", "Plan", "from_torch", "export_onnx", "run_demo",
                 "inspect", "zoo", "Store", "DeviceSpec", "RunResult", "ExportResult"):
        assert getattr(tp, name) is not None, name
