"""CoDL-style predictor vs baselines on real measurements (fresh, small) and the shipped data."""
from pathlib import Path

import numpy as np
import pytest

from tensorplan.codl import predictor as L
from tensorplan.codl.data import PartKernel, load_compact, map_in, trans_in, trans_out
from tensorplan.codl.predictor import KernelSample, OpShape

DATA = Path(__file__).resolve().parents[1] / "data" / "codl"


def _measure(op, proc, reps=7):
    import time

    import torch

    k = PartKernel(op, L.processor(proc)["layout"])
    x = k.example_input()
    with torch.inference_mode():
        for _ in range(2):
            k(x)
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            k(x)
            ts.append(time.perf_counter() - t)
    return min(ts)


def test_units_staircase_and_mace_examples():
    # oneDNN units step at the 16-channel block, not per channel
    a = L.units_onednn(OpShape("conv", 28, 28, 64, 32, 3, 1, 1, 1, 1, 1))[0]
    b = L.units_onednn(OpShape("conv", 28, 28, 64, 33, 3, 1, 1, 1, 1, 1))[0]
    c = L.units_onednn(OpShape("conv", 28, 28, 64, 48, 3, 1, 1, 1, 1, 1))[0]
    assert b == c == a * 3 // 2
    # reference §1.8 worked examples (SD855 constants, 4 threads)
    op = OpShape("conv", 104, 104, 64, 128, 3, 1, 1, 1, 1, 1)
    assert L.mace_gpu_units(op, 2, 64, 1024, 131072)["gpu_direct_k3"] == 9152
    from tensorplan.codl.partition import h_split

    half = h_split(op, 0.5)
    assert L.mace_cpu_units(half.cpu, 4) == {"wino6_tr_in": 2592, "wino6_gemm": 86016, "wino6_tr_out": 5184}
    assert L.mace_gpu_units(half.gpu, 2, 64, 1024, 131072)["gpu_direct_k3"] == 4576
    big = OpShape("conv", 13, 13, 1024, 1024, 3, 1, 1, 1, 1, 1)
    assert L.mace_gpu_units(big, 2, 64, 1024, 131072)["gpu_direct_k3"] == 96 * 256
    one = OpShape("conv", 52, 52, 256, 128, 1, 1)
    assert L.mace_cpu_units(one, 4)["gemm_comp"] == 86528


def test_fit_on_real_measurements_beats_flops():
    """Measure a small sweep now (real kernels), fit on half, check on the other half.

    Each kernel keeps its best of three interleaved rounds: under `pytest -n 2` the other worker
    can hold a core for a while, which a 2-thread kernel timed in one burst would absorb."""
    rng = np.random.default_rng(0)
    items = [(OpShape("conv", rows + 2, h, ic, oc, 3, 1, 0, 0, 1, 1), proc)
             for h in (14, 20, 28) for ic, oc in ((16, 32), (32, 64), (64, 48))
             for rows in range(2, h + 1, max(1, h // 4)) for proc in ("cpu", "cpu2")]
    best = [_measure(op, proc, reps=5) for op, proc in items]
    for _ in range(2):
        best = [min(b, _measure(op, proc, reps=5)) for b, (op, proc) in zip(best, items)]
    samples = [KernelSample(op, proc, t) for (op, proc), t in zip(items, best)]
    idx = rng.permutation(len(samples))
    tr = [samples[i] for i in idx[: len(idx) // 2]]
    te = [samples[i] for i in idx[len(idx) // 2:]]
    codl = L.evaluate(L.CodlPredictor(min_class_samples=4), tr, te, timing_samples=10)
    flops = L.evaluate(L.FlopsLinear(), tr, te, timing_samples=10)
    assert codl["rmspe"] < flops["rmspe"] * 1.2 + 0.05, (codl, flops)
    assert codl["model_bytes"] < 2000


@pytest.mark.skipif(not (DATA / "ops.csv.gz").exists(), reason="no shipped data/codl")
def test_estimators_on_shipped_data_roundtrip(tmp_path):
    samples, sharing = load_compact(DATA)
    assert len(samples) > 1000 and {s.proc for s in samples} == {"cpu", "cpu2"}
    stable = [s for s in samples if s.spread <= 0.05]
    tr, te = L.random_split(stable, 0.7, 66)
    for est, fname in ((L.CodlPredictor(), "c.json"), (L.FlopsLinear(), "f.json")):
        est.fit(tr)
        p = est.predict(te[:50])
        est.save(tmp_path / fname)
        again = type(est).load(tmp_path / fname).predict(te[:50])
        assert np.allclose(p, again)
    codl = L.CodlPredictor().fit(tr)
    m_codl = L.accuracy_metrics(codl.predict(te), np.array([s.latency_s for s in te]))
    m_flops = L.accuracy_metrics(L.FlopsLinear().fit(tr).predict(te), np.array([s.latency_s for s in te]))
    assert m_codl["acc10"] > 2 * m_flops["acc10"] and m_codl["rmspe"] < m_flops["rmspe"]
    assert m_codl["acc10"] >= 0.85, m_codl  # the goal, on the committed quiet-machine data
    sh = L.SharingModel().fit(sharing)
    assert sh.sync_s > 0 and sh.time("trans_in", 10 ** 6) > sh.time("trans_in", 10 ** 4)


def test_sharing_primitives_roundtrip():
    home = np.random.default_rng(0).standard_normal((1, 9, 7, 5)).astype(np.float32)
    x = map_in(home, 2, 6)
    t = trans_in(x)
    assert tuple(t.shape) == (1, 5, 4, 7) and t.is_contiguous()
    assert np.array_equal(trans_out(t), home[:, 2:6])
