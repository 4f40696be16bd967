"""Trees with a within-task spacing booster (`cdmpp_variants/task_relative.py`) on a slice of the real dataset."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from tensorplan.errors import TensorplanError  # noqa: E402
from tensorplan.cdmpp.arrays import as_arrays  # noqa: E402
from tensorplan.cdmpp.base import load_estimator  # noqa: E402
from tensorplan.cdmpp.baselines import RooflineLinear, TenSetXGB  # noqa: E402

from cdmpp_variants.harness import evaluate_variants, make_model  # noqa: E402
from cdmpp_variants.task_relative import MIX_GRID, TaskRelative  # noqa: E402
from cdmpp_variants.wrapped import validation_choices  # noqa: E402
from test_mape_point import _split_by_task  # noqa: E402


def _log_mean_by_group(p, groups):
    return {g: float(np.log(p[groups == g]).mean()) for g in np.unique(groups)}


def test_task_relative_keeps_the_base_scale_and_changes_the_spacing(cdmpp_small, tmp_path):
    """The mix weight is the validation-best of the grid; per task and device the predictions keep
    the base's log mean (its scale) while the spacing moves; a program alone gets the base's value;
    the model survives save/load."""
    tr, va = _split_by_task(as_arrays(cdmpp_small["train"]))
    te = as_arrays(cdmpp_small["test"])
    m = TaskRelative(TenSetXGB(n_rounds=60, seed=0)).fit(tr, va)
    assert set(m.val_mape_by_mix) == set(MIX_GRID)
    assert m.mix == min(m.val_mape_by_mix, key=m.val_mape_by_mix.get)
    base = m.base.predict(te)
    m.mix = 1.0
    p = m.predict(te)
    groups = te.task_domains()
    for g, lm in _log_mean_by_group(base, groups).items():
        assert _log_mean_by_group(p, groups)[g] == pytest.approx(lm, abs=1e-6)
    multi = np.isin(groups, [g for g in np.unique(groups) if (groups == g).sum() > 1])
    assert multi.any() and not np.allclose(p[multi], base[multi], rtol=1e-3)
    one = te.subset([int(np.flatnonzero(multi)[0])])
    np.testing.assert_allclose(m.predict(one), m.base.predict(one), rtol=1e-6)
    # programs the trees were trained on keep the trees' prediction, whatever the mix
    assert len(m.seen) > 0 and not np.isin(te.program_ids(), m.seen).any()
    np.testing.assert_allclose(m.predict(tr), m.base.predict(tr), rtol=1e-6)
    back = load_estimator(m.save(tmp_path / "rel.pt"))
    assert isinstance(back, TaskRelative) and back.mix == 1.0
    np.testing.assert_array_equal(back.seen, m.seen)
    np.testing.assert_allclose(back.predict(te), p, rtol=1e-5)


def test_task_relative_harness_name_and_errors(cdmpp_small):
    """`xgboost*-rel` wraps the harness's trees; only XGBoost bases are accepted; an unfitted model
    refuses to predict; without validation the mix is the default."""
    m = make_model("xgboost-deep-rel", quick=True)
    assert isinstance(m, TaskRelative) and m.base.max_depth == 8
    with pytest.raises(TensorplanError, match="XGBoost"):
        TaskRelative(RooflineLinear())
    tr = as_arrays(cdmpp_small["train"])
    with pytest.raises(TensorplanError, match="not fitted"):
        TaskRelative(TenSetXGB()).predict(tr)
    fitted = TaskRelative(TenSetXGB(n_rounds=20, seed=0)).fit(tr)
    assert fitted.mix == 0.5 and fitted.val_mape_by_mix == {}
    assert np.isfinite(fitted.predict(tr)).all()


def test_evaluate_records_the_mix_chosen_on_validation(cdmpp_small):
    """A result entry says which mix (and s^2) the wrapper layers picked; a plain model has no entry."""
    res = evaluate_variants(cdmpp_small["ds"], models=("xgboost-rel-mape", "roofline"), splits=("network",),
                   quick=True, max_cov=None)
    models = res["splits"]["network"]["models"]
    ch = models["xgboost-rel-mape"]["chosen_on_validation"]
    assert ch["mix"] in MIX_GRID and ch["mix"] == min(ch["val_mape_by_mix"], key=ch["val_mape_by_mix"].get)
    assert ch["log_var"] > 0
    assert "chosen_on_validation" not in models["roofline"]
    assert validation_choices(TenSetXGB()) == {}


def test_program_ids_name_a_schedule_across_devices(cdmpp_small):
    """One program timed on two domains has one id; programs with different leaves differ."""
    arr = as_arrays(cdmpp_small["train"])
    ids = arr.program_ids()
    assert ids.dtype == np.uint64 and len(ids) == len(arr)
    recs = cdmpp_small["train"].records
    same = recs.groupby("prog_idx")["device"].nunique()
    multi = set(same[same > 1].index)
    assert multi, "the fixture should hold programs timed on both domains"
    by_prog = {}
    for pid, i in zip(recs["prog_idx"], ids):
        by_prog.setdefault(int(pid), set()).add(int(i))
    assert all(len(v) == 1 for v in by_prog.values())
    # programs share an id only where their leaves are identical (schedules the features cannot tell apart)
    o, first = arr.offsets, {}
    for i, pid in enumerate(ids):
        j = first.setdefault(int(pid), i)
        np.testing.assert_array_equal(arr.leaf_data[o[i]:o[i + 1]], arr.leaf_data[o[j]:o[j + 1]])
