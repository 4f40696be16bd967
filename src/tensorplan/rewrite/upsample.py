"""Rewrites around upsampling (decoders, feature pyramids, generators): exact in real arithmetic.

Why: decoders and feature pyramids (SegFormer's all-MLP head, YOLO necks) upsample
low-resolution maps and then mix channels at the *high* resolution. Channel mixing and
upsampling are linear and act on different axes, so they commute: the convolution can run
before the upsampling, on 4-64x fewer pixels.

- ``identity_resize``: a Resize/Upsample whose output shape equals its input shape and whose
  sampling grid is the identity is dropped (ONNX Runtime still runs it).
- ``split_concat_conv``: ``Conv1x1(Concat(x_1..x_k, axis=1))`` = ``sum_i Conv1x1_i(x_i)`` with
  the weight split along input channels (bias on the first part). Only applied when a part
  is an upsampling Resize, so the next rule can move that part's convolution down.
- ``conv_before_resize``: ``Conv1x1(Resize_up(x))`` = ``Resize_up(Conv1x1(x))`` for nearest or
  (bi)linear Resize over spatial axes only: every output pixel is a convex combination of
  input pixels (weights sum to 1), so channel mixing and its bias commute with it.
- ``upsample_conv_phases``: ``Conv3x3(pad1(Nearest_up2(x)))`` (the decoder of style-transfer
  nets, GAN generators and U-Nets) is four 2x2 convolutions of ``pad1(x)``, one per output
  phase (row/column parity), interleaved by DepthToSpace: on the upsampled map every 3-tap
  window covers only two distinct source pixels, so their taps add up. 16 instead of 36
  multiply-adds per low-resolution pixel (2.25x fewer). The one-pixel border may be zeros
  (Conv pads or a zero Pad) or a reflect/edge Pad, which on a nearest-upsampled map equals
  an edge pad of ``x``; both the upsampling and the pad are checked numerically on the
  node's own shapes before the rule fires.
"""
from __future__ import annotations

import numpy as np

from tensorplan.ir.graph import Graph, Node
from tensorplan.ir.reference import run_node
from tensorplan.rewrite.common import Editor, attr_str, const, convs1x1, is_unit_conv, replace


def resize_kind(g: Graph, n: Node) -> str | None:
    """'identity' or 'up' for a 4-D nearest/linear Resize over spatial axes only, else None."""
    if n.op not in ("Resize", "Upsample") or not n.inputs or not n.inputs[0]:
        return None
    x, y = g.tensors.get(n.inputs[0]), g.tensors.get(n.outputs[0])
    if x is None or y is None or len(x.shape) != 4 or tuple(x.shape[:2]) != tuple(y.shape[:2]):
        return None
    mode = attr_str(n.attrs.get("mode"), "nearest")
    ctm = attr_str(n.attrs.get("coordinate_transformation_mode"), "half_pixel")
    if mode not in ("nearest", "linear") or ctm == "tf_crop_and_resize" or int(n.attrs.get("antialias", 0)):
        return None
    if tuple(x.shape) == tuple(y.shape):
        # the identity grid: same size and no scale other than 1 (a scale given with equal sizes)
        sidx = 2 if n.op == "Resize" and g.opset >= 11 else 1
        sc = const(g, n.inputs[sidx]) if len(n.inputs) > sidx else None
        if sc is not None and sc.size and not np.allclose(sc.astype(np.float64), 1.0):
            return None
        if n.op == "Upsample" and n.attrs.get("scales") is not None \
                and not np.allclose(np.asarray(n.attrs["scales"], dtype=np.float64), 1.0):
            return None
        if mode == "nearest" and ctm == "tf_half_pixel_for_nn":
            return None  # shifts by half a pixel even at scale 1
        return "identity"
    if all(yo >= xo for xo, yo in zip(x.shape[2:], y.shape[2:])):
        return "up"
    return None


def identity_resize(g: Graph, ed: Editor, applied: list) -> bool:
    """Drop one Resize that samples the identity grid (ORT would still copy the map)."""
    outs = set(g.outputs)
    for n in list(g.nodes):
        if resize_kind(g, n) != "identity" or n.outputs[0] in outs:
            continue
        src, dst = n.inputs[0], n.outputs[0]
        for m in g.nodes:
            m.inputs = [src if i == dst else i for i in m.inputs]
        g.nodes.remove(n)
        applied.append(("identity_resize", n.name))
        return True
    return False


def split_concat_conv(g: Graph, ed: Editor, applied: list) -> bool:
    """Split one Conv1x1 over a Concat with an upsampled part into per-part convolutions summed."""
    for n, cat, prod in convs1x1(g):
        if cat is None or cat.op != "Concat" or int(cat.attrs.get("axis", 1)) % 4 != 1:
            continue
        parts = [i for i in cat.inputs if i]
        if not any(p in prod and resize_kind(g, prod[p]) == "up" for p in parts):
            continue
        w = const(g, n.inputs[1])
        b = const(g, n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
        y = g.tensors[n.outputs[0]]
        terms: list[str] = []
        c0 = 0
        new_nodes: list[Node] = []
        for k, p in enumerate(parts):
            c = g.tensors[p].shape[1]
            wk = np.ascontiguousarray(w[:, c0:c0 + c])
            c0 += c
            ins = [p, ed.const(f"{n.inputs[1]}.part{k}", wk)]
            if b is not None and k == 0:
                ins.append(n.inputs[2])
            out = ed.tensor(f"{n.outputs[0]}.part{k}", y.shape, y.dtype)
            new_nodes.append(Node(ed.name(f"{n.name}.part{k}"), "Conv", ins, [out], dict(n.attrs), n.domain))
            terms.append(out)
        acc = terms[0]
        for k, t in enumerate(terms[1:], start=1):
            out = n.outputs[0] if k == len(terms) - 1 else ed.tensor(f"{n.outputs[0]}.sum{k}", y.shape, y.dtype)
            new_nodes.append(Node(ed.name(f"{n.name}.sum{k}"), "Add", [acc, t], [out]))
            acc = out
        return replace(g, n, new_nodes, "split_concat_conv", applied)
    return False


def conv_before_resize(g: Graph, ed: Editor, applied: list) -> bool:
    """Move one Conv1x1 before the upsampling Resize feeding it: the same map on fewer pixels."""
    for n, rs, _ in convs1x1(g):
        if rs is None or resize_kind(g, rs) != "up":
            continue
        x = g.tensors[rs.inputs[0]]
        y = g.tensors[n.outputs[0]]
        low = ed.tensor(f"{n.outputs[0]}.lowres", (x.shape[0], y.shape[1], *x.shape[2:]), y.dtype)
        conv = Node(ed.name(f"{n.name}.lowres"), "Conv", [rs.inputs[0], *n.inputs[1:]], [low], dict(n.attrs), n.domain)
        r_ins = list(rs.inputs)
        r_ins[0] = low
        sidx = 3 if rs.op == "Resize" and g.opset >= 11 else None
        if sidx is not None and len(r_ins) > sidx and r_ins[sidx]:
            sizes = const(g, r_ins[sidx]).astype(np.int64).copy()
            sizes[1] = y.shape[1]
            r_ins[sidx] = ed.const(f"{rs.inputs[sidx]}.c{y.shape[1]}", sizes)
        resize = Node(ed.name(f"{rs.name}.after_{n.name}"), rs.op, r_ins, [n.outputs[0]], dict(rs.attrs), rs.domain)
        return replace(g, n, [conv, resize], "conv_before_resize", applied)
    return False


def _up2(v: np.ndarray) -> np.ndarray:
    """Nearest x2 upsampling of an NCHW array (each pixel copied into a 2x2 block)."""
    return v.repeat(2, axis=2).repeat(2, axis=3)


def _run_on(g: Graph, n: Node, x: np.ndarray) -> np.ndarray | None:
    """`n`'s first output (reference executor) on data input `x`, its other inputs constants;
    None where one is computed or the node cannot run on `x`."""
    rest = [const(g, i) if i else None for i in n.inputs[1:]]
    if any(i and r is None for i, r in zip(n.inputs[1:], rest)):
        return None
    try:
        return run_node(n, [x, *rest])[0]
    except Exception:
        return None


def _is_nearest_up2(g: Graph, n: Node, probe: np.ndarray) -> bool:
    """True when `n` maps every output pixel (i, j) to source pixel (i//2, j//2), checked by
    running the node itself on `probe` (its real input shape)."""
    if n.op not in ("Resize", "Upsample") or attr_str(n.attrs.get("mode"), "nearest") != "nearest":
        return False
    out, want = _run_on(g, n, probe), _up2(probe)
    return out is not None and out.shape == want.shape and np.array_equal(out, want)


def _border_of_up2(g: Graph, pad: Node, x: np.ndarray) -> str | None:
    """'edge' or 'zero' when Pad `pad` applied to nearest_up2(x) equals nearest_up2 of x padded
    by one pixel (edge or zeros) cropped by one: i.e. a one-pixel spatial border."""
    got = _run_on(g, pad, _up2(x))
    if got is None:
        return None
    width = ((0, 0), (0, 0), (1, 1), (1, 1))
    for kind, want in (("edge", _up2(np.pad(x, width, mode="edge"))[:, :, 1:-1, 1:-1]),
                       ("zero", np.pad(_up2(x), width))):
        if got.shape == want.shape and np.array_equal(got, want):
            return kind
    return None


def _phase_weights(w: np.ndarray) -> np.ndarray:
    """(K, C, 3, 3) -> (4K, C, 2, 2): phase (a, b) of nearest_up2 then 3x3 sums the taps that
    land on the same source pixel (row parity a: taps {0}, {1, 2}; or {0, 1}, {2})."""
    def fold(v: np.ndarray, parity: int, axis: int) -> np.ndarray:
        t0, t1, t2 = (np.take(v, k, axis=axis) for k in range(3))
        return np.stack([t0, t1 + t2] if parity == 0 else [t0 + t1, t2], axis=axis)
    return np.concatenate([fold(fold(w, a, 2), b, 3) for a in (0, 1) for b in (0, 1)], axis=0)


def upsample_conv_phases(g: Graph, ed: Editor, applied: list) -> bool:
    """Compute one Conv3x3 of a nearest-x2 map as four 2x2 phase convolutions of the small map."""
    prod = g.producers()
    for n in list(g.nodes):
        if n.op != "Conv" or len(n.inputs) < 2:
            continue
        w = const(g, n.inputs[1])
        has_b = len(n.inputs) > 2 and bool(n.inputs[2])
        b = const(g, n.inputs[2]) if has_b else None
        a = n.attrs
        if w is None or w.ndim != 4 or w.shape[2:] != (3, 3) or (has_b and b is None):
            continue
        if not is_unit_conv(a):
            continue
        pads = [int(p) for p in a.get("pads", [0, 0, 0, 0])]
        src = prod.get(n.inputs[0])
        if pads == [1, 1, 1, 1]:
            up, border_node = src, None
        elif pads == [0, 0, 0, 0] and src is not None and src.op == "Pad":
            up, border_node = prod.get(src.inputs[0]), src
        else:
            continue
        if up is None or up.op not in ("Resize", "Upsample"):
            continue
        xt = g.tensors.get(up.inputs[0])
        if xt is None or len(xt.shape) != 4 or xt.dtype != "float32":
            continue
        probe = np.random.default_rng(0).standard_normal(xt.shape).astype(np.float32)
        if not _is_nearest_up2(g, up, probe):
            continue
        border = "zero" if border_node is None else _border_of_up2(g, border_node, probe)
        if border is None:
            continue
        nb, _, h, wd = xt.shape
        k = w.shape[0]
        y = g.tensors[n.outputs[0]]
        x = up.inputs[0]
        nodes: list[Node] = []
        xp = ed.tensor(f"{x}.pad1", (nb, xt.shape[1], h + 2, wd + 2), xt.dtype)
        mode = "edge" if border == "edge" else "constant"
        # (the importer guarantees opset >= 11: Pad, Slice take inputs, DepthToSpace a mode)
        nodes.append(Node(ed.name(f"{n.name}.pad1"), "Pad",
                          [x, ed.const(f"{n.name}.pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))],
                          [xp], {"mode": mode}))
        z = ed.tensor(f"{n.outputs[0]}.phases", (nb, 4 * k, h + 1, wd + 1), y.dtype)
        cins = [xp, ed.const(f"{n.inputs[1]}.phases", _phase_weights(w))]
        if has_b:
            cins.append(ed.const(f"{n.inputs[2]}.phases", np.tile(b, 4)))
        nodes.append(Node(ed.name(f"{n.name}.phases"), "Conv", cins, [z],
                          {"kernel_shape": [2, 2], "pads": [0, 0, 0, 0], "strides": [1, 1]}, n.domain))
        parts = []
        axes = ed.const(f"{n.name}.phase_axes", np.array([1, 2, 3], np.int64))
        for idx, (pa, pb) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
            part = ed.tensor(f"{n.outputs[0]}.phase{pa}{pb}", (nb, k, h, wd), y.dtype)
            starts, ends = [idx * k, pa, pb], [(idx + 1) * k, pa + h, pb + wd]
            ins = [z, ed.const(f"{n.name}.phase{pa}{pb}.starts", np.array(starts, np.int64)),
                   ed.const(f"{n.name}.phase{pa}{pb}.ends", np.array(ends, np.int64)), axes]
            nodes.append(Node(ed.name(f"{n.name}.phase{pa}{pb}"), "Slice", ins, [part]))
            parts.append(part)
        cat = ed.tensor(f"{n.outputs[0]}.phases_dcr", (nb, 4 * k, h, wd), y.dtype)
        nodes.append(Node(ed.name(f"{n.name}.phases_cat"), "Concat", parts, [cat], {"axis": 1}))
        nodes.append(Node(ed.name(f"{n.name}.interleave"), "DepthToSpace", [cat], [n.outputs[0]],
                          {"blocksize": 2, "mode": "DCR"}))
        return replace(g, n, nodes, "upsample_conv_phases", applied)
    return False
