"""bench/ort_profile.py: the convolution classes it reports and its activation timing probe."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ort_profile():
    spec = importlib.util.spec_from_file_location("ort_profile", ROOT / "bench" / "ort_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_conv_classes_from_a_real_profile(ort_profile):
    r = ort_profile.profile("tiny-cnn", rewritten=True, runs=3, threads=1, top=3)
    cls = r["conv_classes"]
    assert cls, "tiny-cnn has convolutions"
    for c in cls.values():
        assert c["nodes"] >= 1 and c["ms"] > 0 and c["gflop"] > 0
        assert 0.1 < c["gflops_per_s"] < 5000   # a real rate, not a unit slip
    assert sum(c["ms"] for c in cls.values()) <= r["by_op_ms"]["Conv"] + 1e-9


def test_activation_probe_swaps_silu_and_hardswish(ort_profile):
    from tensorplan.zoo.specs import load_model
    from tensorplan.rewrite import rewrite

    g = rewrite(load_model("yolox-nano")).graph
    probe, n = ort_profile.relu_for_activations(g)
    assert n["silu"] >= 90 and n["hardswish"] == 0
    ops = [x.op for x in probe.nodes]
    assert ops.count("Relu") == n["silu"]
    assert ops.count("Sigmoid") == sum(x.op == "Sigmoid" for x in g.nodes) - n["silu"]
    probe.validate()

    g = rewrite(load_model("efficientvit-b1")).graph
    probe, n = ort_profile.relu_for_activations(g)
    prod = probe.producers()
    assert n["hardswish"] >= 30
    assert not any(x.op == "HardSwish" and prod[x.inputs[0]].op == "Conv" for x in probe.nodes)
    probe.validate()


def test_silu_values_and_activation_pass_rates(ort_profile):
    from tensorplan.zoo.specs import load_model
    from tensorplan.rewrite import rewrite

    g = rewrite(load_model("yolox-nano")).graph
    shapes = ort_profile.silu_shapes(g)
    assert (1, 16, 208, 208) in shapes
    n = sum(int(np.prod(s)) for s in shapes)
    # yolox-nano at 416x416: the stem alone gives 16 x 208 x 208 SiLU values. The Relu probe swaps
    # the SiLUs on a convolution's output; the count also has those after the Add that
    # split_concat_conv leaves, so it is larger, but not by much
    assert n > 16 * 208 * 208
    probe, swapped = ort_profile.relu_for_activations(g)
    relu_vals = sum(int(np.prod(probe.tensors[x.inputs[0]].shape)) for x in probe.nodes if x.op == "Relu")
    assert relu_vals < n < 1.1 * relu_vals

    rate = ort_profile.activation_passes((1, 16, 32, 32), threads=1, rounds=2)
    assert set(rate) == {"relu", "quickgelu", "sigmoid_mul"}
    assert all(0.01 < r < 1000 for r in rate.values())   # values per second, in Gvalues/s
