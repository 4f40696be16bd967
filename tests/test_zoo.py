"""The model zoo: every tiny model exports at opsets 11 and 17, passes the checker, has only
static shapes and matches PyTorch eager in ONNX Runtime; a fast subset of the big models
does the same at opset 17; the cache is atomic, keyed and deterministic."""
from __future__ import annotations

import functools
import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tensorplan.errors import TensorplanError
from tensorplan import zoo

TINY = [e.name for e in zoo.list_models(tag="test")]
# Big models that export and run in a few seconds on 2 cores (the rest: bench/zoo_export.py).
FAST_BIG = ["candy", "mobilenet-v2", "retinaface", "yolox-nano", "segformer-b0", "mobilenet-v3-large",
            "shufflenet-v2"]
LINEAR = {"Conv", "ConvTranspose", "MatMul", "Gemm"}


@functools.lru_cache(maxsize=None)
def _exported(name: str, opset: int) -> onnx.ModelProto:
    """One export per (model, opset) per test process; tests must not mutate the result."""
    return zoo.onnx_model(name, opset)


def _ort_vs_torch(name: str, model: onnx.ModelProto) -> None:
    module, inputs = zoo.build_torch(name)
    with torch.no_grad():
        ref = module(*inputs)
    ref = ref if isinstance(ref, tuple) else (ref,)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, zoo.numpy_inputs(name))
    assert len(outs) == len(ref) == len(zoo.get_entry(name).output_names)
    for o, r in zip(outs, ref):
        r = r.numpy()
        assert o.shape == r.shape
        assert np.isfinite(r).all() and np.abs(r).max() > 0
        np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-5 * float(np.abs(r).max()))


def _assert_static(model: onnx.ModelProto) -> None:
    values = list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)
    for vi in values:
        dims = vi.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), vi.name
    known = {vi.name for vi in values} | {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        assert all(o in known for o in n.output), n.name
        # folding leaves no shape arithmetic or no-op nodes behind
        assert n.op_type not in {"Shape", "Size", "Identity", "Constant", "ConstantOfShape"}, n.name


def _linear_flops(model: onnx.ModelProto) -> int:
    """2 x MACs of Conv/MatMul/Gemm from the inferred static shapes (biases not counted)."""
    shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
              for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)}
    shapes.update({t.name: list(t.dims) for t in model.graph.initializer})
    total = 0
    for n in model.graph.node:
        if n.op_type == "Conv":
            w, y = shapes[n.input[1]], shapes[n.output[0]]
            total += 2 * int(np.prod(y)) * int(np.prod(w[1:]))
        elif n.op_type in ("MatMul", "Gemm"):
            a, y = shapes[n.input[0]], shapes[n.output[0]]
            trans_a = any(at.name == "transA" and at.i for at in n.attribute)
            k = a[-2] if trans_a else a[-1]
            total += 2 * int(np.prod(y)) * k
    return total


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("name", TINY)
def test_tiny_exports_check_and_match_torch(name, opset):
    model = _exported(name, opset)
    assert model.opset_import[0].version == opset
    onnx.checker.check_model(model, full_check=True)
    _assert_static(model)
    _ort_vs_torch(name, model)


def test_tiny_set_covers_the_common_operators():
    ops = set()
    for name in TINY:
        ops |= {n.op_type for n in _exported(name, 17).graph.node}
    assert {"Conv", "Gemm", "MatMul", "Relu", "MaxPool", "Softmax", "LayerNormalization", "Erf",
            "InstanceNormalization", "Pad", "Resize", "Concat", "Transpose", "Reshape", "HardSwish",
            "Sigmoid"} <= ops


@pytest.mark.parametrize("name", ["tiny-attention", "tiny-convnext-ish"])
def test_layernorm_decomposed_at_opset11_only(name):
    ops11 = {n.op_type for n in _exported(name, 11).graph.node}
    ops17 = {n.op_type for n in _exported(name, 17).graph.node}
    assert "LayerNormalization" not in ops11 and {"ReduceMean", "Sqrt", "Pow"} <= ops11
    assert "LayerNormalization" in ops17


@pytest.mark.parametrize("opset", [12, 14, 18, 20, 21])
def test_other_opsets_are_honest(opset):
    model = zoo.onnx_model("tiny-attention", opset)
    assert model.opset_import[0].version == opset
    ops = {n.op_type for n in model.graph.node}
    assert ("Gelu" in ops) == (opset >= 20)  # ONNX Gelu exists from opset 20
    _ort_vs_torch("tiny-attention", model)


@pytest.mark.parametrize("name", FAST_BIG)
def test_big_model_opset17(name):
    model = _exported(name, 17)
    _assert_static(model)
    _ort_vs_torch(name, model)
    if "transformer" in zoo.get_entry(name).tags:
        assert "LayerNormalization" in {n.op_type for n in model.graph.node}


# Baseline table (/work/shared/reference/baselines.md): params in millions, GFLOPs = 2 x MACs.
BASELINE = {"candy": (1.68, 15.43), "resnet-50": (23.51, 8.17), "bert-base": (108.89, 22.35),
            "vit-b16": (85.80, 35.13), "mobilenet-v2": (3.50, 0.60), "yolox-nano": (0.91, 1.05)}


@pytest.mark.parametrize("name", sorted(BASELINE))
def test_param_counts_match_baseline_table(name):
    assert zoo.param_count(name) / 1e6 == pytest.approx(BASELINE[name][0], rel=0.01)


# Published parameter counts (torchvision / the papers; classifier heads removed where the zoo model
# is headless: ConvNeXt-T 28.59M, EfficientNet-B0 5.29M, MobileViT-S 5.58M, Swin-T 28.29M with heads).
PUBLISHED_PARAMS = {"mobilenet-v3-large": 5.483, "shufflenet-v2": 2.279, "efficientnet-b0": 5.289 - 1.281,
                    "convnext-tiny": 28.589 - 0.769, "mobilevit-s": 5.578 - 0.641,
                    "swin-tiny": 28.288 - 0.769, "gpt2": 124.44}


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_dataset_networks_match_published_sizes(name):
    """The networks added for the CDMPP dataset are the published architectures, not look-alikes."""
    assert zoo.param_count(name) / 1e6 == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


@pytest.mark.parametrize("name", ["candy", "mobilenet-v2", "yolox-nano"])
def test_flops_match_baseline_table(name):
    assert _linear_flops(_exported(name, 17)) / 1e9 == pytest.approx(BASELINE[name][1], rel=0.015)


def test_datamove_grid_adds_kernels_no_zoo_network_has():
    """The synthetic coverage model fuses into one kernel per (shape, pattern), none of which is a
    kernel of the committed dataset's networks: adding its records never turns a held-out
    network's task into a seen one."""
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.tasks import network_tasks
    tasks = network_tasks(zoo.export("datamove-grid"), "datamove-grid")
    kinds = {re.sub(r"\d+", "", t.name) for t in tasks}
    assert len(tasks) == 16 * 9 and {"pad", "concatenate", "fused_strided_slice_relu"} <= kinds
    try:
        ds = load_dataset()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"committed dataset not available: {e}")
    assert not {t.key for t in tasks} & set(ds.tasks["task_key"])


def test_registry_and_errors():
    names = {e.name for e in zoo.list_models()}
    assert {"candy", "segformer-b0", "efficientvit-b1", "yolox-nano", "yolov4", "resnet-50", "mobilenet-v2",
            "bert-base", "vit-b16", "yolov2", "vgg-16", "posenet", "retinaface"} <= names
    assert {e.name for e in zoo.list_models(tag="korch")} == {
        "candy", "segformer-b0", "efficientvit-b1", "yolox-nano", "yolov4"}
    assert {"yolov2", "vgg-16", "posenet", "retinaface", "candy"} <= {e.name for e in zoo.list_models(tag="codl")}
    with pytest.raises(TensorplanError, match="known models: .*resnet-50"):
        zoo.get_entry("resnet-51")
    with pytest.raises(TensorplanError, match="opset 10"):
        zoo.export("tiny-cnn", opset=10)
    e = zoo.get_entry("bert-base")
    assert e.input_shapes == {"input_ids": (1, 128)} and e.dtype("input_ids") == "int64"
    json.dumps(e.to_dict())


def test_build_torch_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    m1, x1 = zoo.build_torch("tiny-cnn")
    after = torch.rand(1)
    assert torch.equal(before, after)
    m2, x2 = zoo.build_torch("tiny-cnn")
    assert not m1.training
    for (k, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), k
    assert torch.equal(x1[0], x2[0])
    m3, _ = zoo.build_torch("tiny-cnn", seed=1)
    assert not torch.equal(m1.state_dict()["0.weight"], m3.state_dict()["0.weight"])


def test_bert_int_inputs_in_vocab_range():
    (ids,) = zoo.example_inputs("bert-base")
    assert ids.dtype == torch.int64 and ids.shape == (1, 128) and 0 <= int(ids.min()) and int(ids.max()) < 30522


def test_export_cache(tmp_cache, monkeypatch):
    p = zoo.export("tiny-mlp", opset=11)
    assert p == tmp_cache / "zoo" / "tiny-mlp-opset11.onnx" and p.exists()
    onnx.checker.check_model(str(p))
    first = p.read_bytes()
    mtime = p.stat().st_mtime_ns
    assert zoo.export("tiny-mlp", opset=11) == p and p.stat().st_mtime_ns == mtime  # cache hit
    zoo.export("tiny-mlp", opset=11, force=True)
    assert p.read_bytes() == first  # deterministic: same bytes on re-export
    monkeypatch.setattr(zoo, "ZOO_VERSION", zoo.ZOO_VERSION + 1)
    mtime = p.stat().st_mtime_ns
    zoo.export("tiny-mlp", opset=11)
    assert p.stat().st_mtime_ns != mtime  # a new code version invalidates the cached file
    assert json.loads(p.with_suffix(".json").read_text())["key"]["zoo_version"] == zoo.ZOO_VERSION
    assert not [f for f in (tmp_cache / "zoo").iterdir() if f.name.endswith(".tmp")]


def test_load_returns_graph(tmp_cache):
    g = zoo.load("tiny-cnn", opset=17)
    assert g.input_shapes() == {"input": (1, 3, 32, 32)}
    assert "Conv" in {n.op for n in g.nodes}


def test_cli_list_and_export(tmp_path, tmp_cache):
    from typer.testing import CliRunner

    from tensorplan.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["zoo", "list", "--json", "--tag", "test"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    assert {row["name"] for row in rows} == set(TINY) and all(row["params"] > 0 for row in rows)
    out = tmp_path / "m.onnx"
    r = runner.invoke(app, ["zoo", "export", "tiny-style", "--opset", "11", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert onnx.load(str(out)).opset_import[0].version == 11


def test_fold_constants_settles_deep_shape_chains():
    """Each Reshape whose target shape is computed from Shape/Gather/Concat (torch's opset-11
    export) needs its own folding round; a 12-layer chain must still fold to static shapes
    (MobileViT-S at opset 11 failed with a fixed number of rounds)."""
    from onnx import TensorProto, helper

    from tensorplan.ir.torch_onnx import finalize

    nodes, inits, x = [], [], "x"
    w = np.eye(6, dtype=np.float32)
    inits.append(onnx.numpy_helper.from_array(w, "w"))
    inits.append(onnx.numpy_helper.from_array(np.array(1, np.int64), "one"))
    inits.append(onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus1"))
    for i in range(12):
        nodes += [helper.make_node("MatMul", [x, "w"], [f"m{i}"]),
                  helper.make_node("Shape", [f"m{i}"], [f"s{i}"]),
                  helper.make_node("Gather", [f"s{i}", "one"], [f"g{i}"], axis=0),
                  helper.make_node("Unsqueeze", [f"g{i}"], [f"u{i}"], axes=[0]),
                  helper.make_node("Concat", [f"u{i}", "minus1"], [f"c{i}"], axis=0),
                  helper.make_node("Reshape", [f"m{i}", f"c{i}"], [f"r{i}"]),
                  helper.make_node("Reshape", [f"r{i}", f"s{i}"], [f"y{i}"])]
        x = f"y{i}"
    graph = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    out = finalize(model, "deep-chain", 11)
    assert not {n.op_type for n in out.graph.node} & {"Shape", "Gather", "Unsqueeze", "Concat"}
    assert [d.dim_value for d in out.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 6]
