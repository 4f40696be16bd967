"""The README's main job (`tensorplan demo`) on a tiny zoo model: import, reference vs ONNX
Runtime, per-op profile, orchestrated plan raced against ONNX Runtime."""
from __future__ import annotations

import json

import numpy as np
import pytest

from typer.testing import CliRunner

from tensorplan.cli import app
from tensorplan.workflows.demo import interleaved_medians, run_demo


def test_demo_plan_runs_and_agrees(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPLAN_STORE", str(tmp_path / "store.sqlite"))
    rep = run_demo("tiny-mlp")
    assert rep.agree and rep.max_rel_error <= 1e-4
    assert rep.nodes > 0 and rep.ort_median_ms > 0
    assert sum(o.count for o in rep.per_op) >= 1
    assert abs(sum(o.share for o in rep.per_op) - 1.0) < 1e-6
    p = rep.plan
    assert p.agree and p.kernels >= 1 and p.solver == "optimal"
    assert p.plan_median_ms > 0 and p.speedup_vs_ort == p.ort_median_ms / p.plan_median_ms
    # the data behind the report: every kernel, every interleaved round
    assert len(p.kernel_list) == p.kernels and all(k.predicted_us > 0 for k in p.kernel_list)
    assert sum(k.primitives for k in p.kernel_list) >= p.primitives
    assert len(p.rounds_ms["tensorplan"]) == len(p.rounds_ms["onnxruntime"]) >= 5
    assert np.median(p.rounds_ms["tensorplan"]) == pytest.approx(p.plan_median_ms)
    # torch.compile of the zoo module raced in the same rounds, on the same inputs
    tc = p.torch_compile
    assert tc.median_ms > 0 and tc.compile_s > 0
    assert len(p.rounds_ms["torch.compile"]) == len(p.rounds_ms["tensorplan"])
    assert tc.speedup == pytest.approx(tc.median_ms / p.plan_median_ms)
    from tensorplan.workflows.report import write_demo_report
    html = write_demo_report(rep, tmp_path / "r" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3          # rounds, per-op, kernels
    for k in p.kernel_list:
        assert f"<td>{k.id}</td>" in html
    assert f"{p.speedup_vs_ort:.2f}×" in html and "DISAGREE" not in html
    assert f"{tc.speedup:.2f}×</b> vs torch.compile" in html


def test_demo_without_a_torch_module_says_why(tmp_path, monkeypatch):
    from tensorplan import zoo
    monkeypatch.setenv("TENSORPLAN_STORE", str(tmp_path / "store.sqlite"))
    onnx_file = str(zoo.export("tiny-mlp"))
    p = run_demo(onnx_file, threads=1, save_plan=str(tmp_path / "out" / "mlp.plan.json")).plan
    assert p.agree and "torch.compile" not in p.rounds_ms
    assert "ONNX file" in p.torch_compile.skipped
    # the saved plan is the one that ran, and `tensorplan export` takes it
    from tensorplan.runtime.plan import Plan
    from tensorplan.workflows.export import export_onnx
    plan = Plan.load(p.saved)
    assert len(plan.kernels) == p.kernels and plan.source["model"] == onnx_file
    res = export_onnx(p.saved, tmp_path / "out" / "mlp.onnx", threads=1, rounds=0)
    assert res.ok and res.source == "plan" and res.kernels == p.kernels


def test_demo_cli_json_without_orchestration(tmp_path):
    res = CliRunner().invoke(app, ["demo", "tiny-cnn", "--no-orchestrate", "--json",
                                   "--report", str(tmp_path / "tiny.html")])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout[res.stdout.index("{"):])
    assert d["agree"] is True and d["plan"] is None and d["device"]["kind"] == "cpu"
    html = (tmp_path / "tiny.html").read_text()
    assert "Where ONNX Runtime spends its time" in html and "Plan vs ONNX Runtime" not in html


def test_interleaved_medians_orders_fast_and_slow_work():
    import time
    t = interleaved_medians({"fast": lambda: None, "slow": lambda: time.sleep(0.002)}, rounds=4,
                            burst_s=0.01)
    assert t["slow"].median_s > 10 * t["fast"].median_s
    assert len(t["slow"].repeats) == 4 and "pause" in t["slow"].method
