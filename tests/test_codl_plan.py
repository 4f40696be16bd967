"""Planner: per-op grid, greedy chains vs exhaustive oracle and DP, on real zoo graphs."""
import pytest

from tensorplan.codl.partition import CoexecCost, chain_links, extract_ops, plan_ops, regret
from tensorplan.codl.predictor import OpShape
from tensorplan.codl.simulate import calibrate, sharing_model


@pytest.fixture(scope="module")
def cost():
    m = calibrate("sd855")
    return CoexecCost(m, sharing_model(m.prof), "cpu", "gpu", 4, "codl")


def _small_chain():
    shapes, h, c = [], 64, 16
    for i in range(9):
        shapes.append(OpShape("conv", h, h, c, 32, 3, 1, 1, 1, 1, 1))
        c = 32
        if i % 3 == 2:
            shapes.append(OpShape("pool", h, h, c, c, 2, 2))
            h //= 2
    return shapes


def test_greedy_vs_exhaustive_small_graph(cost):
    shapes = _small_chain()
    assert len(shapes) == 12
    ex = plan_ops(shapes, cost, None, "exhaustive")
    dp = plan_ops(shapes, cost, None, "dp")
    gr = plan_ops(shapes, cost, None, "greedy")
    none = plan_ops(shapes, cost, None, "none")
    assert abs(ex.total - dp.total) < 1e-12             # DP is exact
    assert ex.total <= gr.total + 1e-12 <= none.total + 1e-12
    assert 0.0 <= regret(gr, ex) < 0.25
    assert ex.chained_ops() > 0                          # chains pay off with 1 ms sync per op


def test_sync_cost_drives_chaining(cost):
    shapes = _small_chain()
    cheap = CoexecCost(cost.predictor, type(cost.sharing)(dict(cost.sharing.terms), 0.0), "cpu", "gpu", 4, "codl")
    assert plan_ops(shapes, cost, None, "dp").chained_ops() >= plan_ops(shapes, cheap, None, "dp").chained_ops()


def test_chain_cost_charges_head_and_tail(cost):
    a = OpShape("conv", 56, 56, 32, 32, 3, 1, 1, 1, 1, 1)
    b1, b2 = cost.op_cost(a, "H", 0.5), cost.chain_cost([a, a], 0.5)
    assert b2.sync == b1.sync and b2.share_in == pytest.approx(b1.share_in, rel=0.1)
    assert b2.total < 2 * b1.total                      # one sharing round instead of two


def test_plan_real_graph_yolov2(cost):
    from tensorplan.zoo.specs import load_model

    g = load_model("yolov2")
    ops = extract_ops(g)
    links = chain_links(g, ops)
    assert len(ops) == 28 and sum(links) >= 20
    gr = plan_ops([o.shape for o in ops], cost, links, "greedy")
    dp = plan_ops([o.shape for o in ops], cost, links, "dp")
    cpu = plan_ops([o.shape for o in ops], cost, links, "cpu")
    gpu = plan_ops([o.shape for o in ops], cost, links, "gpu")
    assert dp.total <= gr.total + 1e-12 < min(cpu.total, gpu.total)
    d = gr.to_dict()
    assert d["n_ops"] == 28 and set(d["dim_share"]) == {"H", "OC"}
