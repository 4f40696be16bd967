"""A PyTorch module as a model: `tp.from_torch` and `pkg.mod:factory` specs on every command."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from tensorplan.errors import ModelImportError
from tensorplan.zoo.from_torch import export_spec, from_torch, is_torch_spec
from tensorplan.zoo.specs import load, resolve_model
from tensorplan.ir.reference import run_reference

FACTORY = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)
            self.fc = nn.Linear(8, 4)

        def forward(self, image):
            x = nn.functional.silu(self.bn(self.conv(image)))
            return self.fc(x.mean((2, 3)))

    def build():
        torch.manual_seed(0)
        return Net(), torch.randn(1, 3, 16, 16)

    def not_a_pair():
        return Net()

    def broken():
        raise RuntimeError("no weights here")
""")


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 5)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, y):
        h = self.drop(torch.relu(self.a(x)))
        return h + y, h.sum(-1)


def test_from_torch_exports_what_torch_computes(tmp_cache):
    torch.manual_seed(0)
    m = Two().train()
    x, y = torch.randn(2, 6), torch.randn(2, 5)
    path = from_torch(m, (x, y), name="two")
    assert path.parent == tmp_cache / "torch" and path.name.startswith("two-")
    assert m.training, "the caller's train/eval mode is restored"
    g = load(path)
    assert g.inputs == ["x", "y"]                      # named after forward's parameters
    got = run_reference(g, {"x": x.numpy(), "y": y.numpy()})
    m.eval()
    with torch.no_grad():
        want = m(x, y)                                  # eval mode: dropout off, as exported
    for name, w in zip(g.outputs, want):
        np.testing.assert_allclose(got[name], w.numpy(), rtol=1e-5, atol=1e-6)
    assert from_torch(m, (x, y), name="two") == path    # same module, same file (content hash)


def test_factory_spec_from_a_file_and_a_package(tmp_cache, tmp_path, monkeypatch):
    src = tmp_path / "usernet.py"
    src.write_text(FACTORY)
    spec = f"{src}:build"
    assert is_torch_spec(spec) and is_torch_spec("usernet:build")
    assert not is_torch_spec("candy") and not is_torch_spec("model.onnx")
    path, name = resolve_model(spec)
    assert name == "build" and path.suffix == ".onnx"
    assert export_spec(spec) == path                    # exported once per process
    g = load(spec)
    assert g.name == "build" and g.inputs == ["image"]
    assert any(n.op == "Conv" for n in g.nodes) and not any(n.op == "BatchNormalization" for n in g.nodes)

    monkeypatch.chdir(tmp_path)                         # `pkg.mod:factory` imports from the working dir
    assert load("usernet:build").inputs == ["image"]


@pytest.mark.parametrize("attr, words", [("missing", "no callable 'missing'"),
                                         ("not_a_pair", "must return (module, example_inputs)"),
                                         ("broken", "factory raised RuntimeError: no weights here")])
def test_factory_errors_name_the_spec(tmp_cache, tmp_path, attr, words):
    src = tmp_path / "usernet.py"
    src.write_text(FACTORY)
    with pytest.raises(ModelImportError) as e:
        load(f"{src}:{attr}")
    assert f"{src}:{attr}" in str(e.value) and words in str(e.value)


def test_bad_inputs_and_forward_errors(tmp_cache):
    with pytest.raises(ModelImportError, match="expected a torch.Tensor"):
        from_torch(nn.Linear(3, 2), [np.zeros((1, 3))])
    with pytest.raises(ModelImportError, match="forward on the example inputs raised"):
        from_torch(nn.Linear(3, 2), torch.zeros(1, 4), name="wrong")
    with pytest.raises(ModelImportError, match="no such file"):
        load("/nonexistent/usernet.py:build")


def test_cli_inspect_takes_a_factory(tmp_cache, tmp_path):
    from tensorplan.cli import app

    src = tmp_path / "usernet.py"
    src.write_text(FACTORY)
    res = CliRunner().invoke(app, ["inspect", f"{src}:build", "--check", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["model"] == f"{src}:build" and out["check"]["passed"]
