"""tensorplan.precision on real data: calibration files read and checked, accuracy of real reduced-precision
outputs (OpenVINO bf16, ONNX Runtime and OpenVINO int8 of a zoo CNN) against fp32, which precisions this
CPU runs natively (asserted from its own /proc/cpuinfo flags), `tensorplan devices` saying so, and the
opt-in int8 peers."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from conftest import onnx_model
from tensorplan.errors import CompileError, TensorplanError
from tensorplan.precision import (PRECISIONS, RANDOM_WARNING, Accuracy, CalibrationSet, check_precision, compare,
                                  load_calibration, native_precisions, openvino_int8, ort_int8)
from tensorplan.precision.calibration import file_stem


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


FLAGS = _cpu_flags()


# ---- shared real model: the zoo's MobileNet-V2 (a classifier, [1, 1000] logits) ------------------------
@pytest.fixture(scope="module")
def mnv2():
    """(graph, ONNX proto, 4 calibration samples, ONNX Runtime fp32 outputs per sample)."""
    import onnxruntime as ort

    from tensorplan.zoo.specs import load, onnx_bytes
    g = load("mobilenet-v2")
    proto = onnx.load_model_from_string(onnx_bytes(g, 17))
    cal = load_calibration(g, None, count=4)
    ref = _ort_outputs(ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]),
                       cal.feeds)
    return g, proto, cal, ref


def _ort_outputs(sess, feeds):
    names = [o.name for o in sess.get_outputs()]
    return [dict(zip(names, sess.run(None, f))) for f in feeds]


def _ov_outputs(model, feeds, hint: str | None, names):
    """OpenVINO on the CPU (2 threads, `hint` as INFERENCE_PRECISION_HINT or its default), outputs by name."""
    import openvino as ov
    core = ov.Core()
    if isinstance(model, onnx.ModelProto):
        model = core.read_model(model.SerializeToString(), b"")
    cfg = {"INFERENCE_NUM_THREADS": 2, **({"INFERENCE_PRECISION_HINT": hint} if hint else {})}
    compiled = core.compile_model(model, "CPU", cfg)
    out = []
    for f in feeds:
        r = compiled(f)
        out.append({n: np.array(r[compiled.output(n)]) for n in names})
    return out, str(compiled.get_property("INFERENCE_PRECISION_HINT"))


# ---- calibration -------------------------------------------------------------------------------------
def _two_input_graph():
    """A real two-input model (one input name with a '/', as exporters write them): Add then Relu."""
    from tensorplan.ir.onnx_import import import_onnx
    m = onnx_model([helper.make_node("Add", ["enc/x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["out"])],
                   {"enc/x": (1, 3, 4), "y": (1, 3, 4)}, ["out"])
    return import_onnx(m)


def test_calibration_npz_per_sample(tmp_path, mnv2):
    g = mnv2[0]
    rng = np.random.default_rng(1)
    shape = g.tensors["input"].shape
    samples = [rng.standard_normal(shape).astype(np.float64) for _ in range(3)]   # float64 is cast to float32
    for i, s in enumerate(samples):
        np.savez(tmp_path / f"s{i}.npz", input=s)
    cal = load_calibration(g, tmp_path)
    assert isinstance(cal, CalibrationSet) and len(cal) == 3 and cal.warning is None
    assert "3 samples" in cal.source and ".npz" in cal.source
    for got, want in zip(cal.feeds, samples):
        assert got["input"].dtype == np.float32 and got["input"].shape == shape
        np.testing.assert_allclose(got["input"], want.astype(np.float32))


def test_calibration_npy_per_input_with_sample_axis(tmp_path):
    g = _two_input_graph()
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((5, 1, 3, 4), dtype=np.float32), rng.standard_normal((5, 1, 3, 4), dtype=np.float32)
    assert file_stem("enc/x") == "enc_x"
    np.save(tmp_path / "enc_x.npy", x)
    np.save(tmp_path / "y.npy", y)
    cal = load_calibration(g, tmp_path)
    assert len(cal) == 5 and cal.warning is None and ".npy per input" in cal.source
    for i, f in enumerate(cal.feeds):
        assert set(f) == {"enc/x", "y"}
        np.testing.assert_array_equal(f["enc/x"], x[i])
        np.testing.assert_array_equal(f["y"], y[i])


@pytest.mark.parametrize("case, words", [
    ("wrong_name", ["bad.npz", "lacks input 'input'", "array 'image'"]),
    ("wrong_shape", ["bad.npz", "'input'", "(3, 224, 224)", "[1, 3, 224, 224]"]),
    ("wrong_dtype", ["bad.npz", "'input'", "uint8", "float32"]),
    ("nan", ["bad.npz", "'input'", "NaN"]),
    ("not_npz", ["bad.npz", "not a readable .npz"]),
])
def test_calibration_bad_npz_names_file_and_input(tmp_path, mnv2, case, words):
    g = mnv2[0]
    shape = g.tensors["input"].shape
    good = np.zeros(shape, np.float32)
    if case == "wrong_name":
        np.savez(tmp_path / "bad.npz", image=good)
    elif case == "wrong_shape":
        np.savez(tmp_path / "bad.npz", input=good[0])
    elif case == "wrong_dtype":
        np.savez(tmp_path / "bad.npz", input=np.zeros(shape, np.uint8))
    elif case == "nan":
        bad = good.copy()
        bad[0, 0, 0, 0] = np.nan
        np.savez(tmp_path / "bad.npz", input=bad)
    else:
        (tmp_path / "bad.npz").write_bytes(b"this is no zip archive")
    with pytest.raises(TensorplanError) as e:
        load_calibration(g, tmp_path)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_calibration_bad_npy_dirs(tmp_path):
    g = _two_input_graph()
    a = np.zeros((4, 1, 3, 4), np.float32)
    np.save(tmp_path / "enc_x.npy", a)
    with pytest.raises(TensorplanError, match=r"lacks y.npy \(input 'y'\);"):
        load_calibration(g, tmp_path)
    np.save(tmp_path / "y.npy", a[:3])
    with pytest.raises(TensorplanError, match="different sample counts"):
        load_calibration(g, tmp_path)
    np.save(tmp_path / "y.npy", a[:, 0])          # no sample axis: shape (4, 3, 4)
    with pytest.raises(TensorplanError, match=r"y.npy' has shape \(4, 3, 4\) but input 'y' is \[1, 3, 4\]"):
        load_calibration(g, tmp_path)
    np.savez(tmp_path / "mixed.npz", y=a[0])
    with pytest.raises(TensorplanError, match="both .npz"):
        load_calibration(g, tmp_path)
    with pytest.raises(TensorplanError, match="does not exist"):
        load_calibration(g, tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TensorplanError, match="holds no .npz or .npy"):
        load_calibration(g, tmp_path / "empty")


def test_calibration_random_warns_and_is_reproducible(mnv2):
    from tensorplan.ir.reference import random_feeds
    g = mnv2[0]
    cal = load_calibration(g, None, count=3, seed=5)
    assert len(cal) == 3 and cal.warning == RANDOM_WARNING
    assert "numerical drift, not task accuracy" in cal.warning and "--calibration DIR" in cal.warning
    assert "random" in cal.source
    np.testing.assert_array_equal(cal.feeds[1]["input"], random_feeds(g, seed=6)["input"])
    assert not np.array_equal(cal.feeds[0]["input"], cal.feeds[1]["input"])


# ---- accuracy ----------------------------------------------------------------------------------------
def test_accuracy_of_openvino_bf16_against_fp32(mnv2):
    _, proto, cal, ref = mnv2
    names = list(ref[0])
    f32, f32_hint = _ov_outputs(proto, cal.feeds, "f32", names)
    bf16, bf16_hint = _ov_outputs(proto, cal.feeds, "bf16", names)
    same = compare(ref, ref)
    assert same.error == 0 and same.cosine == pytest.approx(1.0) and same.top1_agreement == 1.0 and same.samples == 4
    a32 = compare(ref, f32)
    assert a32.error < 1e-4 and a32.within(1e-3)
    acc = compare(ref, bf16)
    assert isinstance(acc, Accuracy) and acc.samples == 4
    # the definition: max over samples/outputs of max|out-ref| / max|ref|
    want = max(float(np.abs(o[n] - r[n]).max() / np.abs(r[n]).max()) for o, r in zip(bf16, ref) for n in names)
    assert acc.error == pytest.approx(want, rel=1e-6)
    assert acc.max_abs == pytest.approx(max(float(np.abs(o[n] - r[n]).max()) for o, r in zip(bf16, ref)
                                            for n in names), rel=1e-6)
    assert acc.top1_agreement is not None and 0.0 <= acc.top1_agreement <= 1.0   # [1, 1000] logits
    assert acc.within(0.2) and 0.99 < acc.cosine <= 1.0 + 1e-9
    if native_precisions()["bf16"].native:
        assert "bfloat16" in bf16_hint and "float32" in f32_hint
        assert acc.error > a32.error and acc.error > 1e-4         # bf16 really computed in bf16
        assert not acc.within(1e-6)                               # an absurd tolerance fails
    d = acc.to_dict()
    assert d["finite"] and set(d) >= {"error", "max_abs", "max_rel", "cosine", "top1_agreement", "samples"}


def test_accuracy_nan_and_mismatches():
    ref = [{"y": np.array([[1.0, 2.0, 3.0]], np.float32), "f": np.ones((1, 2, 2, 2), np.float32)}]
    bad = [{"y": np.array([[1.0, np.nan, 3.0]], np.float32), "f": np.ones((1, 2, 2, 2), np.float32)}]
    acc = compare(ref, bad)
    assert math.isinf(acc.error) and not acc.within(1e9)
    d = acc.to_dict()
    assert d["error"] is None and d["finite"] is False
    json.dumps(d, allow_nan=False)                           # strict JSON
    back = Accuracy.from_dict(json.loads(json.dumps(d)))
    assert math.isinf(back.error) and not back.within(1e9) and back.samples == 1
    good = compare(ref, ref)
    assert Accuracy.from_dict(good.to_dict()) == good
    with pytest.raises(TensorplanError, match=r"lacks field\(s\) \['cosine'"):
        Accuracy.from_dict({"error": 0.0, "max_abs": 0.0, "max_rel": 0.0, "samples": 1})
    only_f = compare([{"f": ref[0]["f"]}], [{"f": ref[0]["f"] * 1.01}])
    assert only_f.top1_agreement is None and only_f.error == pytest.approx(0.01, rel=1e-5)
    with pytest.raises(TensorplanError, match="'y' of sample 0 has shape"):
        compare(ref, [{"y": np.zeros((1, 4), np.float32), "f": ref[0]["f"]}])
    with pytest.raises(TensorplanError, match="same named outputs"):
        compare(ref, [{"y": ref[0]["y"]}])
    with pytest.raises(TensorplanError, match="2 output samples vs 1"):
        compare(ref, ref + ref)


# ---- int8 --------------------------------------------------------------------------------------------
def test_ort_int8_runs_within_loose_error(mnv2):
    import onnxruntime as ort
    _, proto, cal, ref = mnv2
    before = proto.SerializeToString()
    q = ort_int8(proto, cal.feeds)
    assert proto.SerializeToString() == before                  # the caller's model is untouched
    ops = {n.op_type for n in q.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops         # QDQ format
    conv_w = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and
              any(a.name == "axis" for a in n.attribute)]
    assert conv_w, "weights are quantized per channel (DequantizeLinear with an axis)"
    out = _ort_outputs(ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]), cal.feeds)
    acc = compare(ref, out)
    assert acc.within(0.1) and acc.error > 1e-5 and acc.cosine > 0.99, acc.short()
    assert not acc.within(1e-6)


def test_openvino_int8_runs_within_loose_error(mnv2):
    _, proto, cal, ref = mnv2
    qm = openvino_int8(proto, cal.feeds)
    assert "FakeQuantize" in {op.get_type_name() for op in qm.get_ops()}
    out, _ = _ov_outputs(qm, cal.feeds, None, list(ref[0]))
    acc = compare(ref, out)
    assert acc.within(0.1) and acc.error > 1e-5 and acc.cosine > 0.99, acc.short()
    assert not acc.within(1e-6)


def test_int8_bad_calibration_is_one_compile_error(mnv2):
    _, proto, cal, _ = mnv2
    with pytest.raises(CompileError, match="no calibration samples"):
        ort_int8(proto, [])
    with pytest.raises(CompileError, match=r"sample 0 lacks input\(s\) \['input'\]"):
        openvino_int8(proto, [{"image": cal.feeds[0]["input"]}])
    with pytest.raises(CompileError, match="calibration method 'entropy'"):
        ort_int8(proto, cal.feeds, method="entropy")


# ---- native precisions -------------------------------------------------------------------------------
def test_native_precisions_on_this_cpu():
    ps = native_precisions()
    assert tuple(ps) == PRECISIONS and ps["fp32"].native
    if FLAGS & {"amx_bf16", "avx512_bf16"}:
        assert ps["bf16"].native and check_precision("bf16") is None
        assert ps["bf16"].via.startswith("AMX-BF16" if "amx_bf16" in FLAGS else "AVX512-BF16")
    elif "flags" in Path("/proc/cpuinfo").read_text():
        assert not ps["bf16"].native
        assert "emulated and slower" in check_precision("bf16")
    if FLAGS & {"amx_int8", "avx512_vnni", "avx_vnni"}:
        assert ps["int8"].native and ("VNNI" in ps["int8"].via or "AMX-INT8" in ps["int8"].via)
    if "f16c" in FLAGS and not FLAGS & {"avx512_fp16", "amx_fp16"}:
        assert not ps["fp16"].native and "F16C" in ps["fp16"].via
        assert "converted to fp32" in check_precision("fp16")
    with pytest.raises(TensorplanError, match="'int4' is not one of fp32, bf16, fp16, int8"):
        check_precision("int4")


def test_predictor_device_features_carry_bf16():
    """The shipped predictor's device features (fixed ISA_FLAGS) set isa_bf16 on a CPU with bf16 units
    (this AMD Zen 4 has AVX512-BF16), without measuring anything."""
    from tensorplan.devices import FEATURE_NAMES, DeviceSpec, cpu_info
    info = cpu_info()
    assert set(info["precision_flags"]) <= FLAGS
    spec = DeviceSpec(name="local", kind="cpu", cores=info["cores"], threads=info["threads"],
                      clock_ghz=info["clock_ghz"], peak_fp32_gflops=100.0, mem_bw_gbs=20.0, isa=info["isa"],
                      extra={"precision_flags": info["precision_flags"]})
    v = spec.feature_vector()
    bf16 = v[FEATURE_NAMES.index("isa_bf16")]
    assert bf16 == (1.0 if "avx512_bf16" in FLAGS or "bf16" in FLAGS else 0.0)
    if "avx512_bf16" in FLAGS:
        assert bf16 == 1.0 and native_precisions(spec)["bf16"].native


def test_native_precisions_of_other_devices():
    from tensorplan.devices import DeviceSpec, device
    # a Sapphire Rapids Xeon's /proc/cpuinfo precision flags (AMX tiles, AMX-BF16/INT8, AVX512-FP16)
    spr = DeviceSpec(name="xeon-spr", kind="cpu", cores=2, threads=2, clock_ghz=2.0, peak_fp32_gflops=100.0,
                     mem_bw_gbs=20.0, isa=["amx", "avx2", "avx512f", "bf16", "fma", "fp16", "vnni"],
                     extra={"precision_flags": ["amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_fp16",
                                                "avx512_vnni", "avx_vnni", "f16c"]})
    ps = native_precisions(spr)
    assert ps["bf16"].via == "AMX-BF16 (also AVX512-BF16)" and ps["int8"].via.startswith("AMX-INT8")
    assert ps["fp16"].native and ps["fp16"].via == "AVX512-FP16"
    # Zen 3 (EPYC 7763) has no bf16 units: a bf16 request is told it would be emulated
    warn = check_precision("bf16", device("epyc-7763"))
    assert warn is not None and "emulated and slower than fp32" in warn
    zen3 = native_precisions(device("epyc-7763"))   # AVX2, no VNNI: int8 not native but worth measuring
    assert not zen3["int8"].native and zen3["int8"].may_gain and not zen3["bf16"].may_gain
    h100 = native_precisions(device("h100"))
    assert h100["fp16"].native and h100["bf16"].native and h100["int8"].native


def test_cli_devices_says_which_precisions_run_natively(tmp_cache):
    from typer.testing import CliRunner

    from tensorplan.cli import app
    r = CliRunner().invoke(app, ["devices", "--local", "--quick", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    local = out["precisions"]["local"]
    assert list(local) == list(PRECISIONS)
    assert out["local"][0]["extra"]["precision_flags"] == sorted(out["local"][0]["extra"]["precision_flags"])
    if "avx512_bf16" in FLAGS and "amx_bf16" not in FLAGS:
        assert local["bf16"] == {"precision": "bf16", "native": True, "via": "AVX512-BF16",
                                 "note": local["bf16"]["note"], "may_gain": True}
    if FLAGS and not FLAGS & {"amx_bf16", "avx512_bf16"}:
        assert local["bf16"]["native"] is False and local["bf16"]["may_gain"] is False
    r = CliRunner().invoke(app, ["devices", "--local", "--quick"])
    assert r.exit_code == 0, r.output
    assert "precisions on" in r.stdout and "bf16" in r.stdout


# ---- int8 peers (opt-in) -----------------------------------------------------------------------------
def test_int8_peers_only_when_asked():
    from tensorplan.workflows.peers import OPENVINO_INT8, ORT_INT8, peer_runners, runners_of, time_interleaved
    from tensorplan.zoo.specs import load
    g = load("tiny-cnn")
    cal = load_calibration(g, None, count=4)
    plain = peer_runners(g, cal.feeds[0], threads=1, torch_compile=False)
    assert not {ORT_INT8, OPENVINO_INT8} & {p.name for p in plain}
    peers = peer_runners(g, cal.feeds[0], threads=1, torch_compile=False, int8_calibration=cal.feeds)
    by = {p.name: p for p in peers}
    for n in (ORT_INT8, OPENVINO_INT8):
        assert by[n].skipped is None, by[n].skipped
        assert by[n].precision == "int8" and 0 < by[n].max_rel_error < 0.5 and by[n].build_s > 0
    t = time_interleaved(runners_of(peers), rounds=2, peers=peers, burst_s=0.005)
    assert t.runners[ORT_INT8].precision == "int8" and t.runners[ORT_INT8].median_ms > 0
    assert t.best_peer() not in (ORT_INT8, OPENVINO_INT8)       # int8 never the fp32 headline
