"""Network totals from median-like kernel predictions (`cdmpp_variants/totals.py`), on real records."""
import numpy as np
import pytest

from tensorplan.errors import TensorplanError

from cdmpp_variants.totals import mean_factor


def test_mean_factor_is_the_expected_sum_of_lognormal_errors(cdmpp_small):
    """Real labels, predictions off by a lognormal error with median 1: each prediction is the
    median, so the sum of predictions falls short of the measured sum by E[exp(e)] = exp(s^2 / 2),
    and the factor recovers it; a constant ratio comes back exactly."""
    y = cdmpp_small["ds"].records["latency_s"].to_numpy()
    rng = np.random.default_rng(0)
    y = np.tile(y, max(1, 20_000 // len(y)))
    for s in (0.3, 0.6):
        pred = y * np.exp(-rng.normal(0, s, len(y)))          # y / pred = exp(e), e ~ N(0, s^2)
        f = mean_factor(pred, y)
        assert f == pytest.approx(np.exp(s * s / 2), rel=0.04)
        assert np.median(y / pred) == pytest.approx(1, abs=0.03)
    assert mean_factor(y / 2.0, y) == pytest.approx(2.0)


def test_mean_factor_winsorises_a_few_many_fold_misses():
    y = np.ones(1000)
    pred = np.ones(1000)
    pred[:5] = 1e-4                     # five programs predicted 10,000-fold too fast
    assert mean_factor(pred, y, trim=0.01) == pytest.approx(1.0)
    assert mean_factor(pred, y, trim=0.0) > 40


def test_mean_factor_refuses_unusable_input():
    with pytest.raises(TensorplanError, match="positive predictions"):
        mean_factor(np.zeros(3), np.ones(3))
    with pytest.raises(TensorplanError, match="one shape"):
        mean_factor(np.ones(3), np.ones(4))


def test_network_totals_study_summarises_its_committed_folds():
    """research/cdmpp/cdmpp_network_totals.py on the committed leave-one-network-out folds: each
    fold's expected total is its kernels' sum times that fold's factor, and the committed summary is
    what the script computes from them."""
    import json

    import _path
    import cdmpp_network_totals as nt

    results = _path.RESULTS
    got = nt.lono(results / "cdmpp_by_network_totals.jsonl", 1.0)
    assert set(got) == {"xgboost-hier", "cdmpp-nocmd-parts"}
    for e in got.values():
        assert e["all"]["n"] == len(e["folds"]) > e["over_1ms"]["n"] > 20
        for f in e["folds"]:
            assert f["expected_ratio"] == pytest.approx(f["ratio"] * f["factor"])
    committed = json.loads((results / "cdmpp_network_totals.json").read_text())["lono"]
    for m, e in got.items():
        for way in ("sum", "expected"):
            assert e["all"][way] == pytest.approx(committed[m]["all"][way])
        assert e["factor_median"] == pytest.approx(committed[m]["factor_median"])
