"""Token-layout rewrites of transformer decoders (SegFormer): channel maps in image layout.

The token layout chains (Reshape/Transpose between NCHW maps and (N, HW, C) tokens) are
checked on index probes, so any spelling an exporter writes qualifies.

- ``token_linear_conv``: ``Conv1x1(to_image(MatMul(to_tokens(x), Wp) + bp))``, where ``to_tokens``
  flattens an NCHW map into (N, HW, C) tokens and ``to_image`` turns them back (the
  Reshape/Transpose chains transformer decoders write: SegFormer's all-MLP head projects every
  stage's tokens to 256 channels, then fuses them with a 1x1 convolution) is one 1x1
  convolution of ``x`` with ``W' = Wf Wp^T`` and ``b' = Wf bp + bf``: two channel maps in a row
  are one. Drops the 256x256 fuse convolution (after ``split_concat_conv`` and
  ``conv_before_resize``, 2.9 of SegFormer-b0's 11.4 GFLOP) and four layout passes per stage.
  Fires only where it does not add multiply-adds and every intermediate is private.
- ``token_linear_as_conv``: ``to_image(MatMul(t, W) + b)`` with ``W`` widening C -> C' channels
  (SegFormer's Mix-FFN ``fc1``, whose output goes to a depthwise convolution in image layout)
  is ``Conv1x1(to_image(t))``: the layout pass (Transpose/Reshape, and ONNX Runtime's NCHWc
  reorder behind it) then moves C instead of C' channels, 4x fewer in Mix-FFN, and the 1x1
  convolution runs in the same blocked layout as the depthwise one after it. The mirror image,
  ``MatMul(f(to_tokens(y)), W) + b`` with ``W`` narrowing C' -> C and ``f`` any elementwise
  chain with scalar constants (Mix-FFN's GELU and ``fc2``), becomes
  ``to_tokens(Conv1x1(f(y)))``, so the way back to tokens also moves C channels.
"""
from __future__ import annotations

import numpy as np

from tensorplan.ir.graph import Graph, Node
from tensorplan.rewrite.common import Editor, const, convs1x1, layout_chain, replace, run_chain


def _nchw_source(g: Graph, t: str, prod: dict, cons: dict) -> str | None:
    """The nearest 4-D fp32 tensor x upstream of `t` (through Reshape/Transpose only) with
    t = x flattened to (N, HW, C) tokens, checked on an index probe; else None."""
    _, chain = layout_chain(g, t, prod, cons, private=False)
    for j in range(len(chain) - 1, -1, -1):
        xt = g.tensors.get(chain[j].inputs[0])
        if xt is None or len(xt.shape) != 4 or xt.dtype != "float32":
            continue
        nb, c, h, w = xt.shape
        probe = np.arange(nb * c * h * w, dtype=np.int64).reshape(nb, c, h, w)
        tokens = probe.reshape(nb, c, h * w).transpose(0, 2, 1)
        got = run_chain(g, chain[j:], probe)
        if got.shape == tokens.shape and np.array_equal(got, tokens):
            return xt.name
    return None


def _live_consumers(g: Graph) -> dict[str, list[Node]]:
    """Consumers among the nodes a graph output still depends on (rules replace nodes in place;
    the ones they orphan are pruned only at the end)."""
    live = g.live_tensors()
    return {t: [n for n in ns if any(o in live for o in n.outputs)] for t, ns in g.consumers().items()}


def _token_linear(g: Graph, u: str, prod: dict, private) -> tuple[Node, Node | None, np.ndarray, np.ndarray] | None:
    """(MatMul, bias Add or None, W (C, C'), b (C',)) if `u` = MatMul(t, W) [+ b] with constant
    W and a per-channel constant b, the MatMul output private to the Add; else None."""
    node = prod.get(u)
    add = None
    if node is not None and node.op == "Add":
        add = node
        parts = [i for i in add.inputs if const(g, i) is None]
        if len(parts) != 1 or parts[0] not in prod or not private(parts[0]):
            return None
        node = prod[parts[0]]
    if node is None or node.op != "MatMul" or const(g, node.inputs[0]) is not None:
        return None
    w = const(g, node.inputs[1])
    if w is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    cm = w.shape[1]
    b = np.zeros(cm, np.float32)
    if add is not None:
        bias = const(g, next(i for i in add.inputs if const(g, i) is not None))
        if bias.size != cm or bias.ndim == 0 or bias.shape[-1] != cm or any(d != 1 for d in bias.shape[:-1]):
            return None
        b = bias.reshape(cm).astype(np.float32)
    return node, add, w, b


def _is_to_image(g: Graph, chain: list[Node], nb: int, h: int, w: int, c: int) -> bool:
    """Does `chain` turn (N, HW, C) tokens into the (N, C, H, W) image (index probe)?"""
    probe = np.arange(nb * h * w * c, dtype=np.int64).reshape(nb, h * w, c)
    got = run_chain(g, chain, probe)
    return got.shape == (nb, c, h, w) and np.array_equal(got, probe.transpose(0, 2, 1).reshape(nb, c, h, w))


def token_linear_conv(g: Graph, ed: Editor, applied: list) -> bool:
    """Fold one token projection followed by a Conv1x1 into one Conv1x1 of the image."""
    prod, cons = g.producers(), _live_consumers(g)
    private = lambda t: len(cons.get(t, [])) == 1 and t not in g.outputs  # noqa: E731
    for n, _, _ in convs1x1(g):
        u, back = layout_chain(g, n.inputs[0], prod, cons, private=True)
        found = _token_linear(g, u, prod, private) if private(u) else None
        if found is None:
            continue
        mm, _, wp, bp = found
        x = _nchw_source(g, mm.inputs[0], prod, cons)
        if x is None:
            continue
        nb, c, h, w = g.tensors[x].shape
        cm = wp.shape[1]
        if wp.shape[0] != c or not _is_to_image(g, back, nb, h, w, cm):
            continue
        wf = const(g, n.inputs[1])[:, :, 0, 0].astype(np.float64)
        co = wf.shape[0]
        if c * co > c * cm + cm * co:
            continue
        has_bf = len(n.inputs) > 2 and bool(n.inputs[2])
        bf = const(g, n.inputs[2]).astype(np.float64) if has_bf else np.zeros(co)
        w2 = (wf @ wp.astype(np.float64).T).astype(np.float32).reshape(co, c, 1, 1)
        b2 = (wf @ bp.astype(np.float64) + bf).astype(np.float32)
        ins = [x, ed.const(f"{n.inputs[1]}.folded", w2), ed.const(f"{n.name}.folded_bias", b2)]
        attrs = {k: v for k, v in n.attrs.items() if k != "auto_pad"}
        return replace(g, n, [Node(ed.name(f"{n.name}.folded"), "Conv", ins, list(n.outputs), attrs, n.domain)],
                        "token_linear_conv", applied)
    return False


_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Erf", "Tanh", "Sigmoid", "Relu", "Exp", "Neg", "Abs", "Sqrt",
                "Pow", "HardSigmoid", "HardSwish", "LeakyRelu", "Clip", "Softplus", "Gelu", "Identity"}


def _elementwise_region(g: Graph, m: str, prod: dict, cons: dict) -> tuple[str, list[Node]] | None:
    """(s, nodes in graph order) if `m` is computed from the single tensor `s` by elementwise
    operators whose other operands are scalar constants and whose intermediates nothing else
    reads; else None."""
    nodes, stack, srcs = {}, [m], set()
    while stack:
        t = stack.pop()
        n = prod.get(t)
        if n is None or n.op not in _ELEMENTWISE or n.domain not in ("", "ai.onnx") or len(n.outputs) != 1:
            srcs.add(t)
            continue
        if id(n) in nodes:
            continue
        nodes[id(n)] = n
        for i in n.inputs:
            if not i:
                continue
            v = const(g, i)
            if v is not None:
                if v.size != 1:
                    return None
            else:
                stack.append(i)
    if len(srcs) != 1 or not nodes:
        return None
    inside = {n.outputs[0] for n in nodes.values()}
    for t in inside - {m}:
        if t in g.outputs or any(c.outputs[0] not in inside for c in cons.get(t, [])):
            return None
    order = {id(n): k for k, n in enumerate(g.nodes)}
    return srcs.pop(), sorted(nodes.values(), key=lambda n: order[id(n)])


def token_linear_as_conv(g: Graph, ed: Editor, applied: list) -> bool:
    """Run one widening (or narrowing) token MatMul as a Conv1x1 on the image side of its layout pass."""
    prod, cons = g.producers(), _live_consumers(g)
    private = lambda t: len(cons.get(t, [])) == 1 and t not in g.outputs  # noqa: E731
    for n in list(g.nodes):
        if n.op not in ("Reshape", "Transpose") or not cons.get(n.outputs[0]) or n.outputs[0] in g.outputs:
            continue
        img = g.tensors[n.outputs[0]]
        if len(img.shape) != 4 or img.dtype != "float32" \
                or all(m.op in ("Reshape", "Transpose") for m in cons[n.outputs[0]]):
            continue  # only the last node of a layout chain
        if not all(const(g, i) is not None for i in n.inputs[1:] if i):
            continue
        u, back = layout_chain(g, n.inputs[0], prod, cons, private=True)
        back = back + [n]
        found = _token_linear(g, u, prod, private) if private(u) else None
        if found is None:
            continue
        mm, add, wp, bp = found
        tok = g.tensors[mm.inputs[0]]
        nb, cm, h, w = img.shape
        c = wp.shape[0]
        if c >= cm or tok.shape != (nb, h * w, c) or not _is_to_image(g, back, nb, h, w, cm):
            continue
        t2 = ed.tensor(f"{mm.inputs[0]}.chw", (nb, c, h * w), tok.dtype)
        x = ed.tensor(f"{mm.inputs[0]}.image", (nb, c, h, w), tok.dtype)
        nodes = [Node(ed.name(f"{mm.name}.to_chw"), "Transpose", [mm.inputs[0]], [t2], {"perm": [0, 2, 1]}),
                 Node(ed.name(f"{mm.name}.to_image"), "Reshape",
                      [t2, ed.const(f"{mm.name}.image_shape", np.array([nb, c, h, w], np.int64))], [x]),
                 Node(ed.name(f"{mm.name}.conv1x1"), "Conv",
                      [x, ed.const(f"{mm.inputs[1]}.conv1x1", np.ascontiguousarray(wp.T).reshape(cm, c, 1, 1)),
                       ed.const(f"{mm.name}.conv1x1_bias", bp)], [n.outputs[0]], {"kernel_shape": [1, 1]})]
        return replace(g, n, nodes, "token_linear_as_conv", applied)
    return _token_linear_as_conv_out(g, ed, applied, prod, cons, private)


def _token_linear_as_conv_out(g: Graph, ed: Editor, applied: list, prod: dict, cons: dict, private) -> bool:
    """The way back: MatMul(f(to_tokens(y)), W) + b -> to_tokens(Conv1x1(f(y)))."""
    for out in [n.outputs[0] for n in g.nodes if n.op in ("MatMul", "Add")]:
        found = _token_linear(g, out, prod, private)
        bias_next = found is not None and found[1] is None and private(out) and cons[out][0].op == "Add"
        if found is None or (bias_next and _token_linear(g, cons[out][0].outputs[0], prod, private) is not None):
            continue  # (a MatMul whose bias Add follows is rewritten from that Add)
        mm, add, wp, bp = found
        cm, c = wp.shape
        last = add if add is not None else mm
        region = _elementwise_region(g, mm.inputs[0], prod, cons) if private(mm.inputs[0]) else None
        src, ew = region if region is not None else (mm.inputs[0], [])
        y = _nchw_source(g, src, prod, cons)
        if y is None or c >= cm:
            continue
        nb, cy, h, w = g.tensors[y].shape
        if cy != cm or g.tensors[last.outputs[0]].shape != (nb, h * w, c):
            continue
        rename = {src: y}
        nodes = []
        for e in ew:
            o = ed.tensor(f"{e.outputs[0]}.image", (nb, cm, h, w), g.tensors[e.outputs[0]].dtype)
            nodes.append(Node(ed.name(f"{e.name}.image"), e.op, [rename.get(i, i) for i in e.inputs], [o],
                              dict(e.attrs), e.domain))
            rename[e.outputs[0]] = o
        z = ed.tensor(f"{last.outputs[0]}.image", (nb, c, h, w), "float32")
        z3 = ed.tensor(f"{last.outputs[0]}.chw", (nb, c, h * w), "float32")
        nodes += [Node(ed.name(f"{mm.name}.conv1x1"), "Conv",
                       [rename[mm.inputs[0]], ed.const(f"{mm.inputs[1]}.conv1x1", np.ascontiguousarray(wp.T).reshape(c, cm, 1, 1)),
                        ed.const(f"{mm.name}.conv1x1_bias", bp)], [z], {"kernel_shape": [1, 1]}),
                  Node(ed.name(f"{mm.name}.to_chw"), "Reshape",
                       [z, ed.const(f"{mm.name}.chw_shape", np.array([nb, c, h * w], np.int64))], [z3]),
                  Node(ed.name(f"{mm.name}.to_tokens"), "Transpose", [z3], [last.outputs[0]], {"perm": [0, 2, 1]})]
        return replace(g, last, nodes, "token_linear_as_conv", applied)
    return False

