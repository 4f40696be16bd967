"""Ensembles of seeded latency models (cdmpp/ensemble.py) on a slice of the real dataset."""
from __future__ import annotations

import copy
import json

import numpy as np
import pytest

pytest.importorskip("torch")

from tensorplan.errors import TensorplanError  # noqa: E402
from tensorplan.cdmpp.arrays import as_arrays  # noqa: E402
from tensorplan.cdmpp.base import load_estimator  # noqa: E402
from tensorplan.cdmpp.baselines import TenSetXGB  # noqa: E402
from tensorplan.cdmpp.ensemble import Ensemble  # noqa: E402
from tensorplan.cdmpp.model import CDMPP  # noqa: E402
from test_cdmpp_common import cdmpp_small  # noqa: E402,F401


def _bagged(seed: int) -> TenSetXGB:
    return TenSetXGB(n_rounds=60, subsample=0.7, colsample=0.7, seed=seed)


def test_ensemble_predicts_shrunk_geometric_mean(cdmpp_small, tmp_path):
    tr, te = as_arrays(cdmpp_small["train"]), as_arrays(cdmpp_small["test"])
    ens = Ensemble.of(_bagged, 3, seed=5, shrink=1.0)
    assert [m.seed for m in ens.members] == [5, 6, 7]
    with pytest.raises(TensorplanError):
        ens.predict(te)
    assert ens.fit(tr) is ens
    logs = np.log(np.stack([m.predict(te) for m in ens.members]))
    var = logs.var(0, ddof=1)
    assert np.all(var >= 0) and var.max() > 0        # bagged members disagree somewhere
    pred, spread = ens.predict_with_spread(te)
    np.testing.assert_allclose(pred, np.exp(logs.mean(0) - var), rtol=1e-6)
    np.testing.assert_allclose(spread, np.sqrt(var), rtol=1e-6)
    np.testing.assert_allclose(ens.predict(te), pred)
    # shrink 0 is the members' geometric mean; shrinking only ever lowers a prediction
    plain = Ensemble(ens.members, shrink=0.0).predict(te)
    np.testing.assert_allclose(plain, np.exp(logs.mean(0)), rtol=1e-6)
    assert np.all(pred <= plain * (1 + 1e-9)) and np.any(pred < plain)
    # save / load keeps members and shrink, through both loaders
    path = ens.save(tmp_path / "ens.pt")
    for loaded in (Ensemble.load(path), load_estimator(path)):
        assert type(loaded) is Ensemble and loaded.shrink == 1.0 and len(loaded.members) == 3
        np.testing.assert_allclose(loaded.predict(te), pred, rtol=1e-6)


def test_ensemble_rejects_bad_input():
    with pytest.raises(TensorplanError, match="at least 2 members"):
        Ensemble.of(_bagged, 1)
    with pytest.raises(TensorplanError, match="shrink"):
        Ensemble([], shrink=-1.0)
    with pytest.raises(TensorplanError, match="no members"):
        Ensemble().fit(None)


def test_ensemble_of_cdmpp_fine_tunes_every_member(cdmpp_small):
    tr, tgt = as_arrays(cdmpp_small["train"]), as_arrays(cdmpp_small["target"])
    ens = Ensemble.of(lambda s: CDMPP(epochs=3, batch_size=32, finetune_steps=5, seed=s), 2)
    assert ens.adapts_by_finetune and not Ensemble.of(_bagged, 2).adapts_by_finetune
    ens.fit(tr)
    before = copy.deepcopy(ens)
    ens.finetune(tgt.subset(np.arange(16)), base=tr)
    for a, b in zip(before.members, ens.members):
        assert not np.allclose(a.predict(tgt), b.predict(tgt))   # each member's head moved


@pytest.mark.slow
def test_train_members_and_predict_network_report_spread(cdmpp_small, tmp_path):
    """`tensorplan predictor train --members 2` saves an ensemble; `predict` with it gives each kernel a spread."""
    from typer.testing import CliRunner

    from tensorplan.cli import app
    from tensorplan.cdmpp.model import train
    from tensorplan.cdmpp.predict import predict

    model, info = train(cdmpp_small["ds"], out=tmp_path / "ens.pt", members=2, epochs=2, batch_size=64,
                        max_cov=0.25)
    assert isinstance(model, Ensemble) and info["members"] == 2 and info["epochs_run"] == [2, 2]
    assert [m.seed for m in model.members] == [0, 1] and info["val"]["n"] > 0
    assert len(json.loads((tmp_path / "ens.norm.json").read_text())["members"]) == 2
    r = predict("tiny-mlp", device="local", weights=tmp_path / "ens.pt").to_dict()
    assert r["predictor"] == "Ensemble" and r["n_kernels"] >= 3
    assert all(k["log_spread"] >= 0 and k["predicted_us"] > 0 for k in r["kernels"])
    assert any(k["log_spread"] > 0 for k in r["kernels"])       # two seeds never agree exactly
    assert len(r["member_total_ms"]) == 2 and all(t > 0 for t in r["member_total_ms"])
    out = CliRunner().invoke(app, ["predict", "tiny-mlp", "--weights", str(tmp_path / "ens.pt")],
                             env={"COLUMNS": "200"})   # wide enough for every column
    assert out.exit_code == 0, out.output
    assert "spread ×" in out.stdout and "(members " in out.stdout


def test_shipped_weights_load_in_a_fresh_process():
    """The packaged weights (an ensemble) load where nothing has imported ensemble.py yet."""
    import subprocess
    import sys

    code = ("from tensorplan.cdmpp.model import load_shipped; m = load_shipped(); "
            "print(type(m).__name__, len(getattr(m, 'members', [m])))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    name, n = r.stdout.split()[-2:]
    assert name in ("Ensemble", "CDMPP") and int(n) >= 1


def test_finetune_device_adapts_the_shipped_model(cdmpp_small, tmp_path):
    """`tensorplan predictor finetune --device` on the packaged weights (an ensemble of CDMPPs, or one CDMPP)."""
    from tensorplan.cdmpp.model import load_shipped
    from tensorplan.cdmpp.finetune import finetune_device

    shipped = load_shipped()
    info = finetune_device("local-1t", data=cdmpp_small["ds"], n_tasks=3, per_task=4, steps=5, max_cov=0.25,
                           out=tmp_path / "ft.pt")
    assert info["adapt"] == "finetune" and 0 < info["n_target_samples"] <= 12
    assert np.isfinite(info["after"]["mape_pct"]) and info["n_eval"] > 0
    tuned = load_estimator(info["path"])
    assert type(tuned) is type(shipped)
    test = as_arrays(cdmpp_small["target"])
    assert not np.allclose(tuned.predict(test), shipped.predict(test))   # the weights moved


def test_members_trained_side_by_side_equal_those_trained_in_turn(cdmpp_small):
    """`train(members=2, workers=2)` fits the two CDMPPs in two processes at once: each comes back
    with its history and predicts exactly what the same seed predicts when the members train in turn."""
    from tensorplan.cdmpp.model import train

    kw = dict(members=2, epochs=2, batch_size=64, max_cov=0.25)
    serial, a = train(cdmpp_small["ds"], workers=1, **kw)
    forked, b = train(cdmpp_small["ds"], workers=2, **kw)
    assert a["epochs_run"] == b["epochs_run"] == [2, 2]
    assert [m.seed for m in forked.members] == [0, 1]
    x = as_arrays(cdmpp_small["test"])
    assert np.array_equal(serial.predict(x), forked.predict(x))
    assert not np.array_equal(forked.members[0].predict(x), forked.members[1].predict(x))   # two seeds, two models
