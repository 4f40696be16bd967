"""Bad invocations end in one clear error (exit 2), never a traceback: an output path that is a
directory (or a file where a directory is wanted), zero or negative counts, a declared input
shape too big for this machine's memory, ONNX Runtime failing inside `inspect --check`, and an
OSError while writing an output. Each runs `tensorplan.cli.main` in-process (what the
`tensorplan` script runs), so the printed message is the one a user sees."""
from __future__ import annotations

import errno
import re
import sys

import pytest

from tensorplan.cli import main, os_error_message

_BOX = re.compile(r"[│╭╮╰╯─]")


def _cli(monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["tensorplan", *args])
    with pytest.raises(SystemExit) as e:
        main()
    cap = capsys.readouterr()
    return e.value.code, cap.err + cap.out


def _one_error(code: int, out: str, *names: str) -> str:
    """Exit 2, no traceback, and a single error line naming each of `names`."""
    assert code == 2, out
    assert "Traceback" not in out, out
    lines = [ln for ln in out.splitlines() if ln.startswith("error:")]
    if lines:                                   # tensorplan's own errors: exactly one line
        assert len(lines) == 1 and len(out.strip().splitlines()) == 1, out
        line = lines[0]
    else:                                       # typer/click's range checks: one message in a box
        line = " ".join(_BOX.sub(" ", out).split())
        assert "Invalid value" in line, out
    for n in names:
        assert n in line, (n, out)
    return line


def _onnx(path, shape, opset: int = 17):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


# ---- output paths ------------------------------------------------------------------------------------
def test_output_paths_that_are_directories(tmp_path, monkeypatch, capsys):
    d = tmp_path / "adir"
    d.mkdir()
    cases = [
        (["zoo", "export", "mlp", "-o", str(d)], "-o/--output"),
        (["devices", "--save", str(d), "--quick"], "--save"),
        (["coexec", "mlp", "--simulate", "sd855", "--timeline", str(d)], "--timeline"),
        (["predictor", "dataset", "sample", "-o", str(d)], "-o/--out"),
        (["predictor", "train", "--out", str(d)], "--out"),
        (["predictor", "finetune", "--device", "local-1t", "--out", str(d)], "--out"),
        (["predictor", "evaluate", "--out", str(d)], "--out"),
        (["predictor", "evaluate", "--doc", str(d)], "--doc"),
    ]
    for args, opt in cases:
        line = _one_error(*_cli(monkeypatch, capsys, *args), opt, str(d))
        assert "is a directory" in line


def test_output_directories_that_are_files(tmp_path, monkeypatch, capsys):
    f = tmp_path / "afile"
    f.write_text("keep me")
    for args, opt in ((["store", "export", "--parquet", str(f)], "--parquet"),
                      (["predictor", "dataset", "export", "--out", str(f)], "--out")):
        _one_error(*_cli(monkeypatch, capsys, *args), opt, str(f), "is a file")
    # an output below a file
    _one_error(*_cli(monkeypatch, capsys, "zoo", "export", "mlp", "-o", str(f / "x.onnx")), "-o/--output",
               "is a file, not a directory")
    assert f.read_text() == "keep me"


def test_oserror_while_writing_is_one_line(tmp_path, monkeypatch, capsys):
    import tensorplan.zoo as zoo

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", "/ro/cache/mlp.onnx")

    monkeypatch.setattr(zoo, "export", denied)
    _one_error(*_cli(monkeypatch, capsys, "zoo", "export", "mlp"), "/ro/cache/mlp.onnx", "Permission denied")
    full = os_error_message(OSError(errno.ENOSPC, "No space left on device", "/data/out.json"))
    assert "/data/out.json" in full and "free space" in full
    assert "is a directory" in os_error_message(IsADirectoryError(errno.EISDIR, "Is a directory", "/tmp"))


# ---- counts --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,opt", [
    (["coexec", "mlp", "--repeats", "0"], "--repeats"),
    (["predictor", "dataset", "collect", "--batch", "0"], "--batch"),
    (["predictor", "dataset", "collect", "--programs-per-task", "-1"], "--programs-per-task"),
    (["predictor", "dataset", "collect", "--threads", "0"], "--threads"),
    (["predictor", "dataset", "collect", "--threads", "1,x"], "--threads"),
    (["predictor", "dataset", "collect", "--budget-minutes", "-5"], "--budget-minutes"),
    (["predictor", "dataset", "collect", "--max-kernel-ms", "0"], "--max-kernel-ms"),
    (["predictor", "dataset", "remeasure", "--threads", "-2"], "--threads"),
    (["predictor", "dataset", "measure-device", "--prefix", "z", "--programs-per-task", "0"], "--programs-per-task"),
    (["predictor", "dataset", "measure-device", "--prefix", "z", "--workers", "0"], "--workers"),
    (["predictor", "dataset", "sample", "-o", "x.parquet", "--programs-per-task", "0"], "--programs-per-task"),
    (["predictor", "dataset", "measure-gpu", "--programs", "p", "--name", "g", "--limit", "0"], "--limit"),
    (["predictor", "dataset", "export", "--workers", "0"], "--workers"),
    (["predictor", "train", "--epochs", "0"], "--epochs"),
    (["predictor", "train", "--members", "0"], "--members"),
    (["predictor", "train", "--workers", "-1"], "--workers"),
    (["predictor", "train", "--max-time", "0"], "--max-time"),
    (["predictor", "finetune", "--device", "d", "--tasks", "0"], "--tasks"),
    (["predictor", "finetune", "--device", "d", "--per-task", "0"], "--per-task"),
    (["predictor", "finetune", "--device", "d", "--steps", "-3"], "--steps"),
    (["predictor", "evaluate", "--per-task", "0"], "--per-task"),
    (["predictor", "evaluate", "--fewshot-tasks", "0"], "--fewshot-tasks"),
    (["predictor", "evaluate", "--time-scale", "0"], "--time-scale"),
])
def test_zero_or_negative_counts(args, opt, monkeypatch, capsys):
    code, out = _cli(monkeypatch, capsys, *args)
    assert code == 2 and opt in out, out            # refused before any work, naming the option
    _one_error(code, out, opt)


# ---- models that cannot run here ------------------------------------------------------------------------
def test_huge_declared_input_refused_before_allocating(tmp_path, monkeypatch, capsys):
    m = _onnx(tmp_path / "huge.onnx", [1, 3, 100000, 100000])
    line = _one_error(*_cli(monkeypatch, capsys, "inspect", str(m), "--check"), str(m), "'x'",
                      "1x3x100000x100000", "GiB")
    assert "refused before allocating" in line
    # the same model inspected without --check allocates nothing: it reports
    code, out = _cli(monkeypatch, capsys, "inspect", str(m), "--json")
    assert code == 0 and "Relu" in out


def test_memory_guard_uses_available_memory(tmp_path):
    from tensorplan.errors import TensorplanError
    from tensorplan.zoo.specs import check_run_memory, load

    g = load(str(_onnx(tmp_path / "small.onnx", [1, 3, 64, 64])))
    check_run_memory(g, "a test", available=10 << 20)          # 48 KiB of input: fits in 10 MiB
    with pytest.raises(TensorplanError, match=r"input 'x' is declared 1x3x64x64 float32"):
        check_run_memory(g, "a test", available=100 << 10)     # ... but not in 100 KiB


def test_onnxruntime_failure_in_inspect_check_is_one_error(tmp_path, monkeypatch, capsys):
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    import tensorplan.workflows.inspect as wi

    def ort_fails(*a, **k):
        raise Fail("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Relu node.\n"
                   "more detail on a second line")

    monkeypatch.setattr(wi, "check_against_ort", ort_fails)
    m = _onnx(tmp_path / "small.onnx", [1, 3, 4, 4])
    line = _one_error(*_cli(monkeypatch, capsys, "inspect", str(m), "--check"), str(m), "ONNX Runtime",
                      "Non-zero status")
    assert "second line" not in line
