"""BLP: optimal against brute force (all subsets) on small instances, recompute vs not, cuts do not
change the optimum, greedy/no-fusion baselines are valid and never beat the BLP, failures raise."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from onnx import helper

from conftest import FixedDevice, prim_graph
from tensorplan.errors import PlanError
from tensorplan.korch.fission import fission
from tensorplan.korch.blp import check_selection, greedy_fusion, no_fusion, recomputed_primitives, solve_blp
from tensorplan.korch.candidates import enumerate_candidates


def diamond():
    """a=Relu(x); b=Exp(a); c=Neg(a); d=Add(b,c); e=MatMul(d,W); y=Tanh(e)+a-ish: 7 primitives."""
    n = helper.make_node
    W = np.eye(4, dtype=np.float32)
    return prim_graph([n("Relu", ["x"], ["a"]), n("Exp", ["a"], ["b"]), n("Neg", ["a"], ["c"]),
                  n("Add", ["b", "c"], ["d"]), n("MatMul", ["d", "W"], ["e"]), n("Tanh", ["e"], ["f"]),
                  n("Mul", ["f", "c"], ["y"])], {"x": (2, 4)}, ["y"], {"W": W})


def two_outputs():
    n = helper.make_node
    return prim_graph([n("Relu", ["x"], ["a"]), n("Exp", ["a"], ["b"]), n("Neg", ["a"], ["c"])],
                 {"x": (2, 4)}, ["b", "c"])


def feasible(prim, cands, chosen, recompute=True) -> bool:
    """Independent check of the BLP constraints (not the code under test)."""
    avail = set(prim.inputs) | set(prim.constants())
    produced = avail | {o for i in chosen for o in cands[i].outputs}
    if any(o not in produced for o in prim.outputs):
        return False
    if any(t not in produced for i in chosen for t in cands[i].inputs):
        return False
    if not recompute:
        seen = [x for i in chosen for x in cands[i].nodes]
        if len(seen) != len(set(seen)):
            return False
    return True


def brute_force(prim, cands, costs, recompute=True) -> float:
    best = math.inf
    ids = list(range(len(cands)))
    for r in range(1, len(ids) + 1):
        for combo in itertools.combinations(ids, r):
            c = sum(costs[i] for i in combo)
            if c < best and feasible(prim, cands, combo, recompute):
                best = c
    return best


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("recompute", [True, False])
def test_blp_matches_brute_force(seed, recompute):
    prim = diamond()
    cands = enumerate_candidates(prim, max_nodes=3)
    assert len(cands) <= 18  # brute force stays cheap
    rng = np.random.default_rng(seed)
    costs = np.array([1.0 + rng.random() * len(c.nodes) * 0.8 for c in cands]) * 1e-5
    want = brute_force(prim, cands, costs, recompute)
    for cuts in (True, False):
        sel = solve_blp(prim, cands, costs, recompute=recompute, cuts=cuts)
        assert sel.status == "optimal"
        assert sel.objective_s == pytest.approx(want, rel=1e-9)
        assert feasible(prim, cands, sel.chosen, recompute)


def test_recomputation_is_used_when_it_pays():
    prim = two_outputs()
    cands = enumerate_candidates(prim)
    # launch-dominated costs: each kernel 10 us + 1 us per primitive
    costs = np.array([10e-6 + 1e-6 * len(c.nodes) for c in cands])
    sel = solve_blp(prim, cands, costs)
    assert sel.objective_s == pytest.approx(24e-6)  # {Relu,Exp} + {Relu,Neg}: Relu computed twice
    assert recomputed_primitives(cands, sel.chosen) == 1
    nore = solve_blp(prim, cands, costs, recompute=False)
    assert nore.objective_s == pytest.approx(brute_force(prim, cands, costs, recompute=False))
    assert nore.objective_s > sel.objective_s and recomputed_primitives(cands, nore.chosen) == 0


def test_baselines_are_valid_and_never_beat_the_blp():
    prim = diamond()
    cands = enumerate_candidates(prim, max_nodes=8)
    costs = np.array([5e-6 + 1e-6 * len(c.nodes) for c in cands])
    opt = solve_blp(prim, cands, costs)
    gr = greedy_fusion(prim, cands, costs)
    nf = no_fusion(prim, cands, costs)
    for s in (gr, nf):
        check_selection(prim, cands, s.chosen)
        assert feasible(prim, cands, [c for c in s.chosen], recompute=False)
        assert s.objective_s >= opt.objective_s - 1e-12
    assert nf.objective_s == pytest.approx(sum(costs[c.id] for c in cands if len(c.nodes) == 1))
    assert gr.objective_s < nf.objective_s  # with launch costs, greedy fuses something
    assert len(nf.chosen) == len(prim.nodes)


def test_zoo_instance_cuts_keep_the_optimum():
    zoo = pytest.importorskip("tensorplan.zoo")
    from tensorplan.cost import AnalyticalCost, cost_many
    prim = fission(zoo.load("tiny-attention")).graph
    cands = enumerate_candidates(prim, max_nodes=8)
    costs = cost_many(AnalyticalCost(FixedDevice()), prim, cands)
    a = solve_blp(prim, cands, costs, cuts=True)
    b = solve_blp(prim, cands, costs, cuts=False)
    assert a.objective_s == pytest.approx(b.objective_s, rel=1e-6)
    assert a.constraints > b.constraints
    g = greedy_fusion(prim, cands, costs)
    assert g.objective_s >= a.objective_s - 1e-12


def test_unbuildable_output_raises_plan_error():
    prim = two_outputs()
    cands = enumerate_candidates(prim)
    costs = np.array([math.inf if prim.outputs[0] in c.outputs else 1e-5 for c in cands])
    with pytest.raises(PlanError, match="cannot be produced"):
        solve_blp(prim, cands, costs)


def test_infinite_costs_are_avoided():
    prim = diamond()
    cands = enumerate_candidates(prim)
    costs = np.array([1e-5 * len(c.nodes) ** 0.5 for c in cands])
    big = max(cands, key=lambda c: len(c.nodes) if c.kind == "memory" else 0)
    costs[big.id] = math.inf
    sel = solve_blp(prim, cands, costs)
    assert big.id not in sel.chosen


def test_check_selection_rejects_broken_selections():
    prim = diamond()
    cands = enumerate_candidates(prim)
    costs = np.array([1e-5] * len(cands))
    sel = solve_blp(prim, cands, costs)
    order = check_selection(prim, cands, sel.chosen)
    assert sorted(order) == sorted(sel.chosen)
    sink = next(i for i in sel.chosen if prim.outputs[0] in cands[i].outputs)
    with pytest.raises(PlanError, match="graph output"):
        check_selection(prim, cands, [i for i in sel.chosen if i != sink])
    feeder = next(i for i in sel.chosen if i != sink)
    with pytest.raises(PlanError, match="no chosen kernel produces"):
        check_selection(prim, cands, [i for i in sel.chosen if i != feeder])


def test_time_out_without_incumbent_falls_back_to_a_verified_greedy_plan(monkeypatch):
    """HiGHS can stop at its time limit with no solution at all (seen on yolov4 with a size cap
    of 16); the planner must still return a feasible plan and say how it got it."""
    import scipy.optimize
    from scipy.optimize import OptimizeResult

    import tensorplan.korch.blp as blp

    prim = diamond()
    cands = enumerate_candidates(prim, max_nodes=4)
    costs = [1.0 + 0.1 * len(c.nodes) for c in cands]
    monkeypatch.setattr(scipy.optimize, "milp", lambda *a, **k: OptimizeResult(
        x=None, status=1, message="Time limit reached", mip_gap=None))
    sel = blp.solve_blp(prim, cands, costs, time_limit=0.01)
    assert sel.status == "time_limit_greedy_fallback"
    assert "no BLP incumbent" in sel.options["fallback"]
    by_id = {c.id: k for k, c in enumerate(cands)}
    assert feasible(prim, cands, [by_id[i] for i in sel.chosen])
    with pytest.raises(PlanError, match="without a solution"):
        blp.solve_blp(prim, cands, costs, time_limit=0.01, require_optimal=True)


def test_time_out_keeps_greedy_when_it_beats_the_incumbent(monkeypatch):
    """A timed-out BLP incumbent can be worse than greedy fusion (YOLOv4 at size cap 16 in
    bench/korch_candidates.py); the solver must return the cheaper of the two, verified."""
    import scipy.optimize
    from scipy.optimize import OptimizeResult

    import tensorplan.korch.blp as blp

    prim = diamond()
    cands = enumerate_candidates(prim, max_nodes=4)
    costs = [1.0 + 0.1 * len(c.nodes) for c in cands]
    # every candidate chosen: feasible (singletons produce everything) but far from optimal
    monkeypatch.setattr(scipy.optimize, "milp", lambda c, **k: OptimizeResult(
        x=np.ones(len(c)), status=1, message="Time limit reached", mip_gap=0.5, mip_dual_bound=0.0))
    sel = blp.solve_blp(prim, cands, costs, time_limit=0.01)
    gr = greedy_fusion(prim, cands, costs)
    assert sel.status == "time_limit_greedy_better"
    assert sel.objective_s == pytest.approx(gr.objective_s) and sel.objective_s < sum(costs)
    assert "beat the BLP incumbent" in sel.options["fallback"]
    check_selection(prim, cands, sel.chosen)
    by_id = {c.id: k for k, c in enumerate(cands)}
    assert feasible(prim, cands, [by_id[i] for i in sel.chosen])
