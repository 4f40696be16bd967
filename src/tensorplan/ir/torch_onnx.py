"""Torch module -> clean, static, constant-folded ONNX model.

The TorchScript exporter leaves shape arithmetic (Shape/Gather/Concat chains,
mask construction, dynamic Pad amounts, Identity copies of tied weights) in
the graph even when every shape is static. Downstream stages (import,
fission, TVM's frontend) want none of it, so we fold every node whose inputs
are known into an initializer, drop Identity nodes, remove dead nodes and
check that shape inference then gives every value a static shape.
"""
from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from tensorplan.errors import ModelImportError

# Never fold these: nondeterministic, or ops whose folded result is huge by design.
_NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
            "Bernoulli"}
# A folded output this large (elements) must not be much bigger than its inputs (e.g. an Expand).
_BIG = 1 << 20


def torch_to_onnx(module: torch.nn.Module, example_inputs: tuple, opset: int,
                  input_names: list[str], output_names: list[str]) -> onnx.ModelProto:
    """Export with the TorchScript exporter (`dynamo=False`): it supports opsets 7..22 natively,
    so the requested opset is the emitted one, and at opset < 17 it decomposes LayerNorm/GELU.

    nn.MultiheadAttention / TransformerEncoderLayer take a fused "fast path" in eval mode that has no
    ONNX export; it is switched off for the export (same math, exported as MatMul/Softmax). The
    exporter's dump of the whole TorchScript graph on failure is silenced: the error says enough."""
    buf = io.BytesIO()
    fastpath = torch.backends.mha.get_fastpath_enabled()
    onnx_log = torch._C._jit_onnx_log          # writes the graph dump whether logging is on or not
    try:
        torch.backends.mha.set_fastpath_enabled(False)
        torch._C._jit_onnx_log = lambda *a: None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, example_inputs, buf, dynamo=False, opset_version=opset,
                              do_constant_folding=True, input_names=input_names,
                              output_names=output_names)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        torch._C._jit_onnx_log = onnx_log
    return onnx.load_from_string(buf.getvalue())


def _light(model: onnx.ModelProto, nodes, inits: dict[str, onnx.TensorProto]) -> onnx.ModelProto:
    """The model with big initializers turned into typed graph inputs: shape inference needs
    their shapes, not their bytes, and copying 500 MB of weights per round is what made it slow."""
    small, big_inputs = [], []
    used = {x for n in nodes for x in n.input}
    for name, t in inits.items():
        if name not in used:
            continue
        if int(np.prod(t.dims, dtype=np.int64)) <= 4096:
            small.append(t)
        else:
            big_inputs.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
    graph = helper.make_graph(list(nodes), model.graph.name, list(model.graph.input) + big_inputs,
                              list(model.graph.output), initializer=small)
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def _infer(model: onnx.ModelProto, strict: bool = False) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, strict_mode=strict, data_prop=True)


def _static_shapes(model: onnx.ModelProto) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """(name -> static shape for every value with all dims known, name -> element type)."""
    try:
        inferred = _infer(model)
    except Exception:  # noqa: BLE001 - folding continues without shapes; the final check reports
        return {}, {}
    shapes, types = {}, {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if t.elem_type:
            types[vi.name] = t.elem_type
        if not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if all(d is not None for d in dims):
            shapes[vi.name] = tuple(int(d) for d in dims)
    for t in inferred.graph.initializer:
        types[t.name] = t.data_type
        shapes[t.name] = tuple(t.dims)
    return shapes, types


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _eval_node(node: onnx.NodeProto, inputs: list[np.ndarray | None], opsets) -> list[np.ndarray]:
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" if x is not None else "" for i, x in enumerate(inputs)]
    n2 = helper.make_node(node.op_type, names, [f"out{i}" for i in range(len(node.output))],
                          domain=node.domain)
    n2.attribute.extend(node.attribute)
    g_inputs = [helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                for nm, x in zip(names, inputs) if x is not None]
    g_outputs = [helper.make_empty_tensor_value_info(o) for o in n2.output]
    m = helper.make_model(helper.make_graph([n2], "fold", g_inputs, g_outputs), opset_imports=opsets)
    feeds = {nm: x for nm, x in zip(names, inputs) if x is not None}
    return [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]


def fold_constants(model: onnx.ModelProto, max_rounds: int = 100) -> onnx.ModelProto:
    """Fold constant subgraphs and Shape/Size of statically shaped values; drop Identity and dead nodes.

    Repeats until nothing changes: shape inference stops at every Reshape whose target shape is
    still computed, so a deep model exported with Shape/Gather/Concat chains (opset 11) needs a
    round per such layer; `max_rounds` only guards against a loop that never settles.
    """
    g = model.graph
    inits: dict[str, onnx.TensorProto] = {t.name: t for t in g.initializer}
    cache: dict[str, np.ndarray] = {}

    def const(name: str) -> np.ndarray | None:
        if name in cache:
            return cache[name]
        if name in inits:
            cache[name] = numpy_helper.to_array(inits[name])
            return cache[name]
        return None

    graph_outputs = {o.name for o in g.output}
    nodes = list(g.node)
    for _ in range(max_rounds):
        shapes, types = _static_shapes(_light(model, nodes, inits))
        changed = False
        alias: dict[str, str] = {}
        kept: list[onnx.NodeProto] = []
        for node in nodes:
            for i, x in enumerate(node.input):
                if x in alias:
                    node.input[i] = alias[x]
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                vals = {a.name: a for a in node.attribute}
                if "value" in vals:
                    arr = numpy_helper.to_array(vals["value"].t)
                else:
                    arr = _eval_node(node, [], model.opset_import)[0]
                inits[node.output[0]] = numpy_helper.from_array(arr, node.output[0])
                cache[node.output[0]] = arr
                changed = True
                continue
            no_op_cast = (node.op_type == "Cast" and node.input[0] in types
                          and types[node.input[0]] == _attrs(node).get("to"))
            if (node.op_type == "Identity" or no_op_cast) and node.output[0] not in graph_outputs:
                alias[node.output[0]] = node.input[0]
                changed = True
                continue
            if node.op_type in ("Shape", "Size") and node.input[0] in shapes:
                shp = np.array(shapes[node.input[0]], dtype=np.int64)
                if node.op_type == "Size":
                    arr = np.array(int(np.prod(shp)), dtype=np.int64)
                else:
                    attrs = _attrs(node)
                    arr = shp[attrs.get("start", 0):attrs.get("end", len(shp))]
                inits[node.output[0]] = numpy_helper.from_array(arr, node.output[0])
                cache[node.output[0]] = arr
                changed = True
                continue
            ins = [const(x) if x else None for x in node.input]
            foldable = (node.op_type not in _NO_FOLD and node.domain in ("", "ai.onnx")
                        and all(x is not None for x, nm in zip(ins, node.input) if nm)
                        and not any(o in graph_outputs for o in node.output))
            if foldable:
                outs = _eval_node(node, ins, model.opset_import)
                in_size = sum(x.size for x in ins if x is not None)
                if all(o.size <= max(_BIG, 2 * in_size) for o in outs):
                    for name, arr in zip(node.output, outs):
                        if name:
                            inits[name] = numpy_helper.from_array(arr, name)
                            cache[name] = arr
                    changed = True
                    continue
            kept.append(node)
        nodes = kept
        if not changed:
            break
    return _assemble(model, _live(nodes, graph_outputs), inits)


def _live(nodes: list[onnx.NodeProto], outputs: set[str]) -> list[onnx.NodeProto]:
    needed = set(outputs)
    keep = []
    for n in reversed(nodes):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(x for x in n.input if x)
    return keep[::-1]


def _assemble(model: onnx.ModelProto, nodes, inits: dict[str, onnx.TensorProto]) -> onnx.ModelProto:
    """Put `nodes` and the initializers they use into `model` in place (no copy of the weights)."""
    g = model.graph
    used = {x for n in nodes for x in n.input} | {o.name for o in g.output}
    present = set()
    for i in reversed(range(len(g.initializer))):
        if g.initializer[i].name in used:
            present.add(g.initializer[i].name)
        else:
            del g.initializer[i]
    g.initializer.extend(t for name, t in inits.items() if name in used and name not in present)
    new_nodes = [onnx.NodeProto.FromString(n.SerializeToString()) for n in nodes]
    g.ClearField("node")
    g.node.extend(new_nodes)
    g.ClearField("value_info")
    model.producer_name = "tensorplan.zoo"
    return model


def finalize(model: onnx.ModelProto, name: str, opset: int, what: str = "zoo model",
             doc: str = "random weights") -> onnx.ModelProto:
    """Fold, infer static shapes for every value, name nodes uniquely and run the checker.
    `what` names the source in errors ("zoo model", "PyTorch module"), `doc` goes in doc_string."""
    model = fold_constants(model)
    inits = {t.name: t for t in model.graph.initializer}
    try:
        shaped = _infer(_light(model, model.graph.node, inits), strict=True)
    except Exception as e:  # noqa: BLE001
        raise ModelImportError(f"{what} '{name}' (opset {opset}): shape inference failed: {e}") from e
    model.graph.ClearField("value_info")
    model.graph.value_info.extend(shaped.graph.value_info)
    del model.graph.output[:]
    model.graph.output.extend(shaped.graph.output)
    dynamic = []
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        t = vi.type.tensor_type
        if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            dynamic.append(vi.name)
    produced = {o for n in model.graph.node for o in n.output}
    known = {vi.name for vi in model.graph.value_info} | {o.name for o in model.graph.output}
    dynamic += sorted(produced - known)
    if dynamic:
        raise ModelImportError(f"{what} '{name}' (opset {opset}): values without a static shape "
                               f"after folding: {dynamic[:8]}")
    seen: set[str] = set()
    for i, n in enumerate(model.graph.node):
        if not n.name or n.name in seen:
            n.name = f"{n.op_type}_{i}"
        seen.add(n.name)
    model.doc_string = f"tensorplan {what} '{name}', {doc}, opset {opset}"
    onnx.checker.check_model(shaped, full_check=True)  # shape-checks the graph without its weights
    onnx.checker.check_model(model)
    return model
