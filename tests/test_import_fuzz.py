"""Fuzz the importer with truncated and byte-mutated versions of a real model's bytes.

Whatever the bytes, `import_onnx` either returns a valid Graph or raises a
`TensorplanError` (never a raw exception from protobuf, onnx or numpy)."""
from __future__ import annotations

import functools
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorplan.errors import TensorplanError
from tensorplan.ir.onnx_import import import_onnx


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        y = y.reshape(y.shape[0], -1)
        return torch.softmax(self.fc(y), -1)


@functools.lru_cache(maxsize=1)
def model_bytes() -> bytes:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = Path(d) / "small.onnx"
        torch.onnx.export(Small().eval(), (torch.randn(1, 3, 8, 8),), str(p), opset_version=13,
                          dynamo=False, input_names=["x"], output_names=["y"],
                          do_constant_folding=False)
        return p.read_bytes()


_DIR = tempfile.mkdtemp(prefix="tp_fuzz_")


def _try_import(data: bytes) -> str | None:
    """The TensorplanError message if the bytes are rejected, None if they import to a valid graph;
    any other exception propagates (and fails the test)."""
    p = Path(_DIR) / "fuzz.onnx"
    p.write_bytes(data)
    try:
        g = import_onnx(p)
    except TensorplanError as e:
        return str(e)
    g.validate()  # if it imports, it is a well-formed static graph
    return None


def test_original_bytes_import():
    g = import_onnx(_write(model_bytes()))
    assert g.tensors["y"].shape == (1, 5)


def _write(data: bytes) -> Path:
    p = Path(_DIR) / "orig.onnx"
    p.write_bytes(data)
    return p


FUZZ = settings(max_examples=200, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(cut=st.integers(min_value=0, max_value=10**9))
def test_truncated_bytes_raise_only_tensorplan_errors(cut):
    data = model_bytes()
    msg = _try_import(data[: cut % len(data)])
    assert msg is None or msg.strip(), "rejected with an empty error message"


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_bytes_raise_only_tensorplan_errors(edits):
    data = bytearray(model_bytes())
    for pos, val in edits:
        data[pos % len(data)] = val
    msg = _try_import(bytes(data))
    assert msg is None or msg.strip(), "rejected with an empty error message"


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=4),
       head=st.integers(0, 400))
def test_mutations_in_structure_raise_only_tensorplan_errors(edits, head):
    """Mutate only outside the big weight blob, where the graph structure lives."""
    data = bytearray(model_bytes())
    # the structure (nodes, attributes, shapes) is mostly in the first and last few hundred bytes
    n = len(data)
    for pos, val in edits:
        idx = pos % (2 * 400)
        idx = idx if idx < 400 else n - 1 - (idx - 400)
        data[(idx + head) % n] = val
    msg = _try_import(bytes(data))
    assert msg is None or msg.strip(), "rejected with an empty error message"


def test_fuzz_model_is_small():
    assert len(model_bytes()) < 20_000
    assert np.frombuffer(model_bytes()[:4], np.uint8).size == 4
