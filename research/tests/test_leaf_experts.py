"""Leaf-count experts (`cdmpp_variants/leaf_experts.py`) on a slice of the real dataset."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from tensorplan.errors import TensorplanError  # noqa: E402
from tensorplan.cdmpp.arrays import as_arrays  # noqa: E402
from tensorplan.cdmpp.base import load_estimator  # noqa: E402
from tensorplan.cdmpp.model import CDMPP  # noqa: E402

from cdmpp_variants.leaf_experts import LeafExperts  # noqa: E402


def _small_cdmpp():
    return CDMPP(epochs=3, batch_size=64, finetune_steps=5, d_model=32, hidden=64, seed=0)


def test_experts_predict_their_leaf_count_and_survive_save(cdmpp_small, tmp_path):
    tr, te = as_arrays(cdmpp_small["train"]), as_arrays(cdmpp_small["test"])
    counts = {int(k): int((tr.n_leaves == k).sum()) for k in np.unique(tr.n_leaves)}
    common = [k for k, n in counts.items() if n >= 40]
    assert common and len(common) < len(counts), counts       # the slice has common and rare counts
    m = LeafExperts(_small_cdmpp(), min_records=40, steps=20).fit(tr)
    assert sorted(m.experts) == sorted(common)                  # no validation set: every expert is kept
    assert all(m.report[str(k)]["train_records"] == counts[k] for k in common)
    pred, base = m.predict(te), m.base.predict(te)
    expert_rows = np.isin(te.n_leaves, common)
    assert expert_rows.any() and (~expert_rows).any()
    np.testing.assert_array_equal(pred[~expert_rows], base[~expert_rows])   # rare counts: the base model
    assert not np.allclose(pred[expert_rows], base[expert_rows])           # common ones: their expert
    assert np.isfinite(pred).all() and (pred > 0).all()
    back = load_estimator(m.save(tmp_path / "leaf.pt"))
    assert isinstance(back, LeafExperts) and sorted(back.experts) == sorted(common)
    np.testing.assert_allclose(back.predict(te), pred, rtol=1e-5)
    # device adaptation fine-tunes the base and every expert
    before = m.predict(te)
    m.finetune(cdmpp_small["target"], base=tr)
    assert not np.allclose(m.predict(te), before)


def test_an_expert_is_kept_only_where_validation_says_so(cdmpp_small, monkeypatch):
    import cdmpp_variants.leaf_experts as le
    tr = as_arrays(cdmpp_small["train"])
    k = int(np.bincount(tr.n_leaves).argmax())
    val = tr.subset(np.flatnonzero(tr.n_leaves == k)[:35])
    # validation on the records the expert was fine-tuned on: it fits them better than the base
    m = LeafExperts(_small_cdmpp(), min_records=40, steps=30, min_val=30).fit(tr, val=val)
    rep = m.report[str(k)]
    assert rep["val_records"] == 35 and rep["val_log_err_expert"] < rep["val_log_err_base"]
    assert rep["kept"] and k in m.experts
    # an expert that validates worse than the base model is dropped (errors forced: base, then expert)
    errs = iter([0.1, 0.2] * 10)
    monkeypatch.setattr(le, "_log_err", lambda pred, true: next(errs))
    m = LeafExperts(_small_cdmpp(), min_records=40, steps=30, min_val=30).fit(tr, val=val)
    assert not m.report[str(k)]["kept"] and k not in m.experts
    # too few validation programs of a count: no comparison, the expert is kept
    m = LeafExperts(_small_cdmpp(), min_records=40, steps=30, min_val=36).fit(tr, val=val)
    assert m.report[str(k)]["kept"] and "val_log_err_base" not in m.report[str(k)]


def test_leaf_experts_need_a_cdmpp_base():
    from tensorplan.cdmpp.baselines import TenSetXGB
    from tensorplan.cdmpp.ensemble import Ensemble
    with pytest.raises(TensorplanError, match="must be a CDMPP"):
        LeafExperts(TenSetXGB())
    with pytest.raises(TensorplanError, match="must be a CDMPP"):   # an ensemble fine-tunes, but has no copies' knobs
        LeafExperts(Ensemble.of(lambda s: _small_cdmpp(), 2))
    with pytest.raises(TensorplanError, match="no base model"):
        LeafExperts().predict([])


def test_harness_names_leaf_expert_models():
    from cdmpp_variants.harness import make_model
    m = make_model("cdmpp-parts-leaf", quick=True)
    assert isinstance(m, LeafExperts) and isinstance(m.base, CDMPP) and m.base.parts_input
    assert make_model("cdmpp-leaf").steps == 1000
    with pytest.raises(TensorplanError):
        make_model("xgboost-leaf")


@pytest.mark.slow
def test_train_with_leaf_experts_saves_a_model_predict_reads(cdmpp_small, tmp_path):
    """`train(make=...)` with leaf experts: the saved model predicts a network like any other."""
    from tensorplan.cdmpp.model import train
    from tensorplan.cdmpp.predict import predict

    model, info = train(cdmpp_small["ds"], out=tmp_path / "leaf.pt", max_cov=0.25,
                        make=lambda s: LeafExperts(CDMPP(epochs=2, batch_size=64, seed=s)))
    # this slice has no leaf count with 1,000 training programs: the base model alone, still saved as experts
    assert isinstance(model, LeafExperts) and info["model"] == "LeafExperts" and model.experts == {}
    assert info["val"]["n"] > 0 and info["epochs_run"] == 2
    r = predict("tiny-mlp", device="local", weights=tmp_path / "leaf.pt").to_dict()
    assert r["predictor"] == "LeafExperts" and r["n_kernels"] >= 3 and r["total_ms"] > 0
