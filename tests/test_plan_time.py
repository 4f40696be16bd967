"""`PlanTimeModel` on real plans: tiny zoo models' kernels timed, several plans of each run end to end
(interleaved), recorded in the store, fitted, and a held-out plan predicted at least as well as by the
plain sum of solo costs (today's BLP objective)."""
from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from tensorplan import devices
from tensorplan.cost.plan_time import (BACKENDS, PROGRAM_KIND, PlanTimeModel, backend_class, load_runs, plan_run,
                                       record_plan_run)
from tensorplan.errors import TensorplanError
from tensorplan.measure.store import Store
from tensorplan.workflows.orchestrate import prepare, solve_problem
from tensorplan.zoo.specs import as_graph

pytestmark = pytest.mark.xdist_group("plan_time")

SOLVE = dict(method="blp", recompute=True, cuts=True, time_limit=20.0, require_optimal=False, kernel_overhead_s=0.0)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Per model (tiny-cnn, tiny-mlp): kernels measured, 3 plans from 1 to ~a dozen kernels raced end to
    end twice in one interleaved race, each recorded with `record_plan_run` (the mean of its two
    medians). Returns (store, spec, {model: [(plan, prim, seconds)], "noise": the median spread of a
    plan and its copy})."""
    from tensorplan.cost.measured import MeasuredCost
    from tensorplan.ir.reference import random_feeds
    from tensorplan.workflows.race import race_plans
    st = Store(tmp_path_factory.mktemp("plan_time") / "store.sqlite")
    spec = devices.device("local")
    threads = devices.default_threads(spec)
    mc = MeasuredCost(store=st, device=spec, region_backends=("ort",))
    out, noise = {}, []
    for model in ("tiny-cnn", "tiny-mlp"):
        g = as_graph(model, None, 17)
        kw = dict(timing={}, threads=threads, rewrite=True, winograd=False, max_nodes=8, max_reduces=2,
                  linear_epilogue=False, region_segments=8, method="blp", progress=False, say=lambda s: None)
        with_regions = prepare(g, spec, mc, regions=True, **kw)
        fine = prepare(g, spec, mc, regions=False, **kw)
        plans = {"fewest": solve_problem(with_regions, **{**SOLVE, "kernel_overhead_s": 1.0}),
                 "blp-noreg": solve_problem(fine, **SOLVE),
                 "none": solve_problem(fine, **{**SOLVE, "method": "none"})}
        prim = fine.prim
        # every plan twice in one interleaved race: the mean of the two is what is recorded, their
        # spread is the noise floor the held-out assertion allows
        raced = {**plans, **{f"{k}#2": v.copy() for k, v in plans.items()}}
        _, med = race_plans(raced, prim, random_feeds(prim, seed=0), threads=threads, rounds=9, burst_s=0.02)
        out[model] = []
        for name, p in plans.items():
            noise.append(abs(med[name] / med[f"{name}#2"] - 1))
            t = (med[name] + med[f"{name}#2"]) / 2
            record_plan_run(st, spec, p, t, label=name, prim=prim, threads=threads)
            out[model].append((p, prim, t))
    out["noise"] = statistics.median(noise)
    yield st, spec, out
    st.close()


def test_recorded_plans_round_trip_with_their_kernels(recorded):
    st, spec, out = recorded
    runs = load_runs(st, spec)
    assert len(runs) == sum(len(v) for k, v in out.items() if k != "noise") == 6
    assert sum(1 for _ in st.measurements(kind=PROGRAM_KIND)) == 6
    by = {(r.model, r.label): r for r in runs}
    for model, items in out.items():
        if model == "noise":
            continue
        for (p, prim, med), label in zip(items, ("fewest", "blp-noreg", "none")):
            r = by[(model, label)]
            assert r.measured_s == pytest.approx(med)
            assert len(r.kernels) == len(p.kernels)
            assert r.solo_sum_s == pytest.approx(p.predicted_s)
            assert all(k.backend in BACKENDS and k.out_bytes > 0 for k in r.kernels)
            assert [k.backend for k in r.kernels] == [backend_class(k.backend, k.schedule)
                                                     for k in p.ordered_kernels()]
    # the unfused plans really have many kernels: what the dispatch terms are fitted on
    assert max(len(r.kernels) for r in runs) >= 8


def test_default_model_is_todays_objective_and_fit_learns_positive_terms(recorded):
    st, spec, out = recorded
    runs = load_runs(st, spec)
    plain = PlanTimeModel()
    for r in runs:
        assert plain.predict_run(r) == pytest.approx(r.solo_sum_s)
    fit = PlanTimeModel().fit(runs)
    assert fit.fitted_on == 6 and fit.models == ["tiny-cnn", "tiny-mlp"]
    assert fit.constant_s >= 0 and fit.handoff_s >= 0 and fit.handoff_s_per_byte >= 0
    assert all(v >= 0 for v in fit.dispatch_s.values()) and all(v > 0 for v in fit.scale.values())
    # a whole Plan and its recorded form get the same prediction
    p, prim, _ = out["tiny-cnn"][2]
    assert fit.predict(p, prim) == pytest.approx(fit.predict_run(plan_run(p, 1.0, prim=prim)))
    # per candidate (the BLP's additive form): finite, and the solo cost plus it stays positive
    from tensorplan.cost.measured import MeasuredCost
    from tensorplan.korch.candidates import enumerate_candidates
    cands = enumerate_candidates(prim)
    costs = np.array(MeasuredCost(store=st, device=spec).cost_many(prim, cands))
    ov = fit.overheads(prim, cands, costs)
    ok = np.isfinite(costs)
    assert ov.shape == costs.shape and np.all(np.isfinite(ov)) and np.all(costs[ok] + ov[ok] > 0)


def test_fitted_model_predicts_held_out_plans_no_worse_than_the_plain_sum(recorded):
    """Leave one plan out: fit on the other five (both models), predict it. Timings of 10-50 us plans
    on a shared 2-core machine move by tens of percent between runs, so the assertion is on the
    median over the six held-out plans, and the fitted model must not be worse than the plain sum by
    more than twice the median spread of a plan raced against its copy in the same run (at least 5 %); the
    measured errors are printed. The 54-plan evaluation is in research/notes/optimize-costs.md."""
    st, spec, out = recorded
    runs = load_runs(st, spec)
    err_fit, err_sum = [], []
    for j, r in enumerate(runs):
        m = PlanTimeModel().fit([x for k, x in enumerate(runs) if k != j])
        err_fit.append(abs(m.predict_run(r) / r.measured_s - 1))
        err_sum.append(abs(r.solo_sum_s / r.measured_s - 1))
    slack = max(0.05, 2 * out["noise"])
    print("held-out |rel err| fitted", [round(e, 3) for e in err_fit], "plain sum", [round(e, 3) for e in err_sum],
          "slack", round(slack, 3))
    assert statistics.median(err_fit) <= statistics.median(err_sum) + slack


def test_model_round_trips_through_the_store_and_bad_input_is_refused(recorded, tmp_path):
    st, spec, out = recorded
    fit = PlanTimeModel().fit(load_runs(st, spec))
    fit.save(st, spec)
    again = PlanTimeModel.load(st, spec)
    assert again.to_dict() == fit.to_dict()
    # no saved model and no plan in a fresh store: today's objective
    empty = PlanTimeModel.load(tmp_path / "empty.sqlite", spec)
    assert set(empty.scale.values()) == {1.0} and empty.constant_s == 0.0
    p, prim, _ = out["tiny-mlp"][0]
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(TensorplanError, match="tiny-mlp"):
            record_plan_run(st, spec, p, bad, prim=prim)
    with pytest.raises(TensorplanError, match="record_plan_run"):
        PlanTimeModel().fit([])
