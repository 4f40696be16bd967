"""Timer: real timings of real work; warm-up, budget, number, sync, CoV and thread pinning."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tensorplan.errors import TensorplanError
from tensorplan.measure.timer import Timing, is_stable, measure, measure_stable, pinned_threads


def test_measures_sleep_with_median():
    t = measure(lambda: time.sleep(0.002), warmup=1, min_repeats=5, max_repeats=50, budget_s=0.05)
    assert 0.002 <= t.median_s < 0.02  # sleep never returns early; the loaded CI box may add a few ms
    assert t.min_s <= t.median_s and len(t.repeats) >= 5
    assert "warmup=1" in t.method and "median" in t.method and "0.05 s" in t.method


def test_call_counts_warmup_repeats_number():
    calls = []
    t = measure(lambda: calls.append(1), warmup=4, min_repeats=6, max_repeats=6, budget_s=10, number=3)
    assert len(t.repeats) == 6 and t.number == 3
    assert len(calls) == 4 + 6 * 3


def test_budget_stops_repeats():
    t0 = time.perf_counter()
    t = measure(lambda: time.sleep(0.005), warmup=0, min_repeats=2, max_repeats=10_000, budget_s=0.1)
    elapsed = time.perf_counter() - t0
    assert 2 <= len(t.repeats) <= 21
    assert elapsed < 1.0


def test_min_repeats_beats_budget():
    t = measure(lambda: time.sleep(0.01), warmup=0, min_repeats=4, max_repeats=100, budget_s=0.0)
    assert len(t.repeats) == 4


def test_auto_number_for_tiny_kernel():
    x = np.ones(16, np.float32)
    t = measure(lambda: x.sum(), warmup=2, number=None, min_repeats=3, max_repeats=5, budget_s=0.01,
                min_repeat_s=2e-3)
    assert t.number >= 8  # a 16-element sum takes ~1 µs: hundreds of calls per 2 ms repeat
    assert t.median_s < 1e-4
    assert t.median_s * t.number >= 1e-3  # each repeat lasted about min_repeat_s


def test_auto_number_survives_one_preempted_batch():
    """A single slow batch (another process took the core) must not fix `number` too low."""
    x = np.ones(16, np.float32)
    calls = {"n": 0}

    def kernel():
        calls["n"] += 1
        if calls["n"] == 4:           # first call of the 4-call calibration batch: "preempted" 5 ms
            time.sleep(0.005)
        return x.sum()
    t = measure(kernel, warmup=0, number=None, min_repeats=3, max_repeats=3, budget_s=0, min_repeat_s=2e-3)
    assert calls["n"] > 4 and t.number >= 64, t.number   # ~1 µs per call: hundreds per 2 ms


def test_sync_called_around_each_repeat():
    syncs = []
    t = measure(lambda: None, warmup=1, min_repeats=5, max_repeats=5, budget_s=0, sync=lambda: syncs.append(1))
    assert len(syncs) >= 2 * len(t.repeats)
    assert "sync" in t.method


def test_cov_reflects_spread():
    state = {"i": 0}

    def alternate():
        state["i"] += 1
        time.sleep(0.001 if state["i"] % 2 else 0.006)

    t = measure(alternate, warmup=0, min_repeats=10, max_repeats=10, budget_s=0)
    assert t.cov > 0.3 and not is_stable(t)


def test_is_stable_thresholds():
    assert is_stable(Timing.from_repeats([1.0, 1.01, 0.99, 1.0]))
    assert not is_stable(Timing.from_repeats([1.0, 2.0, 1.0, 2.0]))
    assert is_stable(Timing.from_repeats([1.0, 1.2, 1.0, 1.2]), max_cov=0.2)
    assert not is_stable(Timing.from_repeats([1.0, 1.0]))  # too few repeats to judge


def test_timing_roundtrip():
    t = measure(lambda: sum(range(1000)), warmup=1, min_repeats=3, max_repeats=3, budget_s=0)
    d = t.to_dict()
    assert Timing.from_dict(d) == t
    assert d["median_s"] == pytest.approx(float(np.median(t.repeats)))
    assert d["mean_s"] == pytest.approx(float(np.mean(t.repeats)))
    assert d["cov"] == pytest.approx(float(np.std(t.repeats) / np.mean(t.repeats)))


def test_bad_arguments():
    with pytest.raises(TensorplanError):
        measure(lambda: None, min_repeats=5, max_repeats=2)
    with pytest.raises(TensorplanError):
        measure(lambda: None, number=0)
    with pytest.raises(TensorplanError):
        with pinned_threads(0):
            pass
    with pytest.raises(TensorplanError):
        Timing.from_repeats([])


def test_pinned_threads_sets_and_restores_torch_blas_env():
    import torch
    from threadpoolctl import threadpool_info

    before_torch = torch.get_num_threads()
    before_env = os.environ.get("OMP_NUM_THREADS")
    with pinned_threads(1) as info:
        assert torch.get_num_threads() == 1 and info["torch"] == 1
        assert os.environ["OMP_NUM_THREADS"] == "1" and os.environ["TVM_NUM_THREADS"] == "1"
        assert all(p["num_threads"] == 1 for p in threadpool_info())
        # a child process inherits the limit
        out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['MKL_NUM_THREADS'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert out == "1"
    assert torch.get_num_threads() == before_torch
    assert os.environ.get("OMP_NUM_THREADS") == before_env


def test_pinned_threads_restores_after_exception():
    import torch

    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with pinned_threads(1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_measure_threads_recorded():
    import torch

    a = torch.randn(64, 64)
    t = measure(lambda: a @ a, threads=1, warmup=1, min_repeats=3, max_repeats=3, budget_s=0)
    assert t.threads == 1 and "threads=1" in t.method


_TVM_CHILD = r"""
import tvm, tvm_ffi
from tensorplan.measure.timer import pinned_threads
num = tvm_ffi.get_global_func("runtime.NumThreads")
start = num()
with pinned_threads(1) as info:
    inside = num()
print(start, inside, num(), info.get("tvm"))
"""


def test_pinned_threads_configures_tvm_runtime_pool():
    """TVM's pool is sized at creation (TVM_NUM_THREADS); pinned_threads lowers and restores it."""
    env = dict(os.environ, TVM_NUM_THREADS="2")
    r = subprocess.run([sys.executable, "-c", _TVM_CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    start, inside, after, reported = map(int, r.stdout.split()[-4:])
    assert (start, inside, after, reported) == (2, 1, 2, 1)


def test_measure_stable_flags_noisy_work():
    state = {"i": 0}

    def alternate():
        state["i"] += 1
        time.sleep(0.001 if state["i"] % 2 else 0.006)

    t = measure_stable(alternate, max_cov=0.1, attempts=2, warmup=0, min_repeats=6, max_repeats=6, budget_s=0)
    assert t.extra["unstable"] and t.extra["attempts"] == 2 and "re-measured" in t.method
    calls = []
    t = measure_stable(lambda: calls.append(1), max_cov=1e9, attempts=3, warmup=0, min_repeats=3, max_repeats=3,
                       budget_s=0)
    assert t.extra == {"attempts": 1, "unstable": False, "max_cov": 1e9} and len(calls) == 3


def test_interleaved_bursts_measure_steady_state_not_the_cold_first_call():
    import statistics
    from tensorplan.measure.timer import interleaved

    # The idle gap that makes a call cold (0.1 s) sits well inside the pause (0.15 s) and well
    # above a scheduler hiccup on a loaded 2-core CI runner; medians over rounds, not maxima,
    # so one preempted round cannot fail the test.
    class ColdAfterPause:
        """Slow (`cold` s) on the first call after an idle gap, fast (`warm` s) back to back."""
        def __init__(self, cold=0.005, warm=0.0005):
            self.last, self.cold, self.warm = 0.0, cold, warm

        def __call__(self):
            time.sleep(self.cold if time.perf_counter() - self.last > 0.1 else self.warm)
            self.last = time.perf_counter()

    pause = 0.15
    cold = interleaved({"a": ColdAfterPause(), "b": lambda: time.sleep(0.001)}, rounds=3, pause_s=pause)
    assert all(len(v) == 3 for v in cold.values())
    assert min(cold["a"]) > 0.004  # one call per round: always the cold one
    steady = interleaved({"a": ColdAfterPause(), "b": lambda: time.sleep(0.001)}, rounds=3,
                         pause_s=pause, burst_s=0.02)
    assert all(len(v) == 3 for v in steady.values())
    med_a = statistics.median(steady["a"])
    assert med_a < 0.003 and med_a < statistics.median(steady["b"]) * 3
    # a system slower than the burst gets one timed call per round, and that one is warm too
    big = interleaved({"slow": ColdAfterPause(cold=0.06, warm=0.025)}, rounds=3, pause_s=pause,
                      burst_s=0.02)
    assert statistics.median(big["slow"]) < 0.045
