"""The peers a plan is judged against (workflows/peers.py), on a real tiny zoo model: every fp32
peer computes what ONNX Runtime computes, the interleaved run has rounds and medians, a peer that
cannot be built is reported with why, and the noise flag follows from the rounds and the load."""
from __future__ import annotations

import time

import pytest

from tensorplan.errors import TensorplanError
from tensorplan.ir.reference import random_feeds
from tensorplan.measure.timer import pinned_threads
from tensorplan.workflows.peers import (MAX_COV, Peer, cov, noise_reason, openvino_default_precision,
                                        peer_runners, runners_of, time_interleaved)
from tensorplan.zoo.specs import as_graph


@pytest.fixture(scope="module")
def cnn_peers():
    graph = as_graph("tiny-cnn")
    feeds = random_feeds(graph, seed=0)
    with pinned_threads(1):
        peers = peer_runners(graph, feeds, threads=1)
        timings = time_interleaved({"sleep-1ms": lambda: time.sleep(0.001), **runners_of(peers)}, rounds=4,
                                   peers=peers, burst_s=0.01)
    return graph, peers, timings


def test_every_fp32_peer_matches_onnx_runtime(cnn_peers):
    _, peers, _ = cnn_peers
    by = {p.name: p for p in peers}
    assert {"onnxruntime", "openvino", "torch.compile"} <= set(by)
    for p in peers:
        assert p.skipped is None, (p.name, p.skipped)
        assert p.runner is not None and p.build_s > 0
        if p.fp32:
            assert p.max_rel_error <= 1e-4, (p.name, p.max_rel_error)
    assert by["onnxruntime"].max_rel_error == 0.0
    # OpenVINO's default is timed beside only when it is not fp32 here, and says what it computes in
    default = openvino_default_precision()
    if default == "fp32":
        assert "openvino-default" not in by
    else:
        d = by["openvino-default"]
        assert d.precision == default and default in d.label and not d.fp32
        assert d.max_rel_error < 0.1        # bf16 rounding, not a different model


def test_interleaved_timings_have_rounds_medians_and_a_best_peer(cnn_peers):
    _, peers, t = cnn_peers
    assert set(t.runners) == {"sleep-1ms"} | set(runners_of(peers))
    for r in t.runners.values():
        assert len(r.rounds_ms) == t.rounds == 4 and r.median_ms > 0 and r.cov >= 0
        assert r.cov == pytest.approx(cov(r.rounds_ms))
    sleep = t.runners["sleep-1ms"]
    assert not sleep.peer and sleep.precision is None and sleep.median_ms >= 1.0
    best = t.best_peer()
    fp32 = [r for r in t.runners.values() if r.peer and r.precision == "fp32"]
    assert t.runners[best].median_ms == min(r.median_ms for r in fp32)
    assert t.speedup_over_best("sleep-1ms") == pytest.approx(t.runners[best].median_ms / sleep.median_ms)
    assert t.noisy == (t.noise_reason is not None) and t.cores >= 1 and t.load_before >= 0
    with pytest.raises(TensorplanError, match="not timed"):
        t.speedup_over("no-such-runtime", "sleep-1ms")


def test_a_peer_that_cannot_be_built_is_skipped_with_a_reason(tmp_path):
    from tensorplan import zoo
    graph = as_graph(str(zoo.export("tiny-mlp")))      # an ONNX file: no PyTorch module behind it
    feeds = random_feeds(graph, seed=0)
    with pinned_threads(1):
        peers = peer_runners(graph, feeds, threads=1, openvino=False)
        t = time_interleaved(runners_of(peers), rounds=2, peers=peers, burst_s=0.0)
    by = {p.name: p for p in peers}
    assert by["torch.compile"].runner is None and "ONNX file" in by["torch.compile"].skipped
    assert by["openvino"].skipped == "skipped (openvino=False)"
    assert set(t.runners) == {"onnxruntime"} and set(t.skipped) == {"torch.compile", "openvino"}
    assert t.best_peer() == "onnxruntime"


def test_noise_flag_from_rounds_and_load():
    quiet = {"a": [1.0, 1.01, 0.99, 1.0], "b": [2.0, 2.02, 1.98, 2.0]}
    assert noise_reason(quiet, load_before=0.5, load_after=1.9, cores=2) is None
    spread = {"a": [1.0, 1.01, 0.99, 1.0], "b": [1.0, 2.0, 1.0, 2.0]}    # CoV 1/3
    why = noise_reason(spread, 0.5, 0.5, cores=2)
    assert why is not None and "b CoV 33.3%" in why and "a CoV" not in why and "load" not in why
    loaded = noise_reason(quiet, load_before=0.5, load_after=2.5, cores=2)
    assert loaded is not None and "after 2.50" in loaded and "before" not in loaded and "CoV" not in loaded
    both = noise_reason(spread, 3.0, 3.0, cores=2)
    assert "CoV" in both and "before 3.00" in both and "after 3.00" in both
    # the threshold decides: a CoV of 10 % is noisy only under a lower limit
    edge = {"a": [0.9, 1.1]}
    assert cov(edge["a"]) == pytest.approx(0.10)
    assert noise_reason(edge, 0.0, 0.0, cores=2, max_cov=0.11) is None
    assert "a CoV 10.0%" in noise_reason(edge, 0.0, 0.0, cores=2, max_cov=0.09)


def test_time_interleaved_orders_fast_and_slow_work_and_flags_spread():
    t = time_interleaved({"fast": lambda: None, "slow": lambda: time.sleep(0.002)}, rounds=4, burst_s=0.01,
                         cores=10 ** 6)   # a load above a million cores cannot happen: only the rounds count
    assert t.runners["slow"].median_ms > 10 * t.runners["fast"].median_ms
    assert len(t.runners["slow"].rounds_ms) == 4 and "pause" in t.method
    assert t.best_peer() is None                  # no peers given: nothing to call the best baseline
    with pytest.raises(TensorplanError, match="no fp32 peer"):
        t.speedup_over_best("fast")
    calls = iter([0.001, 0.001, 0.02, 0.001, 0.02])      # a warm-up call, then one call per round
    jumpy = time_interleaved({"jumpy": lambda: time.sleep(next(calls, 0.001))}, rounds=4, burst_s=0.0,
                             cores=10 ** 6)
    assert jumpy.noisy == (jumpy.runners["jumpy"].cov > MAX_COV)
    assert jumpy.noisy and "jumpy CoV" in jumpy.noise_reason

