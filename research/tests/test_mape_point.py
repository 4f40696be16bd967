"""The MAPE-optimal point of a trained model (`cdmpp_variants/mape_point.py`) on a slice of the real dataset."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from tensorplan.errors import TensorplanError  # noqa: E402
from tensorplan.cdmpp.arrays import as_arrays  # noqa: E402
from tensorplan.cdmpp.base import load_estimator  # noqa: E402
from tensorplan.cdmpp.baselines import TenSetXGB  # noqa: E402

from cdmpp_variants.harness import make_model  # noqa: E402
from cdmpp_variants.mape_point import MapePoint, factor_floors, mape_optimal_factor  # noqa: E402


def _split_by_task(arr, every: int = 3):
    """(train, val): every `every`-th task of `arr` goes to validation, as on the network split."""
    tasks = np.unique(arr.task_key)
    is_va = np.isin(arr.task_key, tasks[::every])
    return arr.subset(np.flatnonzero(~is_va)), arr.subset(np.flatnonzero(is_va))


def test_mape_point_scales_by_the_validation_log_error(cdmpp_small, tmp_path):
    """s^2 is the variance of log(measured / predicted) on the validation tasks; every prediction is
    the base's times exp(-s^2), so ranks within a task stay and the model survives save/load."""
    tr, va = _split_by_task(as_arrays(cdmpp_small["train"]))
    te = as_arrays(cdmpp_small["test"])
    base = TenSetXGB(n_rounds=60, seed=0).fit(tr, va)
    m = MapePoint(TenSetXGB(n_rounds=60, seed=0)).fit(tr, va)
    r = np.log(va.latency_s) - np.log(base.predict(va))
    assert m.log_var == pytest.approx(float(r.var()), rel=1e-6) and m.log_var > 0
    np.testing.assert_allclose(m.predict(te), base.predict(te) * np.exp(-r.var()), rtol=1e-5)
    assert (m.predict(te) < base.predict(te)).all()
    back = load_estimator(m.save(tmp_path / "mp.pt"))
    assert isinstance(back, MapePoint) and back.log_var == m.log_var
    np.testing.assert_allclose(back.predict(te), m.predict(te), rtol=1e-6)


def test_mape_point_harness_name_and_errors(cdmpp_small):
    """`NAME-mape` wraps the harness model NAME; without a validation split there is nothing to
    measure the error on, and an unfitted one refuses to predict."""
    m = make_model("xgboost-deep-mape", quick=True)
    assert isinstance(m, MapePoint) and m.base.max_depth == 8
    tr = as_arrays(cdmpp_small["train"])
    with pytest.raises(TensorplanError, match="validation"):
        m.fit(tr)
    with pytest.raises(TensorplanError, match="not fitted"):
        MapePoint(TenSetXGB()).predict(tr)


def test_mape_optimal_factor_and_its_floors():
    """The one factor minimises MAPE (no factor on a fine grid does better); values that are others
    times a constant get that constant and no error; a factor per group never does worse than one
    (bench/cdmpp_domain_ratio.py's device floors, bench/cdmpp_error_parts.py)."""
    rng = np.random.default_rng(0)
    a = np.exp(rng.normal(-9, 2, 500))
    task = rng.integers(0, 20, 500)
    b = a * 1.7 * np.exp(rng.normal(0, 0.3, 500) + 0.2 * (task % 3))
    g = mape_optimal_factor(a, b)
    best = min(np.mean(np.abs(x * a - b) / b) for x in np.linspace(0.5, 5, 4001))
    assert np.mean(np.abs(g * a - b) / b) <= best + 1e-12
    exact = factor_floors(a, 2.5 * a, task)
    assert abs(exact["one_factor"] - 2.5) < 1e-9 and exact["one_factor_mape_pct"] < 1e-9
    f = factor_floors(a, b, task)
    assert 0 < f["per_task_factor_mape_pct"] < f["one_factor_mape_pct"]
    with pytest.raises(TensorplanError, match="no values"):
        mape_optimal_factor(np.array([]), np.array([]))
