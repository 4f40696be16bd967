"""The finalists' race (workflows/race.py): what `tensorplan orchestrate` keeps is the plan that
ran fastest end to end, preferring fewer kernels within the margin."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tensorplan.runtime.plan import load_plan
from tensorplan.workflows.orchestrate import orchestrate
from tensorplan.workflows.race import pick_finalist


@pytest.mark.parametrize("medians, kernels, margin, chosen, fastest", [
    ({"blp": 1.00, "fewest-kernels": 1.05}, {"blp": 9, "fewest-kernels": 1}, 0.10, "fewest-kernels", "blp"),
    ({"blp": 1.00, "fewest-kernels": 1.15}, {"blp": 9, "fewest-kernels": 1}, 0.10, "blp", "blp"),
    ({"blp": 1.00, "fewest-kernels": 1.05}, {"blp": 9, "fewest-kernels": 1}, 0.0, "blp", "blp"),
    ({"blp": 1.2, "fewest-kernels": 1.0, "blp-no-recompute": 1.05},
     {"blp": 9, "fewest-kernels": 3, "blp-no-recompute": 2}, 0.10, "blp-no-recompute", "fewest-kernels"),
])
def test_pick_finalist_prefers_fewer_kernels_within_the_margin(medians, kernels, margin, chosen, fastest):
    assert pick_finalist(medians, kernels, margin) == (chosen, fastest)


def test_the_race_keeps_a_measured_winner_among_distinct_finalists_that_runs_and_matches_ort(tmp_path):
    plan = orchestrate("tiny-attention", cost="analytical", race_rounds=3, race_burst_s=0.0, race_inductor=False)
    race = plan.stats["race"]
    assert set(race["median_ms"]) >= {"blp", "blp-no-recompute"}     # the BLP recomputes: raced without
    assert all(v > 0 for v in race["median_ms"].values())
    assert len(set(race["kernels"].values())) == len(race["kernels"])  # alternatives differ from the BLP
    assert race["chosen"] == pick_finalist(race["median_ms"], race["kernels"], race["margin"])[0]
    assert len(plan.kernels) == race["kernels"][race["chosen"]]
    assert plan.timing["race_s"] > 0 and plan.timing["total_s"] >= plan.timing["race_s"]
    loaded = load_plan(plan.save(tmp_path / "p.json"))
    assert loaded.stats["race"]["chosen"] == race["chosen"]
    res = loaded.run(repeats=3)
    assert res.ok and res.kernels == len(plan.kernels) and not res.fallbacks
    norec = orchestrate("tiny-attention", cost="analytical", recompute=False, race_rounds=3, race_burst_s=0.0,
                        race_inductor=False)
    assert set(norec.stats.get("race", {}).get("median_ms", {})) <= {"blp", "fewest-kernels"}


def test_without_race_the_plan_is_the_blps():
    plan = orchestrate("tiny-attention", cost="analytical", race=False)
    assert "race" not in plan.stats and "race_s" not in plan.timing


def test_cli_orchestrate_reports_the_race(tmp_path):
    from typer.testing import CliRunner
    from tensorplan.cli import app
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["orchestrate", "tiny-attention", "--cost", "analytical", "--race-rounds", "3",
                                 "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summ = json.loads(r.stdout)
    assert summ["race"]["chosen"] in summ["race"]["median_ms"]
    assert json.loads(out.read_text())["stats"]["race"] == summ["race"]
    r = CliRunner().invoke(app, ["orchestrate", "tiny-attention", "--cost", "analytical", "--no-race", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["race"] is None
    assert np.isfinite(summ["predicted_s"])


def test_inductor_whole_graph_finalist_runs_and_matches_ort(tmp_path):
    """The whole rewritten graph as one Inductor program: a verified one-kernel plan that
    `plan.run` executes through the torch runner, joined to the race as 'inductor'."""
    from tensorplan.workflows.race import whole_graph_inductor
    plan = orchestrate("tiny-cnn", cost="analytical", race=False)
    whole = whole_graph_inductor(plan)
    assert len(whole.kernels) == 1 and whole.kernels[0].backend == "torch-inductor"
    assert whole.predicted_s > 0
    whole.save(tmp_path / "w.json")
    res = load_plan(tmp_path / "w.json").run(repeats=5)
    assert res.ok and res.backends == {"torch-inductor": 1}
    kept = orchestrate("tiny-cnn", cost="analytical", race_rounds=3)
    race = kept.stats["race"]
    assert "inductor" in race["median_ms"] and race["chosen"] in race["median_ms"]


class _RegionsWin:
    """Analytical costs, with every ONNX Runtime region nearly free: the BLP's plan is one region
    kernel over the whole model (the costs are contrived; what runs is real)."""
    name, supports_regions = "regions-win", True

    def __init__(self):
        from tensorplan.cost import AnalyticalCost
        self.base = AnalyticalCost("local")

    def cost(self, prim, cand):
        return 1e-7 if cand.kind == "region" else self.base.cost(prim, cand)


def test_one_session_finalist_is_raced_on_the_other_backend_and_both_run():
    """A plan that is one region kernel gets the same operators on the other region backend (and
    ONNX Runtime at the other thread count); every variant runs and matches ONNX Runtime. A plan of
    several kernels gets no variant."""
    from tensorplan.kernels.openvino import available
    from tensorplan.workflows.race import session_backend_variants, session_thread_variants
    one = orchestrate("tiny-cnn", cost=_RegionsWin(), race=False)
    assert [(k.kind, k.backend) for k in one.kernels] == [("region", "ort")]
    cands = session_thread_variants(session_backend_variants({"blp": one}), threads=2)
    expected = {"blp", "blp@1t"} | ({"blp@openvino"} if available() else set())
    assert set(cands) == expected
    for name, p in cands.items():
        res = p.run(repeats=2)
        assert res.ok and not res.fallbacks, (name, res.fallbacks)
        assert res.backends == {p.kernels[0].backend: 1}
    if available():
        ov = cands["blp@openvino"]
        assert ov.kernels[0].schedule["operators"] == one.kernels[0].schedule["operators"]
        assert "spinning" not in ov.kernels[0].schedule
        back = session_backend_variants({"ov": ov})["ov@ort"]     # and back: one spinning session
        assert back.kernels[0].backend == "ort" and back.kernels[0].schedule["spinning"] is True
    many = orchestrate("tiny-cnn", cost="analytical", race=False)
    assert len(many.kernels) > 1 and set(session_backend_variants({"blp": many})) == {"blp"}
