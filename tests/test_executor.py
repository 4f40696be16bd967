"""Plan executor (runtime/) and measured costs (cost/measured.py) on real tiny zoo models."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tvm")
pytest.importorskip("onnxruntime")

from tensorplan.ir.graph import Graph, Node, Tensor  # noqa: E402
from tensorplan.workflows.orchestrate import orchestrate  # noqa: E402
from tensorplan.runtime.buffers import plan_buffers  # noqa: E402
from tensorplan.runtime.plan import Plan, PlanKernel, load_plan, topo_order  # noqa: E402
from tensorplan.runtime.executor import FALLBACKS, PlanExecutor  # noqa: E402


@pytest.mark.parametrize("model", ["tiny-attention", "tiny-style", "tiny-convnext-ish"])
def test_plan_of_tiny_zoo_model_matches_ort(model):
    plan = orchestrate(model, cost="analytical", time_limit=20, race=False)
    res = plan.run(repeats=3)
    assert res.ok, (res.max_rel_err, res.fallbacks)
    assert res.max_rel_err <= 1e-4
    assert res.kernels == len(plan.kernels)
    assert res.median_s > 0
    assert "tvm" in res.backends


def test_measured_plan_runs_resumes_and_records_backends(tmp_path, store):
    from tensorplan.cost.measured import MeasuredCost
    from tensorplan.korch.fission import fission
    from tensorplan.zoo.specs import load
    from tensorplan.korch.candidates import enumerate_candidates
    # a "killed" profiling job: only part of the candidates measured
    prim = fission(load("tiny-cnn")).graph
    cands = enumerate_candidates(prim, max_nodes=8)
    first = MeasuredCost(store=store, device="local", threads=2, budget_s=0.005)
    part = first.cost_many(prim, cands[:5])
    assert all(c > 0 for c in part)
    second = MeasuredCost(store=store, device="local", threads=2, budget_s=0.005)
    costs = second.cost_many(prim, cands)
    assert second.stats["cached"] >= len({c.canonical_hash for c in cands[:5]})
    assert second.stats["measured"] + second.stats["cached"] + second.stats["failed"] == len(cands)
    assert all(c > 0 for c in costs) and all(math.isfinite(c) for c, k in zip(costs, cands) if k.size == 1)
    plan = orchestrate("tiny-cnn", cost=second, time_limit=20, race=False)
    # every kernel records the backend that won its timing, one the executor builds (which one
    # wins depends on the machine: OpenVINO can win a region, ONNX Runtime another)
    assert all(k.backend in FALLBACKS for k in plan.kernels), [k.backend for k in plan.kernels]
    path = tmp_path / "p.json"
    plan.save(path)
    res = load_plan(path).run(repeats=5, kernel_times=True)
    assert res.ok, res.max_rel_err
    assert sum(res.backends.values()) == len(plan.kernels)
    assert res.kernel_sum_s > 0
    rows = list(store.measurements(kind="korch_kernel"))
    assert rows and all("backend" in r["extra"] for r in rows if not r["extra"].get("failed"))


def _chain_plan(n: int, size: int) -> tuple[Plan, Graph]:
    g = Graph("chain", 17)
    g.add_tensor(Tensor("t0", (size,)))
    g.inputs = ["t0"]
    kernels = []
    for i in range(n):
        g.add_tensor(Tensor(f"t{i + 1}", (size,)))
        g.add_node(Node(f"relu{i}", "Neg", [f"t{i}"], [f"t{i + 1}"]))
        kernels.append(PlanKernel(id=f"k{i}", nodes=[f"relu{i}"], inputs=[f"t{i}"], outputs=[f"t{i + 1}"],
                                  kind="memory", backend="tvm", schedule={"name": "default"}))
    g.outputs = [f"t{n}"]
    plan = Plan(source={"model": "chain"}, device={"name": "local"}, kernels=kernels,
                order=topo_order(kernels, {"t0"}))
    plan_buffers(plan, g)
    return plan, g


def test_executor_reuses_buffers_and_has_low_overhead():
    plan, g = _chain_plan(40, 256)
    assert len(plan.slots) <= 3  # a chain needs two live buffers plus the output
    ex = PlanExecutor(plan, g)
    x = np.random.default_rng(0).standard_normal(256).astype(np.float32)
    out = ex.run({"t0": x})["t40"]
    np.testing.assert_array_equal(out, x)  # 40 negations
    from tensorplan.measure.timer import measure
    total = measure(ex.run_bound, warmup=5, min_repeats=20, budget_s=0.2, number=20).median_s
    per_kernel = total / 40
    assert per_kernel < 50e-6, per_kernel  # a few us per launch at most, even on a loaded machine


def test_plan_json_roundtrip_and_cli_run(tmp_path):
    from typer.testing import CliRunner

    from tensorplan.cli import app
    plan = orchestrate("tiny-mlp", cost="analytical", time_limit=20, race=False)
    path = tmp_path / "mlp.json"
    plan.save(path)
    r = CliRunner().invoke(app, ["run", str(path), "--json", "--repeats", "3"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["ok"] is True and d["kernels"] == len(plan.kernels) and d["median_s"] > 0


def test_unbuildable_backend_falls_back_with_a_note():
    g = Graph("conv", 17)
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    g.add_tensor(Tensor("x", (1, 3, 8, 8)))
    g.add_tensor(Tensor("w", w.shape, "float32", w))
    g.add_tensor(Tensor("y", (1, 4, 8, 8)))
    g.inputs, g.outputs = ["x"], ["y"]
    g.add_node(Node("c", "Conv", ["x", "w"], ["y"], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}))
    k = PlanKernel(id="k0", nodes=["c"], inputs=["x"], outputs=["y"], kind="linear", backend="tvm")
    plan = Plan(source={"model": "conv"}, device={}, kernels=[k], order=["k0"])
    plan_buffers(plan, g)
    ex = PlanExecutor(plan, g)
    assert ex.slots[0].backend == "ort" and "tvm" in ex.slots[0].notes[0]
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    y = ex.run({"x": x})["y"]
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_fp16_model_is_checked_at_fp16_precision(tmp_path):
    """A half-precision model: its outputs differ from ONNX Runtime's by rounding (~5e-4), above the fp32
    bar of 1e-4, which rejects it; the check uses 8 fp16 epsilons (7.8e-3)."""
    import torch
    from tensorplan.zoo.from_torch import from_torch
    from tensorplan.zoo.specs import load
    from tensorplan.ir.reference import default_tolerance

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU()).eval().half()
    path = from_torch(net, (torch.randn(1, 3, 32, 32).half(),), name="half_net", path=tmp_path / "half.onnx")
    g = load(str(path))
    assert g.tensors[g.outputs[0]].dtype == "float16"
    assert default_tolerance(g) == pytest.approx(8 * 2.0 ** -10)
    plan = orchestrate(g, cost="analytical", time_limit=20, race=False)
    res = plan.run(repeats=3)
    assert res.ok and 0 < res.max_rel_err <= res.tol == default_tolerance(g), (res.max_rel_err, res.tol)
    res32 = plan.run(repeats=3, tol=1e-4)
    assert res32.max_rel_err > 1e-4 and not res32.ok     # rounding alone fails the fp32 bar
