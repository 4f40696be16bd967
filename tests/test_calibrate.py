"""Few-shot calibration (cdmpp/calibrate.py) on real records: 2-thread model -> 1-thread device."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("xgboost")

from tensorplan.errors import TensorplanError  # noqa: E402
from tensorplan.cdmpp.baselines import TenSetXGB  # noqa: E402
from tensorplan.cdmpp.calibrate import Calibrated, correction_inputs  # noqa: E402
from tensorplan.cdmpp.arrays import as_arrays  # noqa: E402
from tensorplan.cdmpp.base import load_estimator  # noqa: E402
from tensorplan.cdmpp.metrics import regression_metrics  # noqa: E402
from tensorplan.cdmpp.finetune import few_shot_split  # noqa: E402
from test_cdmpp_common import cdmpp_small  # noqa: E402,F401


@pytest.fixture(scope="module")
def fitted(cdmpp_small):
    src = as_arrays(cdmpp_small["source"])
    pool = as_arrays(cdmpp_small["target"])
    base = TenSetXGB(n_rounds=200).fit(src)
    n_tasks = max(2, len(np.unique(pool.task_key)) // 3)
    ft, rest, _ = few_shot_split(pool, n_tasks, 8, "random", seed=0)
    cal = Calibrated(base, source="local-2t").fit(pool.subset(ft))
    return base, cal, pool.subset(rest)


def test_calibration_beats_zero_shot_on_the_new_device(fitted):
    """The source model, asked about the 1-thread device, answers roughly with 2-thread latencies
    (about half); the correction fitted on a few 1-thread samples must cut that error."""
    base, cal, test = fitted
    zero = regression_metrics(base.predict(test), test.latency_s)
    after = regression_metrics(cal.predict(test), test.latency_s)
    assert after["median_ape_pct"] < 0.8 * zero["median_ape_pct"], (zero, after)
    ratio = np.median(cal.predict(test) / base.predict(test))
    assert 1.2 < ratio < 2.5   # most programs have a parallel loop: one thread is ~2x slower


def test_calibrated_model_round_trips(fitted, tmp_path):
    _, cal, test = fitted
    path = cal.save(tmp_path / "cal.pt")
    again = load_estimator(path)
    assert isinstance(again, Calibrated) and again.source == "local-2t" and again.n_samples == cal.n_samples
    np.testing.assert_allclose(again.predict(test), cal.predict(test), rtol=1e-5)


def test_correction_inputs_and_errors(fitted):
    base, cal, test = fitted
    X = correction_inputs(test, base.predict(test))
    assert X.shape == (len(test), 12) and np.isfinite(X).all()
    with pytest.raises(TensorplanError, match="at least 8"):
        Calibrated(base).fit(test.subset(np.arange(3)))
    with pytest.raises(TensorplanError, match="not fitted"):
        Calibrated(base).predict(test)


@pytest.mark.slow
def test_finetune_calibrate_then_predict_with_it(cdmpp_small, tmp_path):
    """`finetune --adapt calibrate` on the shipped model saves a model that `tensorplan predict` loads."""
    import json

    from typer.testing import CliRunner

    from tensorplan.cli import app
    from tensorplan.cdmpp.finetune import finetune_device

    info = finetune_device("local-1t", data=cdmpp_small["ds"], n_tasks=3, per_task=4, adapt="calibrate",
                           max_cov=0.25, out=tmp_path / "cal.pt")
    assert info["adapt"] == "calibrate" and 0 < info["n_target_samples"] <= 12
    assert np.isfinite(info["after"]["mape_pct"]) and info["n_eval"] > 0
    r = CliRunner().invoke(app, ["predict", "tiny-mlp", "--device", "local-1t", "--weights", info["path"], "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["predictor"] == "Calibrated" and out["total_ms"] > 0
    with pytest.raises(TensorplanError, match="adapt must be"):
        finetune_device("local-1t", data=cdmpp_small["ds"], adapt="bogus")


@pytest.mark.parametrize("domain,installs", [("local-1t", False), ("gpuhost-1t", True)])
def test_held_out_check_declines_on_a_learnt_cpu_and_installs_on_a_new_one(domain, installs):
    """`calibrate`'s guard, replayed on the dataset's records (research/cdmpp/cdmpp_calibration_guard.py):
    on the collection CPU, which the shipped model learnt, the correction loses on tasks it was not
    fitted on (it made the predict check worse there); on the 16-core Xeon it never learnt, it wins.
    Either way the decision matches what the correction does to every other task of the domain."""
    from tensorplan.cdmpp.arrays import device_features
    from tensorplan.cdmpp.model import load_shipped
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.finetune import programs_of_tasks, select_tasks_kmeans
    from tensorplan.cdmpp.local_calibration import held_out_check

    ds = load_dataset(None).filter_stable(max_cov=0.01, metric="mad")
    est = load_shipped()
    arr = as_arrays(ds.device(domain))
    tasks = select_tasks_kmeans(arr, 40, seed=0)
    samples = arr.subset(programs_of_tasks(arr, tasks, 4, 0))
    src = device_features("local-1t", ds.devices).tolist()

    def make():
        return Calibrated(est, source="local-1t", source_features=src)

    check = held_out_check(make, samples, est.predict(samples))
    assert check.folds == 5 and check.n == len(samples)
    assert check.calibration_better is installs
    assert check.to_dict()["calibrated"]["mape_pct"] == check.calibrated["mape_pct"]
    test = arr.subset(np.flatnonzero(~np.isin(arr.task_key, tasks)))
    here = regression_metrics(est.predict(test), test.latency_s)["mape_pct"]
    calibrated = regression_metrics(make().fit(samples).predict(test), test.latency_s)["mape_pct"]
    assert (calibrated < here) is installs
