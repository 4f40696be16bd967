"""`tensorplan optimize` end to end on real small models: predicted costs, lazy measurement, race,
check against ONNX Runtime, artifacts; a second run on the same store re-times nothing it timed."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ort_outputs

pytestmark = pytest.mark.xdist_group("optimize")


def test_optimize_makes_a_verified_plan_measuring_only_part_and_a_second_run_times_nothing(tmp_path):
    import tensorplan as tp
    from tensorplan.runtime.plan import load_plan
    from tensorplan.workflows.optimize import OptimizeSummary

    store = tmp_path / "store.sqlite"
    out = tmp_path / "out"
    plan = tp.optimize("tiny-attention", budget_s=240, out_dir=out, store=store, peers=True, samples=8)
    s = OptimizeSummary.from_plan(plan)
    # checked against ONNX Runtime on the model as given
    assert s.max_rel_err is not None and s.max_rel_err <= s.tolerance
    assert s.reference
    # prediction priced everything; only part of it was compiled and timed
    assert s.unique_kernels > 0 and 0 < s.measured < s.unique_kernels
    assert s.iterations and s.stop in ("stable", "budget", "iterations")
    assert s.iterations[-1].unmeasured == 0 or s.stop != "stable"
    assert s.samples >= 1 and s.top_k == 3
    # timed against ONNX Runtime at least, interleaved, in this run
    assert s.measured_plan_ms > 0 and s.peers_ms.get("onnxruntime", 0) > 0
    assert s.best_peer in s.peers_ms and s.speedup_over_best > 0
    assert s.total_s < 240 * 1.5
    # artifacts: the plan (loads, verifies against its model), the report, the ONNX file when exact
    loaded = load_plan(out / "plan.json")
    loaded.check()
    assert OptimizeSummary.from_plan(loaded).measured == s.measured
    html = (out / "report.html").read_text()
    assert "tiny-attention" in html and "<img" in html
    if "onnx" in s.artifacts:    # one ONNX file computing what the model computes, in stock ONNX Runtime
        from tensorplan.ir.reference import random_feeds
        f = random_feeds(plan.model_graph(), seed=1)
        got = ort_outputs(s.artifacts["onnx"], f)
        want = ort_outputs(plan.reference_model()[1], f)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert np.allclose(a, b, rtol=1e-3, atol=1e-4)
        assert s.artifacts["onnx_runtime"] in ("onnxruntime", "openvino")
    else:                        # the plan itself is the artifact: it runs kernels ONNX Runtime does not
        assert any(k.backend != "ort" for k in plan.kernels)

    # the same model again on the same store, through the CLI: everything that decides is in the store
    from typer.testing import CliRunner

    from tensorplan.cli import app
    r = CliRunner().invoke(app, ["optimize", "tiny-attention", "--budget", "4m", "--samples", "8", "--no-peers",
                                 "--json"],
                           env={"TENSORPLAN_STORE": str(store)})
    assert r.exit_code == 0, r.output
    s2 = json.loads(r.stdout[r.stdout.index("{"):])
    # every kernel timed before comes from the store; the second run times only kernels its objective now
    # prefers (the plan-time model has the first run's plans to fit on) and the first run never chose
    assert s2["from_store"] >= s.measured
    assert s2["measured"] <= s.measured // 2, (s2["measured"], s.measured)
    assert s2["max_rel_err"] <= s2["tolerance"]


def test_parse_budget_reads_durations_and_refuses_nonsense():
    from tensorplan.errors import TensorplanError
    from tensorplan.workflows.optimize import parse_budget

    assert parse_budget("10m") == 600.0
    assert parse_budget("90s") == 90.0
    assert parse_budget("1h") == 3600.0
    assert parse_budget("45") == 45.0
    assert parse_budget(12) == 12.0
    for bad in ("0", "-5m", "ten minutes", "m", "inf"):
        with pytest.raises(TensorplanError, match="budget"):
            parse_budget(bad)


def test_optimize_refuses_a_device_it_cannot_measure_on(tmp_path):
    import tensorplan as tp
    from tensorplan.errors import TensorplanError

    # a GPU that is not this machine's: the message says where to run it and what works here
    with pytest.raises(TensorplanError, match=r"not this machine's.*--device cuda.*--price-only"):
        tp.optimize("tiny-mlp", device="h100", budget_s=30, store=tmp_path / "s.sqlite")
    with pytest.raises(TensorplanError, match="price a GPU's kernels"):
        tp.optimize("tiny-mlp", device="local", budget_s=30, store=tmp_path / "s.sqlite", price_only=True)


def test_cli_optimize_refuses_a_bad_budget_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from tensorplan.cli import app

    r = CliRunner().invoke(app, ["optimize", "tiny-mlp", "--budget", "0", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "budget" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["optimize", "--help"])
    assert r.exit_code == 0 and "--budget" in r.output
