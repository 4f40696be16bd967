"""PyTorch-built kernels (the GPU path of Korch plans): every primitive op, fused candidates,
the torch-device cost model and the plan runner, checked against ONNX Runtime on real models.
CPU here; the CUDA test runs where a GPU exists (bench/korch_gpu.py is the measured proof)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import ort_outputs
from tensorplan.errors import UnsupportedOperatorError
from tensorplan import zoo
from tensorplan.korch.fission import fission
from tensorplan.ir.graph import Graph, Node, Tensor
from tensorplan.ir.reference import random_feeds, rel_error, run_reference
from tensorplan.rewrite import rewrite
from tensorplan.korch.candidates import enumerate_candidates
from tensorplan.kernels.torch_kernel import build_kernel, run_graph, supported_ops


def _prim(name: str) -> tuple[Graph, Graph]:
    g = zoo.load(name)
    return g, fission(rewrite(g).graph).graph


@pytest.mark.parametrize("name", ["candy", "yolox-nano", "segformer-b0", "bert-base"])
def test_whole_primitive_graph_matches_onnxruntime(name):
    """Every primitive op the zoo's fission emits (Resize, Pad, Slice, Gather, Conv, ...) runs in torch."""
    g, prim = _prim(name)
    assert {n.op for n in prim.nodes} <= supported_ops()
    feeds = random_feeds(g)
    out = run_graph(prim, feeds)
    ref = ort_outputs(zoo.export(name), feeds)
    for o, r in zip(prim.outputs, ref):
        assert rel_error(out[o], r) <= 1e-4


def test_inductor_fuses_candidates_exactly():
    """Compiled multi-primitive candidates (memory-bound and linear) equal the reference executor."""
    _, prim = _prim("tiny-style")
    env = run_reference(prim, random_feeds(prim), keep_all=True)
    cands = enumerate_candidates(prim, max_nodes=8)
    picked = [max((c for c in cands if c.kind == "memory"), key=lambda c: len(c.nodes)),
              next(c for c in cands if c.kind == "linear")]
    for c in picked:
        k = build_kernel(prim, c.nodes, c.inputs, c.outputs, compile=True)
        out = k(*[torch.as_tensor(env[i]) for i in c.inputs])
        assert k.compiled and len(out) == len(c.outputs)
        assert rel_error(out[0].numpy(), env[c.outputs[0]]) <= 1e-5


def test_unsupported_op_names_the_node():
    g = Graph("bad")
    g.add_tensor(Tensor("x", (2, 3), "float32"))
    g.add_tensor(Tensor("y", (2, 3), "float32"))
    g.add_node(Node("weird0", "NonMaxSuppression", ["x"], ["y"], {}))
    g.inputs, g.outputs = ["x"], ["y"]
    with pytest.raises(UnsupportedOperatorError, match="weird0"):
        build_kernel(g, ["weird0"], ["x"], ["y"], compile=False)


def test_torch_cost_plan_and_runner_on_cpu():
    """orchestrate with TorchDeviceCost (eager, to keep CI fast), then run the plan: matches ORT."""
    from tensorplan.cost.torch_device import TorchDeviceCost
    from tensorplan.workflows.orchestrate import orchestrate
    from tensorplan.runtime.torch_runner import TorchPlanRunner
    cm = TorchDeviceCost("cpu", compile=False, budget_s=0.005)
    plan = orchestrate("tiny-cnn", cost=cm, regions=False)
    assert plan.stats["cost_model"]["kernels_timed"] == plan.stats["enumeration"]["unique_hashes"]
    assert all(k.backend == "torch" and k.predicted_s > 0 for k in plan.kernels)
    greedy = orchestrate("tiny-cnn", cost=cm, regions=False, method="none")
    assert len(greedy.kernels) >= len(plan.kernels)  # same cached costs, no re-timing
    r = TorchPlanRunner(plan, device="cpu", compile=False)
    g = zoo.load("tiny-cnn")
    feeds = random_feeds(g)
    out = r.outputs_numpy(r.run(feeds))
    ref = ort_outputs(zoo.export("tiny-cnn"), feeds)
    assert rel_error(out[r.prim.outputs[0]], ref[0]) <= 1e-4
    r.bind(feeds)
    again = r.outputs_numpy(r.replay())
    np.testing.assert_array_equal(again[r.prim.outputs[0]], out[r.prim.outputs[0]])


@pytest.mark.gpu
def test_plan_on_cuda_as_one_graph_matches_onnxruntime():
    from tensorplan.cost.torch_device import TorchDeviceCost
    from tensorplan.workflows.orchestrate import orchestrate
    from tensorplan.runtime.torch_runner import TorchPlanRunner
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    plan = orchestrate("tiny-style", device="cuda", cost=TorchDeviceCost("cuda"), regions=False)
    r = TorchPlanRunner(plan, device="cuda", cuda_graph=True)
    g = zoo.load("tiny-style")
    feeds = random_feeds(g)
    r.bind(feeds)
    out = r.outputs_numpy(r.replay())
    assert rel_error(out[r.prim.outputs[0]], ort_outputs(zoo.export("tiny-style"), feeds)[0]) <= 1e-4


def test_cli_orchestrate_and_run_a_torch_plan(tmp_path):
    """`orchestrate --cost torch` writes a plan of PyTorch kernels; `run` executes it through the
    torch runner (not the TVM executor) and checks it against ONNX Runtime."""
    import json

    from typer.testing import CliRunner

    from tensorplan.cli import app
    out = tmp_path / "plan.json"
    r = CliRunner().invoke(app, ["orchestrate", "tiny-cnn", "--cost", "torch", "--jobs", "2", "-o", str(out),
                                 "--json"])
    assert r.exit_code == 0, r.output
    summ = json.loads(r.output[r.output.index("{"):])
    assert summ["race"] is None  # torch plans are not raced (one CUDA graph on a GPU)
    from tensorplan.runtime.plan import Plan
    saved = Plan.load(out)
    assert all(k.backend == "torch-inductor" for k in saved.kernels)
    assert saved.stats["cost_model"]["warm_s"] > 0  # --jobs 2 pre-compiled in worker processes
    r = CliRunner().invoke(app, ["run", str(out), "--json", "-n", "5"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output[r.output.index("{"):])
    assert res["ok"] is True and res["backends"] == {"torch-inductor": summ["kernels"]}
    assert res["median_s"] > 0


@pytest.mark.parametrize("op,attrs", [
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1]}),
    ("AveragePool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ("Resize", {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}),
    ("Resize", {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    ("Pad", {"mode": "reflect"}),
    ("Pad", {"mode": "edge"}),
])
def test_layout_and_pooling_ops_match_the_reference(op, attrs):
    """Single ops with the attributes the zoo does not all exercise, against the reference executor."""
    g = Graph("one")
    g.add_tensor(Tensor("x", (1, 3, 9, 11), "float32"))
    ins = ["x"]
    if op == "Resize":
        for name, val in (("roi", np.zeros(0, np.float32)), ("scales", np.array([1, 1, 2, 1.5], np.float32))):
            g.add_tensor(Tensor(name, val.shape, "float32", data=val))
        ins += ["roi", "scales"]
    if op == "Pad":
        pads = np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64)
        g.add_tensor(Tensor("pads", pads.shape, "int64", data=pads))
        ins.append("pads")
    g.add_node(Node("n0", op, ins, ["y"], attrs))
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 3, 9, 11)).astype(np.float32)}
    ref = run_reference_shapes(g, feeds)
    g.add_tensor(Tensor("y", ref.shape, "float32"))
    g.inputs, g.outputs = ["x"], ["y"]
    out = run_graph(g, feeds)["y"]
    assert out.shape == ref.shape and rel_error(out, ref) <= 1e-6


def test_asymmetric_average_pool_is_refused_not_wrong():
    g = Graph("one")
    g.add_tensor(Tensor("x", (1, 2, 8, 8), "float32"))
    g.add_tensor(Tensor("y", (1, 2, 8, 8), "float32"))
    g.add_node(Node("ap", "AveragePool", ["x"], ["y"], {"kernel_shape": [3, 3], "pads": [0, 0, 2, 2],
                                                        "count_include_pad": 1}))
    g.inputs, g.outputs = ["x"], ["y"]
    with pytest.raises(UnsupportedOperatorError, match="ap"):
        run_graph(g, {"x": np.ones((1, 2, 8, 8), np.float32)})


def run_reference_shapes(g: Graph, feeds) -> np.ndarray:
    from tensorplan.ir.reference import run_node
    n = g.nodes[0]
    vals = [feeds[i] if i in feeds else g.tensors[i].data for i in n.inputs]
    return run_node(n, vals)[0]
