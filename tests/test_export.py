"""`tensorplan export`: a plan or a model's exact rewrites as one ONNX file that stock ONNX Runtime
runs, checked against ONNX Runtime on the original model (real sessions, real rewrites) and timed
against it; the file says in its metadata what it is and how it was timed."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tensorplan.ir.reference import random_feeds, rel_error
from tensorplan.ir.to_onnx import ort_session, run_onnxruntime
from tensorplan.workflows.orchestrate import orchestrate
from tensorplan.workflows.export import export_onnx

from conftest import FixedDevice
from test_regions import RegionFriendlyCost


def _meta(path) -> dict:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


def test_model_export_applies_the_rewrites_and_matches_onnxruntime(tmp_path):
    from tensorplan.zoo.specs import load, resolve_model_path
    out = tmp_path / "yolox.onnx"
    res = export_onnx("yolox-nano", out, rounds=2)
    assert res.source == "model" and not res.exact and res.ok
    assert res.rewrites.get("focus_conv") == 1 and sum(res.rewrites.values()) >= 2
    assert res.gflop[1] < res.gflop[0]  # the Focus stem as one stride-2 conv does fewer FLOPs
    assert res.timing["original_ms"] > 0 and res.timing["exported_ms"] > 0 and res.timing["rounds"] == 2
    meta = _meta(out)
    assert json.loads(meta["tensorplan.rewrites"]) == res.rewrites
    from tensorplan.devices import usable_cores
    assert json.loads(meta["tensorplan.ort_session"])["intra_op_num_threads"] == usable_cores()  # the default
    # independently of the exporter's own check: the file is a drop-in replacement in ONNX Runtime
    g = load("yolox-nano")
    feeds = random_feeds(g, seed=3)
    want = run_onnxruntime(onnx.load(str(resolve_model_path("yolox-nano"))), feeds)
    got = run_onnxruntime(onnx.load(str(out)), feeds)
    assert list(got) == list(want)
    assert max(rel_error(got[k], want[k]) for k in want) <= 1e-4


def test_plan_of_one_region_exports_exactly_and_other_plans_say_what_is_left_out(tmp_path):
    region_plan = orchestrate("tiny-cnn", device=FixedDevice(), cost=RegionFriendlyCost())
    kernel_plan = orchestrate("tiny-cnn", device=FixedDevice(), cost="analytical")
    assert any(k.kind == "memory" for k in kernel_plan.kernels)  # TVM kernels: not in any ONNX file
    for name, plan in (("regions", region_plan), ("kernels", kernel_plan)):
        p = plan.save(tmp_path / f"{name}.plan.json")
        res = export_onnx(str(p), tmp_path / f"{name}.onnx", rounds=0)
        assert res.source == "plan" and res.kernels == len(plan.kernels) and res.ok and res.timing == {}
        non_ort = [k for k in plan.kernels if (k.backend or {"memory": "tvm"}.get(k.kind, "ort")) != "ort"]
        assert sum(res.outside_ort.values()) == len(non_ort)
        whole = len(plan.kernels) == 1 and plan.kernels[0].kind == "region"
        assert res.exact == (whole and not non_ort)
        assert json.loads(_meta(tmp_path / f"{name}.onnx")["tensorplan.exact"]) == res.exact
        if non_ort:
            assert "outside ONNX Runtime" in res.relation and "tensorplan run" in res.relation
    assert export_onnx(str(tmp_path / "kernels.plan.json"), tmp_path / "k.onnx", check=False,
                       rounds=0).outside_ort.get("tvm", 0) > 0


def test_the_check_can_fail_and_a_missing_plan_is_named(tmp_path):
    from tensorplan.errors import PlanError
    res = export_onnx("yolox-nano", tmp_path / "y.onnx", rounds=0, tol=1e-12)
    assert res.rewrites and res.max_rel_err > 1e-12 and not res.ok  # rewritten FP sums differ in the last bits
    with pytest.raises(PlanError, match="does not exist"):
        export_onnx(str(tmp_path / "missing.plan.json"), tmp_path / "m.onnx")


def test_cli_writes_a_file_that_runs_with_the_stored_session_options(tmp_path):
    from typer.testing import CliRunner

    from tensorplan.cli import app
    from tensorplan.zoo.specs import load
    out = tmp_path / "cnn.onnx"
    r = CliRunner().invoke(app, ["export", "tiny-cnn", "-o", str(out), "--rounds", "2", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["ok"] and d["path"] == str(out) and d["timing"]["speedup"] > 0
    opts = json.loads(_meta(out)["tensorplan.ort_session"])
    sess = ort_session(onnx.load(str(out)), threads=opts["intra_op_num_threads"])
    g = load("tiny-cnn")
    feeds = random_feeds(g, seed=0)
    outs = sess.run(None, {i.name: feeds[i.name] for i in sess.get_inputs()})
    assert len(outs) == len(g.outputs) and all(np.isfinite(o).all() for o in outs)
    bad = CliRunner().invoke(app, ["export", "yolox-nano", "-o", str(tmp_path / "y.onnx"), "--rounds", "0",
                                   "--tol", "1e-12", "--json"])
    assert bad.exit_code == 1
