"""No code from data files (issue 60): a predictor file, whether given to `predict --weights`, to
`Estimator.load` or found as this CPU's cached calibration, is read with
`torch.load(weights_only=True)` and only ever rebuilds tensorplan's own estimators. A file crafted
to run code when unpickled is one clear error, and the code never runs."""
from __future__ import annotations

import fractions
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp import base
from tensorplan.cdmpp.base import Estimator, load_estimator


class _OpenPayload:
    """Unpickling this creates `marker` (calls builtins.open)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


class _ExecPayload:
    """Unpickling this runs Python code that writes `marker`."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


class _SystemPayload:
    """Unpickling this runs a shell command that creates `marker` (os.system)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


PAYLOADS = [_OpenPayload, _ExecPayload, _SystemPayload]


def _evil_file(path: Path, payload, where: str) -> Path:
    """A file that looks like a tensorplan model (format, class, params, state) with the payload
    in its state or at the top level, saved with torch.save as a model would be."""
    blob = {"format": base.FORMAT, "class": "RooflineLinear", "module": "tensorplan.cdmpp.baselines",
            "params": {}, "state": {"w": [0.0, 1.0, 0.0, 0.0]}}
    if where == "state":
        blob["state"]["w"] = payload
    else:
        blob = payload
    torch.save(blob, path)
    return path


@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: p.__name__)
def test_the_payloads_do_run_code_when_unpickled(tmp_path, payload):
    """The crafted files are real exploits: loading one the old way (weights_only=False) runs it."""
    marker = tmp_path / "marker"
    path = _evil_file(tmp_path / "evil.pt", payload(marker), "state")
    torch.load(path, weights_only=False)
    assert marker.exists()


@pytest.mark.parametrize("where", ["state", "top"])
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: p.__name__)
def test_estimator_load_refuses_a_weights_file_that_runs_code(tmp_path, payload, where):
    marker = tmp_path / "marker"
    path = _evil_file(tmp_path / "evil.pt", payload(marker), where)
    for load in (load_estimator, Estimator.load):
        with pytest.raises(TensorplanError, match="evil.pt' was not loaded: it holds pickled Python objects") as e:
            load(path)
        assert "never unpickled" in str(e.value) and "tensorplan predictor train" in str(e.value)
        assert not marker.exists()


def test_predict_weights_refuses_a_weights_file_that_runs_code(tmp_path):
    """`predict(weights=...)` and the CLI's `predict --weights`: one clear error (exit 2, no
    traceback), and the payload never runs."""
    from tensorplan.cdmpp.predict import predict

    marker = tmp_path / "marker"
    path = _evil_file(tmp_path / "evil.pt", _ExecPayload(marker), "state")
    with pytest.raises(TensorplanError, match="was not loaded: it holds pickled Python objects"):
        predict("tiny-mlp", device="local", weights=path)
    assert not marker.exists()
    r = subprocess.run([sys.executable, "-m", "tensorplan", "predict", "tiny-mlp", "--weights", str(path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and "was not loaded" in r.stderr
    assert not marker.exists()


def test_a_cached_calibration_that_runs_code_is_refused(tmp_path, monkeypatch):
    """The per-CPU calibration `predict(device="local")` picks up from the cache: a crafted file
    there is one clear error naming it and what to do, and runs nothing."""
    from tensorplan.cdmpp import predict as P

    marker = tmp_path / "marker"
    cached = _evil_file(tmp_path / "cdmpp-local-this-cpu-2t.pt", _SystemPayload(marker), "state")
    monkeypatch.setattr(P, "local_model_path", lambda threads: cached)
    with pytest.raises(TensorplanError, match="this CPU's calibration .* could not be used: .*was not loaded.*"
                                              "Rerun `tensorplan calibrate`"):
        P.predict("tiny-mlp", device="local")
    assert not marker.exists()
    assert P.predict("tiny-mlp", device="local", calibrated=False).total_s > 0   # the shipped model still works


def test_local_calibrate_saves_a_file_that_loads_as_data(tmp_path):
    """What `tensorplan calibrate` saves (a `Calibrated` around the shipped model, its XGBoost
    correction as UBJSON bytes) loads with weights_only=True and holds no pickled class."""
    from tensorplan.cdmpp.calibrate import Calibrated
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.arrays import as_arrays
    from tensorplan.cdmpp.baselines import RooflineLinear

    arr = as_arrays(load_dataset(None).only_devices(["local-1t"]))
    arr = arr.subset(np.arange(0, len(arr), max(1, len(arr) // 400)))
    src = RooflineLinear().fit(arr)
    cal = Calibrated(src, source="local-1t", n_rounds=5).fit(arr)
    path = cal.save(tmp_path / "cal.pt")
    blob = torch.load(path, weights_only=True)
    assert isinstance(blob["state"]["booster"], bytes) and blob["format"] == base.FORMAT
    back = load_estimator(path)
    np.testing.assert_allclose(back.predict(arr), cal.predict(arr), rtol=1e-6)


@pytest.mark.parametrize("cls_name,module", [("Popen", "subprocess"), ("Plan", "tensorplan.runtime.plan"),
                                             ("Estimator", "tensorplan.cdmpp.base")])
def test_a_file_naming_a_class_outside_the_registry_is_refused(tmp_path, cls_name, module):
    """Only tensorplan's registered estimators are built from a file, and only their own modules
    (`base._DEFINED_IN`) are imported: a file naming another class (in or outside tensorplan)
    is one clear error, and the module it names is not imported."""
    path = tmp_path / "other.pt"
    torch.save({"format": base.FORMAT, "class": cls_name, "module": module, "params": {"args": ["id"]},
                "state": {}}, path)
    code = ("import sys; from tensorplan.cdmpp.base import load_estimator\n"
            "try:\n    load_estimator(sys.argv[1])\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            f"print('imported' if {module!r} in sys.modules else 'not imported')")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    out = r.stdout
    if cls_name == "Estimator":     # the abstract base: registered by no subclass hook, so unknown
        assert "TensorplanError" in out and "unknown model class Estimator" in out
    else:
        assert f"TensorplanError" in out and f"unknown model class {cls_name} (the file says it is defined in {module})" in out
        if module != "subprocess":       # the interpreter imports subprocess itself at start-up on some platforms
            assert "not imported" in out
    with pytest.raises(TensorplanError, match=f"unknown model class {cls_name}"):
        load_estimator(path)


def test_a_pickled_foreign_class_is_refused(tmp_path):
    """A pickled instance of any class (here a harmless `fractions.Fraction`) is not rebuilt."""
    path = tmp_path / "frac.pt"
    torch.save({"format": base.FORMAT, "class": "RooflineLinear", "params": {},
                "state": {"w": fractions.Fraction(1, 3)}}, path)
    with pytest.raises(TensorplanError, match="was not loaded: it holds pickled Python objects.*GLOBAL fractions.Fraction"):
        load_estimator(path)


class NumpyStateModel(Estimator):
    """A test estimator whose state holds numpy values and other plain values."""

    def __init__(self, k: int = 1):
        self.k = k
        self.st = None

    def fit(self, train, val=None, target=None):
        return self

    def predict(self, records):
        return np.zeros(0)

    def _state(self):
        return self.st

    def _set_state(self, st):
        self.st = st


def test_numpy_state_is_saved_as_tensors_and_restored_as_arrays(tmp_path):
    m = NumpyStateModel(3)
    m.st = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.int64(7), "f": np.float64(0.25),
            "b": np.bool_(True), "t": (1, "x"), "raw": b"\x00\x01", "nested": [{"z": np.ones(2, np.int16)}],
            "none": None}
    path = m.save(tmp_path / "m.pt")
    blob = torch.load(path, weights_only=True)            # plain data: loads without any allowance
    assert isinstance(blob["state"]["a"]["__ndarray__"], torch.Tensor)
    back = load_estimator(path)
    st = back.st
    assert isinstance(st["a"], np.ndarray) and st["a"].dtype == np.float32 and st["a"].tolist() == m.st["a"].tolist()
    assert st["i"] == 7 and type(st["i"]) is int and st["f"] == 0.25 and st["b"] is True
    assert st["t"] == (1, "x") and st["raw"] == b"\x00\x01" and st["none"] is None
    assert st["nested"][0]["z"].dtype == np.int16 and back.k == 3
    m.st = {"bad": fractions.Fraction(1, 2)}
    with pytest.raises(TensorplanError, match="state/bad is a fractions.Fraction"):
        m.save(tmp_path / "bad.pt")


def test_an_old_format_file_with_numpy_values_loads_through_the_numpy_allowance(tmp_path):
    """A format-/1 file written before numpy values were converted (numpy arrays and scalars pickled
    as such) loads: numpy's array and scalar constructors are allowed, nothing else."""
    m = NumpyStateModel(2)
    m.st = {"ok": 1}
    path = m.save(tmp_path / "old.pt")
    blob = torch.load(path, weights_only=True)
    blob["format"] = "tensorplan-estimator/1"
    blob["state"] = {"a": np.arange(4, dtype=np.float64), "s": np.float32(1.5)}
    torch.save(blob, path)
    with pytest.raises(Exception):
        torch.load(path, weights_only=True)          # needs numpy globals
    back = load_estimator(path)
    assert back.st["a"].tolist() == [0.0, 1.0, 2.0, 3.0] and float(back.st["s"]) == 1.5


def test_shipped_weights_are_data_only():
    """Both shipped predictors load with weights_only=True, in the current format."""
    from tensorplan.cdmpp.model import WEIGHTS_DIR

    for name in ("cdmpp-local.pt", "cdmpp-h100.pt"):
        blob = torch.load(WEIGHTS_DIR / name, weights_only=True)
        assert blob["format"] == base.FORMAT and blob["class"] == "Ensemble"
