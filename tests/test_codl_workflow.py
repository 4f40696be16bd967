"""`workflows.coexec.coexec`: CoDL's public call on real processors (its own module: the
co-executor tests hold a process pair that pins this process to one core while they run)."""
import pytest

from tensorplan.errors import TensorplanError


def test_coexec_plans_runs_and_checks_every_segment():
    """`workflows.coexec.coexec` (what `tensorplan coexec` runs): a model loaded once, planned for
    cpu + cpu2, every segment co-executed and checked against the unsplit result."""
    from tensorplan.workflows.coexec import CoexecResult, coexec
    from tensorplan.zoo.specs import load_model

    r = coexec(load_model("yolov2"), "cpu,cpu2", repeats=1, whole_model=False, max_segments=2)
    assert isinstance(r, CoexecResult) and r.model == "yolov2" and r.processors == ("cpu", "cpu2")
    assert len(r.segments) == 2 and r.whole_model is None
    assert all(s.max_abs_err <= 1e-3 and s.measured.total > 0 and s.predicted.total > 0 for s in r.segments)
    assert r.predicted_s == pytest.approx(sum(s.predicted.total for s in r.segments))
    assert r.relative_error == pytest.approx(r.predicted_s / r.measured_min_s - 1)
    assert r.events["cpu"] and r.events["gpu"]
    d = r.to_dict()
    assert len(d["segments"]) == 2 and d["plan"]["method"] == "greedy" and d["whole_model"] is None
    with pytest.raises(TensorplanError, match="processors"):
        coexec("yolov2", "cpu,npu")

