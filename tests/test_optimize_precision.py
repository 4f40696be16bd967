"""`tensorplan optimize --precision`: the reduced-precision search on a real zoo model (tiny-mlp, a
classifier head), end to end through the CLI and the API: every (backend, precision) tried is
recorded with its measured accuracy, the kept plan stays within the tolerance, a tolerance of 0 keeps
fp32, random calibration warns, a bad calibration directory is one clear error, and the plan reloads
and runs."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytestmark = pytest.mark.xdist_group("optimize")

MODEL = "tiny-mlp"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("precision") / "store.sqlite"


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory, store):
    """`tensorplan optimize tiny-mlp --precision auto --json` once (random calibration, peers on)."""
    from typer.testing import CliRunner

    from tensorplan.cli import app
    out = tmp_path_factory.mktemp("auto") / "out"
    r = CliRunner().invoke(app, ["optimize", MODEL, "--precision", "auto", "--tolerance", "0.02", "--budget", "60s",
                                 "--samples", "4", "--no-race", "-o", str(out), "--json"],
                           env={"TENSORPLAN_STORE": str(store)})
    assert r.exit_code == 0, r.output
    return r, out, json.loads(r.stdout)   # stdout holds the JSON alone (the quantizers are quiet)


def test_auto_records_every_variant_with_its_accuracy_and_keeps_the_plan_within_tolerance(auto_run):
    from tensorplan.kernels.vendor import BACKEND_PRECISIONS
    from tensorplan.precision.native import native_precisions
    from tensorplan.runtime.plan import load_plan
    from tensorplan.workflows.optimize import OptimizeSummary

    r, out, js = auto_run
    p = js["precision"]
    native = [k for k, s in native_precisions().items() if s.may_gain]
    assert p["requested"] == "auto" and p["tolerance"] == 0.02
    assert p["precisions"] == native and "fp32" in native        # auto = what may beat fp32 on this CPU
    assert p["kernels"] and p["variants"]
    # every (backend, precision) a backend builds was tried on every searched kernel, and recorded
    for kid in p["kernels"]:
        tried = {(v["backend"], v["precision"]) for v in p["variants"] if v["kernel"] == kid}
        want = {(b, q) for q in native for b in ("openvino", "ort", "torch") if q in BACKEND_PRECISIONS[b]}
        assert want <= tried, want - tried
    ran = [v for v in p["variants"] if v["accuracy"] is not None]
    assert any(v["precision"] != "fp32" for v in ran)             # reduced precisions were measured ...
    for v in ran:                                                 # ... each with its accuracy and its time
        a = v["accuracy"]
        assert a["samples"] == 8 and a["top1_agreement"] is not None     # tiny-mlp ends in a softmax over classes
        assert v["median_ms"] > 0
        assert v["status"] in ("baseline", "kept", "within", "over tolerance")
        assert (v["status"] == "over tolerance") == (not (a["finite"] and a["error"] <= 0.02))
    for v in p["variants"]:
        if v["accuracy"] is None:
            assert v["status"] in ("not built", "fell back", "failed", "budget") and (v["note"] or
                                                                                    v["status"] == "budget")
    # the kept plan: its kernels carry their precisions, as the search chose them, within the tolerance
    plan = load_plan(out / "plan.json")
    plan.check()
    raw = json.loads((out / "plan.json").read_text())
    assert all(k["precision"] in ("fp32", "bf16", "fp16", "int8") for k in raw["kernels"])
    for kid, choice in p["chosen"].items():
        k = plan.kernel(kid)
        assert choice == f"{k.backend}/{k.precision}"
    kept = [v for v in p["variants"] if v["status"] == "kept"]
    assert {(v["kernel"], f"{v['backend']}/{v['precision']}") for v in kept} <= set(p["chosen"].items())
    assert p["final"]["error"] <= 0.02 and p["final"]["samples"] == 8
    assert js["max_rel_err"] <= js["tolerance"]
    # the summary reads back from the plan as objects
    s = OptimizeSummary.from_plan(plan)
    assert s.precision is not None and s.precision.final.within(0.02)
    assert len(s.precision.variants) == len(p["variants"])
    # beside the fp32 peers, the runtimes' own int8 builds were timed (or say why not)
    assert "onnxruntime-int8" in js["peers_ms"] or "onnxruntime-int8" in js["peer_notes"]
    # the report shows accuracy beside speed; the CLI said the calibration was random
    html = (out / "report.html").read_text()
    assert "Precisions tried" in html and "cosine" in html and "random inputs" in html
    assert "random inputs measure numerical drift" in r.stderr
    # the plan reloads and runs, checked against ONNX Runtime at the plan's own tolerance
    res = plan.run(repeats=3)
    assert res.ok and res.max_rel_err <= max(res.tol, 0.02)
    assert sum(res.precisions.values()) == len(plan.kernels)


def test_a_tolerance_of_zero_keeps_fp32_on_real_calibration_data(tmp_path, store):
    import tensorplan as tp
    from tensorplan.workflows.optimize import OptimizeSummary

    cal = tmp_path / "cal"
    cal.mkdir()
    rng = np.random.default_rng(7)
    for i in range(3):    # one .npz per sample holding every input
        np.savez(cal / f"s{i}.npz", input=rng.standard_normal((4, 64)).astype(np.float32))
    with _no_random_warning():
        plan = tp.optimize(MODEL, budget_s=40, store=store, samples=4, race=False, peers=False, precision="int8",
                           tolerance=0.0, calibration=cal)
    s = OptimizeSummary.from_plan(plan)
    assert all(k.precision == "fp32" for k in plan.kernels)
    p = s.precision
    assert p.precisions == ["fp32", "int8"] and p.samples == 3 and p.calibration_warning is None
    assert str(cal) in p.calibration
    assert not p.reduced and not [v for v in p.variants if v.status == "kept" and v.precision != "fp32"]
    int8 = [v for v in p.variants if v.precision == "int8" and v.accuracy is not None]
    assert int8 and all(v.status == "over tolerance" and v.accuracy.error > 0 for v in int8)
    assert s.max_rel_err <= s.tolerance <= 1e-3     # an fp32 plan is checked at fp32's tolerance


class _no_random_warning:
    """Fails the block if it warns that calibration inputs were random."""

    def __enter__(self):
        import warnings
        self._cm = warnings.catch_warnings(record=True)
        self.seen = self._cm.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._cm.__exit__(*exc)
        assert not [w for w in self.seen if "random inputs" in str(w.message)]
        return False


def test_random_calibration_warns_through_the_api(store):
    import tensorplan as tp
    from tensorplan.workflows.optimize import OptimizeSummary

    with pytest.warns(UserWarning, match="random inputs measure numerical drift"):
        plan = tp.optimize(MODEL, budget_s=30, store=store, samples=4, race=False, peers=False, precision="bf16",
                           tolerance=0.05)
    p = OptimizeSummary.from_plan(plan).precision
    assert p.calibration_warning and "random" in p.calibration
    assert p.precisions == ["fp32", "bf16"]


def test_bad_calibration_and_precision_arguments_are_one_clear_error(tmp_path):
    from typer.testing import CliRunner

    from tensorplan.cli import app
    run = CliRunner().invoke
    missing = tmp_path / "nope"
    r = run(app, ["optimize", MODEL, "--precision", "auto", "--calibration", str(missing), "--budget", "30s"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "calibration directory" in r.output and "does not exist" in r.output
    bad = tmp_path / "bad"
    bad.mkdir()
    np.savez(bad / "s0.npz", wrong_name=np.zeros((4, 64), np.float32))
    r = run(app, ["optimize", MODEL, "--precision", "int8", "--calibration", str(bad), "--budget", "30s"])
    assert r.exit_code == 2 and "Traceback" not in r.output and "s0.npz" in r.output and "input" in r.output
    r = run(app, ["optimize", MODEL, "--calibration", str(bad), "--budget", "30s"])     # fp32 uses no calibration
    assert r.exit_code == 2 and "--precision" in r.output and "Traceback" not in r.output
    for args in (["--precision", "fp8"], ["--precision", "auto", "--tolerance", "-1"]):
        r = run(app, ["optimize", MODEL, *args])
        assert r.exit_code == 2 and "Traceback" not in r.output
    r = run(app, ["optimize", "--help"])
    assert r.exit_code == 0 and "--precision" in r.output and "--tolerance" in r.output and "--calibration" in r.output


def test_precision_arguments_are_checked_in_the_api():
    from tensorplan.errors import TensorplanError
    from tensorplan.workflows.precision_search import check_arguments, precisions_to_try

    for bad in (("int4", 0.02), ("auto", -0.1), ("auto", math.nan), ("auto", "lots")):
        with pytest.raises(TensorplanError, match="precision|tolerance"):
            check_arguments(*bad)
    tried, native, _ = precisions_to_try("auto")
    assert tried[0] == "fp32" and set(native) == {"fp32", "bf16", "fp16", "int8"}
    assert precisions_to_try("fp32")[0] == ["fp32"]
    tried, native, warn = precisions_to_try("fp16")
    assert tried == ["fp32", "fp16"]
    assert bool(warn) == native["fp16"].startswith("emulated")   # an emulated precision says so
    # a CPU with AVX2 and no bf16/fp16/VNNI units (Zen 3): auto measures int8 (16-bit multiply-adds may
    # still beat fp32), never the emulated bf16/fp16
    from tensorplan.devices import device
    tried, native, warn = precisions_to_try("auto", device("epyc-7763"))
    assert tried == ["fp32", "int8"] and not warn
    assert native["int8"].startswith("emulated via 16-bit multiply-adds")


def _three_alike_layers(path):
    """An MLP whose three hidden layers compute the same (64x64 MatMul + Relu, their own weights), as a
    file: the repeated block a plan holds several times (BERT's layers)."""
    import onnx
    from onnx import helper

    from conftest import onnx_model
    rng = np.random.default_rng(0)
    nodes, inits, x = [], {}, "x"
    for i in range(3):
        inits[f"w{i}"] = (rng.standard_normal((64, 64)) / 8).astype(np.float32)
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"mm{i}"),
                  helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    inits["wo"] = (rng.standard_normal((64, 10)) / 8).astype(np.float32)
    nodes.append(helper.make_node("MatMul", [x, "wo"], ["logits"], name="head"))
    onnx.save(onnx_model(nodes, {"x": (8, 64)}, ["logits"], inits), str(path))
    return path


def test_alike_kernels_are_decided_together_and_a_kept_int8_plan_saves_and_runs(tmp_path, monkeypatch):
    """The search's keep path on real kernels: only ONNX Runtime offered and any gain accepted, so the
    plan's ONNX Runtime kernels come back int8 (within a loose tolerance), the three alike layers in one
    decision; the kept plan is rebuilt from its data and checked, and saves its quantized models beside
    plan.json, from which it reloads and runs."""
    import tensorplan as tp
    from tensorplan.precision.calibration import load_calibration
    from tensorplan.runtime.plan import load_plan
    from tensorplan.workflows import precision_search as ps

    model = _three_alike_layers(tmp_path / "mlp3.onnx")
    plan = tp.orchestrate(str(model), cost="analytical", race=False, store=tmp_path / "s.sqlite", threads=2)
    layers = [k.id for k in plan.ordered_kernels() if k.nodes[0].startswith("mm")]
    assert len(layers) == 3 and [layers] == [g for g in ps.kernels_to_search(plan) if len(g) == 3 and
                                             plan.kernel(g[0]).kind == "linear"]
    monkeypatch.setattr(ps, "BACKENDS", ("ort",))
    monkeypatch.setattr(ps, "MIN_GAIN", -1e9)      # keep the fastest variant within the tolerance, even if slower
    cal = load_calibration(plan.model_graph(), None, count=4)
    kept, rec = ps.search_precision(plan, cal, precision="int8", tolerance=0.5, threads=2, rounds=2)
    int8 = {k.id for k in kept.kernels if k.precision == "int8"}
    ort = {k for k in rec.kernels if plan.kernel(k).backend == "ort"}
    assert set(layers) < ort <= int8 and set(rec.reduced) == int8
    assert all(rec.chosen[k] == "ort/int8" for k in int8)
    grouped = [v for v in rec.variants if v.kernel == layers[0]]
    assert grouped and all(v.alike == layers[1:] and v.label == f"{layers[0]} +2" for v in grouped)
    assert not [v for v in rec.variants if v.kernel in layers[1:]]            # one decision for the three
    assert [v.status for v in grouped if v.precision == "int8"] == ["kept"]
    assert rec.final is not None and rec.final.within(0.5) and rec.final.error > 0     # int8 is not exact
    assert rec.final_ms is not None and rec.baseline_ms is not None
    assert kept.options["tolerance"] == 0.5 and kept.stats["precision"]["chosen"] == rec.chosen
    assert all(k.precision == "fp32" for k in plan.kernels)    # the fp32 plan is left as it was
    path = kept.save(tmp_path / "plan" / "plan.json")
    assert len(list(path.parent.glob("*.int8.onnx"))) == len(int8)
    again = load_plan(path)
    assert {k.id for k in again.kernels if k.precision == "int8"} == int8
    res = again.run(repeats=3)
    assert res.ok and res.precisions.get("int8") == len(int8)
