"""Kernels at a precision of their own (issue 63): a zoo model's plan with one kernel at bf16
(OpenVINO) or int8 (ONNX Runtime, calibrated on the inputs the plan hands that kernel) runs close
to fp32 but not identically; an int8 kernel's quantized model is saved beside plan.json, so a
fresh process runs the saved plan without calibration data and gets the same outputs; a bad
precision in a plan file, or a precision a backend has no kernels for, is one clear error, never
a silent fp32 run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import FixedDevice
from tensorplan.errors import CompileError, PlanError
from tensorplan.ir.reference import random_feeds, rel_error
from tensorplan.kernels.openvino import available as openvino_available
from tensorplan.kernels.vendor import Int8Kernel, make_kernel
from tensorplan.runtime.executor import PlanExecutor, kernel_graph
from tensorplan.runtime.plan import Plan, load_plan
from test_regions import RegionFriendlyCost

MODEL = "tiny-attention"


@pytest.fixture(scope="module")
def plan() -> Plan:
    """tiny-attention's plan: TVM memory kernels and two ONNX Runtime regions of original operators."""
    from tensorplan.workflows.orchestrate import orchestrate
    p = orchestrate(MODEL, device=FixedDevice(), cost=RegionFriendlyCost(), race=False)
    assert {k.kind for k in p.kernels} >= {"memory", "region"}
    return p


@pytest.fixture(scope="module")
def one() -> Plan:
    """tiny-cnn's plan of one kernel: an ONNX Runtime region over the whole model."""
    from tensorplan.workflows.orchestrate import orchestrate
    p = orchestrate("tiny-cnn", device=FixedDevice(), cost=RegionFriendlyCost(), race=False)
    assert len(p.kernels) == 1 and p.kernels[0].kind == "region" and p.kernels[0].backend == "ort"
    return p


@pytest.fixture(scope="module")
def feeds(plan) -> list[dict[str, np.ndarray]]:
    prim = plan.check()
    return [random_feeds(prim, seed=s) for s in range(6)]


@pytest.fixture(scope="module")
def fp32(plan) -> PlanExecutor:
    return PlanExecutor(plan)


def _region(plan: Plan) -> str:
    """The id of the plan's largest region (it holds the attention MatMuls and Softmax)."""
    return max((k for k in plan.kernels if k.kind == "region"), key=lambda k: len(k.nodes)).id


def _bf16_native() -> bool:
    from tensorplan.precision.native import native_precisions
    return native_precisions()["bf16"].native


@pytest.mark.skipif(not openvino_available(), reason="openvino not installed")
def test_one_kernel_at_bf16_on_openvino_runs_close_to_fp32_but_not_identical(plan, feeds, fp32):
    kid = _region(plan)
    bf16 = plan.with_precision(kid, "bf16", "openvino")
    k = bf16.kernel(kid)
    assert (k.precision, k.backend) == ("bf16", "openvino") and list(k.schedule) == ["operators"]
    assert plan.kernel(kid).precision == "fp32"                     # a copy: the plan is unchanged
    assert json.loads(bf16.to_json())["kernels"][[x.id for x in bf16.kernels].index(kid)]["precision"] == "bf16"
    assert bf16.summary().precisions == {"fp32": len(plan.kernels) - 1, "bf16": 1}
    if not _bf16_native():   # OpenVINO would run fp32 instead: refused, never silently fp32
        with pytest.raises(CompileError, match=f"{kid}.*bf16"):
            PlanExecutor(bf16)
        return
    ex = PlanExecutor(bf16)
    assert ex.precision_counts() == {"fp32": len(plan.kernels) - 1, "bf16": 1}
    slot = next(s for s in ex.slots if s.kernel.id == kid)
    assert (slot.backend, slot.notes) == ("openvino", [])
    for f in feeds[:3]:
        want, got = fp32.run(f), ex.run(f)
        for o in want:
            assert got[o].dtype == np.float32                      # fp32 in, fp32 out
            assert not np.array_equal(got[o], want[o])             # really computed in bf16
            assert rel_error(got[o], want[o]) < 0.05               # bf16 rounding: 2^-8 per op
    res = bf16.run(feeds[0], repeats=3)                            # checked at the reduced-precision budget
    assert res.ok and res.tol == 0.02 and res.precisions == {"fp32": len(plan.kernels) - 1, "bf16": 1}


def test_int8_ort_kernel_from_captured_inputs_and_rebuilt_from_its_model(plan, feeds, fp32):
    kid = _region(plan)
    cap = fp32.capture(feeds, [kid])
    k = plan.kernel(kid)
    assert len(cap[kid]) == len(feeds) and set(cap[kid][0]) == set(k.inputs)
    assert set(k.inputs) - set(plan.primitive_graph().inputs)          # some made by the kernels before it
    # captured right before each kernel runs: the last kernel on its captured inputs gives the model's output
    import torch
    last = plan.kernel(plan.order[-1])
    out_cap = fp32.capture(feeds[:2], [last.id])[last.id]
    lk = make_kernel(kernel_graph(plan.primitive_graph(), last, plan.source_graph()), list(last.outputs),
                     last.backend or "ort", schedule={x: v for x, v in last.schedule.items() if x != "operators"})
    for f, c in zip(feeds[:2], out_cap):
        got = lk(*[torch.from_numpy(c[n]) for n in lk.input_names])
        assert np.array_equal(got.numpy(), fp32.run(f)[plan.primitive_graph().outputs[0]])
    sub = kernel_graph(plan.primitive_graph(), k, plan.source_graph())
    ref = make_kernel(sub, list(k.outputs), "ort")
    q = make_kernel(sub, list(k.outputs), "ort", precision="int8", calibration=cap[kid])
    assert isinstance(q, Int8Kernel) and q.quantized.format == "onnx" and q.schedule["precision"] == "int8"
    import onnx
    ops = {n.op_type for n in onnx.load_model_from_string(q.quantized.model).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops                # ONNX Runtime's QDQ int8
    x = [torch.from_numpy(cap[kid][0][n]) for n in ref.input_names]
    want, got = ref(*x), q(*x)
    assert got.dtype == torch.float32 and not torch.equal(got, want)
    assert rel_error(got.numpy(), want.numpy()) < 0.1                   # int8: a few quantization steps
    again = make_kernel(sub, list(k.outputs), "ort", precision="int8", quantized=q.quantized)  # no calibration
    assert torch.equal(again(*x), got)
    with pytest.raises(CompileError, match=f"{kid}.*calibration"):
        make_kernel(sub, list(k.outputs), "ort", precision="int8")
    with pytest.raises(PlanError, match="no kernel"):
        fp32.capture(feeds[:1], ["nope"])


def test_saved_int8_plan_runs_in_a_fresh_process_without_calibration(plan, feeds, fp32, tmp_path):
    kid = _region(plan)
    cap = fp32.capture(feeds, [kid])
    with pytest.raises(PlanError, match=f"'{kid}' is int8 but has no quantized model"):
        plan.with_precision(kid, "int8").save(tmp_path / "bare.json")   # would not run: refused
    int8 = plan.with_precision(kid, "int8", calibration=cap[kid])
    feed = feeds[0]
    before = PlanExecutor(int8).run(feed)
    path = int8.save(tmp_path / "plan.json")
    entry = json.loads(path.read_text())["kernels"][[k.id for k in int8.kernels].index(kid)]
    assert entry["precision"] == "int8" and entry["schedule"]["quantized"]["format"] == "onnx"
    assert (tmp_path / entry["schedule"]["quantized"]["file"]).is_file()
    np.savez(tmp_path / "feed.npz", **feed)
    # one fresh process: the plan loaded and run on the feed, then `tensorplan run plan.json --json`
    code = ("import sys, numpy as np; from tensorplan.runtime.plan import load_plan; from tensorplan.runtime.executor "
            "import PlanExecutor; p = load_plan(sys.argv[1]); f = dict(np.load(sys.argv[2])); "
            "np.savez(sys.argv[3], **PlanExecutor(p).run(f)); from tensorplan.cli import main; "
            "sys.argv = ['tensorplan', 'run', sys.argv[1], '-n', '3', '--json']; main()")
    cli = subprocess.run([sys.executable, "-c", code, str(path), str(tmp_path / "feed.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=180)
    assert cli.returncode == 0, cli.stderr[-2000:]
    after = dict(np.load(tmp_path / "out.npz"))
    assert set(after) == set(before) and all(np.array_equal(after[o], before[o]) for o in before)
    res = json.loads(cli.stdout)
    assert res["ok"] and res["precisions"] == {"fp32": len(plan.kernels) - 1, "int8": 1}
    assert res["max_rel_err"] == pytest.approx(int8.run(repeats=1).max_rel_err, rel=1e-6)  # same outputs
    assert res["max_rel_err"] > 1e-5                                   # and int8, not fp32
    # the quantized model is data the plan checks: changed or missing -> one clear error
    qfile = tmp_path / entry["schedule"]["quantized"]["file"]
    qfile.write_bytes(qfile.read_bytes() + b"\0")
    with pytest.raises(PlanError, match="changed since the plan was saved"):
        PlanExecutor(load_plan(path))
    qfile.unlink()
    with pytest.raises(PlanError, match="does not exist"):
        PlanExecutor(load_plan(path))


def test_bad_precision_in_plan_json_is_one_clear_error(plan, tmp_path, monkeypatch, capsys):
    d = json.loads(plan.to_json())
    for k in d["kernels"]:
        k.pop("precision")                                     # a plan from before precisions: fp32
    assert all(k.precision == "fp32" for k in Plan.from_dict(d).kernels)
    d["kernels"][1]["precision"] = "int4"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    from tensorplan.cli import main
    monkeypatch.setattr(sys, "argv", ["tensorplan", "run", str(bad)])
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    text = out.err + out.out
    assert e.value.code == 2 and "Traceback" not in text and len(text.strip().splitlines()) == 1, text
    assert "kernels[1]" in text and "precision" in text and "int4" in text and "bf16" in text
    d["kernels"][1]["precision"] = "bf16"
    d["kernels"][1]["schedule"]["quantized"] = {"format": "onnx", "file": "x.onnx", "sha256": "0" * 64}
    with pytest.raises(PlanError, match="not int8"):
        Plan.from_dict(d)
    d["kernels"][1]["precision"] = "int8"
    assert Plan.from_dict(d).kernels[1].precision == "int8"
    d["kernels"][1]["schedule"]["quantized"]["file"] = "../x.onnx"     # a plan never reads files elsewhere
    with pytest.raises(PlanError, match="file name beside the plan"):
        Plan.from_dict(d)


def test_tvm_kernel_at_bf16_is_a_clear_error_not_an_fp32_run(plan):
    mem = next(k for k in plan.kernels if k.kind == "memory")
    with pytest.raises(PlanError, match=f"'{mem.id}' runs on tvm, which has no bf16"):
        plan.with_precision(mem.id, "bf16")
    sub = kernel_graph(plan.primitive_graph(), mem)
    with pytest.raises(CompileError, match=f"'{mem.id}'.*'tvm' cannot build it at bf16"):
        make_kernel(sub, list(mem.outputs), "tvm", precision="bf16")
    with pytest.raises(CompileError, match="ONNX Runtime's CPU provider has no bf16"):
        make_kernel(sub, list(mem.outputs), "ort", precision="bf16")
    # a plan file that asks for it anyway: refused at build time, naming kernel and precision
    d = json.loads(plan.to_json())
    d["kernels"][[k.id for k in plan.kernels].index(mem.id)]["precision"] = "bf16"
    with pytest.raises(CompileError, match=f"kernel '{mem.id}' cannot be built at bf16.*never run at fp32"):
        PlanExecutor(Plan.from_dict(d), plan.primitive_graph())


def test_torch_linear_kernel_at_bf16_by_autocast():
    """The torch backend's linear kernel (oneDNN / MKL) at bf16: casts inside, fp32 outside."""
    import torch
    from tensorplan.ir.graph import Graph, Node, Tensor
    g = Graph("gemm", 17)
    rng = np.random.default_rng(0)
    g.add_tensor(Tensor("x", (16, 64)))
    g.add_tensor(Tensor("w", (64, 32), data=rng.standard_normal((64, 32)).astype(np.float32)))
    g.add_tensor(Tensor("y", (16, 32)))
    g.add_tensor(Tensor("z", (16, 32)))
    g.inputs, g.outputs = ["x"], ["z"]
    g.add_node(Node("mm", "MatMul", ["x", "w"], ["y"]))
    g.add_node(Node("relu", "Relu", ["y"], ["z"]))
    x = torch.randn(16, 64)
    want = make_kernel(g, ["z"], "torch")(x)
    got = make_kernel(g, ["z"], "torch", precision="bf16")(x)
    assert got.dtype == torch.float32 and not torch.equal(got, want)
    assert rel_error(got.numpy(), want.numpy()) < 0.05
    with pytest.raises(CompileError, match="'torch' cannot build it at int8; backends with int8 kernels: ort"):
        make_kernel(g, ["z"], "torch", precision="int8")
    # Inductor's input: the program traced under autocast (the casts are in it), outputs cast back to fp32
    # (compiling it is Inductor's job, ~15-30 s here, so the traced program is what is checked)
    from tensorplan.kernels.torch_kernel import build_kernel
    traced = build_kernel(g, ["mm", "relu"], ["x"], ["z"], compile=False, autocast=torch.bfloat16)
    assert "torch.bfloat16" in traced.module.code
    (out,) = traced(x)
    assert out.dtype == torch.float32 and not torch.equal(out, want) and rel_error(out.numpy(), want.numpy()) < 0.05


def test_export_of_reduced_precision_plans(one, tmp_path):
    """A one-kernel int8 ONNX Runtime plan exports as its QDQ model (the plan itself); a bf16 plan
    exports the fp32 model and says why it is not the plan."""
    kid = one.kernels[0].id
    prim = one.check()
    cal = PlanExecutor(one).capture([random_feeds(prim, seed=s) for s in range(4)], [kid])[kid]
    res = one.with_precision(kid, "int8", calibration=cal).export(tmp_path / "int8.onnx", rounds=0)
    assert res.exact and "int8 (QDQ)" in res.relation and res.ok and res.tol == 0.02
    assert 1e-5 < res.max_rel_err <= 0.02
    import onnx
    m = onnx.load(tmp_path / "int8.onnx")
    assert "QuantizeLinear" in {n.op_type for n in m.graph.node}
    assert {p.key: p.value for p in m.metadata_props}["tensorplan.precision"] == "int8"
    if openvino_available():
        res = one.with_precision(kid, "bf16", "openvino").export(tmp_path / "bf16.onnx", rounds=0)
        assert not res.exact and "at fp32 only" in res.relation and "openvino bf16" in res.relation
        assert res.outside_ort == {"openvino bf16": 1} and res.max_rel_err <= 1e-4


@pytest.mark.skipif(not openvino_available(), reason="openvino not installed")
def test_openvino_int8_kernel_saved_as_ir_and_fp16_never_silently_bf16(one, tmp_path):
    """An NNCF-quantized OpenVINO kernel is stored as OpenVINO IR beside the plan and reloads to the
    same outputs; an fp16 request on a CPU OpenVINO would run in bf16 is refused."""
    from tensorplan.precision.native import native_precisions
    kid = one.kernels[0].id
    prim = one.check()
    feeds = [random_feeds(prim, seed=s) for s in range(4)]
    fp32 = PlanExecutor(one)
    cal = fp32.capture(feeds, [kid])[kid]
    int8 = one.with_precision(kid, "int8", "openvino", calibration=cal)
    assert int8.kernel(kid).quantized.format == "openvino"
    before = PlanExecutor(int8).run(feeds[0])
    want = fp32.run(feeds[0])
    assert all(not np.array_equal(before[o], want[o]) and rel_error(before[o], want[o]) < 0.1 for o in want)
    path = int8.save(tmp_path / "ov.json")
    q = json.loads(path.read_text())["kernels"][0]["schedule"]["quantized"]
    assert q["format"] == "openvino" and q["file"].endswith(".xml") and (tmp_path / q["weights"]).is_file()
    after = PlanExecutor(load_plan(path)).run(feeds[0])
    assert all(np.array_equal(after[o], before[o]) for o in before)
    fp16 = one.with_precision(kid, "fp16", "openvino")
    if native_precisions()["fp16"].native:
        assert PlanExecutor(fp16).precision_counts() == {"fp16": 1}
    else:
        with pytest.raises(CompileError, match=f"kernel '{kid}'.*fp16"):
            PlanExecutor(fp16)
