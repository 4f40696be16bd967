"""The variant harness (`cdmpp_variants/harness.py`): the research model names on top of the
product's evaluation, its extra figures, the paper's goals, and the experiment runners."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from tensorplan.errors import TensorplanError  # noqa: E402
from tensorplan.cdmpp.arrays import as_arrays  # noqa: E402
from tensorplan.cdmpp.base import load_estimator  # noqa: E402
from tensorplan.cdmpp.ensemble import Ensemble  # noqa: E402
from tensorplan.cdmpp.evaluate import EvalData, _network_errors, render_markdown  # noqa: E402

from cdmpp_variants.harness import GOALS, VariantHarness, evaluate_variants, make_model  # noqa: E402
from cdmpp_variants.totals import add_expected_totals  # noqa: E402
from test_evaluate import _FromLabels, _two_networks  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_variant_evaluation_adds_floors_totals_ensembles_and_goals(cdmpp_small):
    """The product's splits and metrics, plus the oracle-scale floors, each network's expected total,
    an ensemble of CDMPPs fine-tuned (not refitted) on the device split, and the goal checks."""
    res = evaluate_variants(cdmpp_small["ds"], models=("cdmpp", "xgboost", "roofline", "cdmpp-ens2"), quick=True,
                            fewshot_tasks=2, fewshot_per_task=4, max_cov=None)
    for split in ("network", "sample"):
        for name, m in res["splits"][split]["models"].items():
            fl = m["scale_floors"]      # an oracle scale per task can only remove error
            assert fl["per_task_factor_mape_pct"] <= fl["one_factor_mape_pct"] <= m["mape_pct"] + 1e-9
            assert m["total_factor"] > 0        # each network's total also times the factor
            assert all("expected_ms" in e for pick in m["network_latency"].values() for k, e in pick.items()
                       if not k.startswith("_"))
    dev = res["splits"]["device"]["models"]
    assert set(dev) == {"cdmpp", "xgboost", "roofline", "cdmpp-ens2"}
    assert dev["cdmpp-ens2"]["fewshot_kmeans"]["adapt_time_s"] < dev["cdmpp-ens2"]["train_time_s"]
    s = res["summary"]
    assert s["goals"] == GOALS and isinstance(s["network_goal_met"], bool) and isinstance(s["device_goal_met"], bool)
    assert "network_beats_xgboost" in s
    json.dumps(res)
    md = render_markdown(res, VariantHarness())
    assert "**Goals** (CDMPP paper:" in md and f"{GOALS['network_mape_pct']}% cross-model" in md
    assert "**Summary**" in render_markdown(res)      # the product's line when rendered without the harness


def test_expected_totals_scale_the_predicted_sums(cdmpp_small):
    """A model predicting half of every latency, with its measured factor 2: the expected totals are exact."""
    data = EvalData(_two_networks(cdmpp_small["ds"]))
    half = _network_errors(_FromLabels(lambda y, t: y / 2), data, None, None)
    assert "_mean_expected_ape_pct" not in half["first"]     # no factor, no expected totals
    add_expected_totals(half, 2.0)
    for pick in half:
        assert half[pick]["_mean_ape_pct"] == pytest.approx(50)
        assert half[pick]["_mean_expected_ape_pct"] == pytest.approx(0, abs=1e-9)
        assert all(e["expected_ms"] == pytest.approx(e["measured_ms"]) for k, e in half[pick].items()
                   if not k.startswith("_"))


def test_harness_names_ensembles():
    """NAME-ens / NAME-ensK: K seeded members, bagged for the trees."""
    ens = make_model("xgboost-ens", quick=True, seed=2)
    assert isinstance(ens, Ensemble) and len(ens.members) == 3
    assert [(m.seed, m.subsample) for m in ens.members] == [(2, 0.7), (3, 0.7), (4, 0.7)]
    hier = make_model("xgboost-hier-ens2", quick=True)
    assert [(m.base, m.parts, m.subsample) for m in hier.members] == [("hierarchy", True, 0.7)] * 2
    ens5 = make_model("cdmpp-nocmd-ens5", quick=True)
    assert len(ens5.members) == 5 and all(m.cmd_alpha == 0.0 for m in ens5.members)
    with pytest.raises(TensorplanError, match="unknown model"):
        make_model("nothing-ens", quick=True)


def test_mixed_ensemble_pools_two_models_and_survives_a_save(cdmpp_small, tmp_path):
    """A+B: the members of A and B pooled in one ensemble, saved and loaded like any model."""
    tr, te = as_arrays(cdmpp_small["train"]), as_arrays(cdmpp_small["test"])
    mix = make_model("cdmpp-nocmd-ens2+xgboost-ens", quick=True)
    assert [type(m).__name__ for m in mix.members] == ["CDMPP"] * 2 + ["TenSetXGB"] * 3
    mix.fit(tr)
    logs = np.stack([np.log(m.predict(te)) for m in mix.members])
    np.testing.assert_allclose(mix.predict(te), np.exp(logs.mean(0) - logs.var(0, ddof=1)), rtol=1e-5)
    back = load_estimator(mix.save(tmp_path / "mix.pt"))
    assert [type(m).__name__ for m in back.members] == [type(m).__name__ for m in mix.members]
    np.testing.assert_allclose(back.predict(te), mix.predict(te), rtol=1e-5)
    with pytest.raises(TensorplanError, match="at least 2 members"):
        make_model("roofline+", quick=True)


def test_every_product_name_is_a_variant_name_too():
    """The variant harness extends the product's table: the same names build the same models."""
    from tensorplan.cdmpp.evaluate import Harness

    assert set(Harness().models(quick=True)) < set(VariantHarness().models(quick=True))
    ours, theirs = make_model("xgboost-hier", quick=True), Harness().make_model("xgboost-hier", quick=True)
    assert ours.get_params() == theirs.get_params()
    with pytest.raises(TensorplanError, match="unknown model"):
        make_model("nothing-like-it", quick=True)


def test_leave_one_network_out_resumes_and_summarises(cdmpp_small, tmp_path):
    """research/cdmpp/cdmpp_by_network.py: one JSONL line per (network, model) fold, a rerun adds none,
    and the summary pools the folds by test records."""
    import cdmpp_by_network as lono

    ds = cdmpp_small["ds"]
    out = tmp_path / "lono.jsonl"
    args = (["roofline"], 0, 1.0, ["local-1t", "local-2t"], "0/1", [], out)
    lono.run(*args, data=ds, quick=True)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows and all(r["n_test"] > 0 and r["metrics"]["mape_pct"] > 0 for r in rows)
    assert len({r["network"] for r in rows}) == len(rows)       # one fold per held-out network
    lono.run(*args, data=ds, quick=True)                        # resumes: nothing left to do
    assert len(out.read_text().splitlines()) == len(rows)
    doc = lono.summary(out, 0, 1.0, ["local-1t", "local-2t"])
    w = np.array([r["n_test"] for r in rows], float)
    pooled = float((w * np.array([r["metrics"]["mape_pct"] for r in rows])).sum() / w.sum())
    assert doc["pooled"]["roofline"]["folds"] == len(rows)
    assert abs(doc["pooled"]["roofline"]["pooled_mape_pct"] - pooled) < 1e-9
    # the oracle scale per task and domain leaves only within-task error, never more than the plain MAPE
    assert doc["pooled"]["roofline"]["pooled_per_task_scale_floor_pct"] <= pooled + 1e-9
    assert out.with_suffix(".png").stat().st_size > 0


def test_experiment_runner_lists_existing_scripts():
    """research/run_experiments.py: every step names a script that exists, none of them in bench/
    but the feature-speed probe, and `make bench`'s runner lists none of these steps."""
    out = subprocess.run([sys.executable, "research/run_experiments.py", "--list"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) > 50
    scripts = {w for ln in lines for w in ln.split() if w.endswith(".py")}
    assert scripts and all((ROOT / w).exists() for w in scripts), sorted(w for w in scripts if not (ROOT / w).exists())
    assert {w for w in scripts if w.startswith("bench/")} == {"bench/features_speed.py"}
    bench = subprocess.run([sys.executable, "bench/run_all.py", "--list"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout
    assert not {ln.split()[0] for ln in lines} & {ln.split()[0] for ln in bench.splitlines() if ln.strip()}


def test_evaluate_variants_offers_the_product_command_with_the_variant_names():
    r = subprocess.run([sys.executable, "research/cdmpp/evaluate_variants.py", "--help"], cwd=ROOT,
                       capture_output=True, text=True, check=True, env={**os.environ, "COLUMNS": "200"})
    assert "--holdout" in r.stdout and "--resume" in r.stdout and "xgboost-deep-rel-mape" in r.stdout
