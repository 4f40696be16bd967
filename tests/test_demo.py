"""The README's main job (`tensorplan demo`) on a tiny zoo model: import, reference vs ONNX
Runtime, per-op profile, orchestrated plan raced against every peer (ONNX Runtime, OpenVINO,
torch.compile) in one interleaved run."""
from __future__ import annotations

import json

import numpy as np
import pytest

from typer.testing import CliRunner

from tensorplan.cli import app
from tensorplan.workflows.demo import run_demo


def test_demo_plan_runs_and_agrees(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORPLAN_STORE", str(tmp_path / "store.sqlite"))
    rep = run_demo("tiny-mlp", rounds=6)
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
    assert len(p.rounds_ms["tensorplan"]) == len(p.rounds_ms["onnxruntime"]) == 6 == p.peers.rounds
    assert np.median(p.rounds_ms["tensorplan"]) == pytest.approx(p.plan_median_ms)
    # torch.compile of the zoo module raced in the same rounds, on the same inputs
    tc = p.torch_compile
    assert tc.median_ms > 0 and tc.compile_s > 0
    assert len(p.rounds_ms["torch.compile"]) == len(p.rounds_ms["tensorplan"])
    assert tc.speedup == pytest.approx(tc.median_ms / p.plan_median_ms)
    # every peer in the same run: ORT, OpenVINO fp32, torch.compile (+ OpenVINO's default, labelled)
    peers = {n for n, t in p.peers.runners.items() if t.peer}
    assert {"onnxruntime", "openvino", "torch.compile"} <= peers and set(p.peer_medians_ms) == peers
    assert all(len(p.rounds_ms[n]) == len(p.rounds_ms["tensorplan"]) for n in peers)
    fp32 = {n: p.peer_medians_ms[n] for n in peers if p.peers.runners[n].precision == "fp32"}
    assert p.best_peer == min(fp32, key=fp32.get) and p.best_peer_median_ms == min(fp32.values())
    assert p.speedup_vs_best == pytest.approx(p.best_peer_median_ms / p.plan_median_ms)
    assert p.speedup_vs_best <= p.speedup_vs_ort * (1 + 1e-12)   # the best peer is at least as fast as ORT
    assert p.noisy == (p.noise_reason is not None)
    for n in fp32:                                                # a wrong peer would be visible here
        assert p.peers.runners[n].max_rel_error <= 1e-4, (n, p.peers.runners[n].max_rel_error)
    from tensorplan.workflows.report import write_demo_report
    html = write_demo_report(rep, tmp_path / "r" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3          # rounds, per-op, kernels
    for k in p.kernel_list:
        assert f"<td>{k.id}</td>" in html
    assert f"{p.speedup_vs_ort:.2f}×" in html and "DISAGREE" not in html
    assert f"{p.speedup_vs_best:.2f}×</b> vs the best fp32 peer" in html
    assert ("Noisy run" in html) == p.noisy and ("Quiet run" in html) != p.noisy
    for n in peers:
        assert f"<td>{p.peers.runners[n].label}" in html
    bf16 = [t for t in p.peers.runners.values() if t.peer and t.precision != "fp32"]
    for t in bf16:                                                # labelled with what it computes in
        assert t.precision in t.label and "beside, not a baseline" in html
    # one ONNX Runtime figure per page: the interleaved one, not also the separate measurement
    assert f"{rep.ort_median_ms:.3f} ms (CoV" not in html
    # what `--json` prints: the peers' rounds and the flags, as plain data
    d = json.loads(json.dumps(rep.to_dict(), default=str))["plan"]
    assert d["best_peer"] == p.best_peer and d["noisy"] == p.noisy and d["peer_medians_ms"] == p.peer_medians_ms
    assert all(len(r["rounds_ms"]) == d["peers"]["rounds"] for r in d["peers"]["runners"].values())
    # what the terminal shows: every peer, the headline, the noise flag with its reason
    from rich.console import Console
    from tensorplan.cli.demo import _print
    con = Console(record=True, width=2000)
    _print(con, rep)
    out = con.export_text()
    assert f"{p.speedup_vs_best:.2f}× vs the best fp32 peer ({p.best_peer}" in out
    assert all(p.peers.runners[n].label in out for n in peers)
    assert ("NOISY RUN" in out) == p.noisy and (not p.noisy or p.noise_reason in out)


def test_demo_without_a_torch_module_says_why(tmp_path, monkeypatch):
    from tensorplan import zoo
    monkeypatch.setenv("TENSORPLAN_STORE", str(tmp_path / "store.sqlite"))
    onnx_file = str(zoo.export("tiny-mlp"))
    p = run_demo(onnx_file, threads=1, save_plan=str(tmp_path / "out" / "mlp.plan.json"), rounds=4).plan
    assert p.agree and "torch.compile" not in p.rounds_ms
    assert "ONNX file" in p.torch_compile.skipped and "ONNX file" in p.peers.skipped["torch.compile"]
    assert p.best_peer in p.peer_medians_ms and "onnxruntime" in p.peer_medians_ms
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
    assert "Where ONNX Runtime spends its time" in html and "Plan vs the runtimes" not in html
