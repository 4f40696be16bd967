"""`predict(model, device) -> NetworkPrediction` (`tensorplan predict`), `--measure` and `tensorplan
calibrate`: predictions checked against kernels compiled and timed on this machine, and the predictor
calibrated to it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.predict import (DEFAULT, DEFAULT_TUNED, TUNED, KernelPrediction, NetworkPrediction,
                                      SchedulePrediction, local_threads, measured_summary, predict, usable_cores)


def _kernel(name, calls, pred_us, meas_us=None, sample=0, tuned=None, error=None):
    """A KernelPrediction with the default schedule at `pred_us` (measured `meas_us`); `tuned`:
    (sample, predicted µs, measured µs or None)."""
    k = KernelPrediction(name, name, calls, 1.0, 1,
                         SchedulePrediction(DEFAULT, sample, pred_us * 1e-6,
                                            measured_s=None if meas_us is None else meas_us * 1e-6,
                                            measure_error=error))
    if tuned is not None:
        k.tuned = SchedulePrediction(TUNED, tuned[0], tuned[1] * 1e-6, candidates=4,
                                     measured_s=None if tuned[2] is None else tuned[2] * 1e-6,
                                     measure_error="failed" if tuned[2] is None else None)
    return k


def test_measured_summary_weights_totals_by_calls_and_skips_unmeasured():
    ks = [_kernel("a", 2, 10.0, 20.0), _kernel("b", 1, 30.0, 30.0), _kernel("c", 1, 5.0, 4.0),
          _kernel("d", 3, 7.0, error="failed")]
    s = measured_summary(ks, threads=2)
    assert s.kernels_measured == 3 and s.kernels_failed == ["d"] and s.threads == 2
    assert s.predicted_s == pytest.approx((2 * 10 + 30 + 5) / 1e6)
    assert s.measured_s == pytest.approx((2 * 20 + 30 + 4) / 1e6)
    assert s.total_ratio == pytest.approx(55 / 74)
    assert s.per_kernel["mape_pct"] == pytest.approx(100 * (0.5 + 0 + 0.25) / 3)
    assert s.spearman_across_kernels == pytest.approx(1.0)
    d = s.to_dict()      # the JSON keeps the names earlier runs were written with
    assert d["measured_ms"] == pytest.approx(74 / 1e3) and d["kernels_failed"] == ["d"] and "tuned" not in d


def test_measured_summary_reports_the_tuned_picks_over_kernels_timed_both_ways():
    ks = [_kernel("a", 2, 10.0, 20.0, 0, (3, 5.0, 8.0)), _kernel("b", 1, 30.0, 30.0, 0, (0, 30.0, 30.0)),
          _kernel("c", 1, 5.0, 4.0, 1, (2, 4.0, None))]
    m = measured_summary(ks)
    t = m.tuned
    assert (t.kernels, t.changed, t.kernels_slower) == (2, 1, 0)
    assert t.predicted_s == pytest.approx((2 * 5 + 30) / 1e6)
    assert t.measured_s == pytest.approx((2 * 8 + 30) / 1e6)
    assert t.measured_speedup == pytest.approx((2 * 20 + 30) / (2 * 8 + 30))
    # the picks' own error, each kernel once (a: 5 vs 8 µs, b: 30 vs 30), and the whole-network ratio
    assert t.per_kernel["n"] == 2 and t.per_kernel["mape_pct"] == pytest.approx(100 * (3 / 8 + 0) / 2)
    assert t.total_ratio == pytest.approx(40 / 46) and m.counted is t
    d = m.to_dict()
    assert d["schedules"] == "default" and d["tuned"]["per_kernel"]["mape_pct"] == pytest.approx(18.75)
    assert d["tuned"]["total_ape_pct"] == pytest.approx(100 * 6 / 46)
    for k in ks:
        k.tuned.measured_s = None
    assert measured_summary(ks).tuned is None and measured_summary(ks).counted.per_kernel["n"] == 3


def test_predict_reports_tuned_picks_by_default_and_the_untuned_total_beside_them():
    """`predict` on this CPU: by default each kernel's first DEFAULT_TUNED samples are ranked by the
    model and the total sums the predicted-fastest (labelled tuned); the default schedule is each
    kernel's first candidate, so its prediction is the same as with `tuned=0` and the tuned total is
    never above the untuned one, which stays beside it. `tuned=0` gives the default schedules alone,
    and a Graph and a DeviceSpec are accepted as they are and give the same prediction."""
    from tensorplan.devices import resolve
    from tensorplan.zoo.specs import load_model

    p = predict("tiny-cnn", device="local")
    assert isinstance(p, NetworkPrediction) and p.domain == f"local-{usable_cores()}t" and p.kind == "cpu"
    assert len(p.kernels) >= 4 and p.tuned == DEFAULT_TUNED and p.total_is == TUNED and p.measured is None
    assert all(k.tuned.kind == TUNED and 1 <= k.tuned.candidates <= DEFAULT_TUNED and k.pick is k.tuned
               for k in p.kernels)
    assert any(k.tuned.candidates > 1 for k in p.kernels)
    assert all(k.tuned.predicted_s <= k.default.predicted_s * (1 + 1e-9) for k in p.kernels)
    assert p.total_s == pytest.approx(sum(k.calls * k.tuned.predicted_s for k in p.kernels)) and p.total_s > 0
    assert p.tuned_total_s == p.total_s and p.untuned_total_s == pytest.approx(sum(k.total_s for k in p.kernels))
    assert 0 < p.total_s <= p.untuned_total_s
    assert "predicted-fastest of its first 32" in p.what and "tuned kernels" in p.what and "untuned total" in p.what
    d = p.to_dict()
    assert d["total_is"] == TUNED and d["tuned"] == DEFAULT_TUNED and d["predicted"] == p.what
    assert d["total_ms"] == d["tuned_total_ms"] == pytest.approx(sum(k["tuned_total_us"] for k in d["kernels"]) / 1e3)
    assert d["untuned_total_ms"] == pytest.approx(sum(k["total_us"] for k in d["kernels"]) / 1e3)
    assert d["total_ms"] <= d["untuned_total_ms"] and json.loads(json.dumps(d)) == d

    u = predict("tiny-cnn", device="local", tuned=0)
    assert u.tuned == 0 and u.total_is == DEFAULT and u.tuned_total_s is None
    assert all(k.default.kind == DEFAULT and k.default.sample is not None and k.tuned is None and k.pick is k.default
               for k in u.kernels)
    assert "default schedule" in u.what and "untuned" in u.what and "predicted-fastest" not in u.what
    assert u.total_s == u.untuned_total_s == pytest.approx(sum(k.calls * k.predicted_s for k in u.kernels))
    # the default schedule is among the tuned candidates: the same draw, predicted the same
    assert [k.default.sample for k in u.kernels] == [k.default.sample for k in p.kernels]
    assert [k.default.predicted_s for k in u.kernels] == pytest.approx([k.default.predicted_s for k in p.kernels],
                                                                     rel=1e-5)
    assert u.total_s == pytest.approx(p.untuned_total_s, rel=1e-5)
    d = u.to_dict()
    assert d["total_is"] == DEFAULT and d["total_ms"] == pytest.approx(d["untuned_total_ms"])
    assert "tuned_total_ms" not in d and all(k["schedule"] == DEFAULT and "tuned_us" not in k for k in d["kernels"])
    g = predict(load_model("tiny-cnn"), device=resolve("local"), tuned=0)
    assert g.model == "tiny-cnn" and g.domain == p.domain
    assert [k.key for k in g.kernels] == [k.key for k in p.kernels]
    assert g.total_s == pytest.approx(u.total_s, rel=1e-5)


def test_the_picks_programs_are_the_ones_predicted(tmp_path):
    """Kernels are drawn and featurised in forked workers and their modules rebuilt from the draw
    (`scheduled_module`) to be timed or saved: the rebuilt program featurises to the very compact
    AST the model ranked, and an in-process run (`workers=1`) draws and featurises the same."""
    import numpy as np

    from tensorplan.cdmpp.features import compact_ast
    from tensorplan.cdmpp.predict import model_onnx, network_programs, resolve_device, scheduled_module

    path, name = model_onnx("tiny-cnn")
    spec, dom = resolve_device("local")
    tasks, _, progs, first, asts, _ = network_programs(path, name, dom, tuned=4, device=spec)
    serial = network_programs(path, name, dom, tuned=4, device=spec, workers=1)
    assert progs == serial[2] and first == serial[3]
    assert all(np.array_equal(a.leaf_features, b.leaf_features) for a, b in zip(asts, serial[4]))
    starts: dict = {}
    for j, sample in progs:                                              # each task's rows together, default first
        starts.setdefault(j, sample)
    assert [j for j, _ in progs] == sorted(j for j, _ in progs) and list(starts.values()) == first
    for row in (0, len(progs) - 1):
        j, sample = progs[row]
        again = compact_ast(scheduled_module(tasks[j], None, sample))
        np.testing.assert_array_equal(again.leaf_features, asts[row].leaf_features)


@pytest.mark.slow
def test_tuned_prediction_ranks_each_kernels_schedules_and_times_the_picks(tmp_path):
    """`predict --tuned N --measure`: every kernel's first N design-space schedules are predicted, the
    predicted-fastest is its pick (never predicted slower than the default, which is among them), and
    the picks are compiled and timed here next to the default schedules."""
    env = {**os.environ, "TENSORPLAN_CACHE": str(tmp_path / "cache")}
    r = _cli("predict", "tiny-cnn", "--device", "local-1t", "--shipped", "--tuned", "6", "--measure", "--json",
             "--save-schedules", str(tmp_path / "sched"), env=env)
    ks = r["kernels"]
    assert r["tuned"] == 6 and r["total_is"] == TUNED and all(1 <= k["candidates"] <= 6 for k in ks)
    assert any(k["candidates"] > 1 for k in ks)
    assert all(k["tuned_us"] <= k["predicted_us"] * (1 + 1e-9) for k in ks)
    assert r["tuned_total_ms"] == pytest.approx(sum(k["calls"] * k["tuned_us"] for k in ks) / 1e3)
    assert r["total_ms"] == r["tuned_total_ms"] <= r["untuned_total_ms"]
    t = r["measured"]["tuned"]
    assert t["kernels"] == r["n_kernels"] and t["measured_ms"] > 0 and t["measured_speedup"] > 0
    # the picks' per-kernel error and whole-network ratio, over the picks' own timings
    assert t["per_kernel"]["n"] == r["n_kernels"] and t["per_kernel"]["mape_pct"] >= 0
    assert t["measured_ms"] == pytest.approx(sum(k["calls"] * k["tuned_measured_us"] for k in ks) / 1e3)
    assert t["total_ratio"] == pytest.approx(r["total_ms"] / t["measured_ms"])
    for k in ks:
        assert k["tuned_measured_us"] > 0
        if k["tuned_sample"] == k["sample"]:
            assert k["tuned_measured_us"] == k["measured_us"]
    assert t["changed"] == sum(k["tuned_sample"] != k["sample"] for k in ks)
    # the picks saved as TVMScript: each parses and compiles, and the index names the picked sample
    import tvm
    index = json.loads((tmp_path / "sched" / "schedules.json").read_text())
    assert [e["kernel"] for e in index["kernels"]] == [k["task"] for k in ks]
    assert [e["sample"] for e in index["kernels"]] == [k["tuned_sample"] for k in ks]
    for e in index["kernels"][:2]:
        mod = tvm.script.from_source((tmp_path / "sched" / e["file"]).read_text())
        tvm.compile(mod, target="llvm")
    with pytest.raises(TensorplanError, match="tuned"):
        predict("tiny-mlp", tuned=-1)


def test_cli_predicts_tuned_by_default_and_untuned_on_request():
    """`tensorplan predict MODEL`: the tuned total (DEFAULT_TUNED schedules per kernel) is the headline
    and the table says so with the untuned total beside it; `--untuned` predicts the default schedules;
    `--untuned` with `--tuned N` is one usage error."""
    from typer.testing import CliRunner

    from tensorplan.cli import app

    r = CliRunner().invoke(app, ["predict", "tiny-mlp", "--shipped"])
    assert r.exit_code == 0, r.output[-2000:]
    out = " ".join(r.stdout.split())                 # rich wraps the title to the table's width
    assert f"tuned: the predicted-fastest of {DEFAULT_TUNED} schedules per kernel, none timed; untuned" in out
    assert "untuned total (default schedules, --untuned)" in out
    r = CliRunner().invoke(app, ["predict", "tiny-mlp", "--shipped", "--untuned", "--json"])
    assert r.exit_code == 0, r.output[-2000:]
    u = json.loads(r.stdout[r.stdout.index("{"):])
    assert u["tuned"] == 0 and u["total_is"] == DEFAULT and u["total_ms"] == pytest.approx(u["untuned_total_ms"])
    assert all(k["schedule"] == DEFAULT for k in u["kernels"])
    both = CliRunner().invoke(app, ["predict", "tiny-mlp", "--untuned", "--tuned", "4"])
    assert both.exit_code == 2 and "--untuned" in both.output and "Traceback" not in both.output


def test_measure_only_on_this_machines_domains():
    from tensorplan.devices import resolve

    assert local_threads("local-1t") == 1 and local_threads("local") == usable_cores()
    assert local_threads(resolve("local-1t")) == 1
    with pytest.raises(TensorplanError, match="'local' or 'local-<N>t', not 'zen4-1t'"):
        predict("tiny-mlp", device="zen4-1t", measure=True)
    with pytest.raises(TensorplanError, match="not 'epyc-9654'"):
        local_threads(resolve("epyc-9654"))
    with pytest.raises(TensorplanError, match="cannot time kernels at 512 threads"):
        local_threads("local-512t")


def _cli(*args, env):
    r = subprocess.run([sys.executable, "-m", "tensorplan", *args], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout[r.stdout.index("{"):])


@pytest.mark.slow
def test_calibrate_here_then_predict_with_measurement(tmp_path):
    """Real dataset programs compiled and timed here, a correction fitted, and `predict --device local`
    picks the calibration up; `--measure` times every kernel of the network. Each step runs in a fresh
    process, as a user runs it (TVM's thread pool is set up once per process)."""
    env = {**os.environ, "TENSORPLAN_CACHE": str(tmp_path / "cache")}
    # --force: installed even where the held-out check prefers the uncalibrated model (this host may
    # be the collection CPU's type, where it does: tests/test_calibrate.py)
    info = _cli("calibrate", "--threads", "1", "--tasks", "6", "--per-task", "4", "--force", "--json", env=env)
    assert info["n_selected"] == 24 and len(info["tasks"]) == 6 and info["installed"]
    h = info["held_out_tasks"]
    assert h["folds"] >= 2 and isinstance(h["calibration_better"], bool)
    assert len(info["samples"]["latency_s"]) == info["n_timed"]
    assert info["n_timed"] >= 8 and info["n_timed"] + sum(info["skipped"].values()) == 24
    assert info["here_vs_source_median_ratio"] > 0
    # the fitted correction is at least as good on its own samples as the uncorrected model
    assert info["calibrated_on_samples"]["mean_abs_log_ratio"] <= info["uncalibrated_on_samples"]["mean_abs_log_ratio"]
    assert os.path.exists(info["path"]) and "local" in os.path.basename(info["path"])

    r = _cli("predict", "tiny-mlp", "--device", "local-1t", "--measure", "--json", env=env)
    assert r["predictor"] == "Calibrated" and r["weights"] == info["path"]
    m = r["measured"]
    assert m["threads"] == 1 and m["kernels_measured"] == r["n_kernels"] >= 3 and not m["kernels_failed"]
    assert all(k["measured_us"] > 0 and k["measured_cov"] >= 0 for k in r["kernels"])
    assert m["measured_ms"] == pytest.approx(sum(k["calls"] * k["measured_us"] for k in r["kernels"]) / 1e3)
    assert m["total_ratio"] == pytest.approx(r["untuned_total_ms"] / m["measured_ms"])     # the default schedules
    assert m["tuned"]["total_ratio"] == pytest.approx(r["total_ms"] / m["tuned"]["measured_ms"])   # the picks
    # the largest kernel (a matmul of most of the FLOPs) takes longer than the smallest one
    big = max(r["kernels"], key=lambda k: k["flops"])
    small = min(r["kernels"], key=lambda k: k["flops"])
    assert big["measured_us"] > small["measured_us"]


def test_a_gpu_is_predicted_from_cuda_programs_with_the_shipped_h100_model():
    """`--device h100` schedules every kernel for the H100's CUDA target (no GPU needed) and predicts
    with the model trained on the H100's measured programs; a CPU-trained model is refused."""
    from tensorplan.cdmpp.predict import SHIPPED_GPU_MODEL
    from tensorplan.devices import resolve

    r = predict("tiny-cnn", device="h100")
    assert r.kind == "gpu" and r.trained_on == ["h100"] and r.warning is None and not r.zero_shot
    assert r.weights == str(SHIPPED_GPU_MODEL) and len(r.kernels) >= 4 and r.total_is == TUNED
    assert all(k.default.kind == DEFAULT and k.default.sample is not None and k.predicted_s > 0 for k in r.kernels)
    assert r.total_s == pytest.approx(sum(k.pick_total_s for k in r.kernels)) and r.total_s <= r.untuned_total_s
    with pytest.raises(TensorplanError, match="is a GPU, but .* was trained on CPU domains only"):
        predict("tiny-cnn", device="h100", weights=str(SHIPPED_GPU_MODEL.with_name("cdmpp-local.pt")))
    with pytest.raises(TensorplanError, match="no CUDA target tag"):
        predict("tiny-cnn", device="sd855-gpu")
    # the catalog's h100-sxm is the H100 the model learnt (same device vector): no zero-shot warning,
    # named or passed as its spec
    for dev in ("h100-sxm", resolve("h100-sxm")):
        sxm = predict("tiny-cnn", device=dev, tuned=0)
        assert sxm.same_device_as == "h100" and sxm.warning is None
        assert sxm.total_s == pytest.approx(r.untuned_total_s)
    pcie = predict("tiny-cnn", device="h100-pcie", tuned=0)
    assert pcie.same_device_as is None and pcie.zero_shot and "zero-shot" in pcie.warning
    # TVM has no H200 tag: the catalog schedules it as the H100 (same die), the programs it ran
    h200 = predict("tiny-cnn", device="h200", tuned=0)
    assert [k.key for k in h200.kernels] == [k.key for k in r.kernels]
    assert [k.default.sample for k in h200.kernels] == [k.default.sample for k in r.kernels]
    assert "zero-shot" in h200.warning and h200.total_s > 0


def test_big_convolutions_get_a_valid_cuda_schedule():
    """resnet-50's 3x3 convolutions need up to ~100 draws before the CUDA postprocessors accept one;
    with too few draws they fell back to the plain loop nest (no thread binding) and were predicted
    at 5-20 ms each."""
    r = predict("resnet-50", device="h100", tuned=0)
    assert r.unscheduled == []
    assert all(k.default.kind == DEFAULT for k in r.kernels)


def test_predictions_for_a_device_the_model_never_saw_say_so(tmp_path):
    import numpy as np

    from tensorplan.cdmpp.arrays import device_features
    from tensorplan.cdmpp.model import load_shipped
    r = predict("tiny-mlp", device="epyc-9654", tuned=0)
    assert r.kind == "cpu" and r.zero_shot and "never on 'epyc-9654'" in r.warning and "calibrate" in r.warning
    # the same domain name learnt with another machine's device vector is zero-shot too
    est = load_shipped()
    here = device_features("local-1t")
    for name, vec, warned in (("same", here, False), ("other", np.asarray(here) * 1.5, True)):
        est.domain_features_ = {"local-1t": list(map(float, vec))}
        p = est.save(tmp_path / f"{name}.pt")
        r = predict("tiny-mlp", device="local-1t", weights=str(p), tuned=0)
        assert (r.warning is not None and "learnt 'local-1t' on another machine" in r.warning) == warned
    # and it says which figures differ, in natural units, and that they lie outside what it learnt
    assert "peak_gflops" in r.warning and "mem_bw_gbs" in r.warning
    assert "outside every device the model learnt" in r.warning
    assert any(o.startswith("mem_bw_gbs") for o in r.outside_learnt)
    # a model that learnt this CPU as another domain (zen4-1t) predicts it in-domain: no warning
    est.domain_features_ = {"local-1t": list(map(float, np.asarray(here) * 1.5)), "zen4-1t": list(map(float, here))}
    r = predict("tiny-mlp", device="local-1t", weights=str(est.save(tmp_path / "both.pt")), tuned=0)
    assert r.warning is None and r.same_device_as == "zen4-1t" and not r.zero_shot


def test_device_feature_differences_name_the_figures_that_moved():
    from tensorplan.devices import resolve
    from tensorplan.devices.spec import feature_differences
    a = resolve("epyc-9654")
    b = resolve("epyc-9654")
    assert feature_differences(a.feature_vector(), b.feature_vector()) == []
    b.mem_bw_gbs = a.mem_bw_gbs / 2
    diff = feature_differences(a.feature_vector(), b.feature_vector())
    # bandwidth and the ridge point it sets move; nothing else does
    assert [d.split()[0] for d in diff] == ["mem_bw_gbs", "ridge_flop_per_byte"]
    old, new = (float(x) for x in diff[0].split()[1::2])
    assert old == pytest.approx(a.mem_bw_gbs, rel=5e-3) and new == pytest.approx(a.mem_bw_gbs / 2, rel=5e-3)  # 3 digits


def test_device_figures_outside_the_learnt_range_are_named():
    """A device between two learnt ones is interpolation (nothing named); one whose bandwidth lies
    below both is extrapolation, named with the learnt range; GPUs do not count for a CPU."""
    from tensorplan.devices import resolve
    from tensorplan.devices.spec import features_outside
    lo, hi, mid, below = (resolve("epyc-9654") for _ in range(4))
    lo.mem_bw_gbs, hi.mem_bw_gbs, mid.mem_bw_gbs, below.mem_bw_gbs = 100.0, 400.0, 200.0, 20.0
    learnt = [lo.feature_vector(), hi.feature_vector(), resolve("h100").feature_vector()]
    assert features_outside(learnt, mid.feature_vector()) == []
    out = features_outside(learnt, below.feature_vector())
    assert out[0].startswith("mem_bw_gbs 20 (learnt 100-400)")
    # a lower bandwidth raises the ridge point above the learnt ones too
    assert [o.split()[0] for o in out] == ["mem_bw_gbs", "ridge_flop_per_byte"]
    assert features_outside([resolve("h100").feature_vector()], below.feature_vector()) == []


def test_a_dynamic_model_needs_its_shapes_and_then_predicts_static_kernels(tmp_path):
    """A model exported with symbolic batch/height/width: without shapes, one error naming the input
    (not kernels with symbolic bounds predicted as ~0); with `input_shapes`, bigger inputs cost more."""
    import torch
    from torch import nn
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(8, 4)).eval()
    path = tmp_path / "dyn.onnx"
    torch.onnx.export(net, (torch.randn(1, 3, 32, 32),), str(path), dynamo=False, input_names=["img"],
                      output_names=["out"], dynamic_axes={"img": {0: "batch", 2: "h", 3: "w"}}, opset_version=17)
    with pytest.raises(TensorplanError, match="img.*symbolic dimension.*--input-shape"):
        predict(str(path))
    small = predict(str(path), input_shapes={"img": (1, 3, 32, 32)})
    big = predict(str(path), input_shapes={"img": (1, 3, 128, 128)})
    assert 0 < small.total_s < big.total_s
    assert len(small.kernels) >= 2 and not small.not_predicted


def test_a_corrupt_model_file_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    with pytest.raises(TensorplanError, match="bad.onnx: not a valid ONNX model"):
        predict(str(bad))
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(TensorplanError, match="empty.onnx: file is empty"):
        predict(str(empty))


def test_roofline_floor_terms():
    """The floor is max(FLOPs / peak, output bytes beyond all on-chip cache / bandwidth)."""
    import dataclasses

    from tensorplan.cdmpp.predict import cache_bytes, roofline_floor
    from tensorplan.devices import resolve

    spec = dataclasses.replace(resolve("h100"), peak_fp32_gflops=1000.0, mem_bw_gbs=100.0, l1_kb=0, l2_kb=1024,
                               l3_kb=0)
    assert cache_bytes(spec) == 1024 * 1024
    f = roofline_floor(spec, [2e9, 0.0, 0.0], [0.0, 1024 * 1024 + 1e8, 512.0])
    assert f == pytest.approx([2e-3, 1e-3, 0.0])
    assert roofline_floor(dataclasses.replace(spec, peak_fp32_gflops=0.0, mem_bw_gbs=0.0), [1e9], [1e12]) == [0.0]


def test_predictions_below_the_devices_roofline_floor_are_flagged(capsys):
    """A device whose peak and bandwidth are set absurdly low: every kernel's prediction is below
    its floor, and the object, the JSON and the CLI's output say so; on this CPU as it is, none is."""
    import dataclasses

    from tensorplan.cli.predict import _print_prediction
    from tensorplan.devices import resolve

    normal = predict("tiny-cnn", device="local")
    assert normal.floor_s is not None and 0 < normal.floor_s < normal.total_s
    assert all(k.floor_s is not None and not k.below_floor for k in normal.kernels)
    assert normal.below_floor == [] and not normal.total_below_floor and normal.floor_warning is None
    d = normal.to_dict()
    assert d["below_floor"] == [] and d["total_below_floor"] is False and d["floor_ms"] == pytest.approx(
        1e3 * normal.floor_s) and all(k["below_floor"] is False for k in d["kernels"])

    slow = dataclasses.replace(resolve("local"), name="slow-cpu", peak_fp32_gflops=1e-9, mem_bw_gbs=1e-9,
                               l1_kb=0.0, l2_kb=0.0, l3_kb=0.0)
    logs: list[str] = []
    p = predict("tiny-cnn", device=slow, log=logs.append, tuned=0)
    assert len(p.kernels) >= 4 and all(k.below_floor for k in p.kernels)
    assert p.below_floor == [k.name for k in p.kernels] and p.total_below_floor and p.total_s < p.floor_s
    assert f"{len(p.kernels)} of {len(p.kernels)} kernels predicted below the roofline floor" in p.floor_warning
    assert "the total too" in p.floor_warning
    assert any("below the roofline floor" in m for m in logs)
    d = json.loads(json.dumps(p.to_dict()))
    assert d["below_floor"] == p.below_floor and d["total_below_floor"] is True
    assert all(k["below_floor"] and k["floor_us"] > k["predicted_us"] for k in d["kernels"])
    def printed(pred):                          # rich wraps lines at the terminal width
        _print_prediction(pred, False)
        out = capsys.readouterr()
        return " ".join(out.out.split()), " ".join(out.err.split())

    out, err = printed(p)
    assert "predicted below the roofline floor" in err and "the total is below it too" in out
    assert f"{len(p.kernels)} kernel(s) predicted below it" in out
    out, err = printed(normal)
    assert "predicted below the roofline floor" not in err and "0 kernel(s) predicted below it" in out
