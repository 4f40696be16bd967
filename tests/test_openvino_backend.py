"""OpenVINO as a region backend (kernels/openvino.py): a region of original operators compiled
by OpenVINO computes what ONNX Runtime computes, in place on the plan's buffers, and the measured
cost times it next to ONNX Runtime so the BLP can pick per region."""
from __future__ import annotations

import pytest

from tensorplan.korch.fission import fission
from tensorplan.zoo.specs import load
from tensorplan.ir.reference import rel_error
from tensorplan.korch.candidates import enumerate_candidates
from tensorplan.kernels.vendor import make_kernel, random_inputs
from tensorplan.kernels.openvino import available

pytestmark = pytest.mark.skipif(not available(), reason="openvino not installed")


def _whole_region(model):
    from tensorplan.korch.regions import enumerate_regions
    g = load(model)
    fr = fission(g)
    regs = enumerate_regions(g, fr, 0)
    whole = max(regs, key=lambda c: len(c.nodes))
    return g, fr, whole


@pytest.mark.parametrize("model", ["tiny-cnn", "tiny-attention"])
def test_openvino_region_matches_onnxruntime_and_writes_in_place(model):
    g, fr, reg = _whole_region(model)
    sub = reg.graph(fr.graph)                 # the region's original operators, as MeasuredCost times them
    ov = make_kernel(sub, list(reg.outputs), "openvino", threads=2)
    ort = make_kernel(sub, list(reg.outputs), "ort", threads=2)
    ins = random_inputs(sub, list(ov.input_names))
    out_ov, out_ort = ov.alloc_outputs(), ort.alloc_outputs()
    ptrs = [t.data_ptr() for t in out_ov]
    call = ov.bind(ins, out_ov)
    call()
    ort.bind(ins, out_ort)()
    assert [t.data_ptr() for t in out_ov] == ptrs            # written in place, no copy
    for a, b in zip(out_ov, out_ort):
        assert rel_error(a.numpy(), b.numpy()) <= 1e-4
    ins[0].mul_(0.5)                                          # the bound buffers are shared, not copied
    call()
    ort.bind(ins, out_ort)()
    assert all(rel_error(a.numpy(), b.numpy()) <= 1e-4 for a, b in zip(out_ov, out_ort))


def test_measured_cost_times_openvino_for_regions_and_the_plan_runs(store):
    from tensorplan.cost.measured import MeasuredCost
    from tensorplan.workflows.orchestrate import orchestrate
    g, fr, reg = _whole_region("tiny-cnn")
    cm = MeasuredCost(store=store, device="local", threads=2, budget_s=0.005)
    assert "openvino" in cm.region_backends and "openvino" in cm._backends_for(reg)
    assert "openvino" not in cm._backends_for(enumerate_candidates(fr.graph, max_nodes=2)[0])
    cost = cm.cost(fr.graph, reg)
    rec = cm.store.get_measurement(cm._prog_key(fr.graph, reg), cm.dev_key, cm.tag)
    assert cost > 0 and "openvino" in rec["extra"]["times"]
    ort_only = MeasuredCost(store=cm.store, device="local", threads=2, budget_s=0.005, region_backends=("ort",))
    assert ort_only._prog_key(fr.graph, reg) != cm._prog_key(fr.graph, reg)   # no stale ORT-only cost reused
    # a plan with an OpenVINO region (forced) runs and matches ONNX Runtime on the whole model
    plan = orchestrate("tiny-cnn", cost=cm, time_limit=20, race=False)
    for k in plan.kernels:
        if k.kind == "region":
            k.backend, k.schedule = "openvino", {"operators": k.schedule["operators"]}
    res = plan.run(repeats=3)
    assert res.ok and res.backends.get("openvino", 0) >= 1, (res.backends, res.fallbacks)
