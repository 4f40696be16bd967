"""Attention rewrites: EfficientViT's ReLU linear attention in the layout its input already has.

- ``linear_attention_channel_major``: ReLU linear attention (EfficientViT's LiteMLA) as exporters
  write it, ``T = Transpose(R)`` of the (B, heads, 3d, N) qkv map to tokens, ``q, k, v`` = Slices of
  ``T``, ``vk = MatMul(Transpose(relu(k)), Pad(v, +1 column of c))``, ``o = MatMul(relu(q), vk)``,
  ``Transpose(o[..., :d] / (o[..., d:] + eps))`` back to channels, is computed in the channel-major
  layout ``R`` already has: ``q, k, v`` = Slices of ``R`` on the channel axis, ``vk^T =
  MatMul(Pad(v), Transpose(relu(k)))`` (d+1, d), ``o^T = MatMul(vk^T, relu(q))`` (d+1, N), and the
  division on rows of ``o^T``. The same products, reassociated through ``(AB)^T = B^T A^T``: the two
  transposes of full maps (3d and d channels) go, and one of a d-channel map is left, which
  ONNX Runtime (FusedMatMul) and OpenVINO fold into the MatMul (checked in their optimised and
  executed graphs of EfficientViT-b1: no Transpose left). Every shape, slice, pad and transpose of
  the pattern is checked before it fires.
"""
from __future__ import annotations

import numpy as np

from tensorplan.ir.graph import Graph, Node
from tensorplan.rewrite.common import Editor, attr_str, const, replace


def _slice_last(g: Graph, n: Node, rank: int) -> tuple[int, int] | None:
    """(start, end) if `n` is a unit-step Slice of only the last axis of a rank-`rank` tensor with
    constant, in-range bounds; else None."""
    if n.op != "Slice" or len(n.inputs) < 4:
        return None
    vals = [const(g, i) if i else None for i in n.inputs[1:5]]
    if any(v is None for v in vals[:3]) or any(np.asarray(v).size != 1 for v in vals[:3]):
        return None
    if len(vals) > 3 and vals[3] is not None and int(np.asarray(vals[3]).ravel()[0]) != 1:
        return None
    axis = int(np.asarray(vals[2]).ravel()[0]) % rank
    size = g.tensors[n.inputs[0]].shape[-1]
    start, end = (int(np.asarray(v).ravel()[0]) for v in vals[:2])
    start, end = (min(x + size if x < 0 else x, size) for x in (start, end))  # ends past the axis clamp
    if axis != rank - 1 or not 0 <= start < end:
        return None
    return start, end


def _is_swap_last(n: Node | None) -> bool:
    return n is not None and n.op == "Transpose" and list(n.attrs.get("perm", [])) == [0, 1, 3, 2]


def linear_attention_channel_major(g: Graph, ed: Editor, applied: list) -> bool:
    """Compute one ReLU linear attention in its channel-major input layout."""
    cons = g.consumers()
    outs = set(g.outputs)
    only = lambda t: cons.get(t, []) if t not in outs else []  # noqa: E731 - consumers of a private tensor

    def sole(t: str, op: str) -> Node | None:
        c = only(t)
        return c[0] if len(c) == 1 and c[0].op == op else None

    for tr in list(g.nodes):
        if not _is_swap_last(tr) or len(g.tensors[tr.inputs[0]].shape) != 4:
            continue
        r = tr.inputs[0]
        b, h, c3, n_tok = g.tensors[r].shape
        parts = {}
        for sl in only(tr.outputs[0]):
            se = _slice_last(g, sl, 4)
            if se is None:
                break
            parts[se] = sl
        d = c3 // 3
        if c3 % 3 or set(parts) != {(0, d), (d, 2 * d), (2 * d, 3 * d)}:
            continue
        sq, sk, sv = parts[(0, d)], parts[(d, 2 * d)], parts[(2 * d, 3 * d)]
        rq, rk, pad = sole(sq.outputs[0], "Relu"), sole(sk.outputs[0], "Relu"), sole(sv.outputs[0], "Pad")
        if rq is None or rk is None or pad is None:
            continue
        pads = const(g, pad.inputs[1]) if len(pad.inputs) > 1 else None
        cval = const(g, pad.inputs[2]) if len(pad.inputs) > 2 and pad.inputs[2] else None
        if (pads is None or list(np.asarray(pads).ravel()) != [0, 0, 0, 0, 0, 0, 0, 1] or cval is None
                or attr_str(pad.attrs.get("mode"), "constant") != "constant" or len(pad.inputs) > 3):
            continue
        kt = sole(rk.outputs[0], "Transpose")
        if not _is_swap_last(kt):
            continue
        mm1 = sole(kt.outputs[0], "MatMul")
        if mm1 is None or mm1.inputs != [kt.outputs[0], pad.outputs[0]] or len(only(pad.outputs[0])) != 1:
            continue
        mm2 = sole(mm1.outputs[0], "MatMul")
        if mm2 is None or mm2.inputs != [rq.outputs[0], mm1.outputs[0]] or len(only(rq.outputs[0])) != 1:
            continue
        o_cons = only(mm2.outputs[0])
        sl_o = {(_slice_last(g, x, 4)): x for x in o_cons}
        if len(o_cons) != 2 or set(sl_o) != {(0, d), (d, d + 1)}:
            continue
        num, den = sl_o[(0, d)], sl_o[(d, d + 1)]
        add = sole(den.outputs[0], "Add")
        if add is None:
            continue
        eps = [i for i in add.inputs if i != den.outputs[0]]
        if len(eps) != 1 or const(g, eps[0]) is None or np.asarray(const(g, eps[0])).size != 1:
            continue
        div = sole(add.outputs[0], "Div")
        if div is None or div.inputs != [num.outputs[0], add.outputs[0]] or len(only(num.outputs[0])) != 1:
            continue
        back = sole(div.outputs[0], "Transpose")
        if not _is_swap_last(back):
            continue
        dt = g.tensors[r].dtype
        new: list[Node] = []

        def op(kind: str, ins: list[str], shape, out: str | None = None, **attrs) -> str:
            out = out or ed.tensor(f"{back.outputs[0]}.cm_{kind.lower()}", shape, dt)
            new.append(Node(ed.name(f"{tr.name}.cm_{kind.lower()}"), kind, ins, [out], dict(attrs)))
            return out

        def rows(x: str, a: int, e: int, shape) -> str:
            return op("Slice", [x, ed.const("cm_start", np.array([a], np.int64)),
                                ed.const("cm_end", np.array([e], np.int64)),
                                ed.const("cm_axis", np.array([2], np.int64))], shape)

        q = op("Relu", [rows(r, 0, d, (b, h, d, n_tok))], (b, h, d, n_tok))
        k = op("Relu", [rows(r, d, 2 * d, (b, h, d, n_tok))], (b, h, d, n_tok))
        v = op("Pad", [rows(r, 2 * d, 3 * d, (b, h, d, n_tok)),
                       ed.const("cm_pads", np.array([0, 0, 0, 0, 0, 0, 1, 0], np.int64)), pad.inputs[2]],
               (b, h, d + 1, n_tok), mode="constant")
        vk_t = op("MatMul", [v, op("Transpose", [k], (b, h, n_tok, d), perm=[0, 1, 3, 2])], (b, h, d + 1, d))
        o_t = op("MatMul", [vk_t, q], (b, h, d + 1, n_tok))
        den_t = op("Add", [rows(o_t, d, d + 1, (b, h, 1, n_tok)), eps[0]], (b, h, 1, n_tok))
        op("Div", [rows(o_t, 0, d, (b, h, d, n_tok)), den_t], (b, h, d, n_tok), out=back.outputs[0])
        for x in (tr, sq, sk, sv, rq, rk, pad, kt, mm1, mm2, num, den, add, div):
            g.nodes.remove(x)
        return replace(g, back, new, "linear_attention_channel_major", applied)
    return False

