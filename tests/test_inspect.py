"""`tensorplan inspect` through typer's CliRunner (and the real entry point for errors)."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
from onnx import helper
from typer.testing import CliRunner

from conftest import onnx_model
from tensorplan.cli import app

runner = CliRunner()


def _tiny_model(path, dynamic=False, unsupported=False):
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((16, 8)).astype(np.float32), "b": rng.standard_normal((8,)).astype(np.float32),
             "s": np.array([-1, 4, 4], np.int64), "sc": np.ones(3, np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("Softmax", ["r"], ["y"], name="sm", axis=-1)]
    outputs = ["y"]
    if unsupported:   # Det: ONNX Runtime runs it; Upsample (gone after opset 9): nobody does
        nodes.append(helper.make_node("Det", ["sq"], ["d"], name="det"))
        nodes.append(helper.make_node("Upsample", ["sq", "sc"], ["u"], name="ups"))
        outputs.append("u")
        nodes.insert(0, helper.make_node("Reshape", ["x", "s"], ["sq"], name="rs"))
        outputs.append("d")
    shape = ["batch", 16] if dynamic else [2, 16]
    onnx.save(onnx_model(nodes, {"x": shape}, outputs, inits, name="tiny"), str(path))
    return path


def test_inspect_json_check(tmp_path):
    p = _tiny_model(tmp_path / "tiny.onnx", dynamic=True)
    res = runner.invoke(app, ["inspect", str(p), "--input-shape", "x=3,16", "--json", "--check"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["inputs"]["x"]["shape"] == [3, 16]
    assert rep["outputs"]["y"]["shape"] == [3, 8]
    assert rep["ops"]["MatMul"] == {"count": 1, "flops": 2 * 3 * 16 * 8, "bytes": 4 * (48 + 128 + 24)}
    assert rep["parameters"] == 16 * 8 + 8
    assert rep["flops"] == sum(r["flops"] for r in rep["ops"].values())
    assert rep["unsupported"] == [] and rep["opset"] == 17
    assert rep["check"]["passed"] is True and rep["check"]["max_rel_error"] <= 1e-4
    assert set(rep["check"]["rel_errors"]) == {"y"}


def test_inspect_table_output(tmp_path):
    p = _tiny_model(tmp_path / "tiny.onnx")
    res = runner.invoke(app, ["inspect", str(p), "--check"])
    assert res.exit_code == 0, res.output
    assert "MatMul" in res.output and "PASS" in res.output and "opset 17" in res.output


def test_inspect_reports_unsupported_instead_of_failing(tmp_path):
    p = _tiny_model(tmp_path / "tiny.onnx", unsupported=True)
    res = runner.invoke(app, ["inspect", str(p), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["unsupported"] == [{"node": "ups", "op": "Upsample", "domain": ""}]
    assert rep["foreign"] == [{"node": "det", "op": "Det", "domain": ""}]
    res = runner.invoke(app, ["inspect", str(p), "--check"])
    assert res.exit_code == 1 and "Upsample" in res.output and "skipped" in res.output
    assert "run in ONNX Runtime" in " ".join(res.output.split()) and "Det" in res.output


def test_inspect_zoo_name():
    res = runner.invoke(app, ["inspect", "tiny-mlp", "--opset", "11", "--json", "--check"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.output)
    assert rep["opset"] == 11 and rep["check"]["passed"]


def test_inspect_errors_are_one_line_without_traceback(tmp_path):
    p = _tiny_model(tmp_path / "dyn.onnx", dynamic=True)
    cmd = [sys.executable, "-c", "from tensorplan.cli import main; main()", "inspect", str(p)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "'x'" in res.stderr and "batch" in res.stderr and "--input-shape" in res.stderr
    bad = subprocess.run(cmd[:-1] + [str(tmp_path / "nope.onnx")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "no such file" in bad.stderr
