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


def test_simulate_workflow_compares_every_system(yolo, tmp_path):
    """`workflows.coexec.simulate` (what `tensorplan coexec --simulate` runs) returns one object:
    each system's simulated latency, CoDL's speedup over it, a timeline and the JSON form."""
    from tensorplan.workflows.coexec import SimulationResult
    from tensorplan.workflows.coexec import simulate as simulate_model

    r = simulate_model(yolo, "sd855", seed=3)
    assert isinstance(r, SimulationResult) and r.model == "yolov2" and r.soc == "sd855"
    assert list(r.systems) == list(SYSTEMS)
    assert r.latency_s("codl") == simulate(yolo, "sd855", "codl", seed=3).latency_s
    assert r.speedup("codl") == 1.0 and r.speedup("cpu") > 1
    d = r.to_dict()
    assert d["systems"]["codl"]["latency_ms"] == pytest.approx(r.latency_s() * 1e3) and "simulated" in d["note"]
    assert r.save_timeline(tmp_path / "t.png").stat().st_size > 1000
    only = simulate_model("yolov2", "sd855", systems=["gpu"])
    assert list(only.systems) == ["gpu", "codl"]
    with pytest.raises(Exception, match="unknown system"):
        simulate_model(yolo, "sd855", systems=["npu"])
