"""Algebraic rewrites of the operator graph before fission: exact in real arithmetic, fewer FLOPs
or cheaper operators.

Why: Korch (and ONNX Runtime) only regroup the operators a model is given. Decoders and
feature pyramids (SegFormer's all-MLP head, YOLO necks) upsample low-resolution maps and
then mix channels with a 1x1 convolution at the *high* resolution. Both operators are linear
and act on different axes, so they commute: the convolution can run before the upsampling,
on 4-64x fewer pixels. Each rule is exact up to floating-point rounding (checked against
ONNX Runtime on the original model in tests/test_rewrite.py):

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

- ``mish_sigmoid``: Mish ``x * tanh(softplus(x))`` (the ONNX ``Mish`` op, or the
  ``Softplus -> Tanh -> Mul`` chain exporters write) as ``x * m / (2 - m)`` with
  ``m = s * (2 - s)``, ``s = sigmoid(x)``: with ``u = (1 + e^x)^2 = 1 / (1 - s)^2``,
  ``tanh(softplus(x)) = (u - 1) / (u + 1)``, and multiplying through by ``(1 - s)^2`` gives
  ``m / (2 - m)``. No FLOPs saved, but every operator is one ONNX Runtime vectorizes and runs
  on both threads, where its ``Softplus`` (and ``Mish``, which it expands into Softplus) is a
  scalar loop: 3-4x faster Mish there (YOLOv4 spends 2/3 of its ORT time in Softplus); fused
  kernels (TVM, Inductor) compute either form in one pass. No overflow: the sigmoid saturates.

- ``focus_conv``: YOLOv5/YOLOX's "Focus" stem, ``Conv_KxK(Concat(x[::2, ::2], x[1::2, ::2],
  x[::2, 1::2], x[1::2, 1::2]))`` (strided Slices of the image stacked on channels), is one
  stride-2 ``2K x 2K`` convolution of ``x`` with the weight taps interleaved by phase,
  ``W'[o, c, 2a + dh, 2b + dw] = W[o, k*C + c, a, b]`` for the part ``k`` at phase
  ``(dh, dw)``, and the padding doubled: the same multiply-adds, but no Slice/Concat passes
  (ORT's strided Slices + Concat: ~11 % of YOLOX-nano's ORT profile). The phases are
  found by running the Slice chain on an index image, so any slicing that stacks the four
  phases qualifies.

- ``conv_output_phases``: a convolution with few output channels (a final RGB or mask layer)
  and a large kernel, computed as one stride-``s`` convolution with ``s*s`` times the output
  channels, one group per output phase, interleaved by DepthToSpace:
  ``W'[(a*s + b)*O + o, c, a + u, b + v] = W[o, c, u, v]``. CPU convolution kernels (ONNX
  Runtime's NCHWc, oneDNN) compute output channels in blocks of 16 fp32 lanes, so a 3-channel
  output wastes 13 of 16 lanes; with ``s*s*O`` a multiple of 16 no lane is wasted, at the cost
  of ``(K + s - 1)^2 / K^2`` more (zero) taps. Fires only where this cuts the lane-padded
  multiply-adds at least 2x (candy's 9x9 32->3 output layer: 3x fewer; measured 3.6x faster
  in ONNX Runtime and 2.6x in PyTorch on this CPU).

- ``token_linear_conv``: ``Conv1x1(to_image(MatMul(to_tokens(x), Wp) + bp))``, where ``to_tokens``
  flattens an NCHW map into (N, HW, C) tokens and ``to_image`` turns them back (the
  Reshape/Transpose chains transformer decoders write: SegFormer's all-MLP head projects every
  stage's tokens to 256 channels, then fuses them with a 1x1 convolution) is one 1x1
  convolution of ``x`` with ``W' = Wf Wp^T`` and ``b' = Wf bp + bf``: two channel maps in a row
  are one. Drops the 256x256 fuse convolution (after ``split_concat_conv`` and
  ``conv_before_resize``, 2.9 of SegFormer-b0's 11.4 GFLOP) and four layout passes per stage.
  The layout chains are checked on index probes, so any Reshape/Transpose spelling qualifies;
  fires only where it does not add multiply-adds and every intermediate is private.

- ``token_linear_as_conv``: ``to_image(MatMul(t, W) + b)`` with ``W`` widening C -> C' channels
  (SegFormer's Mix-FFN ``fc1``, whose output goes to a depthwise convolution in image layout)
  is ``Conv1x1(to_image(t))``: the layout pass (Transpose/Reshape, and ONNX Runtime's NCHWc
  reorder behind it) then moves C instead of C' channels, 4x fewer in Mix-FFN, and the 1x1
  convolution runs in the same blocked layout as the depthwise one after it. The mirror image,
  ``MatMul(f(to_tokens(y)), W) + b`` with ``W`` narrowing C' -> C and ``f`` any elementwise
  chain with scalar constants (Mix-FFN's GELU and ``fc2``), becomes
  ``to_tokens(Conv1x1(f(y)))``, so the way back to tokens also moves C channels.

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

- ``conv3x3_winograd`` (only for the convolutions named in ``rewrite(..., winograd=names)``,
  chosen by measurement in plan/winograd.py, since it pays only where the GEMMs are large
  enough): a stride-1 3x3 convolution as Winograd F(4x4, 3x3) (Lavin & Gray): each 6x6 input
  tile is transformed by a depthwise 6x6 stride-4 convolution (B^T d B), the 36 transform points
  multiply as 36 batched GEMMs with the pre-transformed weights G g G^T, and the output
  transform A^T m A is one small MatMul followed by DepthToSpace. 36 instead of 144
  multiply-adds per 4x4 output tile and channel pair (4x fewer in the GEMMs); exact in real
  arithmetic, ~1e-5 relative error in fp32.

`rewrite(graph)` returns a new graph and the list of rules applied (name, node); the plan
records that list, and `rewrite` is deterministic, so a plan re-derives the same graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tensorplan.ir.graph import Graph, Node, Tensor, unique_name
from tensorplan.ir.reference import run_node

RULES = ("identity_resize", "split_concat_conv", "conv_before_resize", "upsample_conv_phases", "mish_sigmoid",
         "focus_conv", "conv_output_phases", "token_linear_conv", "token_linear_as_conv",
         "linear_attention_channel_major")
WINOGRAD = "conv3x3_winograd"


@dataclass
class RewriteResult:
    graph: Graph
    applied: list[tuple[str, str]] = field(default_factory=list)  # (rule, node name)

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rule, _ in self.applied:
            out[rule] = out.get(rule, 0) + 1
        return out


def _s(v, default: str) -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def _const(g: Graph, name: str) -> np.ndarray | None:
    t = g.tensors.get(name) if name else None
    return None if t is None or t.data is None else np.asarray(t.data)


def _is_conv1x1(g: Graph, n: Node) -> bool:
    """A plain 1x1 convolution: no stride, padding or groups, weight known."""
    if n.op != "Conv" or len(n.inputs) < 2:
        return False
    w = _const(g, n.inputs[1])
    if w is None or w.ndim != 4 or w.shape[2:] != (1, 1):
        return False
    if len(n.inputs) > 2 and n.inputs[2] and _const(g, n.inputs[2]) is None:
        return False
    a = n.attrs
    if int(a.get("group", 1)) != 1 or any(int(s) != 1 for s in a.get("strides", [1, 1])):
        return False
    if any(int(p) != 0 for p in a.get("pads", [0, 0, 0, 0])):
        return False
    return _s(a.get("auto_pad"), "NOTSET") in ("NOTSET", "VALID")


def _resize_kind(g: Graph, n: Node) -> str | None:
    """'identity' or 'up' for a 4-D nearest/linear Resize over spatial axes only, else None."""
    if n.op not in ("Resize", "Upsample") or not n.inputs or not n.inputs[0]:
        return None
    x, y = g.tensors.get(n.inputs[0]), g.tensors.get(n.outputs[0])
    if x is None or y is None or len(x.shape) != 4 or tuple(x.shape[:2]) != tuple(y.shape[:2]):
        return None
    mode = _s(n.attrs.get("mode"), "nearest")
    ctm = _s(n.attrs.get("coordinate_transformation_mode"), "half_pixel")
    if mode not in ("nearest", "linear") or ctm == "tf_crop_and_resize" or int(n.attrs.get("antialias", 0)):
        return None
    if tuple(x.shape) == tuple(y.shape):
        # the identity grid: same size and no scale other than 1 (a scale given with equal sizes)
        sidx = 2 if n.op == "Resize" and g.opset >= 11 else 1
        sc = _const(g, n.inputs[sidx]) if len(n.inputs) > sidx else None
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


class _Editor:
    """Small helper that adds uniquely named tensors/nodes to a graph being rewritten."""

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


def _drop_identity_resizes(g: Graph, applied: list) -> bool:
    outs = set(g.outputs)
    for n in list(g.nodes):
        if _resize_kind(g, n) != "identity" or n.outputs[0] in outs:
            continue
        src, dst = n.inputs[0], n.outputs[0]
        for m in g.nodes:
            m.inputs = [src if i == dst else i for i in m.inputs]
        g.nodes.remove(n)
        applied.append(("identity_resize", n.name))
        return True
    return False


def _convs1x1(g: Graph):
    """(conv, producer of its input or None) for every plain 1x1 convolution, in graph order."""
    prod = g.producers()
    for n in list(g.nodes):
        if _is_conv1x1(g, n):
            yield n, prod.get(n.inputs[0]), prod


def _replace(g: Graph, node: Node, new_nodes: list[Node], rule: str, applied: list) -> bool:
    at = g.nodes.index(node)
    g.nodes[at:at + 1] = new_nodes
    applied.append((rule, node.name))
    return True


def _split_concat_conv(g: Graph, ed: _Editor, applied: list) -> bool:
    for n, cat, prod in _convs1x1(g):
        if cat is None or cat.op != "Concat" or int(cat.attrs.get("axis", 1)) % 4 != 1:
            continue
        parts = [i for i in cat.inputs if i]
        if not any(p in prod and _resize_kind(g, prod[p]) == "up" for p in parts):
            continue
        w = _const(g, n.inputs[1])
        b = _const(g, n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
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
        return _replace(g, n, new_nodes, "split_concat_conv", applied)
    return False


def _conv_before_resize(g: Graph, ed: _Editor, applied: list) -> bool:
    for n, rs, _ in _convs1x1(g):
        if rs is None or _resize_kind(g, rs) != "up":
            continue
        x = g.tensors[rs.inputs[0]]
        y = g.tensors[n.outputs[0]]
        low = ed.tensor(f"{n.outputs[0]}.lowres", (x.shape[0], y.shape[1], *x.shape[2:]), y.dtype)
        conv = Node(ed.name(f"{n.name}.lowres"), "Conv", [rs.inputs[0], *n.inputs[1:]], [low], dict(n.attrs), n.domain)
        r_ins = list(rs.inputs)
        r_ins[0] = low
        sidx = 3 if rs.op == "Resize" and g.opset >= 11 else None
        if sidx is not None and len(r_ins) > sidx and r_ins[sidx]:
            sizes = _const(g, r_ins[sidx]).astype(np.int64).copy()
            sizes[1] = y.shape[1]
            r_ins[sidx] = ed.const(f"{rs.inputs[sidx]}.c{y.shape[1]}", sizes)
        resize = Node(ed.name(f"{rs.name}.after_{n.name}"), rs.op, r_ins, [n.outputs[0]], dict(rs.attrs), rs.domain)
        return _replace(g, n, [conv, resize], "conv_before_resize", applied)
    return False


def _layout_chain(g: Graph, t: str, prod: dict, cons: dict, private: bool,
                  ops: tuple[str, ...] = ("Reshape", "Transpose")) -> tuple[str, list[Node]]:
    """Walk back from `t` through `ops` nodes with constant operands: (source tensor, the chain
    in execution order). With `private`, stop at a tensor another node also reads."""
    chain = []
    while t in prod and prod[t].op in ops \
            and all(_const(g, i) is not None for i in prod[t].inputs[1:] if i) \
            and (not private or (len(cons.get(t, [])) == 1 and t not in g.outputs)):
        chain.append(prod[t])
        t = prod[t].inputs[0]
    return t, chain[::-1]


def _run_chain(g: Graph, chain: list[Node], v: np.ndarray) -> np.ndarray:
    for n in chain:
        v = run_node(n, [v] + [_const(g, i) if i else None for i in n.inputs[1:]])[0]
    return v


def _nchw_source(g: Graph, t: str, prod: dict, cons: dict) -> str | None:
    """The nearest 4-D fp32 tensor x upstream of `t` (through Reshape/Transpose only) with
    t = x flattened to (N, HW, C) tokens, checked on an index probe; else None."""
    _, chain = _layout_chain(g, t, prod, cons, private=False)
    for j in range(len(chain) - 1, -1, -1):
        xt = g.tensors.get(chain[j].inputs[0])
        if xt is None or len(xt.shape) != 4 or xt.dtype != "float32":
            continue
        nb, c, h, w = xt.shape
        probe = np.arange(nb * c * h * w, dtype=np.int64).reshape(nb, c, h, w)
        tokens = probe.reshape(nb, c, h * w).transpose(0, 2, 1)
        got = _run_chain(g, chain[j:], probe)
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
        parts = [i for i in add.inputs if _const(g, i) is None]
        if len(parts) != 1 or parts[0] not in prod or not private(parts[0]):
            return None
        node = prod[parts[0]]
    if node is None or node.op != "MatMul" or _const(g, node.inputs[0]) is not None:
        return None
    w = _const(g, node.inputs[1])
    if w is None or w.ndim != 2 or w.dtype != np.float32:
        return None
    cm = w.shape[1]
    b = np.zeros(cm, np.float32)
    if add is not None:
        bias = _const(g, next(i for i in add.inputs if _const(g, i) is not None))
        if bias.size != cm or bias.ndim == 0 or bias.shape[-1] != cm or any(d != 1 for d in bias.shape[:-1]):
            return None
        b = bias.reshape(cm).astype(np.float32)
    return node, add, w, b


def _is_to_image(g: Graph, chain: list[Node], nb: int, h: int, w: int, c: int) -> bool:
    """Does `chain` turn (N, HW, C) tokens into the (N, C, H, W) image (index probe)?"""
    probe = np.arange(nb * h * w * c, dtype=np.int64).reshape(nb, h * w, c)
    got = _run_chain(g, chain, probe)
    return got.shape == (nb, c, h, w) and np.array_equal(got, probe.transpose(0, 2, 1).reshape(nb, c, h, w))


def _token_linear_conv(g: Graph, ed: _Editor, applied: list) -> bool:
    prod, cons = g.producers(), _live_consumers(g)
    private = lambda t: len(cons.get(t, [])) == 1 and t not in g.outputs  # noqa: E731
    for n, _, _ in _convs1x1(g):
        u, back = _layout_chain(g, n.inputs[0], prod, cons, private=True)
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
        wf = _const(g, n.inputs[1])[:, :, 0, 0].astype(np.float64)
        co = wf.shape[0]
        if c * co > c * cm + cm * co:
            continue
        has_bf = len(n.inputs) > 2 and bool(n.inputs[2])
        bf = _const(g, n.inputs[2]).astype(np.float64) if has_bf else np.zeros(co)
        w2 = (wf @ wp.astype(np.float64).T).astype(np.float32).reshape(co, c, 1, 1)
        b2 = (wf @ bp.astype(np.float64) + bf).astype(np.float32)
        ins = [x, ed.const(f"{n.inputs[1]}.folded", w2), ed.const(f"{n.name}.folded_bias", b2)]
        attrs = {k: v for k, v in n.attrs.items() if k != "auto_pad"}
        return _replace(g, n, [Node(ed.name(f"{n.name}.folded"), "Conv", ins, list(n.outputs), attrs, n.domain)],
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
            v = _const(g, i)
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


def _token_linear_as_conv(g: Graph, ed: _Editor, applied: list) -> bool:
    prod, cons = g.producers(), _live_consumers(g)
    private = lambda t: len(cons.get(t, [])) == 1 and t not in g.outputs  # noqa: E731
    for n in list(g.nodes):
        if n.op not in ("Reshape", "Transpose") or not cons.get(n.outputs[0]) or n.outputs[0] in g.outputs:
            continue
        img = g.tensors[n.outputs[0]]
        if len(img.shape) != 4 or img.dtype != "float32" \
                or all(m.op in ("Reshape", "Transpose") for m in cons[n.outputs[0]]):
            continue  # only the last node of a layout chain
        if not all(_const(g, i) is not None for i in n.inputs[1:] if i):
            continue
        u, back = _layout_chain(g, n.inputs[0], prod, cons, private=True)
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
        return _replace(g, n, nodes, "token_linear_as_conv", applied)
    return _token_linear_as_conv_out(g, ed, applied, prod, cons, private)


def _token_linear_as_conv_out(g: Graph, ed: _Editor, applied: list, prod: dict, cons: dict, private) -> bool:
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
        return _replace(g, last, nodes, "token_linear_as_conv", applied)
    return False


def _mish_chain(g: Graph, n: Node, cons: dict, prod: dict) -> tuple[str, list[Node]] | None:
    """(x, [Softplus, Tanh]) if `n` is the Mul ending x * Tanh(Softplus(x)) with private
    intermediates; (x, []) for an ONNX Mish node; else None."""
    if n.op == "Mish" and n.domain in ("", "ai.onnx"):
        return n.inputs[0], []
    if n.op != "Mul" or len(n.inputs) != 2:
        return None
    private = lambda t: len(cons.get(t, [])) == 1 and t not in g.outputs  # noqa: E731
    for x, t in (n.inputs, n.inputs[::-1]):
        th = prod.get(t)
        if th is None or th.op != "Tanh" or not private(t):
            continue
        sp = prod.get(th.inputs[0])
        if sp is not None and sp.op == "Softplus" and sp.inputs[0] == x and private(th.inputs[0]):
            return x, [sp, th]
    return None


def _mish_sigmoid(g: Graph, ed: _Editor, applied: list) -> bool:
    prod, cons = g.producers(), g.consumers()
    for n in list(g.nodes):
        chain = _mish_chain(g, n, cons, prod)
        if chain is None:
            continue
        x, old = chain
        y = g.tensors[n.outputs[0]]
        two = ed.scalar(2.0, y.dtype)
        new: list[Node] = []

        def op(kind: str, ins: list[str], out: str | None = None) -> str:
            out = out or ed.tensor(f"{n.outputs[0]}.{kind.lower()}", y.shape, y.dtype)
            new.append(Node(ed.name(f"{n.name}.{kind.lower()}"), kind, ins, [out]))
            return out

        s = op("Sigmoid", [x])
        m = op("Mul", [s, op("Sub", [two, s])])
        op("Mul", [x, op("Div", [m, op("Sub", [two, m])])], out=n.outputs[0])
        for o in old:
            g.nodes.remove(o)
        return _replace(g, n, new, "mish_sigmoid", applied)
    return False


def _focus_phases(g: Graph, cat: Node, prod: dict) -> tuple[str, list[tuple[int, int]]] | None:
    """(x, [(dh, dw) per Concat part]) if every part of `cat` is a chain of Slices of one 4-D x
    picking one 2x2 phase of its spatial grid, all four phases once; else None."""
    src, chains = None, []
    for p in cat.inputs:
        t, chain = _layout_chain(g, p, prod, {}, private=False, ops=("Slice",))
        if not chain or (src is not None and t != src):
            return None
        src = t
        chains.append(chain)
    x = g.tensors[src]
    if len(cat.inputs) != 4 or len(x.shape) != 4 or x.shape[2] % 2 or x.shape[3] % 2:
        return None
    probe = np.arange(int(np.prod(x.shape)), dtype=np.int64).reshape(x.shape)
    phases = []
    for chain in chains:
        v = _run_chain(g, chain, probe)
        hit = [(dh, dw) for dh in (0, 1) for dw in (0, 1)
               if v.shape == probe[:, :, dh::2, dw::2].shape and np.array_equal(v, probe[:, :, dh::2, dw::2])]
        if not hit:
            return None
        phases.append(hit[0])
    return (src, phases) if len(set(phases)) == 4 else None


def _focus_conv(g: Graph, ed: _Editor, applied: list) -> bool:
    prod = g.producers()
    for n in list(g.nodes):
        cat = prod.get(n.inputs[0]) if n.op == "Conv" and n.inputs else None
        if cat is None or cat.op != "Concat" or int(cat.attrs.get("axis", 1)) % 4 != 1:
            continue
        w = _const(g, n.inputs[1]) if len(n.inputs) > 1 else None
        a = n.attrs
        if w is None or w.ndim != 4 or int(a.get("group", 1)) != 1 or _s(a.get("auto_pad"), "NOTSET") != "NOTSET" \
                or any(int(v) != 1 for v in list(a.get("strides", [1, 1])) + list(a.get("dilations", [1, 1]))):
            continue
        if len(n.inputs) > 2 and n.inputs[2] and _const(g, n.inputs[2]) is None:
            continue
        found = _focus_phases(g, cat, prod)
        if found is None:
            continue
        x, phases = found
        c = g.tensors[x].shape[1]
        o, _, kh, kw = w.shape
        w2 = np.zeros((o, c, 2 * kh, 2 * kw), dtype=w.dtype)
        for k, (dh, dw) in enumerate(phases):
            w2[:, :, dh::2, dw::2] = w[:, k * c:(k + 1) * c]
        attrs = dict(a)
        attrs.update(kernel_shape=[2 * kh, 2 * kw], strides=[2, 2],
                     pads=[2 * int(p) for p in a.get("pads", [0, 0, 0, 0])])
        ins = [x, ed.const(f"{n.inputs[1]}.focus", w2), *n.inputs[2:]]
        return _replace(g, n, [Node(ed.name(f"{n.name}.focus"), "Conv", ins, list(n.outputs), attrs, n.domain)],
                        "focus_conv", applied)
    return False


LANES = 16  # fp32 lanes of an AVX-512 register: the output-channel block of ORT's NCHWc and oneDNN


def _padded(c: int) -> int:
    return -(-c // LANES) * LANES


def output_phase_factor(o: int, kh: int, kw: int) -> int | None:
    """The phase factor s (2 or 4) that `conv_output_phases` uses for an O-output KhxKw
    convolution, or None where it would not cut the lane-padded multiply-adds at least 2x.
    Prefers the smallest s that fills whole blocks (s*s*O a multiple of LANES)."""
    base = _padded(o) * kh * kw
    cost = {s: _padded(s * s * o) * (kh + s - 1) * (kw + s - 1) / (s * s) for s in (2, 4)}
    aligned = [s for s in (2, 4) if (s * s * o) % LANES == 0]
    s = aligned[0] if aligned else min(cost, key=cost.get)
    return s if cost[s] * 2 <= base else None


def _conv_output_phases(g: Graph, ed: _Editor, applied: list) -> bool:
    for n in list(g.nodes):
        if n.op != "Conv" or len(n.inputs) < 2 or n.domain not in ("", "ai.onnx"):
            continue
        w = _const(g, n.inputs[1])
        has_b = len(n.inputs) > 2 and bool(n.inputs[2])
        b = _const(g, n.inputs[2]) if has_b else None
        a = n.attrs
        if w is None or w.ndim != 4 or w.dtype != np.float32 or (has_b and b is None):
            continue
        if int(a.get("group", 1)) != 1 or _s(a.get("auto_pad"), "NOTSET") != "NOTSET" \
                or any(int(v) != 1 for v in list(a.get("strides", [1, 1])) + list(a.get("dilations", [1, 1]))):
            continue
        o, c, kh, kw = w.shape
        y = g.tensors.get(n.outputs[0])
        s = output_phase_factor(o, kh, kw)
        if s is None or y is None or len(y.shape) != 4 or y.shape[2] % s or y.shape[3] % s:
            continue
        w2 = np.zeros((s, s, o, c, kh + s - 1, kw + s - 1), dtype=w.dtype)
        for pa in range(s):
            for pb in range(s):
                w2[pa, pb, :, :, pa:pa + kh, pb:pb + kw] = w
        nb, _, ho, wo = y.shape
        z = ed.tensor(f"{n.outputs[0]}.out_phases", (nb, s * s * o, ho // s, wo // s), y.dtype)
        ins = [n.inputs[0], ed.const(f"{n.inputs[1]}.out_phases", w2.reshape(s * s * o, c, kh + s - 1, kw + s - 1))]
        if has_b:
            ins.append(ed.const(f"{n.inputs[2]}.out_phases", np.tile(b, s * s)))
        attrs = dict(a)
        attrs.update(kernel_shape=[kh + s - 1, kw + s - 1], strides=[s, s])
        conv = Node(ed.name(f"{n.name}.out_phases"), "Conv", ins, [z], attrs, n.domain)
        d2s = Node(ed.name(f"{n.name}.out_interleave"), "DepthToSpace", [z], list(n.outputs),
                   {"blocksize": s, "mode": "DCR"})
        return _replace(g, n, [conv, d2s], "conv_output_phases", applied)
    return False


def _up2(v: np.ndarray) -> np.ndarray:
    """Nearest x2 upsampling of an NCHW array (each pixel copied into a 2x2 block)."""
    return v.repeat(2, axis=2).repeat(2, axis=3)


def _is_nearest_up2(g: Graph, n: Node, probe: np.ndarray) -> bool:
    """True when `n` maps every output pixel (i, j) to source pixel (i//2, j//2), checked by
    running the node itself (reference executor) on `probe` (its real input shape)."""
    if n.op not in ("Resize", "Upsample") or _s(n.attrs.get("mode"), "nearest") != "nearest":
        return False
    rest = [_const(g, i) if i else None for i in n.inputs[1:]]
    if any(i and r is None for i, r in zip(n.inputs[1:], rest)):
        return False
    try:
        out = run_node(n, [probe, *rest])[0]
    except Exception:
        return False
    want = _up2(probe)
    return out.shape == want.shape and np.array_equal(out, want)


def _border_of_up2(g: Graph, pad: Node, x: np.ndarray) -> str | None:
    """'edge' or 'zero' when Pad `pad` applied to nearest_up2(x) equals nearest_up2 of x padded
    by one pixel (edge or zeros) cropped by one: i.e. a one-pixel spatial border."""
    rest = [_const(g, i) if i else None for i in pad.inputs[1:]]
    if any(i and r is None for i, r in zip(pad.inputs[1:], rest)):
        return None
    try:
        got = run_node(pad, [_up2(x), *rest])[0]
    except Exception:
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


def _upsample_conv_phases(g: Graph, ed: _Editor, applied: list) -> bool:
    prod = g.producers()
    for n in list(g.nodes):
        if n.op != "Conv" or len(n.inputs) < 2:
            continue
        w = _const(g, n.inputs[1])
        has_b = len(n.inputs) > 2 and bool(n.inputs[2])
        b = _const(g, n.inputs[2]) if has_b else None
        a = n.attrs
        if w is None or w.ndim != 4 or w.shape[2:] != (3, 3) or (has_b and b is None):
            continue
        if int(a.get("group", 1)) != 1 or _s(a.get("auto_pad"), "NOTSET") != "NOTSET" \
                or any(int(s) != 1 for s in a.get("strides", [1, 1])) \
                or any(int(d) != 1 for d in a.get("dilations", [1, 1])):
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
        return _replace(g, n, nodes, "upsample_conv_phases", applied)
    return False


# Winograd F(4x4, 3x3) (Lavin & Gray 2016, points 0, +-1, +-2, inf): Y = A^T [(G g G^T) * (B^T d B)] A
_WINO_BT = np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
                     [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64)
_WINO_G = np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
                    [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64)
_WINO_AT = np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], np.float64)


def _slice_last(g: Graph, n: Node, rank: int) -> tuple[int, int] | None:
    """(start, end) if `n` is a unit-step Slice of only the last axis of a rank-`rank` tensor with
    constant, in-range bounds; else None."""
    if n.op != "Slice" or len(n.inputs) < 4:
        return None
    vals = [_const(g, i) if i else None for i in n.inputs[1:5]]
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


def _linear_attention_channel_major(g: Graph, ed: _Editor, applied: list) -> bool:
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
        pads = _const(g, pad.inputs[1]) if len(pad.inputs) > 1 else None
        cval = _const(g, pad.inputs[2]) if len(pad.inputs) > 2 and pad.inputs[2] else None
        if (pads is None or list(np.asarray(pads).ravel()) != [0, 0, 0, 0, 0, 0, 0, 1] or cval is None
                or _s(pad.attrs.get("mode"), "constant") != "constant" or len(pad.inputs) > 3):
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
        if len(eps) != 1 or _const(g, eps[0]) is None or np.asarray(_const(g, eps[0])).size != 1:
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
        return _replace(g, back, new, "linear_attention_channel_major", applied)
    return False


def winograd_convs(g: Graph) -> list[Node]:
    """The convolutions `conv3x3_winograd` can rewrite: 3x3, stride 1, no dilation or groups,
    explicit pads, fp32 4-d input, constant weight (and bias), output at least 4x4."""
    out = []
    for n in g.nodes:
        if n.op != "Conv" or len(n.inputs) < 2 or n.domain not in ("", "ai.onnx"):
            continue
        w = _const(g, n.inputs[1])
        a = n.attrs
        if w is None or w.ndim != 4 or w.shape[2:] != (3, 3) or w.dtype != np.float32:
            continue
        if len(n.inputs) > 2 and n.inputs[2] and _const(g, n.inputs[2]) is None:
            continue
        if int(a.get("group", 1)) != 1 or _s(a.get("auto_pad"), "NOTSET") != "NOTSET" \
                or any(int(v) != 1 for v in a.get("strides", [1, 1])) \
                or any(int(v) != 1 for v in a.get("dilations", [1, 1])):
            continue
        x, y = g.tensors.get(n.inputs[0]), g.tensors.get(n.outputs[0])
        if x is None or y is None or len(x.shape) != 4 or x.dtype != "float32" or min(y.shape[2:]) < 4:
            continue
        out.append(n)
    return out


def _winograd(g: Graph, ed: _Editor, n: Node, applied: list) -> bool:
    w = _const(g, n.inputs[1]).astype(np.float64)
    b = _const(g, n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
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
    return _replace(g, n, nodes, WINOGRAD, applied)


def rewrite(graph: Graph, rules: tuple[str, ...] | list[str] = RULES, winograd=()) -> RewriteResult:
    """Apply `rules` (see module docstring) until none fires, then `conv3x3_winograd` to the
    convolutions named in `winograd` (names not eligible are an error: a plan that names them
    was made for another model); returns a new, pruned graph."""
    unknown = set(rules) - set(RULES)
    if unknown:
        from tensorplan.errors import TensorplanError
        raise TensorplanError(f"unknown rewrite rule(s) {sorted(unknown)}; known: {', '.join(RULES)}")
    g = graph.copy()
    ed = _Editor(g)
    applied: list[tuple[str, str]] = []
    steps = {"identity_resize": lambda: _drop_identity_resizes(g, applied),
             "split_concat_conv": lambda: _split_concat_conv(g, ed, applied),
             "conv_before_resize": lambda: _conv_before_resize(g, ed, applied),
             "upsample_conv_phases": lambda: _upsample_conv_phases(g, ed, applied),
             "mish_sigmoid": lambda: _mish_sigmoid(g, ed, applied),
             "focus_conv": lambda: _focus_conv(g, ed, applied),
             "conv_output_phases": lambda: _conv_output_phases(g, ed, applied),
             "token_linear_conv": lambda: _token_linear_conv(g, ed, applied),
             "token_linear_as_conv": lambda: _token_linear_as_conv(g, ed, applied),
             "linear_attention_channel_major": lambda: _linear_attention_channel_major(g, ed, applied)}
    changed = True
    while changed:
        changed = False
        for r in RULES:
            if r in rules:
                while steps[r]():
                    changed = True
    if winograd:
        want = set(winograd)
        eligible = {n.name: n for n in winograd_convs(g)}
        missing = sorted(want - set(eligible))
        if missing:
            from tensorplan.errors import TensorplanError
            raise TensorplanError(f"conv3x3_winograd: {', '.join(missing[:5])} not an eligible 3x3 convolution of "
                                  f"'{graph.name}' (see graph.rewrite.winograd_convs); re-run `tensorplan orchestrate`")
        for name in [n.name for n in g.nodes if n.name in want]:
            _winograd(g, ed, eligible[name], applied)
    if applied:
        g.prune()
        g.toposort()
        g.validate()
    return RewriteResult(g, applied)


__all__ = ["RULES", "WINOGRAD", "RewriteResult", "output_phase_factor", "rewrite", "winograd_convs"]
