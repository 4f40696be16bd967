"""Opt-in rewrite: stride-1 3x3 convolutions as Winograd F(4x4, 3x3).

- ``conv3x3_winograd`` (only for the convolutions named in ``rewrite(..., winograd=names)``:
  it pays only where the GEMMs are large enough, so `tensorplan orchestrate --winograd`
  asks for it and the plan records which convolutions got it): a stride-1 3x3 convolution as
  Winograd F(4x4, 3x3) (Lavin & Gray): each 6x6 input tile is transformed by a depthwise 6x6
  stride-4 convolution (B^T d B), the 36 transform points multiply as 36 batched GEMMs with the
  pre-transformed weights G g G^T, and the output transform A^T m A is one small MatMul
  followed by DepthToSpace. 36 instead of 144 multiply-adds per 4x4 output tile and channel
  pair (4x fewer in the GEMMs); exact in real arithmetic, ~1e-5 relative error in fp32.
"""
from __future__ import annotations

import numpy as np

from tensorplan.ir.graph import Graph, Node
from tensorplan.rewrite.common import Editor, const, is_unit_conv, replace

WINOGRAD = "conv3x3_winograd"

# Winograd F(4x4, 3x3) (Lavin & Gray 2016, points 0, +-1, +-2, inf): Y = A^T [(G g G^T) * (B^T d B)] A
_WINO_BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                     [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)
_WINO_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                    [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
_WINO_AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], np.float64)


def winograd_convs(g: Graph) -> list[Node]:
    """The convolutions `conv3x3_winograd` can rewrite: 3x3, stride 1, no dilation or groups,
    explicit pads, fp32 4-d input, constant weight (and bias), output at least 4x4."""
    out = []
    for n in g.nodes:
        if n.op != "Conv" or len(n.inputs) < 2 or n.domain not in ("", "ai.onnx"):
            continue
        w = const(g, n.inputs[1])
        a = n.attrs
        if w is None or w.ndim != 4 or w.shape[2:] != (3, 3) or w.dtype != np.float32:
            continue
        if len(n.inputs) > 2 and n.inputs[2] and const(g, n.inputs[2]) is None:
            continue
        if not is_unit_conv(a):
            continue
        x, y = g.tensors.get(n.inputs[0]), g.tensors.get(n.outputs[0])
        if x is None or y is None or len(x.shape) != 4 or x.dtype != "float32" or min(y.shape[2:]) < 4:
            continue
        out.append(n)
    return out


def winograd_conv(g: Graph, ed: Editor, n: Node, applied: list) -> bool:
    """Replace convolution `n` (one of `winograd_convs`) by its Winograd F(4x4, 3x3) form."""
    w = const(g, n.inputs[1]).astype(np.float64)
    b = const(g, n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
    nb, c, h, wd = g.tensors[n.inputs[0]].shape
    k = w.shape[0]
    y = g.tensors[n.outputs[0]]
    ho, wo = y.shape[2:]
    pt, pl, pb, pr = (int(p) for p in n.attrs.get("pads", [0, 0, 0, 0]))
    th, tw = -(-ho // 4), -(-wo // 4)
    t = th * tw
    # extra zero rows/columns at the end so the output is whole tiles (sliced off again below)
    eb, er = 4 * th + 2 - (h + pt + pb), 4 * tw + 2 - (wd + pl + pr)
    bt = np.einsum("ap,bq->abpq", _WINO_BT, _WINO_BT).reshape(36, 6, 6)
    w_in = np.broadcast_to(bt[None], (c, 36, 6, 6)).reshape(c * 36, 1, 6, 6).astype(np.float32)
    u = np.einsum("ai,kcij,bj->abkc", _WINO_G, w, _WINO_G).reshape(36, k, c).astype(np.float32)
    a_out = np.einsum("ia,jb->ijab", _WINO_AT, _WINO_AT).reshape(16, 36).astype(np.float32)
    base, nm = n.outputs[0], n.name
    nodes: list[Node] = []

    def node(op: str, ins: list[str], shape, attrs=None, out: str | None = None) -> str:
        o = out or ed.tensor(f"{base}.wino", shape, y.dtype)
        nodes.append(Node(ed.name(f"{nm}.wino_{op.lower()}"), op, ins, [o], attrs or {}))
        return o

    def shape(*dims) -> str:
        return ed.const(f"{nm}.wino_shape", np.array(dims, np.int64))

    v = node("Conv", [n.inputs[0], ed.const(f"{nm}.wino_bt", w_in)], (nb, 36 * c, th, tw),
             {"group": c, "kernel_shape": [6, 6], "strides": [4, 4], "pads": [pt, pl, pb + eb, pr + er]})
    v = node("Reshape", [v, shape(nb, c, 36, t)], (nb, c, 36, t))
    v = node("Transpose", [v], (36, c, nb, t), {"perm": [2, 1, 0, 3]})
    v = node("Reshape", [v, shape(36, c, nb * t)], (36, c, nb * t))
    m = node("MatMul", [ed.const(f"{n.inputs[1]}.wino_u", u), v], (36, k, nb * t))
    m = node("Reshape", [m, shape(36, k * nb * t)], (36, k * nb * t))
    o = node("MatMul", [ed.const(f"{nm}.wino_at", a_out), m], (16, k * nb * t))
    if nb == 1:
        o = node("Reshape", [o, shape(1, 16 * k, th, tw)], (1, 16 * k, th, tw))
    else:
        o = node("Reshape", [o, shape(16, k, nb, th, tw)], (16, k, nb, th, tw))
        o = node("Transpose", [o], (nb, 16, k, th, tw), {"perm": [2, 0, 1, 3, 4]})
        o = node("Reshape", [o, shape(nb, 16 * k, th, tw)], (nb, 16 * k, th, tw))
    last_needed = eb or er or b is not None
    o = node("DepthToSpace", [o], (nb, k, 4 * th, 4 * tw), {"blocksize": 4, "mode": "DCR"},
             out=None if last_needed else base)
    if eb or er:
        o = node("Slice", [o, ed.const(f"{nm}.wino_starts", np.zeros(2, np.int64)),
                           ed.const(f"{nm}.wino_ends", np.array([ho, wo], np.int64)),
                           ed.const(f"{nm}.wino_axes", np.array([2, 3], np.int64))],
                 (nb, k, ho, wo), out=None if b is not None else base)
    if b is not None:
        node("Add", [o, ed.const(f"{n.inputs[2]}.wino_bias", b.reshape(k, 1, 1).astype(np.float32))],
             (nb, k, ho, wo), out=base)
    return replace(g, n, nodes, WINOGRAD, applied)

