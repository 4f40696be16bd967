"""CDMPP's compact AST with 164-d Ansor per-store leaf features, from scheduled TIR.

Why: CDMPP predicts latency from a *tree* whose leaves are buffer stores and whose inner
nodes are loops / attributes / allocations; only leaves carry features (the 164-d
Ansor/TenSet per-store vector), and a leaf's position in the marker-inclusive pre-order
serialisation feeds a sinusoidal positional encoding (reference/cdmpp.md §1).

How: a scheduled PrimFunc is lowered with the same pass list TVM's
`meta_schedule.PerStoreFeature` uses (init blocks lowered, opaque blocks, compacted
allocations, buffers *not* flattened), then one Python walk builds the tree and computes
every leaf's vector with TVM's own integer-bound analyser.  The definitions follow
PerStoreFeature (apache-tvm 0.27) so that, for every buffer, the row of the *last
non-constant store* equals TVM's row for that buffer (`tests/test_features.py` checks
this; see `crosscheck_per_store_feature`).  Differences from TVM, all deliberate:

* every BufferStore is its own leaf (CDMPP): a reduction's init store (`C = 0`) is a
  leaf too; TVM skips constant stores and keeps one row per buffer.  Constant stores are
  featurised with the same formulas but do not feed the reuse bookkeeping of later
  stores, so they never change the rows TVM also produces.
* group 4 (allocation) is attached to every leaf writing the allocated buffer, as TVM
  does per buffer (CDMPP writes it on BufferRealize nodes, i.e. zero at leaves).

Tree node kinds: ROOT, ATTR (a loop's `pragma_auto_unroll_max_step`, which lowering turns
into an AttrStmt around the loop), FOR, ALLOC (a buffer allocated in an opaque block; the
block body is its child, like CDMPP's BufferRealize) and STORE (leaves).  Unit serial
loops without annotations are transparent, as in TVM's SimplifyForFeatureExtraction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

FEATURE_DIM = 164
END_MARKER = -1
N_BUFFERS = 5
CURVE_SAMPLES = 10
CACHE_LINE_BYTES = 64

# node kinds
ROOT, ATTR, FOR, ALLOC, STORE = 0, 1, 2, 3, 4
NODE_KIND_NAMES = ("root", "attr", "for", "alloc", "store")


def _feature_names() -> list[str]:
    names = ["float_mad", "float_addsub", "float_mul", "float_divmod", "float_cmp", "float_mathfunc",
             "float_otherfunc", "int_mad", "int_addsub", "int_mul", "int_divmod", "int_cmp",
             "int_mathfunc", "int_otherfunc", "bool_op", "select_op"]
    pos = ["none", "inner_spatial", "middle_spatial", "outer_spatial", "inner_reduce",
           "middle_reduce", "outer_reduce", "mixed"]
    for ann in ("vec", "unroll", "parallel"):
        names += [f"{ann}_num", f"{ann}_prod", f"{ann}_len"] + [f"{ann}_type.{p}" for p in pos]
    names += ["is_gpu", "blockIdx_x_len", "blockIdx_y_len", "blockIdx_z_len", "threadIdx_x_len",
              "threadIdx_y_len", "threadIdx_z_len", "vthread_len"]
    for b in range(N_BUFFERS):
        names += [f"B{b}.{n}" for n in (
            "acc_type.read", "acc_type.write", "acc_type.read_write", "bytes", "unique_bytes",
            "lines", "unique_lines", "reuse_type.loop_multiple_read",
            "reuse_type.serial_multiple_read_write", "reuse_type.no_reuse", "reuse_dis_iter",
            "reuse_dis_bytes", "reuse_ct", "bytes_d_reuse_ct", "unique_bytes_d_reuse_ct",
            "lines_d_reuse_ct", "unique_lines_d_reuse_ct", "stride")]
    names += [f"arith_intensity_curve_{i}" for i in range(CURVE_SAMPLES)]
    names += ["alloc_size", "alloc_prod", "alloc_outer_prod", "alloc_inner_prod",
              "outer_prod", "num_loops", "auto_unroll_max_step"]
    assert len(names) == FEATURE_DIM
    return names


#: The 164 feature names, in vector order (Ansor / TenSet / TVM PerStoreFeature layout).
FEATURE_NAMES: list[str] = _feature_names()

#: Index ranges of the feature groups (for cross-checks and ablations).
FEATURE_GROUPS: dict[str, tuple[int, int]] = {
    "arith_ops": (0, 16), "loop_annotations": (16, 49), "gpu_threads": (49, 57),
    "buffer_access": (57, 147), "arith_intensity": (147, 157), "alloc": (157, 161),
    "outer_loops": (161, 164),
}


@dataclass
class CompactAST:
    """One tensor program as CDMPP's compact AST.

    Nodes are numbered in creation (pre-order DFS) order, root = 0.  `preorder` is the
    serialisation: node id, children, then END_MARKER (-1).  Leaves (stores) are listed in
    serialisation order; `positions[p]` is the index of leaf p's node id inside `preorder`
    (marker-inclusive, CDMPP §1.4) and is what `positional_encoding` consumes.
    """

    leaf_features: np.ndarray          # [n_leaves, 164] float32, slog-scaled like TVM
    node_kinds: np.ndarray             # [n_nodes] int8, ROOT/ATTR/FOR/ALLOC/STORE
    depths: np.ndarray                 # [n_nodes] int16, root depth 0
    preorder: np.ndarray               # [2 * n_nodes] int32, ids and -1 end markers
    leaf_node_ids: np.ndarray          # [n_leaves] int32
    positions: np.ndarray              # [n_leaves] int32
    flops: float                       # float ops of the whole program (sum over leaves)
    node_extents: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # loop extent / alloc bytes / unroll step
    node_for_kinds: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # tirx.ForKind for FOR nodes else -1
    leaf_is_const: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # store of a constant (e.g. reduction init)
    leaf_buffers: list[str] = field(default_factory=list)  # name of each leaf's stored buffer

    @property
    def n_leaves(self) -> int:
        return int(self.leaf_features.shape[0])

    @property
    def n_nodes(self) -> int:
        return int(self.node_kinds.shape[0])

    def summed(self) -> np.ndarray:
        """Sum of leaf vectors (the flat TenSet-style 'pack-sum' representation)."""
        return self.leaf_features.sum(axis=0)


def positional_encoding(positions: np.ndarray | Sequence[int], dim: int = FEATURE_DIM) -> np.ndarray:
    """CDMPP's order-based PE: [n, dim] float32, added after min-max scaling.

    PE[p, i] = sin(pos / 10000^(2i/d)), PE[p, i+1] = cos(pos / 10000^(2(i+1)/d)) for even i
    (the released code's exponent quirk, reference/cdmpp.md §1.4).
    """
    pos = np.asarray(positions, dtype=np.float64).reshape(-1, 1)
    i = np.arange(dim, dtype=np.float64)
    div = np.power(10000.0, 2.0 * i / dim)
    ang = pos / div
    pe = np.where((np.arange(dim) % 2) == 0, np.sin(ang), np.cos(ang))
    return pe.astype(np.float32)


# --------------------------------------------------------------------------- lowering

_PIPELINES: dict[bool, Any] = {}


def _pipeline(is_gpu: bool = False):
    """TVM PerStoreFeature's preprocessing (its SimplifyForFeatureExtraction is emulated in the walk).

    On CPU the GPU-only passes (cross-thread reduction, auto-copy, thread-binding unification) and
    the first of TVM's two Simplify passes are left out: on CPU programs they do not change the
    result (checked by tests/test_features.py against PerStoreFeature) and lowering is ~2.5x faster.
    """
    p = _PIPELINES.get(is_gpu)
    if p is None:
        import tvm
        from tvm import s_tir, tirx
        st = s_tir.transform
        if is_gpu:
            passes = [st.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True),
                      st.LowerCrossThreadReduction(), st.LowerInitBlock(),
                      st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(),
                      st.CompactBufferAllocation(), tirx.transform.StmtSimplify(), st.LowerAutoCopy(),
                      st.UnifyThreadBinding(), st.LowerMatchBuffer(), tirx.transform.StmtSimplify()]
        else:
            passes = [st.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True), st.LowerInitBlock(),
                      st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(),
                      st.CompactBufferAllocation(), st.LowerMatchBuffer(), tirx.transform.StmtSimplify()]
        p = _PIPELINES[is_gpu] = tvm.ir.transform.Sequential(passes)
    return p


def _as_module(prog: Any):
    """Accept a PrimFunc, an IRModule with one PrimFunc, or an s_tir.Schedule."""
    import tvm
    from tvm import tirx
    if hasattr(prog, "mod") and hasattr(prog, "trace"):      # Schedule
        prog = prog.mod
    if isinstance(prog, tirx.PrimFunc):
        return tvm.IRModule({"main": prog})
    if isinstance(prog, tvm.IRModule):
        return prog
    from tensorplan.errors import TensorplanError
    raise TensorplanError(f"compact_ast: expected a PrimFunc, IRModule or Schedule, got {type(prog).__name__}")


def lower_for_features(prog: Any, is_gpu: bool = False):
    """Lower a scheduled program for featurisation; returns the lowered PrimFunc."""
    mod = _pipeline(is_gpu)(_as_module(prog))
    funcs = [f for _, f in mod.functions.items() if hasattr(f, "body")]
    if len(funcs) != 1:
        from tensorplan.errors import TensorplanError
        raise TensorplanError(f"compact_ast: expected exactly one PrimFunc, found {len(funcs)}")
    return funcs[0]


# --------------------------------------------------------------------------- the walk

def _slog(x: float) -> float:
    return math.log2(abs(x) + 1.0)


def _i64(x: int) -> int:
    """Wrap to signed 64-bit, as TVM's C++ int64_t arithmetic does."""
    return ((x + (1 << 63)) % (1 << 64)) - (1 << 63)


def _dtype_bytes(dtype: str) -> int:
    s = str(dtype)
    bits = "".join(ch for ch in s.split("x")[0] if ch.isdigit())
    if s.startswith("bool"):
        return 1
    b = int(bits) if bits else 32
    lanes = int(s.split("x")[1]) if "x" in s else 1
    return max(1, (b * lanes + 7) // 8)


class _Types:
    """TVM node classes, resolved once (tvm import is slow; keep it out of module import)."""

    def __init__(self):
        import tvm
        from tvm import s_tir, tirx
        ir = tvm.ir
        self.tvm = tvm
        self.For, self.BufferStore, self.SeqStmt = tirx.For, tirx.BufferStore, tirx.SeqStmt
        self.AttrStmt, self.IfThenElse = tirx.AttrStmt, tirx.IfThenElse
        self.SBlockRealize, self.SBlock = s_tir.SBlockRealize, s_tir.SBlock
        self.Load, self.Call, self.Var = ir.TensorLoad, ir.Call, ir.Var
        self.IntImm, self.FloatImm = tirx.IntImm, tirx.FloatImm
        self.Select = tirx.Select
        self.Add, self.Sub, self.Mul = tirx.Add, tirx.Sub, tirx.Mul
        # binary op class -> (float counter idx, int counter idx)
        self.binary = {}
        for cls, fi, ii in ((tirx.Add, 1, 8), (tirx.Sub, 1, 8), (tirx.Mul, 2, 9), (tirx.Div, 3, 10),
                            (tirx.Mod, 3, 10), (tirx.FloorDiv, 3, 10), (tirx.FloorMod, 3, 10),
                            (tirx.Max, 4, 11), (tirx.Min, 4, 11), (tirx.EQ, 4, 11), (tirx.NE, 4, 11),
                            (tirx.LT, 4, 11), (tirx.LE, 4, 11), (tirx.GT, 4, 11), (tirx.GE, 4, 11)):
            self.binary[cls] = (fi, ii)
        self.boolop = {tirx.And, tirx.Or}
        self.Not = tirx.Not
        self.unary_value = {tirx.Cast, tirx.Broadcast}
        self.Ramp, self.Let, self.Shuffle = tirx.Ramp, tirx.Let, tirx.Shuffle
        self._effect: dict[str, bool] = {}

    def is_pure(self, op) -> bool:
        name = op.name
        r = self._effect.get(name)
        if r is None:
            try:
                kind = int(op.get_attr("TCallEffectKind"))
            except Exception:  # noqa: BLE001 - unknown ops count as "other"
                kind = 3
            r = self._effect[name] = kind in (0, 1)   # kExprAnnotation, kPure
        return r


_T: _Types | None = None


def _types() -> _Types:
    global _T
    if _T is None:
        _T = _Types()
    return _T


def _is_float(expr) -> bool:
    s = str(expr.ty)
    return s.startswith("float") or s.startswith("bfloat")


def _has_load(expr, T) -> bool:
    found = [False]

    def rec(e):
        if found[0]:
            return
        t = type(e)
        if t is T.Load:
            found[0] = True
            return
        for c in _children(e, T):
            rec(c)
    rec(expr)
    return found[0]


def _children(e, T):
    t = type(e)
    if t in T.binary or t in T.boolop:
        return (e.a, e.b)
    if t is T.Load:
        return tuple(e.indices)
    if t is T.Call:
        return tuple(e.args)
    if t is T.Select:
        return (e.condition, e.true_value, e.false_value)
    if t in T.unary_value:
        return (e.value,)
    if t is T.Not:
        return (e.a,)
    if t is T.Ramp:
        return (e.base, e.stride)
    if t is T.Let:
        return (e.value, e.body)
    if t is T.Shuffle:
        return tuple(e.vectors) + tuple(e.indices)
    return ()


def _count_ops(value, T) -> tuple[list[int], list[tuple[Any, str, list]]]:
    """Per-iteration op counts (16 counters) and loads [(buffer, name, indices)] in post-order."""
    counts = [0] * 16
    loads: list = []

    def rec(e):
        t = type(e)
        if t is T.Select:
            if not (_has_load(e.condition, T) or _has_load(e.true_value, T) or _has_load(e.false_value, T)):
                return                                  # TVM folds load-free selects to a constant
            counts[15] += 1
            rec(e.condition); rec(e.true_value); rec(e.false_value)
            return
        bi = T.binary.get(t)
        if bi is not None:
            counts[bi[0] if _is_float(e) else bi[1]] += 1
            rec(e.a); rec(e.b)
            return
        if t in T.boolop:
            counts[14] += 1
            rec(e.a); rec(e.b)
            return
        if t is T.Not:
            counts[14] += 1
            rec(e.a)
            return
        if t is T.Call:
            fl = _is_float(e)
            if T.is_pure(e.op):
                counts[5 if fl else 12] += 1
            else:
                counts[6 if fl else 13] += 1
            for a in e.args:
                rec(a)
            return
        if t is T.Load:
            idx = list(e.indices)
            for i in idx:
                rec(i)
            loads.append((e.source, idx))
            return
        for c in _children(e, T):
            rec(c)
    rec(value)
    return counts, loads


def _var_stride(multi_indices, buffer_stride, var, T) -> int:
    """TVM's GetVarStride: min |coef|*dim_stride of var over the rightmost dim using it."""
    best = None
    for mi in multi_indices:
        for d in range(len(mi) - 1, -1, -1):
            coef = _coef(mi[d], var, T)
            if coef != 0:
                v = abs(coef) * buffer_stride[d]
                best = v if best is None else min(best, v)
                break
    return 0 if best is None else best


def _coef(expr, var, T) -> int:
    st = {"var": False, "add": False, "mul": False, "stride": 0}

    def rec(e):
        t = type(e)
        if t is T.Var:
            if e.same_as(var):
                st["var"] = True
                st["stride"] = 2
            return
        for c in _children(e, T):
            rec(c)
        if t is T.Mul:
            if st["var"] and not st["add"]:
                if type(e.a) is T.IntImm:
                    st["mul"] = True
                    st["stride"] = int(e.a.value)
                elif type(e.b) is T.IntImm:
                    st["mul"] = True
                    st["stride"] = int(e.b.value)
        elif t is T.Add:
            if st["var"] and not st["mul"]:
                st["add"] = True
                st["stride"] = 1
    rec(expr)
    if st["var"] and not st["mul"] and not st["add"]:
        return 1
    return st["stride"] if st["var"] else 0


class _Loop:
    __slots__ = ("node", "var", "min", "extent", "kind", "tag", "unroll")

    def __init__(self, node, var, mn, extent, kind, tag, unroll):
        self.node, self.var, self.min, self.extent = node, var, mn, extent
        self.kind, self.tag, self.unroll = kind, tag, unroll


def _vars_in(exprs, T, out: set):
    for e in exprs:
        def rec(x):
            if type(x) is T.Var:
                out.add(x)
                return
            for c in _children(x, T):
                rec(c)
        rec(e)


class _Walker:
    def __init__(self, T, is_gpu: bool = False):
        import tvm.sym as sym
        self.T, self.is_gpu = T, is_gpu
        self.an = sym.Analyzer()
        self.Range = T.tvm.ir.Range
        self.loops: list[_Loop] = []
        self.prod = 1
        self.kinds: list[int] = []
        self.depths: list[int] = []
        self.extents: list[int] = []
        self.for_kinds: list[int] = []
        self.preorder: list[int] = []
        self.leaf_ids: list[int] = []
        self.leaf_rows: list[np.ndarray] = []
        self.leaf_const: list[bool] = []
        self.leaf_bufs: list[Any] = []
        self.leaf_outer: list[int] = []
        self.flops = 0.0
        # reuse bookkeeping: id(loop node) -> {buffer: [numel,...]}; non-const stores only
        self.touched: dict[int, dict[Any, list[int]]] = {}
        self.touched_const: dict[int, dict[Any, list[int]]] = {}
        self.alloc: dict[Any, tuple[int, int, int]] = {}
        self._keep: list = []   # buffer -> (alloc_size, alloc_prod, alloc_outer_prod)

    # ---- tree
    def _new(self, kind: int, depth: int, extent: int = 0, for_kind: int = -1) -> int:
        nid = len(self.kinds)
        self.kinds.append(kind); self.depths.append(depth)
        self.extents.append(extent); self.for_kinds.append(for_kind)
        self.preorder.append(nid)
        return nid

    def run(self, func):
        self._new(ROOT, 0)
        self.stmt(func.body, 0)
        self.preorder.append(END_MARKER)
        T = self.T
        for p in func.params:                       # TVM: function params get alloc features too
            buf = p
            if hasattr(buf, "shape") and buf.shape is not None:
                self._handle_alloc(buf)

    def stmt(self, s, depth: int):
        T = self.T
        t = type(s)
        if t is T.SeqStmt:
            for c in s.seq:
                self.stmt(c, depth)
        elif t is T.For:
            self._for(s, depth)
        elif t is T.BufferStore:
            self._store(s, depth)
        elif t is T.SBlockRealize:
            self.stmt(s.block, depth)
        elif t is T.SBlock:
            allocs = list(s.alloc_buffers)
            d = depth
            for b in allocs:                         # like BufferRealize: the body is a child
                self._new(ALLOC, d + 1, self._numel(b) * _dtype_bytes(b.dtype))
                d += 1
            self.stmt(s.body, d)
            for _ in allocs:
                self.preorder.append(END_MARKER)
            for b in allocs:
                self._handle_alloc(b)
        elif t is T.AttrStmt:
            self._new(ATTR, depth + 1)
            self.stmt(s.body, depth + 1)
            self.preorder.append(END_MARKER)
        elif t is T.IfThenElse:
            self.stmt(s.then_case, depth)
            if s.else_case is not None:
                self.stmt(s.else_case, depth)
        else:
            body = getattr(s, "body", None)
            if body is not None and not isinstance(body, (list, tuple)):
                self.stmt(body, depth)

    def _numel(self, buf) -> int:
        n = 1
        for x in buf.shape:
            try:
                n *= int(x)
            except Exception:  # noqa: BLE001 - symbolic dims: use the bound like TVM
                b = self.an.const_int_bound(x)
                n *= b.max_value if 0 <= b.max_value < (1 << 62) else 1
        return n

    def _handle_alloc(self, buf):
        n = self._numel(buf)
        self.alloc[buf] = (n * _dtype_bytes(buf.dtype), n * self.prod, self.prod)

    def _for(self, s, depth: int):
        T = self.T
        ext_e, min_e = s.extent, s.min
        ext = int(ext_e.value) if type(ext_e) is T.IntImm else None
        ann = s.annotations
        kind = int(s.kind)
        if ext == 0:
            return
        if ext == 1 and kind == 0 and len(ann) == 0 and type(min_e) is T.IntImm and int(min_e.value) == 0:
            self.an.bind(s.loop_var, T.tvm.tirx.const(0, str(s.loop_var.ty)), True)
            self.stmt(s.body, depth)                 # TVM: unit loops are removed
            return
        unroll = -1
        if "pragma_auto_unroll_max_step" in ann:
            unroll = int(ann["pragma_auto_unroll_max_step"])
        tag = ""
        if kind == 4 and s.thread_binding is not None:
            tag = str(s.thread_binding.thread_tag)
        d = depth
        if unroll > 0:                               # lowering turns the pragma into an AttrStmt
            self._new(ATTR, d + 1, unroll)
            d += 1
        self._new(FOR, d + 1, ext if ext is not None else -1, kind)
        self.loops.append(_Loop(s, s.loop_var, min_e, ext, kind, tag, unroll))
        self._keep.append(s)                         # keeps id(loop) unique for the reuse maps
        if ext is not None:
            self.prod *= ext
        self.stmt(s.body, d + 1)
        if ext is not None:
            self.prod //= ext
        self.loops.pop()
        self.preorder.append(END_MARKER)
        if unroll > 0:
            self.preorder.append(END_MARKER)

    # ---- leaf features
    def _store(self, s, depth: int):
        T = self.T
        nid = self._new(STORE, depth + 1)
        self.preorder.append(END_MARKER)
        value = s.value
        is_const = type(value) in (T.IntImm, T.FloatImm)
        row, fl = self._features(s, is_const)
        self.leaf_ids.append(nid)
        self.leaf_rows.append(row)
        self.leaf_const.append(is_const)
        self.leaf_bufs.append(s.buffer)
        self.leaf_outer.append(self.prod)
        self.flops += fl

    def _features(self, s, is_const: bool):
        T, an, loops, prod = self.T, self.an, self.loops, self.prod
        out = np.zeros(FEATURE_DIM, dtype=np.float64)
        counts, loads = _count_ops(s.value, T)
        counts = [c * prod for c in counts]
        for i, c in enumerate(counts):
            out[i] = _slog(c)
        # loop annotation features (vectorize=2, unroll=3, parallel=1)
        base = 16
        for kind in (2, 3, 1):
            ls = [lp for lp in loops if lp.kind == kind]
            if not ls:
                out[base + 3] = 1.0                   # pos none
            else:
                p = 1
                for lp in ls:
                    if lp.extent is not None:
                        p *= lp.extent
                last = ls[-1].extent if ls[-1].extent is not None else 1
                out[base] = _slog(len(ls)); out[base + 1] = _slog(p); out[base + 2] = _slog(last)
                out[base + 10] = 1.0                  # pos mixed
            base += 11
        out[49] = 1.0 if self.is_gpu else 0.0
        thread_len = [1] * 7
        if self.is_gpu:
            tags = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
            for k, tg in enumerate(tags):
                for lp in loops:
                    if lp.tag == tg:
                        thread_len[k] = lp.extent if lp.extent is not None else 1
                        break
            for lp in loops:
                if lp.tag.startswith("vthread"):
                    thread_len[6] = lp.extent if lp.extent is not None else 1
                    break
        for k in range(7):
            out[50 + k] = _slog(thread_len[k])

        # ---- group 2: buffer access
        info: dict[Any, list] = {}                   # buffer -> [acc_type, multi_indices]
        info[s.buffer] = [1, [list(s.indices)]]
        for buf, idx in loads:
            e = info.get(buf)
            if e is None:
                info[buf] = [0, [idx]]
            elif e[0] == 1:
                e[0] = 2
            elif e[0] == 0:
                e[1].append(idx)
        # reuse bookkeeping: a non-constant store appends to self.touched; a constant store sees
        # self.touched + earlier constant stores + itself, and never feeds non-constant rows
        own = self.touched if not is_const else {}
        if is_const:
            srcs = (self.touched, self.touched_const, own)

            def view(key):
                merged: dict = {}
                for src in srcs:
                    for b, v in src.get(key, {}).items():
                        merged.setdefault(b, []).extend(v)
                return merged
        else:
            def view(key):
                return own.get(key, {})
        n = len(loops)
        subs = []
        for buf, (acc, mis) in info.items():
            subs.append({"buf": buf, "acc": acc, "mis": mis, "bytes_e": _dtype_bytes(buf.dtype),
                         "numel": [0] * n, "shape": None})
        Range = self.Range
        for lp in loops:
            an.bind(lp.var, lp.min, True)
        for_touched = [0] * n
        if n == 0:
            for sf in subs:
                sf["shape"] = [1] * len(sf["buf"].shape)
        for i in range(n - 1, -1, -1):
            lp = loops[i]
            an.bind(lp.var, Range.from_min_extent(lp.min, lp.node.extent), True)
            tb = 0
            key = id(lp.node)
            for sf in subs:
                mis = sf["mis"]
                ndim = len(mis[0]) if mis else 0
                numel = 1
                shape = [0] * ndim
                for d in range(ndim):
                    lo, hi = None, None
                    for mi in mis:
                        b = an.const_int_bound(mi[d])
                        lo = b.min_value if lo is None else min(lo, b.min_value)
                        hi = b.max_value if hi is None else max(hi, b.max_value)
                    ext = _i64(hi - lo + 1)            # int64 arithmetic like TVM (unbounded
                    shape[d] = ext                      # indices, e.g. if_then_else, wrap around)
                    numel = _i64(numel * ext)
                sf["shape"] = shape
                numel = max(0, numel)
                sf["numel"][i] = numel
                tb = _i64(tb + numel * sf["bytes_e"])
                own.setdefault(key, {}).setdefault(sf["buf"], []).append(numel)
            for_touched[i] = tb
        top_loop_touch_bytes = sum(sf["bytes_e"] for sf in subs) if n > 0 else 0
        for sf in subs:
            buf, eb = sf["buf"], sf["bytes_e"]
            bshape = []
            for x in buf.shape:
                try:
                    bshape.append(int(x))
                except Exception:  # noqa: BLE001
                    bb = an.const_int_bound(x)
                    bshape.append(bb.max_value if 0 <= bb.max_value < (1 << 62) else 1)
            nd = len(bshape)
            bstride = [1] * nd
            for d in range(nd - 2, -1, -1):
                bstride[d] = bstride[d + 1] * bshape[d + 1]
            ncb = 1
            for d in range(nd - 1, -1, -1):
                if sf["shape"][d] == bshape[d]:
                    ncb = bshape[d] * eb
                    break
            stride, i = 0, n - 1
            while i >= 0:
                stride = _var_stride(sf["mis"], bstride, loops[i].var, T)
                if stride != 0:
                    break
                i -= 1
            innermost = stride if i == n - 1 else 0
            pns = 1
            for j in range(n - 1, i, -1):
                if loops[j].extent is not None:
                    pns *= loops[j].extent
            # reuse
            rvars: set = set()
            for mi in sf["mis"]:
                _vars_in(mi, T, rvars)
            rtype, rdi, rdb, rct = 2, 0.0, 0.0, 0
            for i2 in range(n - 1, -1, -1):
                lp = loops[i2]
                if lp.var not in rvars:
                    rtype = 0
                    rct = lp.extent if lp.extent is not None else 1
                    rdi = 1.0
                    for j in range(n - 1, i2, -1):
                        if loops[j].extent is not None:
                            rdi *= loops[j].extent
                    if i2 == n - 1:
                        rdb = float(top_loop_touch_bytes)
                    else:
                        rdb = 0.0
                        for b2, nums in view(id(loops[i2 + 1].node)).items():
                            rdb += sum(nums) * _dtype_bytes(b2.dtype)
                    break
                under = view(id(lp.node))
                tl = under.get(buf, [])
                if len(tl) >= 2:
                    ext = lp.extent if lp.extent is not None else 1
                    rtype = 1
                    rct = len(tl) - 1
                    rdi = float(min(tl))
                    rdb = 0.0
                    for b2, nums in under.items():
                        rdb += sum(nums) * _dtype_bytes(b2.dtype)
                    rdi /= ext
                    rdb /= ext
                    break
            nbytes = float(eb * prod)
            if n == 0:
                ub, lines, ul = 1.0, 1.0, 1.0
            else:
                ub = float(sf["numel"][0] * eb)
                lines = max(1.0, prod / pns * min(1.0, stride * eb / CACHE_LINE_BYTES))
                ul = max(1.0, ub / min(CACHE_LINE_BYTES, ncb))
            proxy = rct if rct > 0 else 0.5
            sf.update(lines=lines, nbytes=nbytes, vec=(
                float(sf["acc"] == 0), float(sf["acc"] == 1), float(sf["acc"] == 2),
                _slog(nbytes), _slog(ub), _slog(lines), _slog(ul),
                float(rtype == 0), float(rtype == 1), float(rtype == 2),
                _slog(rdi), _slog(rdb), _slog(rct), _slog(nbytes / proxy), _slog(ub / proxy),
                _slog(lines / proxy), _slog(ul / proxy), _slog(innermost)))
        if is_const:                                  # only now: the reuse analysis above saw `own` once
            for key, d in own.items():
                for b, v in d.items():
                    self.touched_const.setdefault(key, {}).setdefault(b, []).extend(v)
        subs.sort(key=lambda sf: (-sf["lines"], -sf["nbytes"], str(sf["buf"].name)))
        for k, sf in enumerate(subs[:N_BUFFERS]):
            out[57 + 18 * k: 57 + 18 * (k + 1)] = sf["vec"]

        # ---- group 3: arithmetic intensity curve
        float_ops = float(sum(counts[0:7]))
        if n > 0 and float_ops > 0:
            mem = [0.0] * n
            for i in range(n):
                mem[n - 1 - i] = float(for_touched[i])
            comp = []
            tot = float_ops / prod if prod else 0.0
            for i in range(n - 1, -1, -1):
                if loops[i].extent is not None:
                    tot *= loops[i].extent
                comp.append(tot)
            tot = comp[-1]
            p = 0
            for k in range(CURVE_SAMPLES):
                cur = (k + 1) / CURVE_SAMPLES * tot
                while p < n and comp[p] < cur - 1e-4:
                    p += 1
                p = min(p, n - 1)
                with np.errstate(divide="ignore", invalid="ignore"):
                    if p == 0:
                        val = comp[0] / mem[0] if mem[0] else 0.0
                    else:
                        a0 = comp[p - 1] / mem[p - 1] if mem[p - 1] else 0.0
                        a1 = comp[p] / mem[p] if mem[p] else 0.0
                        dc = comp[p] - comp[p - 1]
                        val = a0 + ((a1 - a0) / dc if dc else 0.0) * (cur - comp[p - 1])
                out[147 + k] = _slog(val)
        # ---- group 5
        out[161] = _slog(prod)
        out[162] = _slog(n)
        unrolls = [lp.unroll for lp in loops if lp.unroll > 0]
        out[163] = _slog(unrolls[-1] if unrolls else 0)
        return out, float_ops

    def finish(self) -> CompactAST:
        rows = np.array(self.leaf_rows, dtype=np.float64).reshape(-1, FEATURE_DIM)
        for r, buf, outer in zip(rows, self.leaf_bufs, self.leaf_outer):   # group 4
            a = self.alloc.get(buf)
            size, aprod, aouter = a if a is not None else (0, 0, 1)
            r[157] = _slog(size); r[158] = _slog(aprod); r[159] = _slog(aouter)
            r[160] = _slog(outer / aouter)
        pre = np.asarray(self.preorder, dtype=np.int32)
        leaf_ids = np.asarray(self.leaf_ids, dtype=np.int32)
        pos_of = {int(v): i for i, v in enumerate(pre) if v >= 0}
        positions = np.asarray([pos_of[int(i)] for i in leaf_ids], dtype=np.int32)
        return CompactAST(
            leaf_features=rows.astype(np.float32),
            node_kinds=np.asarray(self.kinds, dtype=np.int8),
            depths=np.asarray(self.depths, dtype=np.int16),
            preorder=pre, leaf_node_ids=leaf_ids, positions=positions, flops=float(self.flops),
            node_extents=np.asarray(self.extents, dtype=np.int64),
            node_for_kinds=np.asarray(self.for_kinds, dtype=np.int8),
            leaf_is_const=np.asarray(self.leaf_const, dtype=bool),
            leaf_buffers=[str(b.name) for b in self.leaf_bufs],
        )


def compact_ast(prog: Any, *, lowered: bool = False, is_gpu: bool = False) -> CompactAST:
    """Compact AST + 164-d leaf features of one scheduled program.

    `prog`: a scheduled `PrimFunc`, an `IRModule` holding one, or an `s_tir.Schedule`.
    Set `lowered=True` if it already went through `lower_for_features`.
    """
    func = prog if lowered else lower_for_features(prog, is_gpu)
    w = _Walker(_types(), is_gpu=is_gpu)
    w.run(func)
    return w.finish()


def featurize_many(progs: Iterable[Any], *, is_gpu: bool = False, workers: int | None = 1,
                   batch: int = 64) -> list[CompactAST]:
    """Featurise many programs, equal to `compact_ast` on each.

    Lowers them in batches of one IRModule (amortises pass overhead); `workers` > 1 (None: every
    CPU) featurises batches in forked processes, which inherit the programs, so nothing is pickled
    on the way out.
    """
    from tensorplan.forkmap import fork_map
    progs = list(progs)

    def job(a: int, b: int) -> list[CompactAST]:
        return _featurize_batch(progs[a:b], a, is_gpu)
    return fork_map(job, len(progs), workers=workers, chunk=batch)


def _featurize_batch(chunk: list, first: int, is_gpu: bool) -> list[CompactAST]:
    import tvm
    T = _types()
    funcs = {}
    for k, p in enumerate(chunk):
        m = _as_module(p)
        fs = [f for _, f in m.functions.items() if hasattr(f, "body")]
        if len(fs) != 1:
            from tensorplan.errors import TensorplanError
            raise TensorplanError(f"featurize_many: program {first + k} has {len(fs)} PrimFuncs, expected 1")
        funcs[f"f{k}"] = fs[0].with_attr("global_symbol", f"f{k}")
    low = _pipeline(is_gpu)(tvm.IRModule(funcs))
    out = []
    for k in range(len(chunk)):
        w = _Walker(T, is_gpu=is_gpu)
        w.run(low[f"f{k}"])
        out.append(w.finish())
    return out


# --------------------------------------------------------------------------- cross-check

def tvm_per_store_feature(sch, target=None) -> np.ndarray:
    """TVM's own PerStoreFeature rows (n_buffers x 164) for a Schedule, in TVM's buffer order."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    global _CTX
    tgt = target or tvm.target.Target({"kind": "llvm", "num-cores": 2})
    key = str(tgt)
    if _CTX.get(key) is None:
        from tensorplan.kernels.tvm_intrin import load_tensor_intrinsics
        load_tensor_intrinsics()
        _CTX[key] = (ms.TuneContext(target=tgt, num_threads=1), ms.feature_extractor.PerStoreFeature())
    ctx, fe = _CTX[key]
    cand = ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"]))
    return fe.extract_from(ctx, [cand])[0].numpy()


_CTX: dict = {}


def rows_like_tvm(ast: CompactAST) -> np.ndarray:
    """Our rows reduced to TVM's convention: one row per stored buffer (its last non-constant
    store), ordered by each buffer's first non-constant store."""
    order: list[str] = []
    last: dict[str, int] = {}
    for i, (b, c) in enumerate(zip(ast.leaf_buffers, ast.leaf_is_const)):
        if c:
            continue
        if b not in last:
            order.append(b)
        last[b] = i
    if not order:
        return np.zeros((0, FEATURE_DIM), np.float32)
    return ast.leaf_features[[last[b] for b in order]]
