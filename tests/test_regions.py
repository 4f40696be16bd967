"""ONNX Runtime region candidates: intervals are convex and well formed, a region's original
operators compute exactly what its primitives compute (real ORT vs the reference executor),
the BLP picks regions when they are cheaper, adjacent regions merge into one session, and the
merged plan runs and matches ONNX Runtime on the whole model."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import FixedDevice, assert_close
from tensorplan.cost import AnalyticalCost
from tensorplan.errors import PlanError
from tensorplan.korch.fission import category, fission
from tensorplan.ir.reference import run_reference
from tensorplan.ir.to_onnx import run_onnxruntime
from tensorplan.workflows.orchestrate import orchestrate
from tensorplan.runtime.plan import verify
from tensorplan.runtime.plan import _check_convex, PlanKernel
from tensorplan.korch.regions import NORM_OPS, enumerate_regions, intervals, segments

zoo = pytest.importorskip("tensorplan.zoo")

MODELS = ["tiny-cnn", "tiny-attention", "tiny-convnext-ish"]


class RegionFriendlyCost:
    """Roofline costs, with every region priced at a fifth of the sum of its primitives' solo
    costs, so the BLP must choose regions (the costs are contrived; what runs is real)."""
    name = "region-friendly"
    supports_regions = True

    def __init__(self):
        self.base = AnalyticalCost(FixedDevice())

    def cost(self, prim, cand):
        if cand.kind != "region":
            return self.base.cost(prim, cand)
        from tensorplan.korch.candidates import Candidate
        solo = 0.0
        for x in cand.nodes:
            n = next(n for n in prim.nodes if n.name == x)
            one = Candidate(-1, (x,), tuple(i for i in n.inputs if i and i not in prim.constants()),
                            n.outputs[0], "memory", "")
            solo += self.base.cost(prim, one)
        return solo / 5


def test_intervals_cover_runs_dyadic_blocks_and_the_whole_model():
    iv = intervals(20, max_segments=3)
    assert (0, 20) in iv and (16, 20) in iv and (8, 16) in iv and (5, 8) in iv
    assert (5, 9) not in iv  # length 4 only where dyadic-aligned
    assert all(0 <= a < b <= 20 for a, b in iv)
    assert len(iv) == len(set(iv))


@pytest.mark.parametrize("model", MODELS)
def test_segments_start_at_linear_or_norm_operators_and_partition_the_graph(model):
    g = zoo.load(model)
    segs = segments(g)
    assert [x for s in segs for x in s] == [n.name for n in g.nodes]
    ops = {n.name: n.op for n in g.nodes}
    for s in segs:
        assert sum(category(ops[x]) == "linear" for x in s) <= 1
    for s in segs[1:]:
        assert category(ops[s[0]]) == "linear" or ops[s[0]] in NORM_OPS
    if model == "tiny-attention":  # the softmax after the score MatMul starts its own segment
        assert any(ops[s[0]] == "Softmax" for s in segs)


@pytest.mark.parametrize("model", MODELS)
def test_region_candidates_are_convex_and_match_their_primitives(model):
    g = zoo.load(model)
    fr = fission(g)
    prim = fr.graph
    regs = enumerate_regions(g, fr, start_id=1000)
    assert regs, "every tiny model has at least one region with a linear operator"
    assert [r.id for r in regs] == list(range(1000, 1000 + len(regs)))
    pos = {n.name: k for k, n in enumerate(prim.nodes)}
    for r in regs:
        assert r.kind == "region" and r.source is not None and r.span is not None
        k = PlanKernel(id="r", nodes=list(r.nodes), inputs=list(r.inputs), outputs=list(r.outputs), kind="region")
        _check_convex(prim, k, pos)  # raises if a path leaves and re-enters
        src = r.graph(prim)
        assert sorted(src.inputs) == sorted(r.inputs) and list(src.outputs) == list(r.outputs)
        # the original operators compute what the primitives compute, on the same inputs
        sub = prim.subgraph(r.nodes)
        rng = np.random.default_rng(0)
        ins = {i: rng.standard_normal(prim.tensors[i].shape).astype(prim.tensors[i].dtype) for i in r.inputs}
        got = run_onnxruntime(src, ins, threads=1)
        want = run_reference(sub, ins)
        assert_close(got, want, 1e-4, r.outputs, what=f"{model} {r.span}")


def test_analytical_cost_leaves_regions_out():
    g = zoo.load("tiny-cnn")
    fr = fission(g)
    reg = enumerate_regions(g, fr, 0)[0]
    assert AnalyticalCost(FixedDevice()).cost(fr.graph, reg) == float("inf")
    plan = orchestrate("tiny-cnn", device=FixedDevice(), cost="analytical")
    assert plan.options["regions"] is False and all(k.kind != "region" for k in plan.kernels)


@pytest.mark.parametrize("model", ["tiny-cnn", "tiny-attention"])
def test_cheap_regions_are_chosen_merged_and_run_correctly(model):
    plan = orchestrate(model, device=FixedDevice(), cost=RegionFriendlyCost())
    prim = plan.primitive_graph()
    verify(plan, prim)
    reg = plan.stats["ort_regions"]
    assert reg["candidates"] > 0 and reg["selected"] >= 1
    regions = [k for k in plan.kernels if k.kind == "region"]
    assert len(regions) == reg["kernels_after_merge"] <= reg["selected"]
    assert all(k.backend == "ort" and k.schedule["operators"] for k in regions)
    # no two region kernels that run back to back span adjacent intervals (they would be merged)
    ordered = plan.ordered_kernels()
    for a, b in zip(ordered, ordered[1:]):
        if a.kind == b.kind == "region":
            assert a.schedule["span"][1] != b.schedule["span"][0]
    res = plan.run(repeats=3)
    assert res.ok, res.errors
    assert res.backends.get("ort", 0) >= len(regions)


def test_without_regions_option_the_plan_has_none():
    plan = orchestrate("tiny-cnn", device=FixedDevice(), cost=RegionFriendlyCost(), regions=False)
    assert plan.stats["ort_regions"]["candidates"] == 0
    assert all(k.kind != "region" for k in plan.kernels)


def test_kernel_overhead_favours_fewer_kernels():
    lo = orchestrate("tiny-attention", device=FixedDevice(), cost="analytical")
    hi = orchestrate("tiny-attention", device=FixedDevice(), cost="analytical", kernel_overhead_s=1e-3)
    assert len(hi.kernels) <= len(lo.kernels)
    assert hi.solver["objective_s"] == pytest.approx(hi.predicted_s + 1e-3 * len(hi.kernels), rel=1e-6)


def test_cuts_keep_the_optimum_with_multi_output_regions():
    a = orchestrate("tiny-attention", device=FixedDevice(), cost=RegionFriendlyCost(), cuts=True)
    b = orchestrate("tiny-attention", device=FixedDevice(), cost=RegionFriendlyCost(), cuts=False)
    assert a.solver["objective_s"] == pytest.approx(b.solver["objective_s"], rel=1e-6)


def test_region_kernel_without_operators_is_a_clear_error():
    from tensorplan.runtime.executor import kernel_graph
    g = zoo.load("tiny-cnn")
    prim = fission(g).graph
    k = PlanKernel(id="k0", nodes=[prim.nodes[0].name], inputs=[], outputs=[], kind="region", backend="ort")
    with pytest.raises(PlanError, match="k0"):
        kernel_graph(prim, k, g)


def test_race_plans_times_each_plan_end_to_end_and_names_the_faster():
    from tensorplan.ir.reference import random_feeds
    from tensorplan.workflows.race import race_plans
    fused = orchestrate("tiny-cnn", device=FixedDevice(), cost="analytical")
    unfused = orchestrate("tiny-cnn", device=FixedDevice(), cost="analytical", method="none")
    prim = fused.primitive_graph()
    assert len(unfused.kernels) > len(fused.kernels)
    win, med = race_plans({"fused": fused, "unfused": unfused}, prim, random_feeds(prim, seed=0), rounds=3,
                          pause_s=0.0)
    assert set(med) == {"fused", "unfused"} and all(v > 0 for v in med.values())
    assert win == min(med, key=med.get)
