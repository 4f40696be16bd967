"""Sampled schedules and `TunedCost` (issue #59): kernels ranked by the predictor over schedules
drawn from their meta_schedule design space, the chosen ones timed; on a real small model with
real compiled kernels and real timings."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

torch = pytest.importorskip("torch")
pytest.importorskip("tvm")

from conftest import onnx_model  # noqa: E402
from tensorplan.errors import CompileError, PlanError  # noqa: E402

DATA = Path(__file__).parent / "data"


def _model():
    """x[4,32,64] -> softmax(x) * w + x -> minus its row mean -> ReLU: rows, broadcasts, reductions."""
    w = np.random.default_rng(0).standard_normal((1, 1, 64)).astype(np.float32)
    nodes = [helper.make_node("Softmax", ["x"], ["s"], axis=-1),
             helper.make_node("Mul", ["s", "w"], ["m"]),
             helper.make_node("Add", ["m", "x"], ["a"]),
             helper.make_node("ReduceMean", ["a"], ["r"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["a", "r"], ["d"]),
             helper.make_node("Relu", ["d"], ["y"])]
    return onnx_model(nodes, {"x": (4, 32, 64)}, ["y"], {"w": w})


@pytest.fixture(scope="module")
def problem():
    from tensorplan.ir.onnx_import import import_onnx
    from tensorplan.korch.candidates import enumerate_candidates
    from tensorplan.korch.fission import fission
    prim = fission(import_onnx(_model())).graph
    cands = enumerate_candidates(prim, max_nodes=8)
    mem: dict = {}
    for c in cands:
        if c.kind == "memory":
            mem.setdefault(c.canonical_hash, c)
    return prim, list(mem.values())


def _biggest(cands):
    return max(cands, key=lambda c: len(c.nodes))


def test_sampled_schedules_replay_and_compute_the_default_outputs(problem):
    import tvm_ffi

    from tensorplan.kernels.build import compile_kernel
    from tensorplan.kernels.lower import lower
    from tensorplan.kernels.sampled import sample_schedules
    from tensorplan.kernels.schedule import replay_trace
    from tensorplan.cost.measured import KernelJob, time_kernel
    from tensorplan.kernels.vendor import random_inputs
    prim, mem = problem
    c = _biggest(mem)
    sub = c.graph(prim)
    low = lower(sub, list(c.outputs), use_let=False)
    got = sample_schedules(low, 3, threads=2)
    assert len(got) == 3 and len({s.index for s in got}) == 3
    again = sample_schedules(low, 3, threads=2)                        # deterministic draws
    assert [s.trace for s in again] == [s.trace for s in got]
    ref = compile_kernel(sub, list(c.outputs), threads=2)
    ins = random_inputs(sub, list(ref.input_names))
    want = ref(*ins, out=ref.alloc_outputs())
    right = 0
    for s in got:
        json.dumps(s.trace)                                            # plain JSON
        assert tvm_ffi.structural_equal(replay_trace(low, s.trace), s.mod)
        k = compile_kernel(sub, list(c.outputs), schedule=s.schedule, threads=2)
        assert k.schedule["name"] == "sampled"
        out = k(*ins, out=k.alloc_outputs())
        if all(np.allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5) for a, b in zip(out, want)):
            right += 1
        else:   # TVM can compile a draw that computes something else: measuring refuses it
            oc = time_kernel(KernelJob(sub, list(c.outputs), ["tvm", "tvm:s0"], [s.schedule], threads=2))
            assert "tvm:s0" not in oc.timings and oc.errors["tvm:s0"].startswith("wrong result against variant 'tvm'")
    assert right >= 1
    bad = {"name": "sampled", "trace": got[0].trace}
    other = min(mem, key=lambda x: len(x.nodes))
    if other.canonical_hash != c.canonical_hash:
        with pytest.raises(CompileError, match="trace does not apply"):
            compile_kernel(other.graph(prim), list(other.outputs), schedule=bad, threads=2)
    with pytest.raises(CompileError, match="needs its 'trace'"):
        compile_kernel(sub, list(c.outputs), schedule={"name": "sampled"}, threads=2)


def test_a_sampled_schedule_that_computes_wrong_values_is_never_timed(problem, tmp_path):
    """A real meta_schedule draw that apache-tvm 0.27 compiles into a wrong kernel (the softmax
    denominator merged inside its consumer's reduction loop, summed 64 times; tests/data): measuring
    it beside the default schedule refuses it with the reason, times the rest, and a MeasuredCost
    records the default's schedule for the kernel, never the wrong one."""
    from tensorplan.cost.measured import KernelJob, MeasuredCost, time_kernel
    from tensorplan.kernels.build import compile_kernel
    from tensorplan.kernels.vendor import random_inputs
    prim, mem = problem
    c = _biggest(mem)
    sub = c.graph(prim)
    wrong = {"name": "sampled", "trace": json.loads((DATA / "sampled_wrong_result_trace.json").read_text())["trace"]}
    k = compile_kernel(sub, list(c.outputs), schedule=wrong, threads=2)     # it builds and runs ...
    ref = compile_kernel(sub, list(c.outputs), threads=2)
    ins = random_inputs(sub, list(ref.input_names))
    a, b = k(*ins, out=k.alloc_outputs())[0].numpy(), ref(*ins, out=ref.alloc_outputs())[0].numpy()
    assert np.abs(a - b).max() > 1e-3 * np.abs(b).max()                     # ... and computes something else
    oc = time_kernel(KernelJob(sub, list(c.outputs), ["tvm", "tvm:s0"], [wrong], threads=2, budget_s=0.01))
    assert set(oc.timings) == {"tvm"}
    assert oc.errors["tvm:s0"].startswith("wrong result against variant 'tvm' on the same inputs (output ")
    cost = MeasuredCost(tmp_path / "store.sqlite", "local", threads=2, tvm_schedules=lambda g, cand: [wrong])
    assert math.isfinite(cost.cost(prim, c))
    assert cost.kernel_info(prim, c)["schedule"] == {"name": "default"}


def test_tuned_cost_beats_or_ties_the_default_prediction_and_caches(problem, store):
    from tensorplan.cdmpp.model import SHIPPED_MODEL
    from tensorplan.cost import AnalyticalCost
    from tensorplan.cost.predicted import CDMPPCost
    from tensorplan.cost.tuned import TunedCost
    prim, mem = problem
    mem = sorted(mem, key=lambda c: -len(c.nodes))[:10]
    tc = TunedCost(store=store, samples=8, model=SHIPPED_MODEL, threads=2, fallback=AnalyticalCost("local"))
    costs = tc.cost_many(prim, mem)
    d = tc.describe()
    assert d["tuned"] == len(mem) and d["schedules_sampled"] > 0 and d["draws"] <= 8 * len(mem)
    default = CDMPPCost(model=SHIPPED_MODEL, threads=2).cost_many(prim, mem)
    for c, v, dv in zip(mem, costs, default):
        p = tc.prediction(c)
        assert p.default_s == pytest.approx(dv, rel=1e-5)              # the same default program and model
        assert v == p.best_s <= dv * (1 + 1e-6)
        assert p.ranked[0].predicted_s == v
        top = tc.top_schedules(prim, c, 2)
        assert 1 <= len(top) <= 2 and {"name": "default"} in top
        info = tc.kernel_info(prim, c)
        assert info["backend"] == "tvm" and info["schedule"] == top[0]
    # a fresh cost model on the same store featurises nothing and answers the same
    warm = TunedCost(store=store, samples=8, model=SHIPPED_MODEL, threads=2)
    assert warm.cost_many(prim, mem) == costs
    w = warm.describe()
    assert w["cache_hits"] == len(mem) and w["schedules_featurised"] == 0 and w["draws"] == 0
    # another budget is another key
    assert TunedCost(store=store, samples=16, model=SHIPPED_MODEL, threads=2)._payload(mem[0]) != \
        warm._payload(mem[0])


def test_measured_top_k_keeps_the_fastest_timed_schedule(problem, store):
    from tensorplan.cdmpp.model import SHIPPED_MODEL
    from tensorplan.cost.measured import MeasuredCost
    from tensorplan.cost import kernel_work
    from tensorplan.cost.tuned import KernelTiming, TunedCost, bandwidth_distance
    from tensorplan.devices import device
    prim, mem = problem
    tc = TunedCost(store=store, samples=8, model=SHIPPED_MODEL, threads=2)
    some = sorted(mem, key=lambda c: -len(c.nodes))[:3]
    tc.cost_many(prim, some)
    plain = MeasuredCost(store=store, threads=2, budget_s=0.005)
    mc = MeasuredCost(store=store, threads=2, budget_s=0.005, tvm_schedules=lambda p, c: tc.top_schedules(p, c, 3))
    for c in some:
        assert mc._prog_key(prim, c) != plain._prog_key(prim, c)     # timings of other schedule sets never mix
        assert plain._prog_key(prim, c) == MeasuredCost(store=store, threads=2)._prog_key(prim, c)
    vals = mc.cost_many(prim, some)
    timings = []
    for c, v in zip(some, vals):
        rec = store.get_measurement(mc._prog_key(prim, c), mc.dev_key)
        times = rec["extra"]["times"]
        timed = {name: mc._variant(name, mc._extra_schedules(prim, c)) for name in times}
        extra = mc._extra_schedules(prim, c)
        errors = rec["extra"]["errors"] or {}
        for j in range(len(extra)):      # every extra schedule was timed, or refused for computing wrong values
            assert f"tvm:s{j}" in times or errors[f"tvm:s{j}"].startswith("wrong result against variant")
        info = mc.kernel_info(prim, c)
        assert (info["backend"], info["schedule"]) in timed.values()
        assert v == pytest.approx(min(times.values())) and v > 0
        timings.append(KernelTiming(c, times["tvm"], v))
    # distance to the bandwidth bound: measured / (bytes moved / bandwidth), the tuned pick never further
    spec = device("local")
    rep = bandwidth_distance(prim, timings, spec)
    assert rep.bandwidth_gbs == spec.mem_bw_gbs and len(rep.rows) == len(some)
    for r, t in zip(rep.rows, timings):
        assert r.bound_s == pytest.approx(kernel_work(prim, t.cand)[1] / (spec.mem_bw_gbs * 1e9))
        assert r.default_ratio == pytest.approx(t.default_s / r.bound_s) and 0 < r.tuned_ratio <= r.default_ratio
    assert rep.tuned_median <= rep.default_median * (1 + 1e-9) and rep.tuned_median <= rep.tuned_p90


def test_sampled_schedule_survives_the_plan_round_trip(problem, tmp_path):
    from tensorplan.kernels.lower import lower
    from tensorplan.kernels.sampled import sample_schedules
    from tensorplan.runtime.executor import kernel_graph
    from tensorplan.runtime.plan import Plan
    from tensorplan.workflows.orchestrate import orchestrate
    from tensorplan.zoo.specs import load
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    plan = orchestrate(load(str(path)), cost="analytical", time_limit=20, race=False)
    prim = plan.primitive_graph()
    tvm_k = [k for k in plan.kernels if k.backend == "tvm"]
    assert tvm_k
    k = max(tvm_k, key=lambda x: len(x.nodes))
    sub = kernel_graph(prim, k)
    s = sample_schedules(lower(sub, list(k.outputs), use_let=False), 1, threads=plan.run_threads())[0]
    k.schedule = s.schedule
    back = Plan.from_dict(json.loads(plan.to_json()))
    assert back.kernel(k.id).schedule == s.schedule
    res = back.run(repeats=2)
    assert res.ok, res.max_rel_err
    bad = json.loads(plan.to_json())
    j = next(i for i, x in enumerate(bad["kernels"]) if x["id"] == k.id)
    bad["kernels"][j]["schedule"]["trace"] = "not a trace"
    with pytest.raises(PlanError, match="trace"):
        Plan.from_dict(bad)
