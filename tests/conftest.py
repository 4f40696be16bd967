"""Helpers several test files share: fixtures, plain functions (`from conftest import onnx_model`)
and the `gpu` marker's skip.

Why here: each was written again in several files (a small float ONNX model, its fissioned
primitive graph, ONNX Runtime's outputs, a close-enough check, a fixed roofline device, a temp
store or cache); one copy keeps their conventions (opset, IR version, tolerances) the same.
tensorplan is imported inside the helpers, so a test that needs none of them (test_layout's
source scan) does not import the package.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def pytest_runtest_setup(item):
    """The `gpu` marker (declared in pyproject.toml) skips its test where no CUDA GPU exists."""
    if item.get_closest_marker("gpu") is not None and not _has_cuda():
        pytest.skip("no CUDA GPU")


@functools.cache
def _has_cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def onnx_model(nodes, inputs: dict, outputs, inits: dict | None = None, opset: int = 17, *, name: str = "t",
               elem_type: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """A model of `nodes`: `inputs` maps names to shapes, `outputs` are names (ONNX Runtime infers
    their shapes), `inits` maps initializer names to arrays; one element type for inputs and outputs.
    IR version 9 (10 from opset 21), the newest the opset allows."""
    g = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info(k, elem_type, list(v)) for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, elem_type, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9 if opset < 21 else 10
    return m


def prim_graph(nodes, inputs: dict, outputs, inits: dict | None = None, opset: int = 17):
    """The fissioned primitive graph of `onnx_model(nodes, ...)`: what Korch's stages take."""
    from tensorplan.ir.onnx_import import import_onnx
    from tensorplan.korch.fission import fission
    return fission(import_onnx(onnx_model(nodes, inputs, outputs, inits, opset=opset))).graph


def ort_outputs(model: onnx.ModelProto | str | Path, feeds: dict) -> list[np.ndarray]:
    """ONNX Runtime's outputs (CPU, default session options) for a model or a model file, in the
    model's output order; feeds the model does not take are left out."""
    import onnxruntime as ort
    src = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    return sess.run(None, {k: v for k, v in feeds.items() if k in names})


def assert_close(got: dict, want: dict, tol: float, names=None, what: str = "") -> None:
    """Every output in `names` (default: all of `want`) within `tol` relative error
    (tensorplan's rel_error); the message names the output, the error and `what`."""
    from tensorplan.ir.reference import rel_error
    for k in want if names is None else names:
        err = rel_error(got[k], want[k])
        assert err <= tol, f"{what + ': ' if what else ''}{k}: rel error {err:.3g} > {tol:g}"


class FixedDevice:
    """Fixed roofline numbers, so analytical plans do not depend on this machine's measured peaks."""
    name, kind, peak_fp32_gflops, mem_bw_gbs = "fixed-cpu", "cpu", 100.0, 20.0

    def to_dict(self):
        return {"name": self.name, "kind": self.kind, "peak_fp32_gflops": self.peak_fp32_gflops,
                "mem_bw_gbs": self.mem_bw_gbs}


@pytest.fixture
def store(tmp_path):
    """A fresh measurement store in a temp dir, closed after the test."""
    from tensorplan.measure.store import Store
    s = Store(tmp_path / "s.sqlite")
    yield s
    s.close()


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch) -> Path:
    """An empty TENSORPLAN_CACHE for this test (zoo exports, device specs): nothing cached by an
    earlier run or test is seen, and nothing this test caches outlives it."""
    d = tmp_path / "cache"
    d.mkdir()
    monkeypatch.setenv("TENSORPLAN_CACHE", str(d))
    return d
