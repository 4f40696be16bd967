"""Graph-editing helpers every rewrite rule shares: constants, attributes, unique names, node
replacement and layout-chain probing.

Why here: the rules live one family per file (rewrite/passes.py lists them); what they have in
common lives once, so a rule file reads as its pattern and its replacement only.

Every rule has the signature ``rule(g, ed, applied) -> bool``: it edits `g` in place through
the `Editor`, records ``(rule name, node name)`` in `applied` and returns True when it fired once
(the pass list calls it again until it returns False).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from tensorplan.ir.graph import Graph, Node, Tensor, unique_name
from tensorplan.ir.reference import run_node


def attr_str(v, default: str) -> str:
    """An ONNX string attribute as str (the importer may keep bytes), `default` when unset."""
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def const(g: Graph, name: str) -> np.ndarray | None:
    """The value of a constant tensor, None for a computed (or missing) one."""
    t = g.tensors.get(name) if name else None
    return None if t is None or t.data is None else np.asarray(t.data)


class Editor:
    """Adds uniquely named tensors/nodes to a graph being rewritten."""

    def __init__(self, g: Graph):
        self.g = g
        self.names = set(g.tensors) | {n.name for n in g.nodes}
        self.scalars: dict[tuple[float, str], str] = {}

    def name(self, base: str) -> str:
        nm = unique_name(self.names, base)
        self.names.add(nm)
        return nm

    def const(self, base: str, value: np.ndarray) -> str:
        nm = self.name(base)
        self.g.add_tensor(Tensor(nm, tuple(value.shape), str(value.dtype), value))
        return nm

    def scalar(self, value: float, dtype: str) -> str:
        """One shared scalar constant per (value, dtype), however many nodes use it."""
        key = (float(value), str(dtype))
        if key not in self.scalars:
            self.scalars[key] = self.const(f"scalar_{value:g}", np.array(value, dtype=dtype))
        return self.scalars[key]

    def tensor(self, base: str, shape, dtype: str = "float32") -> str:
        nm = self.name(base)
        self.g.add_tensor(Tensor(nm, tuple(int(d) for d in shape), dtype))
        return nm


Rule = Callable[[Graph, Editor, list], bool]


def replace(g: Graph, node: Node, new_nodes: list[Node], rule: str, applied: list) -> bool:
    """Put `new_nodes` where `node` was (keeps the order valid) and record the rule."""
    at = g.nodes.index(node)
    g.nodes[at:at + 1] = new_nodes
    applied.append((rule, node.name))
    return True


def is_unit_conv(a: dict) -> bool:
    """Conv attributes of an ungrouped, stride-1, undilated convolution with explicit pads: the
    form the kernel-reshaping rules (phases, Focus, Winograd) rewrite."""
    return (int(a.get("group", 1)) == 1 and attr_str(a.get("auto_pad"), "NOTSET") == "NOTSET"
            and all(int(v) == 1 for v in [*a.get("strides", [1, 1]), *a.get("dilations", [1, 1])]))


def is_conv1x1(g: Graph, n: Node) -> bool:
    """A plain 1x1 convolution: no stride, padding or groups, weight known."""
    if n.op != "Conv" or len(n.inputs) < 2:
        return False
    w = const(g, n.inputs[1])
    if w is None or w.ndim != 4 or w.shape[2:] != (1, 1):
        return False
    if len(n.inputs) > 2 and n.inputs[2] and const(g, n.inputs[2]) is None:
        return False
    a = n.attrs
    if int(a.get("group", 1)) != 1 or any(int(s) != 1 for s in a.get("strides", [1, 1])):
        return False
    if any(int(p) != 0 for p in a.get("pads", [0, 0, 0, 0])):
        return False
    return attr_str(a.get("auto_pad"), "NOTSET") in ("NOTSET", "VALID")


def convs1x1(g: Graph) -> Iterator[tuple[Node, Node | None, dict]]:
    """(conv, producer of its input or None, producers) for every plain 1x1 convolution, in graph order."""
    prod = g.producers()
    for n in list(g.nodes):
        if is_conv1x1(g, n):
            yield n, prod.get(n.inputs[0]), prod


def layout_chain(g: Graph, t: str, prod: dict, cons: dict, private: bool,
                 ops: tuple[str, ...] = ("Reshape", "Transpose")) -> tuple[str, list[Node]]:
    """Walk back from `t` through `ops` nodes with constant operands: (source tensor, the chain
    in execution order). With `private`, stop at a tensor another node also reads."""
    chain = []
    while t in prod and prod[t].op in ops \
            and all(const(g, i) is not None for i in prod[t].inputs[1:] if i) \
            and (not private or (len(cons.get(t, [])) == 1 and t not in g.outputs)):
        chain.append(prod[t])
        t = prod[t].inputs[0]
    return t, chain[::-1]


def run_chain(g: Graph, chain: list[Node], v: np.ndarray) -> np.ndarray:
    """Run a chain of single-data-input nodes on `v` (an index probe) with the reference executor."""
    for n in chain:
        v = run_node(n, [v] + [const(g, i) if i else None for i in n.inputs[1:]])[0]
    return v
