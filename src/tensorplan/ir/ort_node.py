"""Operators tensorplan has no rule for, run one node at a time by ONNX Runtime.

A model with an LSTM, a NonMaxSuppression or a `com.microsoft` contrib op should still import,
plan and run: such a node is *foreign*. Import accepts it when ONNX Runtime's CPU provider has a
kernel for it (`ort_has_kernel`), the reference executor runs it through a one-node ONNX Runtime
session (`run_foreign`), fission keeps it as an opaque primitive that runs alone, and the CLI
lists it. Sessions are cached per (op, attributes, input types), so a node inside a loop of runs
is built once.
"""
from __future__ import annotations

import functools
import hashlib
from typing import Any

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Node
from tensorplan.ir.to_onnx import IR_VERSION, domain_opset, is_default_domain, node_to_proto, onnx_dtype


@functools.lru_cache(maxsize=1)
def _cpu_kernels() -> dict[tuple[str, str], list[tuple[int, int]]]:
    from onnxruntime.capi import onnxruntime_pybind11_state as C
    out: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for k in C.get_all_opkernel_def():
        if k.provider == "CPUExecutionProvider":
            dom = "" if is_default_domain(k.domain) else k.domain
            out.setdefault((dom, k.op_name), []).append(tuple(k.version_range))
    return out


def ort_has_kernel(op: str, domain: str, opset: int, domain_opsets: dict[str, int] | None = None) -> bool:
    """Whether ONNX Runtime's CPU provider registers a kernel for `domain::op` at this opset."""
    dom = "" if is_default_domain(domain) else domain
    v = domain_opset(domain, opset, domain_opsets)
    return any(lo <= v <= hi for lo, hi in _cpu_kernels().get((dom, op), []))


def _signature(node: Node, inputs: list, opset: int, domain_opsets: dict[str, int] | None) -> str:
    h = hashlib.sha1()
    h.update(f"{node.domain}::{node.op}@{domain_opset(node.domain, opset, domain_opsets)}/{opset}".encode())
    for k in sorted(node.attrs):
        v = node.attrs[k]
        h.update(k.encode())
        h.update(v.tobytes() if isinstance(v, np.ndarray) else repr(v).encode())
    for v in inputs:
        h.update(b"-" if v is None else f"{np.asarray(v).dtype}{np.asarray(v).shape}".encode())
    h.update(f"{len(node.outputs)}:{[bool(o) for o in node.outputs]}".encode())
    return h.hexdigest()


_SESSIONS: dict[str, Any] = {}
_MAX_SESSIONS = 256


def _one_node_model(node: Node, inputs: list, opset: int, domain_opsets: dict[str, int] | None):
    import onnx
    from onnx import helper
    in_names = [f"in{k}" if v is not None else "" for k, v in enumerate(inputs)]
    out_names = [f"out{k}" if o else "" for k, o in enumerate(node.outputs)]
    p = node_to_proto(Node(node.name or node.op, node.op, in_names, out_names, node.attrs, node.domain), opset)
    vis = [helper.make_tensor_value_info(n, onnx_dtype(np.asarray(v).dtype.name), list(np.asarray(v).shape))
           for n, v in zip(in_names, inputs) if v is not None]
    outs = [onnx.ValueInfoProto(name=n) for n in out_names if n]   # types: ORT infers them
    imports = [helper.make_opsetid("", opset)]
    if not is_default_domain(node.domain):
        imports.append(helper.make_opsetid(node.domain, domain_opset(node.domain, opset, domain_opsets)))
    g = helper.make_graph([p], f"foreign_{node.op}", vis, outs)
    m = helper.make_model(g, opset_imports=imports, producer_name="tensorplan")
    m.ir_version = IR_VERSION
    return m, [n for n in in_names if n], [n for n in out_names if n]


def run_foreign(node: Node, inputs: list, opset: int, domain_opsets: dict[str, int] | None = None) -> list:
    """Run one node in a cached one-node ONNX Runtime session; outputs in the node's order
    (None where the node leaves an optional output unnamed)."""
    import onnxruntime as ort
    key = _signature(node, inputs, opset, domain_opsets)
    entry = _SESSIONS.get(key)
    if entry is None:
        model, in_names, out_names = _one_node_model(node, inputs, opset, domain_opsets)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        so.inter_op_num_threads = 1
        so.log_severity_level = 4            # its failure becomes our one error, not a log line too
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as e:
            raise TensorplanError(
                f"node '{node.name}' ({node.domain + '::' if node.domain else ''}{node.op}): tensorplan has "
                f"no rule for this operator and ONNX Runtime cannot run it either: "
                f"{str(e).splitlines()[0][:300]}") from None
        if len(_SESSIONS) >= _MAX_SESSIONS:
            _SESSIONS.pop(next(iter(_SESSIONS)))
        entry = _SESSIONS[key] = (sess, in_names, out_names)
    sess, in_names, out_names = entry
    feeds = dict(zip(in_names, (np.asarray(v, order="C") for v in inputs if v is not None)))
    try:
        res = iter(sess.run(out_names, feeds))
    except Exception as e:
        raise TensorplanError(f"node '{node.name}' ({node.op}) failed in ONNX Runtime: "
                              f"{str(e).splitlines()[0][:300]}") from None
    return [next(res) if o else None for o in node.outputs]
