"""One conformance test for every latency estimator (CDMPP and the baselines), scikit-learn style."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

pytest.importorskip("torch")

from tensorplan.errors import TensorplanError  # noqa: E402
from tensorplan.cdmpp.analytic import program_bytes  # noqa: E402
from tensorplan.cdmpp.arrays import as_arrays  # noqa: E402
from tensorplan.cdmpp.base import Estimator, load_estimator  # noqa: E402
from tensorplan.cdmpp.baselines import RooflineLinear, TenSetMLP, TenSetXGB, TLPModel, _trace_steps, store_stat_features, summed_features  # noqa: E402
from tensorplan.cdmpp.model import CDMPP  # noqa: E402
from tensorplan.cdmpp.tasks import TASK_IO_DIM  # noqa: E402
from test_cdmpp_common import cdmpp_small  # noqa: E402,F401

FAST = {
    CDMPP: dict(epochs=20, batch_size=32),
    TenSetXGB: dict(n_rounds=60),
    TenSetMLP: dict(epochs=40, batch_size=16),
    TLPModel: dict(epochs=40, batch_size=16),
    RooflineLinear: dict(),
}


@pytest.mark.parametrize("klass", list(FAST), ids=lambda k: k.__name__)
def test_estimator_conformance(klass, cdmpp_small, tmp_path):
    tr, te = as_arrays(cdmpp_small["train"]), as_arrays(cdmpp_small["test"])
    # params live in __init__ and round-trip through get_params
    sig = inspect.signature(klass.__init__)
    assert all(p.default is not inspect.Parameter.empty for n, p in sig.parameters.items() if n != "self")
    est = klass(**FAST[klass])
    assert isinstance(est, Estimator)
    assert klass(**est.get_params()).get_params() == est.get_params()
    with pytest.raises(TensorplanError):
        est.predict(te)
    assert est.fit(tr) is est
    pred = est.predict(te)
    assert pred.shape == (len(te),) and np.all(np.isfinite(pred)) and np.all(pred > 0)
    # it learned: on its training data its log error beats a constant (geometric-mean) predictor
    # (latencies span 5 orders of magnitude, so MAPE of a constant is meaningless here)
    ly = np.log(tr.latency_s)
    err = np.mean(np.abs(np.log(est.predict(tr)) - ly))
    err_c = np.mean(np.abs(ly.mean() - ly))
    assert err < 0.8 * err_c, (klass.__name__, err, err_c)
    # save / load round trip gives identical predictions, through both loaders
    path = est.save(tmp_path / f"{klass.__name__}.pt")
    for loaded in (klass.load(path), load_estimator(path)):
        assert type(loaded) is klass
        np.testing.assert_allclose(loaded.predict(te), pred, rtol=1e-6)
    # the dataset object itself is accepted as well as ProgramArrays
    np.testing.assert_allclose(est.predict(cdmpp_small["test"]), pred, rtol=1e-6)


def test_load_rejects_wrong_files(tmp_path):
    bad = tmp_path / "x.pt"
    bad.write_bytes(b"not a model")
    with pytest.raises(Exception):
        load_estimator(bad)
    with pytest.raises(TensorplanError, match="does not exist"):
        load_estimator(tmp_path / "missing.pt")


def test_every_estimator_registers_where_it_is_defined_and_loads_by_its_module(cdmpp_small, tmp_path):
    """Subclassing registers a model under its class name; loading in a fresh process imports the
    package's own module for it from `base._DEFINED_IN`, which names every estimator of the
    package, whatever module the file names (or none: the files saved before it was recorded); a
    module the file names is never imported, inside tensorplan or not."""
    import subprocess
    import sys

    import torch

    from tensorplan.cdmpp import base, calibrate, ensemble  # noqa: F401  (every estimator module)

    ours = {n: k for n, k in base._REGISTRY.items() if k.__module__.startswith("tensorplan.")}
    assert {n: k.__module__ for n, k in ours.items()} == base._DEFINED_IN
    path = RooflineLinear().fit(as_arrays(cdmpp_small["train"])).save(tmp_path / "rf.pt")
    assert torch.load(path, weights_only=True)["module"] == "tensorplan.cdmpp.baselines"
    code = ("import sys; from tensorplan.cdmpp.base import load_estimator; m = load_estimator(sys.argv[1]); "
            "assert 'tensorplan.cdmpp.evaluate' not in sys.modules; print(type(m).__name__)")
    for blob_module in ("tensorplan.cdmpp.baselines", None, "tensorplan.cdmpp.evaluate"):
        blob = torch.load(path, weights_only=True)
        if blob_module is None:
            del blob["module"]              # as in files saved before the module was recorded
        else:
            blob["module"] = blob_module    # a module the file names is not imported
        torch.save(blob, path)
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "RooflineLinear"
    blob = torch.load(path, weights_only=True)
    for cls_name, module in (("Elsewhere", "os"), ("Evaluation", "tensorplan.cdmpp.evaluate")):
        blob["class"], blob["module"] = cls_name, module
        torch.save(blob, path)
        with pytest.raises(TensorplanError, match=f"unknown model class {cls_name} .the file says it is defined "
                                                  f"in {module}"):
            load_estimator(path)


def test_feature_helpers(cdmpp_small):
    arr = as_arrays(cdmpp_small["train"])
    X = summed_features(arr)
    assert X.shape == (len(arr), 164 + 1 + arr.device.shape[1])
    i = int(np.argmax(arr.n_leaves))
    np.testing.assert_allclose(X[i, :164], arr.leaves(i).sum(0), rtol=1e-5)
    b = program_bytes(arr)
    assert np.all(b > 0)
    steps = _trace_steps(arr.trace[0])
    assert len(steps) > 0 and all(isinstance(k, str) for k, _, _ in steps)
    kinds = {k for k, _, _ in steps}
    assert kinds & {"GetSBlock", "SamplePerfectTile", "Split", "GetLoops"}, kinds


def test_trace_steps_keep_numeric_inputs():
    """Split factors and annotation values are instruction *inputs*; TLP must see them."""
    trace = [[["GetSBlock", [], ["root", "main"], ["b2"]],
              ["Annotate", ["b2", 64], ["meta_schedule.vectorize"], []],
              ["Split", ["l9", None, 64], [True, False], ["l10", "l11"]],
              ["SamplePerfectTile", ["l1"], [4, 64], ["v1", "v2", "v3", "v4"]]],
             [[3, [2, 4, 8, 1]]]]
    steps = {k: a for k, a, _ in _trace_steps(trace)}
    names = {k: n for k, _, n in _trace_steps(trace)}
    assert names["GetSBlock"] == ["root", "main"] and names["Annotate"] == ["meta_schedule.vectorize"]
    assert 64.0 in steps["Annotate"]
    assert steps["Split"][:3] == [64.0, 1.0, 0.0]
    assert steps["SamplePerfectTile"] == [4.0, 64.0, 2.0, 4.0, 8.0, 1.0]


def test_tlp_encodes_each_trace_once(cdmpp_small, monkeypatch):
    """Alternating train/validation sets must not re-encode the traces every epoch."""
    tr, va = as_arrays(cdmpp_small["train"]), as_arrays(cdmpp_small["test"])
    calls = []
    orig = TLPModel._encode
    monkeypatch.setattr(TLPModel, "_encode", lambda self, t: calls.append(1) or orig(self, t))
    TLPModel(epochs=3, batch_size=64).fit(tr, val=va)
    distinct = len(set(tr.trace)) + len(set(va.trace))
    assert len(calls) <= distinct


def test_task_io_from_script_and_tlp_task_row(cdmpp_small):
    """Same trace, different kernel sizes: only the task row tells TLP apart (elementwise traces)."""
    from tensorplan.cdmpp.tasks import TASK_IO_DIM, buffer_shapes, task_io_vector

    ds = cdmpp_small["ds"]
    script = ds.tasks["script"].iloc[0]
    shapes = buffer_shapes(script)
    assert len(shapes) >= 2 and all(isinstance(d, int) and d > 0 for s, _ in shapes for d in s)
    vec = task_io_vector(script)
    assert len(vec) == TASK_IO_DIM and vec[0] == pytest.approx(np.log2(1 + np.prod(shapes[-1][0])))
    arr = as_arrays(ds)
    assert arr.task_io is not None and arr.task_io.shape == (len(arr), TASK_IO_DIM)
    two = arr.subset([0, 0])
    two.task_io = two.task_io.copy()
    two.task_io[1, 0] += 3.0                     # an 8x larger output, same trace
    m = TLPModel(epochs=1, batch_size=16)
    m.fit(as_arrays(cdmpp_small["train"]))
    x, valid, _ = m._inputs(two, np.arange(2))
    assert valid[:, 0].all() and bool((x[0, 1:] == x[1, 1:]).all()) and not bool((x[0, 0] == x[1, 0]).all())
    with pytest.raises(TensorplanError, match="def main"):
        buffer_shapes("no function here")


def test_task_io_of_a_parsed_program_matches_its_script(cdmpp_small):
    """What the planner and `predict` compute from an in-memory kernel equals what the dataset read
    from the task's TVMScript signature."""
    from tensorplan.cdmpp.tasks import task_from_script, task_io_of, task_io_vector

    tasks = cdmpp_small["ds"].tasks.head(5)
    for _, t in tasks.iterrows():
        mod = task_from_script(t["task_key"], t["task_name"], t["script"], {}, 0.0).mod
        assert task_io_of(mod) == pytest.approx(task_io_vector(t["script"]))
        assert task_io_of(mod["main"]) == task_io_of(mod)


def test_xgboost_hierarchy_options(cdmpp_small, tmp_path):
    """parts=True adds the log compute / footprint / traffic seconds and the log estimate as columns;
    base="hierarchy" makes the trees predict log(latency / estimate), with the cache ratio fitted on
    the training split and kept through save/load."""
    import xgboost as xgb

    from tensorplan.cdmpp.analytic import fit_cache_ratio, hierarchy_parts, hierarchy_seconds

    tr, te = as_arrays(cdmpp_small["train"]), as_arrays(cdmpp_small["test"])
    m = TenSetXGB(n_rounds=60, parts=True, base="hierarchy").fit(tr)
    assert m.cache_ratio == fit_cache_ratio(hierarchy_parts(tr), tr.latency_s, tr.task_key)
    X = m._features(te)
    assert X.shape[1] == summed_features(te).shape[1] + 4
    log_est = np.log(hierarchy_seconds(hierarchy_parts(te), m.cache_ratio))
    np.testing.assert_allclose(X[:, -1], log_est, rtol=1e-5)
    z = m.booster.predict(xgb.DMatrix(X)).astype(np.float64)
    np.testing.assert_allclose(m.predict(te), np.exp(z + log_est), rtol=1e-5)
    ly = np.log(tr.latency_s)
    assert np.mean(np.abs(np.log(m.predict(tr)) - ly)) < 0.8 * np.mean(np.abs(ly.mean() - ly))
    back = load_estimator(m.save(tmp_path / "xgb_hier.pt"))
    assert back.base == "hierarchy" and back.parts and back.cache_ratio == m.cache_ratio
    np.testing.assert_allclose(back.predict(te), m.predict(te), rtol=1e-6)
    with pytest.raises(TensorplanError, match="base"):
        TenSetXGB(base="roofline")


def test_xgboost_deep_reads_max_and_last_store_rows(cdmpp_small, tmp_path):
    """stats=("sum","max","last") adds, per program, the element-wise max over its stores and its
    last store's row (the output store) after the sums, and the option survives save/load."""
    te = as_arrays(cdmpp_small["test"])
    plain = TenSetXGB(n_rounds=20, parts=True, base="hierarchy").fit(as_arrays(cdmpp_small["train"]))
    m = TenSetXGB(n_rounds=20, parts=True, base="hierarchy", stats=("sum", "max", "last"),
                  max_depth=8).fit(as_arrays(cdmpp_small["train"]))
    X, n_sum = m._features(te), summed_features(te).shape[1]
    multi = int(np.flatnonzero(te.n_leaves > 1)[0])       # a program with several stores
    a, b = te.offsets[multi], te.offsets[multi + 1]
    rows = te.leaf_data[a:b]
    d = rows.shape[1]
    np.testing.assert_allclose(X[multi, n_sum:n_sum + d], rows.max(0), rtol=1e-6)
    np.testing.assert_allclose(X[multi, n_sum + d:n_sum + 2 * d], rows[-1], rtol=1e-6)
    assert not np.allclose(rows.max(0), rows[-1])          # the two pools carry different figures
    lo, first = store_stat_features(te, ("sum", "min", "first"))   # the bench's other two pools
    np.testing.assert_allclose(lo[multi], rows.min(0), rtol=1e-6)
    np.testing.assert_allclose(first[multi], rows[0], rtol=1e-6)
    assert X.shape[1] == plain._features(te).shape[1] + 2 * d
    back = load_estimator(m.save(tmp_path / "deep.pt"))
    assert tuple(back.stats) == m.stats
    np.testing.assert_allclose(back.predict(te), m.predict(te), rtol=1e-6)
    with pytest.raises(TensorplanError, match="stats"):
        TenSetXGB(stats=("max",))


def test_xgboost_task_io_appends_the_tasks_buffer_sizes(cdmpp_small, tmp_path):
    """task_io=True adds the task's log2 buffer sizes after every other column; records without them
    are refused with a clear error; the option survives save/load."""
    tr, te = as_arrays(cdmpp_small["train"]), as_arrays(cdmpp_small["test"])
    assert te.task_io is not None
    m = TenSetXGB(n_rounds=20, parts=True, base="hierarchy", task_io=True).fit(tr)
    X = m._features(te)
    m.task_io = False
    assert X.shape[1] == m._features(te).shape[1] + TASK_IO_DIM
    m.task_io = True
    np.testing.assert_allclose(X[:, -TASK_IO_DIM:], te.task_io[:, :TASK_IO_DIM], rtol=1e-6)
    back = load_estimator(m.save(tmp_path / "io.pt"))
    assert back.task_io
    np.testing.assert_allclose(back.predict(te), m.predict(te), rtol=1e-6)
    bare = te.subset(np.arange(len(te)))
    bare.task_io = None
    with pytest.raises(TensorplanError, match="buffer sizes"):
        m.predict(bare)


def test_train_a_hierarchy_xgboost_and_predict_a_network_with_it(cdmpp_small, tmp_path):
    """`tensorplan predictor train --model xgboost-hier` path: the tree model trains through the same `train`,
    records its domains, and `predict --weights` uses it for a whole network."""
    from typer.testing import CliRunner

    from tensorplan.cli import app
    from tensorplan.cdmpp.model import train
    from tensorplan.cdmpp.predict import predict

    model, info = train(cdmpp_small["ds"], out=tmp_path / "xh.pt", max_cov=0.25,
                        make=lambda s: TenSetXGB(n_rounds=40, parts=True, base="hierarchy", seed=s))
    assert info["model"] == "TenSetXGB" and info["val"]["n"] > 0 and info["train_time_s"] > 0
    assert model.domains_ == ["local-1t", "local-2t"] and model.cache_ratio is not None
    r = predict("tiny-mlp", device="local-1t", weights=tmp_path / "xh.pt").to_dict()
    assert r["predictor"] == "TenSetXGB" and r["n_kernels"] >= 3
    assert all(k["predicted_us"] > 0 for k in r["kernels"])
    out = CliRunner().invoke(app, ["predictor", "train", "--model", "nothing-like-it", "--out", str(tmp_path / "x.pt")])
    assert out.exit_code != 0 and "unknown model" in out.output
    out = CliRunner().invoke(app, ["predictor", "train", "--model", "xgboost-hier", "--ship"])
    assert out.exit_code != 0 and "--ship" in out.output
