"""Graph -> ONNX ModelProto, so any Graph (a whole model, a subgraph, a fissioned
primitive graph) can run in ONNX Runtime, the numerical and speed baseline.

Attributes are plain Python values in the IR; their ONNX types come from the op
schema, so an int-valued float (`alpha=1`) or an empty list still round-trips.
Opset-dependent forms (Reduce*/Split/Squeeze/Unsqueeze axes as attribute or as
input) are rewritten to whatever the target opset wants, so producers of
primitive graphs need not care.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph, Node

IR_VERSION = 9

# Opset of a non-default domain when the graph does not say (ONNX Runtime's current versions).
DEFAULT_DOMAIN_OPSETS = {"com.microsoft": 1, "ai.onnx.ml": 3, "com.microsoft.nchwc": 1}
_DEFAULT_DOMAINS = ("", "ai.onnx")

# op -> first opset where the listed attribute became an input (at index 1)
_ATTR_TO_INPUT = {
    "ReduceSum": ("axes", 13), "Squeeze": ("axes", 13), "Unsqueeze": ("axes", 13),
    "Split": ("split", 13),
    **{op: ("axes", 18) for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                     "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                                     "ReduceSumSquare")},
}


def is_default_domain(domain: str) -> bool:
    return domain in _DEFAULT_DOMAINS


def domain_opset(domain: str, opset: int, domain_opsets: dict[str, int] | None = None) -> int:
    """The opset version a node of `domain` follows (here, not in ort_node.py: exporting a graph
    needs it, and ort_node builds its one-node models with this module)."""
    if is_default_domain(domain):
        return opset
    return int((domain_opsets or {}).get(domain, DEFAULT_DOMAIN_OPSETS.get(domain, 1)))


def onnx_dtype(name: str) -> int:
    if name == "bfloat16":
        return TensorProto.BFLOAT16
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(name)))


def _schema_attr_types(op: str, opset: int, domain: str = "") -> dict[str, int]:
    try:
        schema = onnx.defs.get_schema(op, opset, domain)
    except Exception:
        return {}
    return {k: int(v.type) for k, v in schema.attributes.items()}


def _guess_type(value: Any) -> int:
    if isinstance(value, bool) or isinstance(value, (int, np.integer)):
        return AttributeProto.INT
    if isinstance(value, (float, np.floating)):
        return AttributeProto.FLOAT
    if isinstance(value, (str, bytes)):
        return AttributeProto.STRING
    if isinstance(value, np.ndarray):
        return AttributeProto.TENSOR
    if isinstance(value, onnx.GraphProto):
        return AttributeProto.GRAPH
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, np.integer)) for v in value):
            return AttributeProto.INTS
        if all(isinstance(v, (int, float, np.integer, np.floating)) for v in value):
            return AttributeProto.FLOATS
        if all(isinstance(v, (str, bytes)) for v in value):
            return AttributeProto.STRINGS
    raise TensorplanError(f"cannot convert attribute value {value!r} to ONNX")


def make_attribute(name: str, value: Any, attr_type: int | None) -> AttributeProto:
    t = attr_type if attr_type else _guess_type(value)
    if t == AttributeProto.FLOAT:
        return helper.make_attribute(name, float(value), attr_type=AttributeProto.FLOAT)
    if t == AttributeProto.INT:
        return helper.make_attribute(name, int(value), attr_type=AttributeProto.INT)
    if t == AttributeProto.STRING:
        return helper.make_attribute(name, value if isinstance(value, bytes) else str(value),
                                     attr_type=AttributeProto.STRING)
    if t == AttributeProto.TENSOR:
        return helper.make_attribute(name, numpy_helper.from_array(np.asarray(value)),
                                     attr_type=AttributeProto.TENSOR)
    if t == AttributeProto.FLOATS:
        return helper.make_attribute(name, [float(v) for v in np.asarray(value).reshape(-1)],
                                     attr_type=AttributeProto.FLOATS)
    if t == AttributeProto.INTS:
        return helper.make_attribute(name, [int(v) for v in np.asarray(value).reshape(-1)],
                                     attr_type=AttributeProto.INTS)
    if t == AttributeProto.STRINGS:
        return helper.make_attribute(name, [v if isinstance(v, bytes) else str(v) for v in value],
                                     attr_type=AttributeProto.STRINGS)
    if t == AttributeProto.GRAPH:
        return helper.make_attribute(name, value, attr_type=AttributeProto.GRAPH)
    raise TensorplanError(f"attribute '{name}': ONNX attribute type {t} is not supported")


def node_to_proto(node: Node, opset: int) -> onnx.NodeProto:
    """One IR node as a NodeProto with attribute types taken from the op schema."""
    types = _schema_attr_types(node.op, opset, node.domain)
    attrs = []
    for k, v in node.attrs.items():
        if v is None:
            continue
        attrs.append(make_attribute(k, v, types.get(k)))
    p = helper.make_node(node.op, list(node.inputs), list(node.outputs), name=node.name,
                         domain=node.domain or None)
    p.attribute.extend(attrs)
    return p


def _adapt_nodes(graph: Graph, opset: int) -> tuple[list[Node], dict[str, np.ndarray]]:
    """Rewrite attribute/input forms for the target opset; returns nodes + new constants."""
    consts = graph.constants()
    extra: dict[str, np.ndarray] = {}
    taken = set(graph.tensors)
    out: list[Node] = []

    def new_const(base: str, value: np.ndarray) -> str:
        name = base
        k = 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        extra[name] = value
        return name

    for n in graph.nodes:
        n = Node(n.name, n.op, list(n.inputs), list(n.outputs), dict(n.attrs), n.domain)
        rule = _ATTR_TO_INPUT.get(n.op)
        if rule is not None:
            attr, since = rule
            has_input = len(n.inputs) > 1 and n.inputs[1] != ""
            if opset >= since and attr in n.attrs:
                val = np.asarray(n.attrs.pop(attr), dtype=np.int64).reshape(-1)
                name = new_const(f"{n.name}.{attr}", val)
                n.inputs = [n.inputs[0], name] + n.inputs[2:]
            elif opset < since and has_input:
                src = n.inputs[1]
                if src in consts:
                    n.attrs[attr] = [int(v) for v in np.asarray(consts[src].data).reshape(-1)]
                elif src in extra:
                    n.attrs[attr] = [int(v) for v in extra[src].reshape(-1)]
                else:
                    raise TensorplanError(
                        f"node '{n.name}' ({n.op}): '{attr}' comes from a computed tensor "
                        f"'{src}', which opset {opset} cannot express (needs opset >= {since})")
                n.inputs = [n.inputs[0]]
            if n.op == "Split" and opset >= 18 and "num_outputs" not in n.attrs and \
                    not (len(n.inputs) > 1 and n.inputs[1]):
                n.attrs["num_outputs"] = len(n.outputs)
            if n.op == "Split" and opset < 18:
                n.attrs.pop("num_outputs", None)
        if n.op in ("Softmax", "LogSoftmax", "Hardmax") and (graph.opset < 13) != (opset < 13):
            rank = len(graph.tensors[n.inputs[0]].shape)
            default = 1 if graph.opset < 13 else -1
            axis = int(n.attrs.get("axis", default)) % max(rank, 1)
            if axis != rank - 1:
                raise TensorplanError(
                    f"node '{n.name}' ({n.op}): axis {axis} of a rank-{rank} input means different "
                    f"things in opset {graph.opset} and {opset}; export at the graph's opset")
            n.attrs["axis"] = -1 if opset >= 13 else rank - 1
        out.append(n)
    return out, extra


def graph_to_onnx(graph: Graph, opset: int | None = None) -> onnx.ModelProto:
    """A valid ModelProto (ir_version 9, constants as initializers) for `graph`."""
    opset = int(opset or graph.opset)
    nodes, extra = _adapt_nodes(graph, opset)
    used = {i for n in nodes for i in n.inputs if i} | set(graph.outputs)
    inits = []
    for name, t in graph.tensors.items():
        if t.data is not None and name in used and name not in graph.inputs:
            inits.append(numpy_helper.from_array(np.asarray(t.data), name))
    for name, arr in extra.items():
        inits.append(numpy_helper.from_array(arr, name))
    proto_nodes = [node_to_proto(n, opset) for n in nodes]

    def vi(name: str) -> onnx.ValueInfoProto:
        t = graph.tensors.get(name)
        if t is None:
            raise TensorplanError(f"graph '{graph.name}': tensor '{name}' has no shape/dtype")
        return helper.make_tensor_value_info(name, onnx_dtype(t.dtype), list(t.shape))

    inputs = [vi(i) for i in graph.inputs]
    outputs = [vi(o) for o in graph.outputs]
    io = set(graph.inputs) | set(graph.outputs)
    value_info = [vi(o) for n in nodes for o in n.outputs
                  if o and o not in io and o in graph.tensors]
    g = helper.make_graph(proto_nodes, graph.name or "graph", inputs, outputs, inits,
                          value_info=value_info)
    domains = sorted({n.domain for n in nodes if n.domain and n.domain != "ai.onnx"})
    imports = [helper.make_opsetid("", opset)] + [
        helper.make_opsetid(d, domain_opset(d, opset, graph.domain_opsets)) for d in domains]
    model = helper.make_model(g, opset_imports=imports, producer_name="tensorplan")
    model.ir_version = IR_VERSION
    return model


def run_onnxruntime(graph_or_model: Graph | onnx.ModelProto, feeds: dict[str, np.ndarray],
                    threads: int = 2) -> dict[str, np.ndarray]:
    """Run with ONNX Runtime (CPU, all graph optimizations); outputs by name."""
    sess = ort_session(graph_or_model, threads)
    names = [o.name for o in sess.get_outputs()]
    in_names = {i.name for i in sess.get_inputs()}
    res = sess.run(names, {k: v for k, v in feeds.items() if k in in_names})
    return dict(zip(names, res))


def ort_session(graph_or_model: Graph | onnx.ModelProto, threads: int = 2, spinning: bool = True):
    """An ORT InferenceSession (CPU, ORT_ENABLE_ALL, `threads` intra-op threads). `spinning=False`
    stops its pool threads busy-waiting after a run, when other work shares the cores."""
    import onnxruntime as ort
    model = graph_to_onnx(graph_or_model) if isinstance(graph_or_model, Graph) else graph_or_model
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise TensorplanError(f"ONNX Runtime rejected model '{model.graph.name}': {e}") from e
