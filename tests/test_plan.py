"""Plan: orchestrate end to end (analytical costs), JSON round trip, verification catches broken
plans, buffer slots never overlap, schema versioning, the CLI."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from conftest import FixedDevice, prim_graph
from tensorplan.errors import PlanError
from tensorplan.runtime.buffers import plan_buffers
from tensorplan.runtime.plan import Plan, verify
from tensorplan.workflows.orchestrate import orchestrate
from tensorplan.runtime.plan import PlanKernel

zoo = pytest.importorskip("tensorplan.zoo")


@pytest.fixture(scope="module")
def graph():
    return zoo.load("tiny-attention")


@pytest.fixture(scope="module")
def planned(graph):
    from tensorplan.korch.fission import fission
    plan = orchestrate("tiny-attention", device=FixedDevice(), cost="analytical")
    return plan, fission(graph).graph


def test_orchestrate_produces_a_verified_fused_plan(planned):
    plan, prim = planned
    verify(plan, prim)
    assert plan.solver["status"] == "optimal"
    assert len(plan.kernels) < len(prim.nodes)  # something was fused
    assert plan.predicted_s < plan.stats["unfused_s"]
    assert plan.predicted_s == pytest.approx(plan.solver["objective_s"])
    assert set(plan.timing) >= {"load_s", "fission_s", "enumerate_s", "profile_s", "solve_s", "total_s"}
    assert {k.kind for k in plan.kernels} == {"memory", "linear"}
    covered = {x for k in plan.kernels for x in k.nodes}
    assert covered == {n.name for n in prim.nodes}


def test_plan_executes_correctly_kernel_by_kernel(planned, graph):
    """Running each kernel's subgraph in plan order reproduces the model output (real numerics)."""
    from tensorplan.ir.reference import random_feeds, rel_error, run_reference
    from tensorplan.korch.candidates import Candidate
    plan, prim = planned
    feeds = random_feeds(graph, 0)
    want = run_reference(prim, feeds)
    env = dict(feeds)
    for k in plan.ordered_kernels():
        c = Candidate(0, tuple(k.nodes), tuple(k.inputs), k.outputs[0], k.kind, "", tuple(k.outputs))
        out = run_reference(c.graph(prim), {i: env[i] for i in k.inputs})
        env.update(out)
    for o in prim.outputs:
        assert rel_error(env[o], want[o]) < 1e-6


def test_json_round_trip(planned, tmp_path):
    plan, prim = planned
    p = plan.save(tmp_path / "plan.json")
    back = Plan.load(p)
    assert back.to_dict() == json.loads(plan.to_json())
    verify(back, prim)
    d = json.loads(p.read_text())
    assert d["schema"] == "tensorplan.korch/1"
    assert d["source"]["prim_fingerprint"] == prim.fingerprint()


def test_unknown_schema_and_bad_files_raise(planned, tmp_path):
    plan, _ = planned
    d = plan.to_dict()
    d["schema"] = "tensorplan.korch/2"
    (tmp_path / "new.json").write_text(json.dumps(d))
    with pytest.raises(PlanError, match="unsupported plan schema"):
        Plan.load(tmp_path / "new.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        Plan.load(tmp_path / "bad.json")
    with pytest.raises(PlanError, match="does not exist"):
        Plan.load(tmp_path / "missing.json")


def _broken(plan, fn):
    p = copy.deepcopy(plan)
    fn(p)
    return p


def test_verify_catches_broken_plans(planned):
    plan, prim = planned
    last = plan.order[-1]
    first = plan.order[0]
    cases = {
        "never produces graph output": lambda p: (p.kernels.remove(p.kernel(last)), p.order.remove(last)),
        "runs before its input": lambda p: p.order.reverse(),
        "not a permutation": lambda p: p.order.append(first),
        "declares inputs": lambda p: p.kernel(last).inputs.append(prim.inputs[0] + "_nope"),
        "unknown primitive": lambda p: p.kernel(first).nodes.append("no-such-node"),
        "duplicate kernel ids": lambda p: setattr(p.kernels[1], "id", p.kernels[0].id),
        "a kernel listed twice": lambda p: (p.kernels.append(PlanKernel(**{**p.kernel(last).__dict__, "id": "kx"})),
                                            p.order.append("kx")),
        "slots": lambda p: p.slots.__setitem__(0, p.slots[0] + 10 ** 15),
    }
    for msg, fn in cases.items():
        with pytest.raises(PlanError, match=msg):
            verify(_broken(plan, fn), prim)


def test_verify_catches_non_convex_kernel():
    """Kernel {Relu, Add} around Exp is not convex: Relu -> Exp (outside) -> Add."""
    from onnx import helper
    n = helper.make_node
    prim = prim_graph([n("Relu", ["x"], ["a"]), n("Exp", ["a"], ["b"]), n("Add", ["a", "b"], ["y"])], {"x": [3]}, ["y"])
    relu, exp, add = (x.name for x in prim.nodes)
    bad = Plan(source={}, device={}, kernels=[
        PlanKernel("k0", [relu, add], ["x", "b"], ["y"], "memory"),
        PlanKernel("k1", [relu, exp], ["x"], ["b"], "memory")], order=["k1", "k0"])
    with pytest.raises(PlanError, match="not convex"):
        verify(bad, prim)


def test_buffer_slots_never_overlap(planned):
    plan, prim = planned
    plan_buffers(plan, prim)
    assert plan.buffers and plan.slots
    by_slot: dict[int, list] = {}
    for b in plan.buffers:
        assert plan.slots[b["slot"]] >= b["bytes"]
        assert b["first_use"] <= b["last_use"]
        by_slot.setdefault(b["slot"], []).append(b)
    for bs in by_slot.values():
        bs.sort(key=lambda b: b["first_use"])
        for a, b in zip(bs, bs[1:]):
            assert a["last_use"] < b["first_use"]
    total = sum(b["bytes"] for b in plan.buffers)
    assert sum(plan.slots) <= total
    for o in prim.outputs:
        assert next(b for b in plan.buffers if b["tensor"] == o)["last_use"] == len(plan.order)


@pytest.mark.parametrize("method", ["greedy", "none"])
def test_baseline_methods_give_valid_plans(graph, planned, method):
    plan, prim = planned
    other = orchestrate(graph, device=FixedDevice(), cost="analytical", method=method)
    verify(other, prim)
    assert other.predicted_s >= plan.predicted_s - 1e-12
    if method == "none":
        assert len(other.kernels) == len(prim.nodes)


def test_no_recompute_and_epilogue_options(graph, planned):
    plan, prim = planned
    nore = orchestrate(graph, device=FixedDevice(), cost="analytical", recompute=False)
    verify(nore, prim)
    assert nore.stats["recomputed_primitives"] == 0
    assert nore.predicted_s >= plan.predicted_s - 1e-12
    epi = orchestrate(graph, device=FixedDevice(), cost="analytical", linear_epilogue=True)
    verify(epi, prim)
    assert epi.predicted_s <= plan.predicted_s + 1e-12  # a superset of candidates never hurts


def test_custom_cost_model_is_used(graph):
    class Launchy:
        """Every kernel costs 10 us + 1 us per primitive: fusion wins big."""
        name = "launchy"

        def cost(self, prim, cand):
            return 10e-6 + 1e-6 * len(cand.nodes)
    plan = orchestrate(graph, device=FixedDevice(), cost=Launchy())
    assert plan.options["cost"] == "launchy"
    assert plan.predicted_s == pytest.approx(sum(10e-6 + 1e-6 * len(k.nodes) for k in plan.kernels))


def test_cli_orchestrate_json(tmp_path):
    from typer.testing import CliRunner
    from tensorplan.cli import app
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["orchestrate", "tiny-mlp", "--cost", "analytical", "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summ = json.loads(r.stdout)
    assert summ["kernels"] >= 1 and summ["solver"]["status"] == "optimal"
    plan = Plan.load(out)
    assert len(plan.kernels) == summ["kernels"]
    r = CliRunner().invoke(app, ["orchestrate", "--help"])
    assert r.exit_code == 0 and "--no-recompute" in r.stdout
    assert np.isfinite(plan.predicted_s)


def test_primitive_graph_is_held_or_rederived_once_and_checked(planned):
    plan, prim = planned
    assert plan.source["model"] == "tiny-attention"
    assert plan.primitive_graph() is plan.primitive_graph()     # the pipeline's graph, held
    loaded = Plan.from_dict(json.loads(plan.to_json()))          # as read from a file: no graphs
    again = loaded.primitive_graph()
    assert again.fingerprint() == prim.fingerprint() and loaded.primitive_graph() is again
    stale = Plan.from_dict(json.loads(plan.to_json()))
    stale.source["prim_fingerprint"] = "0" * 16
    with pytest.raises(PlanError, match="re-run `tensorplan orchestrate`"):
        stale.primitive_graph()
