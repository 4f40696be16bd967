"""CDMPP model: training on real measured records, padding mask, CMD, normalisers, fine-tuning."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tensorplan.errors import TensorplanError  # noqa: E402
from tensorplan.cdmpp.arrays import FeatureScaler, ProgramArrays, as_arrays  # noqa: E402
from tensorplan.cdmpp.model import CDMPP, TargetTransform, cmd  # noqa: E402
from test_cdmpp_common import cdmpp_small  # noqa: E402,F401


@pytest.fixture(scope="module")
def small(cdmpp_small):
    return cdmpp_small


def test_training_reduces_loss(small):
    arr = as_arrays(small["train"])
    m = CDMPP(epochs=1, batch_size=64, seed=0)
    m.fit(arr)  # normalisers + net
    losses = []
    net = m.net
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    idx = rng.choice(len(arr), size=min(128, len(arr)), replace=False)
    x, p, v, d = m._tensors(arr, idx)
    y = torch.from_numpy(m.ytf.transform(arr.latency_s[idx]))
    ys = torch.from_numpy(arr.latency_s[idx])
    net.train()
    for _ in range(25):
        pred, _ = net(x, p, v, d)
        loss = m._loss(pred, y, ys)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert np.mean(losses[-5:]) < 0.5 * losses[0], losses


def test_fit_records_history_and_learns(small):
    tr, te = as_arrays(small["train"]), as_arrays(small["test"])
    m = CDMPP(epochs=40, batch_size=64, seed=0).fit(tr)
    assert len(m.history) == 40
    assert m.history[-1]["loss"] < m.history[0]["loss"]
    ly = np.log(tr.latency_s)
    err = np.mean(np.abs(np.log(m.predict(tr)) - ly))
    err_c = np.mean(np.abs(ly.mean() - ly))
    assert err < 0.6 * err_c, (err, err_c)
    assert np.all(np.isfinite(m.predict(te))) and np.all(m.predict(te) > 0)


@pytest.mark.parametrize("flat_skip", [False, True])
def test_padding_is_masked(small, flat_skip):
    arr = as_arrays(small["train"])
    m = CDMPP(epochs=1, batch_size=64, seed=0, flat_skip=flat_skip).fit(arr)
    n = arr.n_leaves
    assert n.max() > n.min(), "need programs with different leaf counts"
    idx = np.concatenate([np.flatnonzero(n == n.min())[:3], np.flatnonzero(n == n.max())[:3]])
    x, p, v, d = m._tensors(arr, idx)
    assert (~v).any()
    m.net.eval()
    with torch.no_grad():
        y1, r1 = m.net(x, p, v, d)
        x2, p2 = x.clone(), p.clone()
        x2[~v] = torch.randn(int((~v).sum()), x.shape[-1]) * 100
        p2[~v] = 7
        y2, r2 = m.net(x2, p2, v, d)
        # and a batch of one, without any padding, gives the same answer
        xs, ps, vs, ds = m._tensors(arr, idx[:1])
        y3, _ = m.net(xs, ps, vs, ds)
    assert torch.equal(y1, y2) and torch.equal(r1, r2)
    assert torch.allclose(y1[:1], y3, atol=1e-5)


def test_cmd_zero_iff_same_distribution():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(500, 16, generator=g)
    assert float(cmd(x, x)) == 0.0
    assert float(cmd(x, x[torch.randperm(500, generator=g)])) < 1e-5
    assert float(cmd(x, x + 0.1)) > 0.05            # shifted mean
    y = (torch.rand(500, 16, generator=g) - 0.5) * 0.2 + 0.5  # same mean, smaller spread
    assert float(cmd(x, y)) > 0.01


def test_normalisers_fit_on_train_only(small):
    tr, te = as_arrays(small["train"]), as_arrays(small["test"])
    m = CDMPP(epochs=1, batch_size=64, seed=0).fit(tr, target=te)
    np.testing.assert_array_equal(m.scaler.lo, tr.leaf_data.min(0))
    ref = TargetTransform.fit(tr.latency_s, m.target)
    assert m.ytf.to_dict() == ref.to_dict()
    both = TargetTransform.fit(np.concatenate([tr.latency_s, te.latency_s * 10]), m.target)
    assert both.mean != m.ytf.mean
    before = m.normalisers()
    m.predict(te)
    assert m.normalisers() == before
    # the standardised training target has mean 0 / std 1, and inverse() undoes transform()
    z = m.ytf.transform(tr.latency_s)
    assert abs(z.mean()) < 1e-3 and abs(z.std() - 1) < 1e-3
    np.testing.assert_allclose(m.ytf.inverse(z), tr.latency_s, rtol=1e-4)


def test_feature_scaler_ignores_padding():
    leaves = [np.ones((1, 164), np.float32) * 3, np.ones((3, 164), np.float32) * 5]
    sc = FeatureScaler.fit(np.concatenate(leaves))
    assert sc.lo[0] == 3 and sc.scale[0] == 2


def test_finetune_moves_towards_target(small):
    src, tgt = as_arrays(small["source"]), as_arrays(small["target"])
    m = CDMPP(epochs=8, batch_size=64, seed=0, finetune_steps=60).fit(src, target=tgt)
    rng = np.random.default_rng(0)
    ft = rng.choice(len(tgt), size=min(40, len(tgt) // 2), replace=False)
    rest = np.setdiff1d(np.arange(len(tgt)), ft)
    # the symmetric log error, which the (log-target) loss minimises; MAPE over-weights the few
    # over-predictions of a model trained for 8 epochs on a few hundred programs
    before = m.predict(tgt.subset(ft))
    err_before = np.mean(np.abs(np.log(before / tgt.latency_s[ft])))
    m.finetune(tgt.subset(ft), target=tgt.subset(rest))
    after = m.predict(tgt.subset(ft))
    err_after = np.mean(np.abs(np.log(after / tgt.latency_s[ft])))
    assert err_after < 0.9 * err_before


def test_errors_are_clear(small):
    with pytest.raises(TensorplanError, match="not trained"):
        CDMPP().predict(small["train"])
    arr = as_arrays(small["train"]).subset(np.arange(4))
    arr.latency_s = None
    with pytest.raises(TensorplanError, match="no measured latencies"):
        CDMPP(epochs=1).fit(arr)
    with pytest.raises(TensorplanError, match="leaf features"):
        ProgramArrays.from_programs([np.zeros((0, 164), np.float32)], [np.zeros(0)], device="local-1t")
    with pytest.raises(TensorplanError, match="emb_norm"):
        CDMPP(emb_norm="group")
    with pytest.raises(TensorplanError, match="cmd_layer"):
        CDMPP(cmd_layer="x")


@pytest.mark.parametrize("layer", ["r", "z"])
def test_cmd_acts_on_the_chosen_layer(small, layer):
    """CMD towards an unlabelled target is computed (and logged) on r or on z, and changes the model."""
    tr, tgt = as_arrays(small["train"]), as_arrays(small["target"])
    tgt = tgt.subset(np.arange(len(tgt)))     # a copy: the fixture's cached arrays stay labelled for other tests
    tgt.latency_s = None
    kw = dict(epochs=3, batch_size=32, seed=0, cmd_layer=layer)
    with_cmd = CDMPP(**kw).fit(tr, target=tgt)
    without = CDMPP(**{**kw, "cmd_alpha": 0.0}).fit(tr, target=tgt)
    assert with_cmd.history and all(h["cmd"] > 0 for h in with_cmd.history)
    assert all(h["cmd"] == 0 for h in without.history)
    assert not np.allclose(with_cmd.predict(tgt), without.predict(tgt))


def test_boxcox_target_roundtrip_and_bounded(small):
    y = as_arrays(small["train"]).latency_s
    t = TargetTransform.fit(y, "boxcox")
    np.testing.assert_allclose(t.inverse(t.transform(y)), y, rtol=1e-4)
    wild = t.inverse(np.array([-1e6, 1e6]))  # an extrapolating net gets a finite, clipped answer
    assert np.all(np.isfinite(wild)) and wild[0] > 0


@pytest.mark.parametrize("base", ["none", "roofline"])
def test_cdmpp_cost_for_planner(small, base):
    """CDMPPCost implements the planner's KernelCost protocol on real fused candidates (also for a
    roofline-relative model, which needs each kernel's FLOPs and output size)."""
    from tensorplan.cost import AnalyticalCost, KernelCost
    from tensorplan import zoo
    from tensorplan.korch.fission import fission
    from tensorplan.korch.candidates import enumerate_candidates
    from tensorplan.cost.predicted import CDMPPCost

    m = CDMPP(epochs=2, batch_size=64, seed=0, base=base).fit(as_arrays(small["train"]))
    prim = fission(zoo.load("tiny-mlp")).graph
    cands = enumerate_candidates(prim, max_nodes=3)[:12]
    cm = CDMPPCost(m, device="local", fallback=AnalyticalCost("local"))
    assert isinstance(cm, KernelCost)
    costs = cm.cost_many(prim, cands)
    assert len(costs) == len(cands) and all(np.isfinite(c) and c > 0 for c in costs)
    assert cm.stats["predicted"] > 0
    n = cm.stats["predicted"] + cm.stats["fallback"]
    assert cm.cost(prim, cands[0]) == costs[0] and cm.stats["predicted"] + cm.stats["fallback"] == n  # cached


def test_weights_from_another_network_shape_fail_clearly(small, tmp_path):
    """A model file whose weights do not fit the network its parameters build (e.g. saved by an
    older version with batch norm) must say so and what to do, not dump a state-dict diff."""
    m = CDMPP(epochs=1, batch_size=64, seed=0).fit(as_arrays(small["train"]))
    path = m.save(tmp_path / "m.pt")
    blob = torch.load(path, weights_only=True)
    blob["params"]["emb_norm"] = "batch"
    torch.save(blob, path)
    with pytest.raises(TensorplanError, match="retrain"):
        CDMPP.load(path)


def test_roofline_seconds_takes_the_larger_byte_count(small):
    """The bound uses the task's buffer sizes where region analysis under-reports the bytes."""
    from tensorplan.cdmpp.analytic import device_peak_bw, program_bytes, roofline_seconds

    arr = as_arrays(small["train"])
    assert arr.task_io is not None and arr.flops is not None
    peak, bw = device_peak_bw(arr)
    plain = arr.subset(np.arange(len(arr)))
    plain.task_io = None
    only_features = np.maximum(np.maximum(arr.flops / peak, program_bytes(arr) / bw), 1e-9)
    np.testing.assert_allclose(roofline_seconds(plain), only_features)
    big = arr.subset(np.arange(len(arr)))
    big.task_io = np.where(arr.task_io > 0, arr.task_io + 10.0, 0.0).astype(np.float32)  # 1024x the elements
    r, rb = roofline_seconds(arr), roofline_seconds(big)
    assert np.all(r >= only_features - 1e-15) and np.all(rb >= r)
    assert np.all(rb > 100 * only_features * (only_features == program_bytes(arr) / bw) + 0)


def test_roofline_base_predicts_an_efficiency_factor(small, tmp_path):
    """base="roofline": the net's output times the program's bound on its device is the prediction;
    the option survives save/load and bad values fail clearly."""
    from tensorplan.cdmpp.analytic import roofline_seconds
    from tensorplan.cdmpp.base import load_estimator

    tr, te = as_arrays(small["train"]), as_arrays(small["test"])
    m = CDMPP(epochs=30, batch_size=64, seed=0, base="roofline").fit(tr)
    z = m._run(te, 4096, want_embedding=False)
    np.testing.assert_allclose(m.predict(te), m.ytf.inverse(z) * roofline_seconds(te), rtol=1e-6)
    ly = np.log(tr.latency_s)
    assert np.mean(np.abs(np.log(m.predict(tr)) - ly)) < 0.6 * np.mean(np.abs(ly.mean() - ly))
    back = load_estimator(m.save(tmp_path / "rf.pt"))
    assert back.base == "roofline"
    np.testing.assert_allclose(back.predict(te), m.predict(te), rtol=1e-5)
    with pytest.raises(TensorplanError, match="base"):
        CDMPP(base="flops")


def test_task_io_input_needs_the_task_sizes(small):
    tr = as_arrays(small["train"])
    m = CDMPP(epochs=2, batch_size=64, seed=0, task_io=True).fit(tr)
    assert np.all(np.isfinite(m.predict(tr)))
    bare = tr.subset(np.arange(8))
    bare.task_io = None
    with pytest.raises(TensorplanError, match="task_io"):
        m.predict(bare)


def test_footprint_counts_a_slice_without_reuse_whole():
    """EfficientViT's strided_slice -> pad kernel writes 1.1 MB; Ansor's unique_bytes sees ~1 KB of it
    (taken at the innermost loop for an access without reuse), the footprint sees all of it."""
    from tensorplan.cdmpp.analytic import program_bytes, program_footprint_traffic
    from tensorplan.cdmpp.dataset import load_dataset, replay_trace, task_module
    from tensorplan.cdmpp.features import compact_ast

    ds = load_dataset(None)
    key = "aca4b0a70db7dd6b"
    rec = ds.records[ds.records["task_key"] == key]
    if rec.empty:
        pytest.skip("the committed dataset has no strided_slice -> pad task")
    sch = replay_trace(task_module(ds, key), rec.iloc[0]["trace"])
    ast = compact_ast(sch)
    arr = ProgramArrays.from_programs([ast.leaf_features], [ast.positions], "local-1t", flops=[0.0])
    out_bytes = 16 * 1024 * 17 * 4
    footprint, traffic = program_footprint_traffic(arr)
    assert program_bytes(arr)[0] < out_bytes / 100
    assert out_bytes <= footprint[0] <= traffic[0] * 1.001
    assert footprint[0] == pytest.approx(2 * out_bytes, rel=0.01)   # the slice read + the padded write


def test_hierarchy_base_fits_its_cache_ratio_on_training_data(small, tmp_path):
    """base="hierarchy": the target is latency / (compute + footprint + traffic / ratio), with the
    ratio fitted on the training records; it survives save/load."""
    from tensorplan.cdmpp.analytic import fit_cache_ratio, hierarchy_parts, hierarchy_seconds
    from tensorplan.cdmpp.base import load_estimator

    tr, te = as_arrays(small["train"]), as_arrays(small["test"])
    parts = hierarchy_parts(tr)
    assert parts.shape == (len(tr), 3) and np.all(parts >= 0) and np.all(parts[:, 2] >= parts[:, 1] * 0.999)
    k = fit_cache_ratio(parts, tr.latency_s, tr.task_key)
    assert k in (1, 2, 4, 8, 16, 32)
    m = CDMPP(epochs=20, batch_size=64, seed=0, base="hierarchy").fit(tr)
    assert m.cache_ratio == k
    z = m._run(te, 4096, want_embedding=False)
    np.testing.assert_allclose(m.predict(te), m.ytf.inverse(z) * hierarchy_seconds(hierarchy_parts(te), k), rtol=1e-6)
    back = load_estimator(m.save(tmp_path / "hier.pt"))
    assert back.base == "hierarchy" and back.cache_ratio == k
    np.testing.assert_allclose(back.predict(te), m.predict(te), rtol=1e-5)
    with pytest.raises(TensorplanError, match="cache ratio"):
        CDMPP(base="hierarchy")._base(te)


def test_hierarchy_estimate_tracks_latency_across_tasks_better_than_the_roofline():
    """On all stable records of the collection CPU (one thread), per-task log(latency / estimate)
    spreads less with the fitted hierarchy estimate than with the roofline bound, and far less than
    the latency itself: what makes it a better base for a relative target."""
    from tensorplan.cdmpp.analytic import TaskSpread, fit_cache_ratio, hierarchy_parts, hierarchy_seconds, roofline_seconds
    from tensorplan.cdmpp.dataset import load_dataset

    ds = load_dataset(None).only_devices(["local-1t"]).filter_stable(0.01, metric="mad")
    arr = as_arrays(ds)
    lat, task = arr.latency_s, np.asarray(arr.task_key)
    assert len(set(task)) >= 200
    task_spread = TaskSpread(lat, task)
    parts = hierarchy_parts(arr)
    hier = task_spread(hierarchy_seconds(parts, fit_cache_ratio(parts, lat, task)))
    assert hier < 0.8 * task_spread(roofline_seconds(arr))
    assert hier < 0.4 * task_spread(np.ones(len(lat)))


def test_loading_a_file_that_is_not_a_model_is_one_clear_error(tmp_path):
    import torch

    from tensorplan.cdmpp.base import load_estimator
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"junk" * 100)
    with pytest.raises(TensorplanError, match="junk.pt' is not a readable tensorplan model file.*tensorplan predictor train"):
        load_estimator(junk)
    other = tmp_path / "other.pt"
    torch.save({"weights": [1, 2, 3]}, other)      # a torch file, but not ours
    with pytest.raises(TensorplanError, match="other.pt' is not a tensorplan model file"):
        load_estimator(other)
    with pytest.raises(TensorplanError, match="does not exist"):
        load_estimator(tmp_path / "missing.pt")


def test_parts_input_feeds_standardised_log_hierarchy_parts(small, tmp_path):
    """parts_input=True: the net reads the program's log compute / footprint / traffic seconds,
    standardised with the training split's mean and std, and the normaliser survives save/load."""
    from tensorplan.cdmpp.analytic import hierarchy_parts
    from tensorplan.cdmpp.base import load_estimator

    tr, te = as_arrays(small["train"]), as_arrays(small["test"])
    m = CDMPP(epochs=10, batch_size=64, seed=0, parts_input=True).fit(tr)
    assert m.io_dim == 3 and m.net.io_dim == 3
    lp = np.log(np.maximum(hierarchy_parts(tr), 1e-10))
    np.testing.assert_allclose(m.parts_norm[0], lp.mean(0), rtol=1e-6)
    io = m._io(te, np.arange(len(te))).numpy()
    expect = (np.log(np.maximum(hierarchy_parts(te), 1e-10)) - lp.mean(0)) / np.maximum(lp.std(0), 1e-6)
    np.testing.assert_allclose(io, expect, rtol=1e-4, atol=1e-5)
    back = load_estimator(m.save(tmp_path / "parts.pt"))
    assert back.parts_input and back.parts_norm is not None
    np.testing.assert_allclose(back.predict(te), m.predict(te), rtol=1e-5)
    # a different input moves the prediction: the branch is wired in
    te2 = te.subset(np.arange(len(te)))
    te2.flops = te.flops * 1000.0
    assert not np.allclose(m.predict(te2), m.predict(te))
    te2.flops = None
    with pytest.raises(TensorplanError, match="FLOP"):
        m.predict(te2)


def test_ranked_batches_hold_each_record_once_in_single_task_pieces():
    """w_rank > 0: an epoch's batches are pieces of one (task, device) each, so every batch holds
    within-task pairs, and still every record exactly once."""
    rng = np.random.default_rng(0)
    codes = np.repeat(np.arange(60), rng.integers(1, 30, 60))
    m = CDMPP(w_rank=1.0, rank_group=8)
    batches = m._ranked_batches(codes, np.random.default_rng(1), 128)
    seen = np.concatenate(batches)
    assert np.array_equal(np.sort(seen), np.arange(len(codes)))
    for b in batches:
        assert len(b) >= 64
        groups, counts = np.unique(codes[b], return_counts=True)
        # at most two pieces of one group per batch; the pieces of a group sit side by side
        assert (counts >= 2).sum() >= len(groups) // 2
    with pytest.raises(TensorplanError, match="w_rank"):
        CDMPP(w_rank=-1)
    with pytest.raises(TensorplanError, match="rank_group"):
        CDMPP(rank_group=1)


def test_rank_loss_orders_schedules_within_a_task_only(small):
    """The pairwise term is small when each task's schedules are predicted in their measured order,
    large when reversed, blind to pairs across tasks and to near-ties; and training on it alone
    raises the within-task rank correlation on real measured programs."""
    from tensorplan.cdmpp.metrics import within_task_spearman

    arr = as_arrays(small["train"])
    m = CDMPP(epochs=1, batch_size=64, seed=0, w_rank=1.0).fit(arr)
    y = torch.tensor([1e-3, 2e-3, 4e-3, 1e-3, 1.02e-3], dtype=torch.float64)
    piece = torch.tensor([0, 0, 0, 1, 1])
    z = torch.from_numpy(m.ytf.transform(y.numpy()))
    right = float(m._rank_loss(z, y, 1.0, piece))
    wrong = float(m._rank_loss(-z, y, 1.0, piece))
    assert right < 0.1 < 1.0 < wrong
    # each program alone in its piece: no pairs, no loss; a 2 % near-tie: no pair either
    assert float(m._rank_loss(-z, y, 1.0, torch.arange(5))) == 0.0
    assert float(m._rank_loss(-z[3:], y[3:], 1.0, piece[3:])) == 0.0

    grp = np.unique([f"{t}@{d}" for t, d in zip(arr.task_key, arr.device_name)], return_inverse=True)[1]
    idx = np.concatenate(m._ranked_batches(grp, np.random.default_rng(0), 10_000))
    x, p, v, d = m._tensors(arr, idx)
    ys, pc = torch.from_numpy(arr.latency_s[idx]), torch.from_numpy(grp[idx])
    keys = np.array([f"{t}@{d}" for t, d in zip(arr.task_key[idx], arr.device_name[idx])], dtype=object)
    rho0 = within_task_spearman(m.predict(arr.subset(idx)), arr.latency_s[idx], keys)
    opt = torch.optim.Adam(m.net.parameters(), lr=1e-3)
    m.net.train()
    losses = []
    for _ in range(40):
        pred, _ = m.net(x, p, v, d)
        loss = m._rank_loss(pred, ys, 1.0, pc)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    m.net.eval()
    rho1 = within_task_spearman(m.predict(arr.subset(idx)), arr.latency_s[idx], keys)
    assert np.mean(losses[-5:]) < 0.7 * losses[0], losses
    assert rho1 > rho0 + 0.1, (rho0, rho1)


def test_fit_with_rank_term_trains_saves_and_loads(small, tmp_path):
    from tensorplan.cdmpp.base import load_estimator

    tr, te = as_arrays(small["train"]), as_arrays(small["test"])
    m = CDMPP(epochs=3, batch_size=64, seed=0, w_rank=0.5, rank_group=4).fit(tr)
    assert len(m.history) == 3 and np.all(np.isfinite(m.predict(te)))
    back = load_estimator(m.save(tmp_path / "rank.pt"))
    assert (back.w_rank, back.rank_group) == (0.5, 4)
    np.testing.assert_allclose(back.predict(te), m.predict(te), rtol=1e-5)
