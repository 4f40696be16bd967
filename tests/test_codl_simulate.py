"""SoC simulator: determinism per seed, calibration anchors, system ordering."""
import pytest

from tensorplan.zoo.specs import load_model
from tensorplan.codl.simulate import SYSTEMS, calibrate, simulate


@pytest.fixture(scope="module")
def yolo():
    return load_model("yolov2")


def test_deterministic_with_seed(yolo):
    a = simulate(yolo, "sd855", "codl", seed=3)
    b = simulate(yolo, "sd855", "codl", seed=3)
    c = simulate(yolo, "sd855", "codl", seed=4)
    assert a.latency_s == b.latency_s and a.events == b.events
    assert a.latency_s != c.latency_s


def test_calibration_anchors_and_ordering(yolo):
    m = calibrate("sd855")
    cpu = simulate(yolo, m, "cpu", noise=False).latency_s * 1e3
    gpu = simulate(yolo, m, "gpu", noise=False).latency_s * 1e3
    assert cpu == pytest.approx(213.0, rel=0.02) and gpu == pytest.approx(169.31, rel=0.02)
    r = {s: simulate(yolo, m, s, seed=0).latency_s for s in SYSTEMS}
    assert r["ideal"] <= r["codl"] <= r["codl-nochain"] * 1.02
    assert r["codl"] < min(r["cpu"], r["gpu"], r["ulayer"])


def test_other_socs_load():
    for soc in ("sd865", "sd888", "kirin990"):
        assert calibrate(soc).cpu_rate > 0
    with pytest.raises(Exception):
        calibrate("nope")
