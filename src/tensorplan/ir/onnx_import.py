"""ONNX -> static-shape `Graph`, for default-domain opsets 1..26 (`MIN_OPSET`, `MAX_OPSET`;
26 is the newest opset the pinned ONNX Runtime 1.31 loads, 27 it refuses).

Steps: load (errors name the file) -> a model below opset 11 (`NATIVE_OPSET`) is validated as
given and converted to opset 11 (`_upgrade`: onnx's version converter, for the operator versions
whose conversion was checked against ONNX Runtime; any other operator whose version changes is
refused by name) -> check the opset, domains and each node's operator version
(a version newer than the reference executor implements, or an attribute of a newer version it
does not honour, is an error naming the node, op and version) -> inline local functions ->
validate as strictly as ONNX Runtime: onnx's checker (op schemas, attribute types, arity) and
strict type and shape inference with data propagation on the model as given, so declared output
and value_info shapes that contradict the computed ones are errors -> repeat {inline
constant-condition `If`s, unroll `Loop`s whose iteration count is known and `Scan`s over inputs
of static length; onnx shape inference (strict, data_prop) on a weight-free skeleton; fold every
node whose inputs are constant, and `Shape`/`Size` of static tensors} until nothing changes ->
shapes left unknown are found by running the reference executor on zeros -> every tensor has a
static shape -> the shape rules onnx's inference skips but ONNX Runtime enforces when it runs
(convolution channels, groups, kernel_shape and bias; Reshape element counts; normalization,
PRelu, Gemm and quantization parameter sizes; axis ranges; constant Gather indices) -> nodes left
to ONNX Runtime must load there. Every refusal is one `ModelImportError` naming the node and op.

Dynamic models become static with `input_shapes` (`--input-shape x=1,3,224,224`);
a symbolic input dimension without an override is an error that names it.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tensorplan.errors import ModelImportError, TensorplanError, UnsupportedOperatorError
from tensorplan.ir import reference as _reference
from tensorplan.ir.graph import Graph, Node, Tensor, unique_name
from tensorplan.ir.ort_node import ort_has_kernel
from tensorplan.ir.reference import ONNX_TO_NP, OPS, _OPSET, is_foreign, run_node, run_reference

MIN_OPSET, MAX_OPSET = 1, 26
# The reference executor implements operator versions from this opset on; older models are
# converted to it at import (`_upgrade`).
NATIVE_OPSET = 11
# Every operator version up to this opset was checked against the reference executor (newer
# versions of its ops only added element types, or attributes gated in `_UNHONOURED`). A node
# whose op version is newer than this is refused by name rather than run on older semantics.
_REVIEWED_OPSET = 26
_DEFAULT_DOMAINS = ("", "ai.onnx")
# Ops never folded even with constant inputs (random or stateful).
_NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
            "Multinomial", "Bernoulli"}
# Constants at most this many elements go into the inference skeleton as data
# (shape arithmetic needs their values); bigger ones go in as typed inputs.
_SKELETON_DATA_LIMIT = 4096


def parse_input_shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]]:
    """`["x=1,3,224,224", "ids=1x128"]` -> `{"x": (1,3,224,224), "ids": (1,128)}`."""
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs or []:
        if "=" not in spec:
            raise ModelImportError(
                f"--input-shape '{spec}': expected NAME=D1,D2,... (e.g. x=1,3,224,224)")
        name, dims = spec.rsplit("=", 1)
        name = name.strip()
        parts = [p for p in dims.replace("x", ",").replace(" ", "").split(",") if p != ""]
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            raise ModelImportError(
                f"--input-shape '{spec}': dimensions must be integers (e.g. {name}=1,3,224,224)")
        if not name or any(d < 0 for d in shape):
            raise ModelImportError(f"--input-shape '{spec}': need a name and non-negative dims")
        out[name] = shape
    return out


# ------------------------------------------------------------------ loading
def load_proto(model: str | Path | onnx.ModelProto) -> tuple[onnx.ModelProto, str, Path | None]:
    """The ModelProto (external data not loaded), a label for errors, and the folder external data
    is relative to. A missing, empty or corrupt file is one `ModelImportError` naming it."""
    if isinstance(model, onnx.ModelProto):
        return model, f"model '{model.graph.name or 'in memory'}'", None
    path = Path(model)
    label = str(path)
    if not path.exists():
        raise ModelImportError(f"{label}: no such file")
    if path.is_dir():
        raise ModelImportError(f"{label}: is a directory, expected an .onnx file")
    data = path.read_bytes()
    if not data:
        raise ModelImportError(f"{label}: file is empty, not an ONNX model")
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:
        raise ModelImportError(
            f"{label}: not a valid ONNX model (truncated or corrupt protobuf: {e})") from None
    return proto, label, path.parent


def _load_external(proto: onnx.ModelProto, label: str, base: Path | None) -> None:
    ext = [t for t in proto.graph.initializer
           if t.HasField("data_location") and t.data_location == onnx.TensorProto.EXTERNAL]
    if not ext:
        return
    for t in ext:
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location")
        if not loc:
            raise ModelImportError(f"{label}: initializer '{t.name}' has external data without a location")
        if base is None:
            raise ModelImportError(
                f"{label}: initializer '{t.name}' keeps its data in external file '{loc}'; "
                "pass the model's path instead of a ModelProto")
        f = base / loc
        if not f.exists():
            raise ModelImportError(
                f"{label}: external data file '{f}' (for initializer '{t.name}') is missing; "
                "keep it next to the .onnx file")
    try:
        from onnx.external_data_helper import load_external_data_for_model
        load_external_data_for_model(proto, str(base))
    except Exception as e:
        raise ModelImportError(f"{label}: cannot read external data: {e}") from None


def _check_opset(proto: onnx.ModelProto, label: str) -> int:
    versions = {o.domain: o.version for o in proto.opset_import}
    v = versions.get("", versions.get("ai.onnx"))
    if v is None:
        if not proto.opset_import and proto.ir_version and proto.ir_version < 3:
            v = 1
        elif versions and not any(n.domain in _DEFAULT_DOMAINS for n in proto.graph.node):
            v = MAX_OPSET  # only other domains' ops (ai.onnx.ml): any default opset serves
        else:
            raise ModelImportError(
                f"{label}: declares no default-domain opset (opset_import is "
                f"{dict(versions) or 'empty'}); not a usable ONNX model")
    if not MIN_OPSET <= v <= MAX_OPSET:
        raise ModelImportError(
            f"{label}: opset {v} is outside the supported range {MIN_OPSET}..{MAX_OPSET}; "
            f"re-export the model with an opset in that range")
    return int(v)


# ------------------------------------------------------------------ validation
_NODE_IN_MSG = re.compile(r"\(op_type:([^,)]*)(?:, node name: ([^)]*))?\): (.*)")
_NODE_CTX_MSG = re.compile(r"Bad node spec for node\. Name: (.*?) OpType: (\S*)")
_DIFFER_MSG = re.compile(r"Inferred (shape|elem type) (?:and existing (?:shape|elem type) differ|"
                         r"differs from existing elem type)(.*)")
_ATTR_TYPE_MSG = re.compile(r"Mismatched attribute type in '[^']*?:\s*([^']*)'\. Expected: '(\w+)', "
                            r"actual: '(\w+)'")
_VS_MSG = re.compile(r"(?:in (dimension \d+|rank))?:?\s*\(([^)]*)\) vs \(([^)]*)\)")


def _elem_name(v: str) -> str:
    try:
        return onnx.TensorProto.DataType.Name(int(v))
    except Exception:
        return v


def _reword(reason: str, outs: str) -> str:
    """onnx's wording of the common failures, said in tensorplan's words."""
    a = _ATTR_TYPE_MSG.search(reason)
    if a:
        return (f"attribute '{a.group(1).strip()}' has type {a.group(3)}, but the operator "
                f"requires {a.group(2)}")
    d = _DIFFER_MSG.search(reason)
    if d:
        what = "shape" if d.group(1) == "shape" else "element type"
        vs = _VS_MSG.search(d.group(2))
        target = f"its output {outs}" if outs else "its output"
        if vs:
            got, want = vs.group(2), vs.group(3)
            if what == "element type":
                got, want = _elem_name(got), _elem_name(want)
            part = f" in {vs.group(1)}" if vs.group(1) else ""
            return (f"the {what} it computes contradicts the {what} the model declares for "
                    f"{target}{part}: computed {got}, declared {want}")
        return f"the {what} it computes contradicts the {what} the model declares for {target}"
    return reason


# Attribute defaults of the operator schema that onnx's shape inference does not apply (STFT's
# inference reads onesided as 0 when it is absent; the schema's default, which ONNX Runtime
# runs, is 1): set explicitly on import, so inference and execution agree.
_INFERENCE_DEFAULTS: dict[str, dict[str, Any]] = {"STFT": {"onesided": 1}}


def _validation_copy(proto: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]],
                     node_names: list[str]) -> tuple[onnx.ModelProto, dict[str, str]]:
    """The model as given, without its big weights (they go in as typed inputs), for the checker
    and strict shape inference; nodes carry tensorplan's (unique, non-empty) names for errors.

    Graph outputs declared without a shape (ONNX Runtime accepts them, the checker does not)
    are checked only for their element type (as value_info)."""
    g = proto.graph
    m = onnx.ModelProto()
    m.ir_version = proto.ir_version
    m.opset_import.extend(proto.opset_import)
    mg = m.graph
    mg.name = g.name or "graph"
    mg.node.extend(g.node)
    declared_in = {vi.name for vi in g.input}
    for vi in g.input:
        c = mg.input.add()
        c.CopyFrom(vi)
        tt = c.type.tensor_type
        if c.type.HasField("tensor_type") and not tt.HasField("shape") and vi.name in input_shapes:
            tt.shape.SetInParent()
            for d in input_shapes[vi.name]:
                tt.shape.dim.add().dim_value = int(d)
    for t in g.initializer:
        n = 1
        for d in t.dims:
            n *= int(d)
        if n <= _SKELETON_DATA_LIMIT:
            mg.initializer.add().CopyFrom(t)
        elif t.name not in declared_in:
            mg.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    mg.sparse_initializer.extend(g.sparse_initializer)
    mg.value_info.extend(g.value_info)
    for vi in g.output:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and not tt.HasField("shape"):
            mg.value_info.add().CopyFrom(vi)
        else:
            mg.output.add().CopyFrom(vi)
    names: dict[str, str] = {}
    for k, n in enumerate(mg.node):
        if k < len(node_names):
            n.name = node_names[k]
        names[n.name] = f"node '{n.name}' ({n.op_type})"
        given = {a.name for a in n.attribute}
        for key, value in _INFERENCE_DEFAULTS.get(n.op_type, {}).items():
            if n.domain in _DEFAULT_DOMAINS and key not in given:
                n.attribute.append(helper.make_attribute(key, value))
    return m, names


def _validation_error(label: str, err: Exception, names: dict[str, str],
                      copy: onnx.ModelProto) -> ModelImportError:
    """A checker/shape-inference failure as one line naming the node and op."""
    text = str(err).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    first = lines[0] if lines else type(err).__name__
    where, reason = None, first
    m = _NODE_IN_MSG.search(text)
    if m:
        op, nname, reason = m.group(1), (m.group(2) or "").strip(), m.group(3).strip()
        reason = re.sub(r"^(\[\w+\]\s*)+", "", reason)
        where = names.get(nname) if nname else None
        if where is None:
            cands = [v for k, v in names.items() if v.endswith(f"({op})") or f"({op}," in v]
            where = cands[0] if len(cands) == 1 else f"a {op} node"
        reason = _reword(reason, _declared_outputs(copy, nname, op))
    else:
        c = _NODE_CTX_MSG.search(text)
        if c:
            nname, op = c.group(1).strip(), c.group(2).strip()
            where = names.get(nname, f"node '{nname}' ({op})")
            reason = _reword(re.sub(r"^(\[\w+\]\s*)+", "", first), "")
    reason = reason.rstrip(".")
    msg = f"{label}: " + (f"{where}: " if where else "") + f"invalid model: {reason}"
    return ModelImportError(msg)


def _declared_outputs(proto: onnx.ModelProto, nname: str, op: str) -> str:
    declared = {vi.name for vi in proto.graph.output} | {vi.name for vi in proto.graph.value_info}
    for n in proto.graph.node:
        if n.name == nname and n.op_type == op:
            outs = [o for o in n.output if o in declared]
            return ", ".join(f"'{o}'" for o in outs)
    return ""


def _in_function_body(text: str, m: onnx.ModelProto) -> bool:
    """The first strict-inference error is inside the body onnx expands for a function operator
    (not an If/Loop/Scan sub-graph of the model)."""
    found = _NODE_IN_MSG.search(text)
    if not found or "Inference error(s): (op_type:" not in found.group(3):
        return False
    op = found.group(1)
    if op in ("If", "Loop", "Scan", "SequenceMap"):
        return False
    try:
        schema = onnx.defs.get_schema(op, max(o.version for o in m.opset_import
                                              if o.domain in _DEFAULT_DOMAINS), "")
    except Exception:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def _sort_nodes(g: onnx.GraphProto) -> None:
    """Order g's nodes so each comes after the producers of its inputs (stable otherwise)."""
    produced = {o for n in g.node for o in n.output if o}
    done: set[str] = set()
    pending = list(g.node)
    order: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for n in pending:
            deps = {i for i in n.input if i in produced} | (
                _subgraph_reads_node(n) & produced)
            if deps <= done:
                order.append(n)
                done.update(o for o in n.output if o)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            order.extend(rest)  # a cycle: the checker names it
            break
        pending = rest
    nodes = [onnx.NodeProto() for _ in order]
    for dst, src in zip(nodes, order):
        dst.CopyFrom(src)
    del g.node[:]
    g.node.extend(nodes)


def _subgraph_reads_node(n: onnx.NodeProto) -> set[str]:
    reads: set[str] = set()
    for a in n.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            reads |= _subgraph_reads(a.g)
    return reads


def _validate(proto: onnx.ModelProto, label: str,
              input_shapes: dict[str, tuple[int, ...]] | None, node_names: list[str]) -> None:
    """Refuse what ONNX Runtime refuses to load: onnx's checker (op schemas, attribute types,
    arity, graph structure) and strict type and shape inference with data propagation on the
    model as given, declared value_info and output shapes included."""
    m, names = _validation_copy(proto, dict(input_shapes or {}), node_names)
    try:
        try:
            onnx.checker.check_model(m, full_check=False)
        except onnx.checker.ValidationError as e:
            if "topologically sorted" not in str(e):
                raise
            # ONNX Runtime sorts the nodes itself; so does tensorplan (`_toposort`)
            _sort_nodes(m.graph)
            onnx.checker.check_model(m, full_check=False)
        try:
            onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True, data_prop=True)
        except onnx.shape_inference.InferenceError as e:
            if not _in_function_body(str(e), m):
                raise
            # onnx's own expansion of a function operator (MeanVarianceNormalization) fails
            # strict inference on valid models ONNX Runtime loads: only the checker's verdict holds
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise _validation_error(label, e, names, m) from None


# ------------------------------------------------------------------ proto -> IR pieces
def _attr_value(a: onnx.AttributeProto, where: str) -> Any:
    T = onnx.AttributeProto
    if a.type == T.FLOAT:
        return float(a.f)
    if a.type == T.INT:
        return int(a.i)
    if a.type == T.STRING:
        return a.s.decode("utf-8", errors="replace")
    if a.type == T.TENSOR:
        return _to_array(a.t, where)
    if a.type == T.GRAPH:
        return a.g
    if a.type == T.FLOATS:
        return [float(v) for v in a.floats]
    if a.type == T.INTS:
        return [int(v) for v in a.ints]
    if a.type == T.STRINGS:
        return [s.decode("utf-8", errors="replace") for s in a.strings]
    if a.type == T.TENSORS:
        return [_to_array(t, where) for t in a.tensors]
    raise ModelImportError(f"{where}: attribute '{a.name}' has unsupported type "
                           f"{onnx.AttributeProto.AttributeType.Name(a.type) if a.type in T.AttributeType.values() else a.type}")


def _to_array(t: onnx.TensorProto, where: str) -> np.ndarray:
    if t.data_type not in ONNX_TO_NP and t.data_type != onnx.TensorProto.BFLOAT16:
        raise ModelImportError(
            f"{where}: tensor '{t.name}' has unsupported element type "
            f"{onnx.TensorProto.DataType.Name(t.data_type) if t.data_type in onnx.TensorProto.DataType.values() else t.data_type}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as e:
        raise ModelImportError(f"{where}: tensor '{t.name}' cannot be decoded: {e}") from None
    if t.data_type == onnx.TensorProto.BFLOAT16:
        arr = np.asarray(arr, dtype=np.float32)
    if arr.flags.owndata and arr.flags.writeable and arr.flags.c_contiguous:
        return arr  # already a private copy (no second copy of big weights)
    return np.array(arr)


def _dims_of(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return dims


def _np_dtype_name(elem: int, where: str) -> str:
    if elem == onnx.TensorProto.BFLOAT16:
        return "float32"
    dt = ONNX_TO_NP.get(elem)
    if dt is None:
        raise ModelImportError(
            f"{where}: element type "
            f"{onnx.TensorProto.DataType.Name(elem) if elem in onnx.TensorProto.DataType.values() else elem}"
            " is not supported")
    return np.dtype(dt).name


class _State:
    """Mutable import state: nodes, constants, input types, discovered shapes."""

    def __init__(self, label: str, opset: int):
        self.label = label
        self.opset = opset
        self.nodes: list[Node] = []
        self.consts: dict[str, np.ndarray] = {}
        self.inputs: list[str] = []
        self.input_types: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.outputs: list[str] = []
        self.output_elem: dict[str, int] = {}
        self.shapes: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        self.names: set[str] = set()
        self.domain_opsets: dict[str, int] = {}
        self.proto_names: list[str] = []  # tensorplan's name of each node read, in order
        # Scan nodes converted from Scan-8 (batched), by first output: their scan directions
        self.scan8: dict[str, list[int]] = {}


@functools.lru_cache(maxsize=4096)
def _op_versions(op: str, opset: int) -> tuple[int, int] | None:
    """(version in effect at `opset`, version in effect at NATIVE_OPSET or the op's first version)
    of a default-domain op; None if onnx does not know the op at that opset."""
    try:
        since = onnx.defs.get_schema(op, opset, "").since_version
    except Exception:
        return None
    try:
        floor = onnx.defs.get_schema(op, NATIVE_OPSET, "").since_version
    except Exception:
        floor = 0  # the op is newer than NATIVE_OPSET: every version of it is in range
    return int(since), int(floor)


def _dequant_unhonoured(attrs: dict) -> str | None:
    if int(attrs.get("block_size", 0) or 0) != 0:
        return f"attribute block_size={attrs['block_size']} (blocked quantization)"
    if int(attrs.get("output_dtype", 0) or 0) != 0:
        return f"attribute output_dtype={attrs['output_dtype']}"
    return None


def _cast_unhonoured(attrs: dict) -> str | None:
    rm = attrs.get("round_mode", "up")
    if rm not in ("up", b"up"):
        return f"attribute round_mode='{rm}'"
    return None


# Attributes of newer operator versions the reference executor does not implement: a node
# that sets one to a non-default value is refused by name (never run with the attribute ignored).
_UNHONOURED = {"DequantizeLinear": _dequant_unhonoured, "Cast": _cast_unhonoured,
               "CastLike": _cast_unhonoured}


def _check_version(where: str, op: str, domain: str, opset: int, attrs: dict) -> None:
    """A default-domain op the reference executor runs must be at a version it implements: at
    most `_REVIEWED_OPSET`'s, within `reference.OP_VERSIONS[op] = (lowest, highest)` where the
    reference declares a range, and with no attribute of a newer version it ignores."""
    if domain not in _DEFAULT_DOMAINS or op not in OPS:
        return  # foreign ops run in ONNX Runtime, which checks its own versions
    v = _op_versions(op, opset)
    if v is None:
        return  # unknown op at this opset: the checker names it
    since, floor = v
    lo, hi = getattr(_reference, "OP_VERSIONS", {}).get(op, (floor, _REVIEWED_OPSET))
    if since > hi:  # the reference executor declares the newest version it implements
        raise ModelImportError(
            f"{where}: {op} version {since} (opset {opset}) is newer than tensorplan implements "
            f"({op} up to version {hi}); re-export at an opset where {op} is version {hi} or older")
    floor = max(floor, lo)
    if since < floor:
        raise ModelImportError(
            f"{where}: {op} version {since} (in effect at opset {opset}) is older than "
            f"tensorplan implements ({op} from version {floor}); re-export the model at opset "
            f"{NATIVE_OPSET} or newer")
    if since > _REVIEWED_OPSET:
        raise ModelImportError(
            f"{where}: {op} version {since} (opset {opset}) is newer than tensorplan implements "
            f"(operator versions up to opset {_REVIEWED_OPSET}); re-export at opset {_REVIEWED_OPSET}")
    check = _UNHONOURED.get(op)
    what = check(attrs) if check else None
    if what:
        raise ModelImportError(
            f"{where}: {op} version {since} {what} is not supported by tensorplan")


def _add_nodes(st: _State, nodes, prefix: str = "") -> None:
    for k, p in enumerate(nodes):
        base = (prefix + p.name) if p.name else f"{prefix}{p.op_type or 'node'}_{len(st.nodes) + k}"
        name = unique_name(st.names, base)
        st.names.add(name)
        st.proto_names.append(name)
        where = f"{st.label}: node '{name}' ({p.op_type})"
        attrs = {a.name: _attr_value(a, where) for a in p.attribute}
        if not p.op_type:
            raise ModelImportError(f"{where}: node has no op_type")
        _check_version(where, p.op_type, p.domain, st.opset, attrs)
        if p.domain in _DEFAULT_DOMAINS:
            for key, value in _INFERENCE_DEFAULTS.get(p.op_type, {}).items():
                attrs.setdefault(key, value)
        if p.op_type == "Constant" and p.domain in _DEFAULT_DOMAINS:
            if len(p.output) != 1 or not p.output[0]:
                raise ModelImportError(f"{where}: Constant must have exactly one output")
            if "sparse_value" in attrs or any(k in attrs for k in ("value_string", "value_strings")):
                raise ModelImportError(f"{where}: string/sparse Constant values are not supported")
            val = run_node(Node(name, "Constant", [], list(p.output), attrs), [])[0]
            st.consts[p.output[0]] = val
            continue
        st.nodes.append(Node(name, p.op_type, list(p.input), list(p.output), attrs,
                             "" if p.domain in _DEFAULT_DOMAINS else p.domain))


def _parse(proto: onnx.ModelProto, label: str, opset: int) -> _State:
    g = proto.graph
    st = _State(label, opset)
    st.domain_opsets = {o.domain: int(o.version) for o in proto.opset_import
                        if o.domain not in _DEFAULT_DOMAINS}
    if len(g.sparse_initializer):
        raise ModelImportError(f"{label}: sparse initializers are not supported")
    for t in g.initializer:
        if not t.name:
            raise ModelImportError(f"{label}: an initializer has no name")
        st.consts[t.name] = _to_array(t, label)
    for vi in g.input:
        if vi.name in st.consts:
            continue
        if not vi.type.HasField("tensor_type"):
            raise ModelImportError(f"{label}: input '{vi.name}' is not a tensor (sequences/maps "
                                   "are not supported)")
        st.inputs.append(vi.name)
    _add_nodes(st, g.node)
    for vi in g.output:
        if not vi.name:
            raise ModelImportError(f"{label}: a graph output has no name")
        st.outputs.append(vi.name)
        if vi.type.HasField("tensor_type"):
            st.output_elem[vi.name] = vi.type.tensor_type.elem_type
    if not st.outputs:
        raise ModelImportError(f"{label}: graph has no outputs")
    return st


def _resolve_inputs(st: _State, proto: onnx.ModelProto,
                    input_shapes: dict[str, tuple[int, ...]] | None) -> None:
    overrides = dict(input_shapes or {})
    unknown = [k for k in overrides if k not in st.inputs]
    if unknown:
        raise ModelImportError(
            f"{st.label}: --input-shape names {unknown}, but the model's inputs are {st.inputs}")
    by_name = {vi.name: vi for vi in proto.graph.input}
    for name in st.inputs:
        vi = by_name[name]
        dtype = _np_dtype_name(vi.type.tensor_type.elem_type, f"{st.label}: input '{name}'")
        if name in overrides:
            shape = tuple(int(d) for d in overrides[name])
            dims = _dims_of(vi)
            if dims is not None and len(dims) != len(shape):
                raise ModelImportError(
                    f"{st.label}: --input-shape {name}={','.join(map(str, shape))} has rank "
                    f"{len(shape)} but input '{name}' has rank {len(dims)} ({_fmt_dims(dims)})")
        else:
            dims = _dims_of(vi)
            if dims is None:
                raise ModelImportError(
                    f"{st.label}: input '{name}' has no shape; pass --input-shape {name}=D1,D2,...")
            for k, d in enumerate(dims):
                if not isinstance(d, int):
                    label = f"'{d}'" if isinstance(d, str) and d else "unknown"
                    open_ = [f"D{j}" if not (isinstance(x, str) and x) else x.upper()
                             for j, x in enumerate(dims) if not isinstance(x, int)]
                    it = iter(open_)
                    pattern = ",".join(str(x) if isinstance(x, int) else next(it) for x in dims)
                    raise ModelImportError(
                        f"{st.label}: input '{name}' has a symbolic dimension {label} at index {k} "
                        f"(shape {_fmt_dims(dims)}); make it static with "
                        f"--input-shape {name}={pattern}, giving {', '.join(open_)} the sizes you run it at")
            shape = tuple(int(d) for d in dims)
        st.input_types[name] = (dtype, shape)
        st.shapes[name] = (dtype, shape)


def _fmt_dims(dims: list) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"


# ------------------------------------------------------------------ If inlining
def _inline_constant_ifs(st: _State) -> bool:
    changed = False
    out: list[Node] = []
    for n in st.nodes:
        if n.op == "If" and n.inputs and n.inputs[0] in st.consts:
            cond = bool(np.asarray(st.consts[n.inputs[0]]).reshape(-1)[0])
            branch = n.attrs.get("then_branch" if cond else "else_branch")
            if not isinstance(branch, onnx.GraphProto):
                raise ModelImportError(f"{st.label}: node '{n.name}' (If) has no branch graph")
            sub = _State(st.label, st.opset)
            sub.names = st.names
            for t in branch.initializer:
                st.consts[t.name] = _to_array(t, st.label)
            _add_nodes(sub, branch.node, prefix=f"{n.name}/")
            st.consts.update(sub.consts)
            out.extend(sub.nodes)
            for src, dst in zip([o.name for o in branch.output], n.outputs):
                if dst:
                    ident = unique_name(st.names, f"{n.name}/out_{dst}")
                    st.names.add(ident)
                    out.append(Node(ident, "Identity", [src], [dst]))
            changed = True
        else:
            out.append(n)
    st.nodes = out
    return changed


# Loops unrolled at import: at most this many iterations and this many body nodes in all.
_MAX_UNROLL_ITERATIONS, _MAX_UNROLL_NODES = 1024, 20000


def _loop_cond_out(body: onnx.GraphProto) -> tuple[str, Any]:
    """How a Loop body computes its condition output: ("same", None) when it passes its
    condition input through, ("const", bool) when it is a constant, ("data", None) otherwise."""
    cin, cout = body.input[1].name, body.output[0].name
    while True:
        if cout == cin:
            return "same", None
        for t in body.initializer:
            if t.name == cout:
                return "const", bool(numpy_helper.to_array(t).reshape(-1)[0])
        prod = next((p for p in body.node if cout in p.output), None)
        if prod is None or prod.domain not in _DEFAULT_DOMAINS:
            return "data", None
        if prod.op_type == "Identity":
            cout = prod.input[0]
            continue
        if prod.op_type == "Constant":
            for a in prod.attribute:
                if a.name == "value":
                    return "const", bool(numpy_helper.to_array(a.t).reshape(-1)[0])
        return "data", None


def _loop_trips(st: _State, n: Node) -> int | None:
    """How many times a Loop runs, when its trip count, first condition and the way its body
    updates the condition are known at import; None otherwise."""
    body = n.attrs.get("body")
    if not isinstance(body, onnx.GraphProto) or len(body.input) < 2 or not body.output:
        return None
    if _has_nested_graphs(body):
        return None  # nested control flow stays a Loop (and is refused by name)
    m_name = n.inputs[0] if n.inputs else ""
    c_name = n.inputs[1] if len(n.inputs) > 1 else ""
    if not m_name or m_name not in st.consts or (c_name and c_name not in st.consts):
        return None
    trips = int(np.asarray(st.consts[m_name]).reshape(-1)[0])
    cond = bool(np.asarray(st.consts[c_name]).reshape(-1)[0]) if c_name else True
    kind, value = _loop_cond_out(body)
    if kind == "data":
        return None
    if not cond:
        return 0
    return max(0, min(trips, 1 if (kind == "const" and not value) else trips))


class _Unroller:
    """Copies of a sub-graph's nodes inlined into the importing graph, its names made unique per
    copy; values stacked along an axis with Unsqueeze + Concat in the graph's opset."""

    def __init__(self, st: _State, owner: Node, out: list[Node]):
        self.st, self.owner, self.out = st, owner, out
        self.taken = st.names | set(st.consts) | {i for m in st.nodes for i in m.inputs + m.outputs}

    def fresh(self, base: str) -> str:
        name = unique_name(self.taken, base)
        self.taken.add(name)
        return name

    def inline(self, body: onnx.GraphProto, bound: list, tag: str) -> list[str]:
        """One copy of `body` with its inputs bound to tensor names (str) or constants (arrays);
        the names of its outputs."""
        st = self.st
        local = {vi.name for vi in body.input} | {t.name for t in body.initializer} | {
            o for p in body.node for o in p.output if o}
        ren = {name: self.fresh(tag + name) for name in sorted(local)}
        for vi, v in zip(body.input, bound):
            if isinstance(v, str):
                ren[vi.name] = v
            else:
                st.consts[ren[vi.name]] = np.asarray(v)
        for t in body.initializer:
            st.consts[ren[t.name]] = _to_array(t, st.label)
        copy = onnx.GraphProto()
        copy.node.extend(body.node)
        for p in copy.node:
            p.input[:] = [ren.get(i, i) for i in p.input]
            p.output[:] = [ren.get(o, o) if o else o for o in p.output]
        sub = _State(st.label, st.opset)
        sub.names = st.names
        _add_nodes(sub, copy.node, prefix=tag)
        st.consts.update(sub.consts)
        self.out.extend(sub.nodes)
        return [ren.get(o.name, o.name) for o in body.output]

    def emit(self, op: str, inputs: list[str], output: str, attrs: dict | None = None) -> None:
        name = unique_name(self.st.names, f"{self.owner.name}/{op.lower()}_{output}")
        self.st.names.add(name)
        self.out.append(Node(name, op, inputs, [output], attrs or {}))

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(f"{self.owner.name}/{base}")
        self.st.consts[name] = value
        return name

    def stack(self, values: list[str], dst: str, axis: int) -> None:
        parts = []
        for v in values:
            part = self.fresh(f"{v}/stacked")
            if self.st.opset >= 13:
                self.emit("Unsqueeze", [v, self.const("axis", np.array([axis], np.int64))], part)
            else:
                self.emit("Unsqueeze", [v], part, {"axes": [axis]})
            parts.append(part)
        self.emit("Concat", parts, dst, {"axis": axis})


def _check_unroll(where: str, trips: int, body: onnx.GraphProto) -> None:
    if trips > _MAX_UNROLL_ITERATIONS or trips * len(body.node) > _MAX_UNROLL_NODES:
        raise ModelImportError(
            f"{where}: runs {trips} iterations of {len(body.node)} nodes, too many to unroll "
            f"(at most {_MAX_UNROLL_ITERATIONS} iterations, {_MAX_UNROLL_NODES} nodes); "
            "re-export with a shorter loop")


def _has_nested_graphs(body: onnx.GraphProto) -> bool:
    return any(a.type == onnx.AttributeProto.GRAPH for p in body.node for a in p.attribute)


def _unroll_loop(st: _State, n: Node, trips: int, out: list[Node]) -> None:
    body: onnx.GraphProto = n.attrs["body"]
    n_carried = len(n.inputs) - 2
    n_scan = len(body.output) - 1 - n_carried
    where = f"{st.label}: node '{n.name}' (Loop)"
    _check_unroll(where, trips, body)
    if trips == 0 and n_scan:
        raise ModelImportError(
            f"{where}: runs no iteration, so its scan outputs have no shape; re-export "
            "without the empty loop")
    u = _Unroller(st, n, out)
    carried: list = list(n.inputs[2:])
    scans: list[list[str]] = [[] for _ in range(n_scan)]
    for k in range(trips):
        outs = u.inline(body, [np.array(k, np.int64), np.array(True)] + carried, f"{n.name}/{k}/")
        carried = outs[1:1 + n_carried]
        for j, name in enumerate(outs[1 + n_carried:]):
            scans[j].append(name)
    for src, dst in zip(carried, n.outputs[:n_carried]):
        if dst:
            u.emit("Identity", [src], dst)
    for vals, dst in zip(scans, n.outputs[n_carried:]):
        if dst:
            u.stack(vals, dst, 0)


def _scan_shape(st: _State, name: str) -> tuple | None:
    return st.consts[name].shape if name in st.consts else (st.shapes.get(name) or (None, None))[1]


def _scan_trips(st: _State, n: Node) -> int | None:
    """Iterations of a Scan: the length of its scan inputs along their scan axes (axis 1 of a
    batched Scan-8), once shapes are known; None before that or for a Scan not unrolled."""
    body = n.attrs.get("body")
    m = int(n.attrs.get("num_scan_inputs", 0) or 0)
    if not isinstance(body, onnx.GraphProto) or m < 1 or _has_nested_graphs(body):
        return None
    batched = bool(n.outputs) and n.outputs[0] in st.scan8
    axes = [1] * m if batched else list(n.attrs.get("scan_input_axes") or [0] * m)
    lengths, batches = set(), set()
    for name, ax in zip(n.inputs[len(n.inputs) - m:], axes):
        shape = _scan_shape(st, name)
        if shape is None or not -len(shape) <= ax < len(shape):
            return None
        lengths.add(int(shape[ax]))
        batches.add(int(shape[0]))
    if len(lengths) != 1 or (batched and len(batches) != 1):
        return None  # the checker / ONNX Runtime names the mismatch
    return lengths.pop()


def _scan_sequence(u: _Unroller, n: Node, states: list, inputs: list[str], axes: list[int],
                   dirs: list[int], trips: int, tag: str) -> tuple[list, list[list[str]]]:
    """`trips` copies of a Scan body over `inputs`: the final states and each scan output's
    per-iteration values (in iteration order)."""
    body: onnx.GraphProto = n.attrs["body"]
    scans: list[list[str]] = [[] for _ in range(len(body.output) - len(states))]
    for k in range(trips):
        elems = []
        for j, (name, ax, d) in enumerate(zip(inputs, axes, dirs)):
            e = u.fresh(f"{tag}{k}/in{j}")
            u.emit("Gather", [name, u.const("index", np.array(trips - 1 - k if d else k, np.int64))],
                   e, {"axis": int(ax)})
            elems.append(e)
        outs = u.inline(body, states + elems, f"{tag}{k}/")
        states = outs[:len(states)]
        for j, name in enumerate(outs[len(states):]):
            scans[j].append(name)
    return states, scans


def _unroll_scan(st: _State, n: Node, trips: int, out: list[Node]) -> None:
    body: onnx.GraphProto = n.attrs["body"]
    m = int(n.attrs["num_scan_inputs"])
    n_state = len(n.inputs) - m
    n_scan_out = len(body.output) - n_state
    where = f"{st.label}: node '{n.name}' (Scan)"
    batched = n.outputs[0] in st.scan8
    batch = int(_scan_shape(st, n.inputs[-1])[0]) if batched else 1
    _check_unroll(where, trips * batch, body)
    if trips == 0 and n_scan_out:
        raise ModelImportError(f"{where}: scans no element, so its scan outputs have no shape")
    u = _Unroller(st, n, out)
    if not batched:
        in_axes = list(n.attrs.get("scan_input_axes") or [0] * m)
        in_dirs = list(n.attrs.get("scan_input_directions") or [0] * m)
        out_axes = list(n.attrs.get("scan_output_axes") or [0] * n_scan_out)
        out_dirs = list(n.attrs.get("scan_output_directions") or [0] * n_scan_out)
        states, scans = _scan_sequence(u, n, list(n.inputs[:n_state]), list(n.inputs[n_state:]),
                                       in_axes, in_dirs, trips, f"{n.name}/")
        for src, dst in zip(states, n.outputs[:n_state]):
            if dst:
                u.emit("Identity", [src], dst)
        for vals, dst, ax, d in zip(scans, n.outputs[n_state:], out_axes, out_dirs):
            if dst:
                u.stack(vals[::-1] if d else vals, dst, int(ax))
        return
    # Scan-8: axis 0 of every input and output is a batch; each batch element is one scan
    dirs = st.scan8[n.outputs[0]] or [0] * m
    finals: list[list[str]] = [[] for _ in range(n_state)]
    stacked: list[list[str]] = [[] for _ in range(n_scan_out)]
    for b in range(batch):
        pick = []
        for j, name in enumerate(n.inputs):
            e = u.fresh(f"{n.name}/b{b}/{'state' if j < n_state else 'in'}{j}")
            u.emit("Gather", [name, u.const("batch", np.array(b, np.int64))], e, {"axis": 0})
            pick.append(e)
        states, scans = _scan_sequence(u, n, pick[:n_state], pick[n_state:], [0] * m, dirs, trips,
                                       f"{n.name}/b{b}/")
        for j, s in enumerate(states):
            finals[j].append(s)
        for j, vals in enumerate(scans):
            seq = u.fresh(f"{n.name}/b{b}/scan{j}")
            u.stack(vals, seq, 0)
            stacked[j].append(seq)
    for vals, dst in zip(finals + stacked, n.outputs):
        if dst:
            u.stack(vals, dst, 0)


def _unroll_constant_loops(st: _State) -> bool:
    """Replace each Loop whose iteration count is known at import, and each Scan over inputs of
    known length, by copies of its body, one per iteration (carried values wired through, scan
    outputs stacked along their axis)."""
    changed = False
    out: list[Node] = []
    for n in st.nodes:
        if n.op == "Loop" and not n.domain and (trips := _loop_trips(st, n)) is not None:
            _unroll_loop(st, n, trips, out)
        elif n.op == "Scan" and not n.domain and (trips := _scan_trips(st, n)) is not None:
            _unroll_scan(st, n, trips, out)
        else:
            out.append(n)
            continue
        for o in n.outputs:  # what inference said of the loop's outputs is recomputed
            st.shapes.pop(o, None)
        changed = True
    st.nodes = out
    return changed


# ------------------------------------------------------------------ shape inference
def _skeleton(st: _State) -> onnx.ModelProto:
    """The current graph without big weights: inference needs only their types/shapes."""
    from tensorplan.ir.to_onnx import node_to_proto, onnx_dtype
    used = {i for n in st.nodes for i in n.inputs if i} | set(st.outputs)
    # outer-scope names read inside remaining subgraphs (If/Loop bodies)
    for n in st.nodes:
        for v in n.attrs.values():
            if isinstance(v, onnx.GraphProto):
                used |= _subgraph_reads(v)
    inputs = [helper.make_tensor_value_info(k, onnx_dtype(d), list(s))
              for k, (d, s) in st.input_types.items()]
    inits = []
    for k, v in st.consts.items():
        if k not in used:
            continue
        if v.size <= _SKELETON_DATA_LIMIT:
            inits.append(numpy_helper.from_array(v, k))
        else:
            inputs.append(helper.make_tensor_value_info(k, onnx_dtype(v.dtype.name), list(v.shape)))
    outputs = []
    for o in st.outputs:
        elem = st.output_elem.get(o, 0)
        outputs.append(helper.make_tensor_value_info(o, elem, None))
    nodes = [node_to_proto(n, st.opset) for n in st.nodes]
    g = helper.make_graph(nodes, "skeleton", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", st.opset)] + [
        helper.make_opsetid(d, v) for d, v in st.domain_opsets.items()])
    m.ir_version = 9
    return m


def _subgraph_reads(g: onnx.GraphProto) -> set[str]:
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    reads: set[str] = set()
    for n in g.node:
        for i in n.input:
            if i and i not in defined:
                reads.add(i)
        defined |= set(n.output)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                reads |= _subgraph_reads(a.g) - defined
    return reads


def _infer(st: _State) -> str | None:
    """Run onnx shape inference; record static shapes. Returns the strict-mode error, if any."""
    model = _skeleton(st)
    strict_err = None
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                     data_prop=True)
    except Exception as e:
        strict_err = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        except Exception:
            return strict_err
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        elem = vi.type.tensor_type.elem_type
        dims = _dims_of(vi)
        dtype = None
        if elem:
            try:
                dtype = _np_dtype_name(elem, st.label)
            except ModelImportError:
                dtype = None
        shape = tuple(dims) if dims is not None and all(isinstance(d, int) for d in dims) else None
        prev = st.shapes.get(vi.name)
        if prev is not None and prev[1] is not None and shape is None:
            continue
        st.shapes[vi.name] = (dtype or (prev[0] if prev else None), shape)
    return strict_err


# ------------------------------------------------------------------ constant folding
def _fold(st: _State) -> bool:
    """Fold nodes with constant inputs and Shape/Size of static tensors. True if changed."""
    changed = False
    keep: list[Node] = []
    token = _OPSET.set(st.opset)
    try:
        for n in st.nodes:
            ins = [i for i in n.inputs if i]
            has_graph = any(isinstance(v, onnx.GraphProto) for v in n.attrs.values())
            val: list | None = None
            if n.op in ("Shape", "Size") and not n.domain and ins:
                src = st.consts.get(ins[0])
                shape = src.shape if src is not None else (st.shapes.get(ins[0]) or (None, None))[1]
                if shape is not None:
                    # only the shape matters: a zero-stride view allocates nothing
                    shape_only = np.broadcast_to(np.zeros((), np.uint8), tuple(shape))
                    val = run_node(n, [shape_only])
            elif (all(i in st.consts for i in ins) and n.op in OPS and not n.domain
                  and n.op not in _NO_FOLD and not has_graph):
                try:
                    val = run_node(n, [st.consts[i] if i else None for i in n.inputs])
                except TensorplanError as e:
                    raise ModelImportError(f"{st.label}: constant folding failed: {e}") from None
            if val is None:
                keep.append(n)
                continue
            for name, v in zip(n.outputs, val):
                if name:
                    st.consts[name] = np.asarray(v)
            changed = True
    finally:
        _OPSET.reset(token)
    st.nodes = keep
    return changed


def _toposort(st: _State) -> None:
    """Topological order; a read of a never-defined tensor is an error naming it."""
    produced = {o: k for k, n in enumerate(st.nodes) for o in n.outputs if o}
    available = set(st.inputs) | set(st.consts)
    for k, n in enumerate(st.nodes):
        for i in n.inputs:
            if i and i not in produced and i not in available:
                raise ModelImportError(
                    f"{st.label}: node '{n.name}' ({n.op}) reads '{i}', which no node, input or "
                    "initializer defines")
    for o in st.outputs:
        if o not in produced and o not in available:
            raise ModelImportError(f"{st.label}: graph output '{o}' is never produced")
    g = Graph("tmp", st.opset)
    for name in available:
        g.tensors[name] = Tensor(name, (), "float32", np.zeros(()) if name in st.consts else None)
    g.inputs = list(st.inputs)
    g.nodes = st.nodes
    try:
        g.toposort()
    except TensorplanError as e:
        raise ModelImportError(f"{st.label}: {e}") from None
    st.nodes = g.nodes


def _runnable(st: _State, n: Node) -> bool:
    """A node tensorplan can execute: the reference executor has the op, or ONNX Runtime's CPU
    provider has a kernel for it (a *foreign* node, run one node at a time by `ort_node`)."""
    return not is_foreign(n) or ort_has_kernel(n.op, n.domain, st.opset, st.domain_opsets)


def _check_domains(st: _State, allow_unsupported: bool) -> None:
    foreign = [(n.name, f"{n.domain}::{n.op}") for n in st.nodes
               if n.domain and not _runnable(st, n)]
    if foreign and not allow_unsupported:
        lines = ", ".join(f"'{name}' ({op})" for name, op in foreign[:20])
        more = f" and {len(foreign) - 20} more" if len(foreign) > 20 else ""
        raise ModelImportError(
            f"{st.label}: {len(foreign)} node(s) use operators of non-default domains that neither "
            f"tensorplan nor ONNX Runtime's CPU provider implement: {lines}{more}; re-export "
            "without these custom ops")


# ------------------------------------------------------------------ older opsets
# Operator versions in effect below NATIVE_OPSET that differ from the version at NATIVE_OPSET and
# that `_upgrade` converts (onnx's version converter, plus `_resize_from_v10` for Upsample and
# Resize-10). Each conversion was checked against ONNX Runtime running the original model
# (tests/test_onnx_import.py, `OLD_FORMS`); an operator version not listed here is refused by name.
_UPGRADES: dict[str, tuple[int, ...]] = {
    "ArgMax": (1,), "ArgMin": (1,), "AveragePool": (7, 10), "BatchNormalization": (7,),
    "Cast": (6,), "Clip": (6,), "Compress": (9,), "Concat": (4,), "Constant": (1, 9), "Conv": (1,),
    "ConvTranspose": (1,), "DepthToSpace": (1,), "Dropout": (7,), "Equal": (7,), "Flatten": (1, 9),
    "Gather": (1,), "Gemm": (7, 9), "Greater": (7,), "Hardmax": (1,), "If": (1,), "Less": (7,),
    "LogSoftmax": (1,), "Loop": (1,), "LpPool": (2,), "MatMul": (1,), "Max": (6,), "MaxPool": (1, 8, 10),
    "MaxUnpool": (9,), "Mean": (6,), "Min": (6,), "NonMaxSuppression": (10,), "OneHot": (9,),
    "PRelu": (7,), "Pad": (2,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,), "ReduceMax": (1,), "ReduceMean": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceSum": (1,), "ReduceSumSquare": (1,), "Resize": (10,), "Scan": (8, 9),
    "Scatter": (9,), "Slice": (1, 10), "Softmax": (1,), "Split": (2,), "Squeeze": (1,), "Sum": (6,),
    "TopK": (1, 10), "Unsqueeze": (1,), "Upsample": (7, 9),
}


def _since(op: str, opset: int) -> int | None:
    try:
        return int(onnx.defs.get_schema(op, opset, "").since_version)
    except Exception:
        return None


def _walk_nodes(g: onnx.GraphProto, names: list[str], prefix: str = ""):
    """(name, node) for every node of g and of its sub-graphs; top-level names from `names`."""
    for k, p in enumerate(g.node):
        name = names[k] if not prefix and k < len(names) else prefix + (p.name or f"{p.op_type}_{k}")
        yield name, p
        for a in p.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _walk_nodes(a.g, names, f"{name}/{a.name}/")


def _resize_from_v10(p: onnx.NodeProto) -> dict:
    """The Resize-11 attributes that compute what ONNX Runtime computes for Upsample-7/9 and
    Resize-10: asymmetric coordinates; nearest rounds down (Upsample, whose scales are >= 1).
    Resize-10 in nearest mode rounds down when it upsamples and up when it downsamples (ONNX
    Runtime's "simple" rounding): `_settle_resize10` picks the mode once its scales are known."""
    attrs = {a.name: helper.get_attribute_value(a) for a in p.attribute}
    mode = attrs.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    out = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    if mode == "nearest":
        out["nearest_mode"] = "floor"
    return out


def _settle_resize10(st: _State, pending: dict[str, int]) -> None:
    """Each converted Resize-10 in nearest mode (by output name -> version): round up when all
    its scales downsample; refused when its scales are unknown at import or mix both ways."""
    for n in st.nodes:
        if n.op != "Resize" or not n.outputs or n.outputs[0] not in pending:
            continue
        where = f"{st.label}: node '{n.name}' (Resize)"
        since = pending[n.outputs[0]]
        scales = st.consts.get(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
        if scales is None:
            raise ModelImportError(
                f"{where}: Resize version {since} in nearest mode with scales computed at run time "
                f"rounds differently when it downsamples; re-export the model at opset {NATIVE_OPSET} or newer")
        sc = np.asarray(scales, np.float32).reshape(-1)
        if (sc > 1).any() and (sc < 1).any():
            raise ModelImportError(
                f"{where}: Resize version {since} in nearest mode upsamples some axes and "
                f"downsamples others (scales {sc.tolist()}), which opset {NATIVE_OPSET} cannot "
                f"express; re-export the model at opset {NATIVE_OPSET} or newer")
        if (sc < 1).any():
            n.attrs["nearest_mode"] = "ceil"


def _check_old_node(where: str, p: onnx.NodeProto, opset: int) -> None:
    """Refuse an operator version `_upgrade` does not convert."""
    old, new = _since(p.op_type, opset), _since(p.op_type, NATIVE_OPSET)
    if old is None or old == new:
        return  # unknown ops are named by the checker; unchanged versions need nothing
    if new is None:
        raise ModelImportError(
            f"{where}: {p.op_type} version {old} (opset {opset}) was removed from ONNX before opset "
            f"{NATIVE_OPSET} and tensorplan does not implement it; re-export the model without it")
    if old not in _UPGRADES.get(p.op_type, ()):
        raise ModelImportError(
            f"{where}: {p.op_type} version {old} (opset {opset}) is older than tensorplan "
            f"implements and is not converted ({p.op_type} from version {new}); re-export the "
            f"model at opset {NATIVE_OPSET} or newer")
    if p.op_type == "BatchNormalization":
        spatial = {a.name: a.i for a in p.attribute}.get("spatial", 1)
        if spatial != 1:
            raise ModelImportError(
                f"{where}: BatchNormalization version {old} with spatial={spatial} (statistics per "
                "element, not per channel) is not supported; re-export the model at opset "
                f"{NATIVE_OPSET} or newer")
    if p.op_type == "Scan" and old == 8 and p.input and p.input[0]:
        raise ModelImportError(
            f"{where}: Scan version 8 with sequence_lens (a length per batch element) is not "
            f"supported; re-export the model at opset {NATIVE_OPSET} or newer")


def _scope_generated_names(g: onnx.GraphProto, original: set[str], tag: str = "") -> None:
    """The converter names the constants it adds `_v_<n>` per graph, so a sub-graph can repeat
    a name of its parent; tensorplan inlines sub-graphs into one namespace: make them unique."""
    rename = {o: f"{o}{tag}" for p in g.node for o in p.output if o and o not in original} if tag else {}
    for k, p in enumerate(g.node):
        for j, i in enumerate(p.input):
            if i in rename:
                p.input[j] = rename[i]
        for j, o in enumerate(p.output):
            if o in rename:
                p.output[j] = rename[o]
        for a in p.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _scope_generated_names(a.g, original, f"{tag}__{k}_{a.name}")


def _all_names(g: onnx.GraphProto) -> set[str]:
    names = {t.name for t in g.initializer} | {v.name for v in g.input} | {v.name for v in g.output}
    for p in g.node:
        names |= set(p.input) | set(p.output)
        for a in p.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                names |= _all_names(a.g)
    return names


def _marked_nodes(g: onnx.GraphProto, ops: tuple[str, ...]):
    """Nodes of g and its sub-graphs (depth first, in order) whose op is one of `ops`."""
    for p in g.node:
        if p.op_type in ops and p.domain in _DEFAULT_DOMAINS:
            yield p
        for a in p.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _marked_nodes(a.g, ops)


def _restore_interface(new: onnx.GraphProto, old: onnx.GraphProto, label: str) -> None:
    """The model's declared inputs, outputs and value_info as given: they do not change with
    its opset (the Scan 8->9 adapter drops the batch axis from graph inputs and outputs)."""
    weights = {t.name for t in new.initializer}
    for field in ("input", "output"):
        # (weights passed through the converter as graph inputs are not inputs of the model)
        given = {v.name for v in getattr(old, field)}
        names = [v.name for v in getattr(new, field) if v.name in given or v.name not in weights]
        if names == [v.name for v in getattr(old, field)]:
            del getattr(new, field)[:]
            getattr(new, field).extend(getattr(old, field))
        else:
            raise ModelImportError(
                f"{label}: converting the model to opset {NATIVE_OPSET} changed its graph {field}s "
                f"({[v.name for v in getattr(old, field)]} became {names}); re-export the model at "
                f"opset {NATIVE_OPSET} or newer")
    produced = {o for p in new.node for o in p.output} | {v.name for v in new.input}
    keep = [v for v in old.value_info if v.name in produced]
    del new.value_info[:]
    new.value_info.extend(keep)


def _upgrade(proto: onnx.ModelProto, label: str, opset: int, input_shapes: dict[str, tuple[int, ...]] | None,
             pending: dict[str, int], scan8: dict[str, list[int]]) -> onnx.ModelProto:
    """A model below NATIVE_OPSET, validated as given (so what ONNX Runtime refuses at its own
    opset is refused) and converted to NATIVE_OPSET; operator versions whose conversion is not
    known to be exact are refused by node name first. Fills `pending` for `_settle_resize10` and
    `scan8` with the batched Scan-8 nodes (which `_unroll_scan` unrolls per batch element).

    The converter renames values freely, so its Resize and Scan nodes are matched to the
    original Upsample / Resize and Scan nodes by their order (depth first through sub-graphs)."""
    taken: set[str] = set()
    names = []
    for k, p in enumerate(proto.graph.node):
        n = unique_name(taken, p.name or f"{p.op_type or 'node'}_{k}")
        taken.add(n)
        names.append(n)
    _validate(proto, label, input_shapes, names)
    resize_where = []  # in the order of _marked_nodes
    for name, p in _walk_nodes(proto.graph, names):
        if p.domain in _DEFAULT_DOMAINS:
            where = f"{label}: node '{name}' ({p.op_type})"
            _check_old_node(where, p, opset)
            if p.op_type in ("Upsample", "Resize"):
                resize_where.append(where)
    # the converter copies the model: big weights go through it as typed graph inputs (no
    # adapter reads their values) and are put back afterwards
    light, big = onnx.ModelProto(), []
    light.ir_version = proto.ir_version
    light.opset_import.extend(proto.opset_import)
    light.graph.name = proto.graph.name
    declared = {v.name for v in proto.graph.input}
    for field in ("node", "input", "output", "value_info", "sparse_initializer"):
        getattr(light.graph, field).extend(getattr(proto.graph, field))
    for t in proto.graph.initializer:
        if int(np.prod(t.dims)) > _SKELETON_DATA_LIMIT:
            big.append(t)
            if t.name not in declared:
                light.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            light.graph.initializer.add().CopyFrom(t)
    from onnx import version_converter
    try:
        new = version_converter.convert_version(light, NATIVE_OPSET)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise ModelImportError(
            f"{label}: converting the model from opset {opset} to {NATIVE_OPSET} failed ({first}); "
            f"re-export it at opset {NATIVE_OPSET} or newer") from None
    new.graph.initializer.extend(big)
    new.ir_version = max(new.ir_version, proto.ir_version)
    _scope_generated_names(new.graph, _all_names(proto.graph))
    _restore_interface(new.graph, proto.graph, label)
    scan_v = _since("Scan", opset)
    for kinds, target in ((("Upsample", "Resize"), "Resize"), (("Scan",), "Scan")):
        before = list(_marked_nodes(proto.graph, kinds))
        after = list(_marked_nodes(new.graph, (target,)))
        if len(before) != len(after):
            raise ModelImportError(
                f"{label}: converting the model from opset {opset} to {NATIVE_OPSET} turned "
                f"{len(before)} {'/'.join(kinds)} node(s) into {len(after)} {target} node(s); "
                f"re-export it at opset {NATIVE_OPSET} or newer")
        for k, (p, q) in enumerate(zip(before, after)):
            if target == "Scan":
                if scan_v == 8 and q.output:
                    scan8[q.output[0]] = [int(v) for a in p.attribute if a.name == "directions" for v in a.ints]
                    keep = [a for a in q.attribute if a.name in ("body", "num_scan_inputs")]
                    del q.attribute[:]
                    q.attribute.extend(keep)
                continue
            fix = _resize_from_v10(p)
            mode = next((helper.get_attribute_value(a) for a in q.attribute if a.name == "mode"), b"nearest")
            if (mode.decode() if isinstance(mode, bytes) else mode) != fix["mode"]:
                raise ModelImportError(
                    f"{resize_where[k]}: its conversion to opset {NATIVE_OPSET} could not "
                    f"be matched; re-export the model at opset {NATIVE_OPSET} or newer")
            keep = [a for a in q.attribute if a.name not in fix]
            del q.attribute[:]
            q.attribute.extend(keep + [helper.make_attribute(k, v) for k, v in fix.items()])
            if p.op_type == "Resize" and fix["mode"] == "nearest" and q.output:
                pending[q.output[0]] = _since("Resize", opset) or 10
    return new


# ------------------------------------------------------------------ main entry
def import_onnx(model: str | Path | onnx.ModelProto,
                input_shapes: dict[str, tuple[int, ...]] | None = None,
                *, allow_unsupported: bool = False, name: str | None = None) -> Graph:
    """Import an ONNX model as a static-shape `Graph` with constants folded.

    `allow_unsupported=True` keeps nodes whose op the reference executor lacks
    (for `tensorplan inspect`, which reports them); otherwise they raise one
    `UnsupportedOperatorError` listing all of them."""
    label = str(model) if not isinstance(model, onnx.ModelProto) else "model"
    try:
        return _import(model, input_shapes, allow_unsupported, name)
    except TensorplanError:
        raise
    except RecursionError:
        raise ModelImportError(f"{label}: model is nested too deeply to import") from None
    except MemoryError:
        raise ModelImportError(f"{label}: model does not fit in memory") from None
    except Exception as e:  # anything else from a malformed file: one line, no traceback
        raise ModelImportError(f"{label}: cannot import ({type(e).__name__}: {e})") from None


def _import(model, input_shapes, allow_unsupported, name) -> Graph:
    proto, label, base = load_proto(model)
    if not proto.HasField("graph"):
        raise ModelImportError(f"{label}: not an ONNX model (no graph; truncated or a different file type)")
    opset = _check_opset(proto, label)
    _load_external(proto, label, base)
    if len(proto.functions):
        try:
            from onnx import inliner
            proto = inliner.inline_local_functions(proto)
        except Exception as e:
            raise ModelImportError(f"{label}: cannot inline local functions: {e}") from None
    resize10: dict[str, int] = {}
    scan8: dict[str, list[int]] = {}
    if opset < NATIVE_OPSET:
        proto = _upgrade(proto, label, opset, input_shapes, resize10, scan8)
        opset = NATIVE_OPSET
    st = _parse(proto, label, opset)
    st.scan8 = scan8
    _check_domains(st, allow_unsupported)
    _resolve_inputs(st, proto, input_shapes)
    _toposort(st)
    early = [(n.name, n.op) for n in st.nodes if not _runnable(st, n)]
    if early and not allow_unsupported:
        raise UnsupportedOperatorError(early, label)  # listed all at once, before the checker
    # (`inspect` keeps unknown ops, which the checker would refuse; a converted Scan-8 keeps its
    # batch axis until it is unrolled, which opset 11's Scan does not allow: the model was
    # validated at its own opset)
    if not early and not scan8:
        _validate(proto, label, input_shapes, st.proto_names)

    strict_err = None
    for _ in range(12):
        changed = _inline_constant_ifs(st)
        changed |= _unroll_constant_loops(st)
        if changed:
            _toposort(st)
        strict_err = _infer(st)
        changed |= _fold(st)
        if not changed:
            break
    _settle_resize10(st, resize10)
    # subgraph ops that did not fold away cannot be represented
    sub = [(n.name, n.op) for n in st.nodes
           if any(isinstance(v, onnx.GraphProto) for v in n.attrs.values())]
    if sub and not allow_unsupported:
        names = ", ".join(f"'{a}' ({b})" for a, b in sub[:10])
        raise ModelImportError(
            f"{label}: {len(sub)} node(s) with sub-graphs could not be constant-folded: {names}; "
            "control flow (If/Loop/Scan) is only supported when its condition/trip count is "
            "constant — re-export with the control flow traced out")
    unsupported = [(n.name, n.op) for n in st.nodes if not _runnable(st, n)]
    if unsupported and not allow_unsupported:
        raise UnsupportedOperatorError(unsupported, label)

    _fill_missing_shapes(st, strict_err, unsupported)
    _check_semantics(st)
    if not unsupported:
        _check_foreign(st)
    return _build_graph(st, proto, name)


def _fill_missing_shapes(st: _State, strict_err: str | None, unsupported: list) -> None:
    missing = [o for n in st.nodes for o in n.outputs
               if o and (st.shapes.get(o) is None or st.shapes[o][1] is None or st.shapes[o][0] is None)]
    if not missing:
        return
    if unsupported:
        bad = [o for o in missing][:5]
        raise ModelImportError(
            f"{st.label}: shapes of {bad} cannot be inferred"
            + (f" (shape inference: {strict_err})" if strict_err else "")
            + "; they depend on unsupported operators")
    # Run the graph on zeros to learn the remaining shapes (data-dependent ops included).
    g = _graph_from_state(st, with_shapes=False)
    feeds = {i: np.zeros(st.input_types[i][1], dtype=st.input_types[i][0]) for i in st.inputs}
    from tensorplan.ir.reference import ShapeValueError, random_feeds

    def probe(values: dict, which: str) -> dict:
        """Run the graph on probe inputs; a shape value the probe itself may have made up (a zero
        step, a random size) is reported as a data-dependent shape, never as a fault of the model."""
        try:
            return run_reference(g, values, keep_all=True)
        except ShapeValueError as e:
            raise ModelImportError(
                f"{st.label}: node '{e.node}' ({e.op}) has a shape that depends on runtime input values "
                f"(with the {which} tensorplan tried for the inputs: {e}); tensorplan needs static shapes "
                "— make the shape-controlling inputs constants") from None
        except TensorplanError as e:
            msg = f"{st.label}: cannot determine static shapes"
            if strict_err:
                msg += f" (shape inference: {strict_err})"
            raise ModelImportError(f"{msg}: {e}") from None

    env = probe(feeds, "zeros")
    # A second run on other values: a shape that changes is data-dependent, not static.
    env2 = probe(random_feeds(g, seed=1), "random values")
    producer = {o: n for n in st.nodes for o in n.outputs if o}
    for o in missing:
        if o not in env:
            continue
        a, b = np.asarray(env[o]), np.asarray(env2[o])
        if a.shape != b.shape:
            n = producer[o]
            raise ModelImportError(
                f"{st.label}: output '{o}' of node '{n.name}' ({n.op}) has a data-dependent shape "
                f"({a.shape} vs {b.shape} for different input values); tensorplan needs static "
                "shapes — make the shape-controlling inputs constants")
        st.shapes[o] = (a.dtype.name, tuple(a.shape))


# ------------------------------------------------------------------ checks shape inference skips
def _unidirectional(small: tuple, big: tuple) -> bool:
    """`small` broadcasts to `big` (ONNX unidirectional broadcasting)."""
    if len(small) > len(big):
        return False
    return all(a in (1, b) for a, b in zip(reversed(small), reversed(big)))


# ops whose `axis` attribute must lie in [-r, r-1] (Flatten: [-r, r]) for an input of rank r
_AXIS_OPS = {"LayerNormalization", "Softmax", "LogSoftmax", "Hardmax", "Gather", "GatherElements",
             "Concat", "Split", "ArgMax", "ArgMin", "TopK", "ScatterElements", "LpNormalization",
             "QuantizeLinear", "DequantizeLinear", "Compress", "Flatten"}


def _node_semantic_error(n: Node, shp) -> str | None:
    """Why ONNX Runtime would refuse this node once shapes are static (checks onnx's shape
    inference does not make), or None."""
    ins = n.inputs + [""] * 3
    if n.op in _AXIS_OPS and isinstance(n.attrs.get("axis"), int) and ins[0]:
        x = shp(ins[0])
        per_tensor = n.op in ("QuantizeLinear", "DequantizeLinear") and (
            not ins[1] or shp(ins[1]) is None or int(np.prod(shp(ins[1]))) <= 1)
        if x is not None and not per_tensor:  # (a per-tensor scale ignores the axis)
            hi = len(x) if n.op == "Flatten" else len(x) - 1
            if not -len(x) <= n.attrs["axis"] <= hi:
                return (f"axis {n.attrs['axis']} is out of range for input '{ins[0]}' of rank "
                        f"{len(x)} (valid: {-len(x)}..{hi})")
    if n.op in ("Conv", "ConvTranspose") and ins[0] and ins[1]:
        x, w = shp(ins[0]), shp(ins[1])
        if x is None or w is None:
            return None
        if len(x) != len(w) or len(x) < 3:
            return (f"input '{ins[0]}' has rank {len(x)} but weight '{ins[1]}' has rank {len(w)}; "
                    "both must be N+2-dimensional for N spatial axes")
        ks = n.attrs.get("kernel_shape")
        if ks is not None and list(ks) != list(w[2:]):
            return (f"kernel_shape {list(ks)} does not match the spatial shape {list(w[2:])} of "
                    f"weight '{ins[1]}' {tuple(w)}")
        group = int(n.attrs.get("group", 1))
        if group < 1:
            return f"group={group} must be positive"
        if n.op == "Conv":
            if x[1] != w[1] * group:
                return (f"weight '{ins[1]}' {tuple(w)} expects {w[1] * group} input channels "
                        f"({w[1]} per group x group {group}) but input '{ins[0]}' {tuple(x)} has {x[1]}")
            if w[0] % group:
                return f"weight '{ins[1]}' has {w[0]} output channels, not divisible by group {group}"
            m = w[0]
        else:
            if x[1] != w[0]:
                return (f"weight '{ins[1]}' {tuple(w)} expects {w[0]} input channels but input "
                        f"'{ins[0]}' {tuple(x)} has {x[1]}")
            if w[0] % group:
                return f"weight '{ins[1]}' has {w[0]} input channels, not divisible by group {group}"
            m = w[1] * group
        if ins[2]:
            b = shp(ins[2])
            if b is not None and tuple(b) != (m,):
                return f"bias '{ins[2]}' has shape {tuple(b)}, expected ({m},) (one per output channel)"
    elif n.op == "Gemm" and ins[2] and n.outputs and n.outputs[0]:
        c, y = shp(ins[2]), shp(n.outputs[0])
        if c is not None and y is not None and not _unidirectional(tuple(c), tuple(y)):
            return f"C '{ins[2]}' {tuple(c)} does not broadcast to the output shape {tuple(y)}"
    elif n.op == "Reshape" and ins[0] and n.outputs and n.outputs[0]:
        x, y = shp(ins[0]), shp(n.outputs[0])
        if x is not None and y is not None and int(np.prod(x)) != int(np.prod(y)):
            return (f"reshapes input '{ins[0]}' {tuple(x)} ({int(np.prod(x))} elements) to "
                    f"{tuple(y)} ({int(np.prod(y))} elements)")
    elif n.op == "InstanceNormalization" and ins[0]:
        x = shp(ins[0])
        for k, what in ((1, "scale"), (2, "bias")):
            v = shp(ins[k]) if ins[k] else None
            if x is not None and len(x) >= 2 and v is not None and tuple(v) != (x[1],):
                return (f"{what} '{ins[k]}' has shape {tuple(v)}, expected ({x[1]},) "
                        f"(one per channel of input '{ins[0]}' {tuple(x)})")
    elif n.op == "LayerNormalization" and ins[0]:
        x = shp(ins[0])
        if x is not None:
            axis = int(n.attrs.get("axis", -1))
            tail = tuple(x[axis % len(x):]) if x else ()
            for k, what in ((1, "scale"), (2, "bias")):
                v = shp(ins[k]) if ins[k] else None
                if v is not None and not _unidirectional(tuple(v), tail):
                    return (f"{what} '{ins[k]}' {tuple(v)} does not broadcast to the normalized "
                            f"shape {tail} of input '{ins[0]}' (axis {axis})")
    elif n.op == "PRelu" and ins[0] and ins[1]:
        x, v = shp(ins[0]), shp(ins[1])
        if x is not None and v is not None and not _unidirectional(tuple(v), tuple(x)):
            return f"slope '{ins[1]}' {tuple(v)} does not broadcast to input '{ins[0]}' {tuple(x)}"
    elif n.op in ("DequantizeLinear", "QuantizeLinear") and ins[0] and ins[1]:
        x, v = shp(ins[0]), shp(ins[1])
        if x is not None and v is not None and len(v) == 1 and v[0] != 1 and x:
            axis = int(n.attrs.get("axis", 1)) % len(x)
            if v[0] != x[axis]:
                return (f"per-axis scale '{ins[1]}' has {v[0]} values but input '{ins[0]}' "
                        f"{tuple(x)} has {x[axis]} along axis {axis}")
    return None


def _gather_error(n: Node, st: _State, shp) -> str | None:
    """Constant Gather indices outside the data's axis (ONNX Runtime fails when it runs)."""
    if n.op != "Gather" or len(n.inputs) < 2 or n.inputs[1] not in st.consts:
        return None
    x = shp(n.inputs[0])
    idx = st.consts[n.inputs[1]]
    if x is None or not len(x) or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
        return None
    axis = int(n.attrs.get("axis", 0)) % len(x)
    lo, hi = int(idx.min()), int(idx.max())
    if lo < -x[axis] or hi >= x[axis]:
        bad = hi if hi >= x[axis] else lo
        return (f"index {bad} in '{n.inputs[1]}' is out of range for axis {axis} of "
                f"'{n.inputs[0]}' {tuple(x)} (valid: {-x[axis]}..{x[axis] - 1})")
    return None


_FOREIGN_LOADS: dict[str, str | None] = {}  # node signature -> ONNX Runtime's refusal, or None


def _check_foreign(st: _State) -> None:
    """A node tensorplan leaves to ONNX Runtime must load there as it stands (attributes, input
    types): its kernel registry alone says nothing about an unknown attribute or a type it lacks."""
    from tensorplan.ir.ort_node import _signature
    for n in st.nodes:
        if not is_foreign(n) or any(isinstance(v, onnx.GraphProto) for v in n.attrs.values()):
            continue
        ins = []
        for i in n.inputs:
            if not i:
                ins.append(None)
                continue
            c = st.consts.get(i)
            if c is not None:
                ins.append(np.broadcast_to(np.zeros((), c.dtype), c.shape))
                continue
            dt, shape = st.shapes.get(i, (None, None))
            if dt is None or shape is None:
                break
            ins.append(np.broadcast_to(np.zeros((), dt), tuple(shape)))
        else:
            key = _signature(n, ins, st.opset, st.domain_opsets)
            if key not in _FOREIGN_LOADS:
                _FOREIGN_LOADS[key] = _ort_refusal(n, ins, st)
            why = _FOREIGN_LOADS[key]
            if why:
                op = f"{n.domain}::{n.op}" if n.domain else n.op
                raise ModelImportError(
                    f"{st.label}: node '{n.name}' ({op}): invalid model: ONNX Runtime, which runs "
                    f"this operator for tensorplan, refuses it: {why}")


def _ort_refusal(n: Node, ins: list, st: _State) -> str | None:
    import onnxruntime as ort
    from tensorplan.ir.ort_node import _one_node_model
    try:
        model, _, _ = _one_node_model(n, ins, st.opset, st.domain_opsets)
    except TensorplanError as e:
        return str(e)
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    except Exception as e:
        text = " ".join(str(e).split())
        text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
        text = re.sub(r"/onnxruntime_src/\S+ ", "", text)
        if "In Node, (" in text and ", Error " in text:
            text = text.split(", Error ", 1)[1]
        return text[:300]
    return None


def _check_semantics(st: _State) -> None:
    """Shape rules onnx's shape inference does not check but ONNX Runtime enforces when it runs
    (convolution channels and groups, bias and normalization sizes, Reshape element counts,
    broadcastable slopes and scales, constant Gather indices): one error naming the node."""
    def shp(name: str):
        c = st.consts.get(name)
        if c is not None:
            return tuple(c.shape)
        got = st.shapes.get(name)
        return None if got is None or got[1] is None else tuple(got[1])
    for n in st.nodes:
        if n.domain:
            continue
        why = _node_semantic_error(n, shp) or _gather_error(n, st, shp)
        if why:
            raise ModelImportError(f"{st.label}: node '{n.name}' ({n.op}): invalid model: {why}")


def _graph_from_state(st: _State, with_shapes: bool = True, name: str = "graph") -> Graph:
    g = Graph(name, st.opset)
    g.domain_opsets = dict(st.domain_opsets)
    for k, v in st.consts.items():
        g.add_tensor(Tensor(k, tuple(int(d) for d in v.shape), v.dtype.name, v))
    for i in st.inputs:
        d, s = st.input_types[i]
        g.add_tensor(Tensor(i, s, d))
    g.inputs = list(st.inputs)
    for n in st.nodes:
        g.add_node(n)
        for o in n.outputs:
            if o:
                dt, shp = st.shapes.get(o, (None, None))
                if with_shapes:
                    g.add_tensor(Tensor(o, tuple(int(d) for d in shp), dt or "float32"))
                else:
                    g.add_tensor(Tensor(o, (), dt or "float32"))
    g.outputs = list(st.outputs)
    return g


def _build_graph(st: _State, proto: onnx.ModelProto, name: str | None) -> Graph:
    gname = name or proto.graph.name or "graph"
    for n in st.nodes:
        for o in n.outputs:
            if o:
                dt, shp = st.shapes.get(o, (None, None))
                if shp is None or dt is None:
                    raise ModelImportError(
                        f"{st.label}: output '{o}' of node '{n.name}' ({n.op}) has no static shape")
    g = _graph_from_state(st, True, gname)
    g.prune()
    try:
        g.validate()
    except TensorplanError as e:
        raise ModelImportError(f"{st.label}: {e}") from None
    return g
