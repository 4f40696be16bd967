"""CDMPP compact AST + 164-d leaf features: tree invariants, positional encoding, and a
row-by-row cross-check against TVM's own meta_schedule PerStoreFeature on sampled schedules."""
from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tvm import s_tir, te  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from tensorplan.errors import TensorplanError  # noqa: E402
from tensorplan.cdmpp import features as F  # noqa: E402

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _matmul_relu(m=64, n=64, k=128):
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    D = te.compute((m, n), lambda i, j: te.max(C[i, j], 0.0), name="D")
    return tvm.IRModule({"main": te.create_prim_func([A, B, D])})


def _softmax(m=32, n=64):
    A = te.placeholder((m, n), name="A")
    r = te.reduce_axis((0, n), name="r")
    mx = te.compute((m,), lambda i: te.max(A[i, r], axis=r), name="mx")
    e = te.compute((m, n), lambda i, j: te.exp(A[i, j] - mx[i]), name="e")
    r2 = te.reduce_axis((0, n), name="r2")
    s = te.compute((m,), lambda i: te.sum(e[i, r2], axis=r2), name="s")
    out = te.compute((m, n), lambda i, j: e[i, j] / s[i], name="out")
    return tvm.IRModule({"main": te.create_prim_func([A, out])})


def _conv(c=8, hw=16, k=16):
    X = te.placeholder((1, c, hw + 2, hw + 2), name="X")
    W = te.placeholder((k, c, 3, 3), name="W")
    rc = te.reduce_axis((0, c), name="rc")
    ry = te.reduce_axis((0, 3), name="ry")
    rx = te.reduce_axis((0, 3), name="rx")
    Y = te.compute((1, k, hw, hw), lambda b, o, y, x: te.sum(X[b, rc, y + ry, x + rx] * W[o, rc, ry, rx],
                                                              axis=[rc, ry, rx]), name="Y")
    Z = te.compute((1, k, hw, hw), lambda b, o, y, x: te.max(Y[b, o, y, x] + 1.0, 0.0), name="Z")
    return tvm.IRModule({"main": te.create_prim_func([X, W, Z])})


def _samples(mod, n, seed0=1):
    ctx = ms.TuneContext(mod=mod, target=TARGET, space_generator="post-order-apply",
                         search_strategy="replay-trace", num_threads=1)
    spaces = ctx.generate_design_space()
    out = []
    s = seed0
    while len(out) < n and s < seed0 + 10 * n:
        sch = s_tir.Schedule(mod, seed=s)
        spaces[s % len(spaces)].trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=lambda *a: None)
        if all(p.apply(sch) for p in ctx.space_generator.postprocs):
            out.append(sch)
        s += 1
    return out


def test_feature_names_and_groups():
    assert len(F.FEATURE_NAMES) == 164 == F.FEATURE_DIM
    assert len(set(F.FEATURE_NAMES)) == 164
    covered = sorted(i for a, b in F.FEATURE_GROUPS.values() for i in range(a, b))
    assert covered == list(range(164))
    assert F.FEATURE_NAMES[57] == "B0.acc_type.read" and F.FEATURE_NAMES[163] == "auto_unroll_max_step"


def test_positional_encoding_formula():
    pos = np.array([0, 3, 17])
    pe = F.positional_encoding(pos, 164)
    assert pe.shape == (3, 164) and pe.dtype == np.float32
    np.testing.assert_allclose(pe[0, 0::2], 0.0, atol=1e-7)      # sin(0)
    np.testing.assert_allclose(pe[0, 1::2], 1.0, atol=1e-7)      # cos(0)
    i = 10
    np.testing.assert_allclose(pe[1, i], np.sin(3 / 10000 ** (2 * i / 164)), rtol=1e-5)
    np.testing.assert_allclose(pe[2, i + 1], np.cos(17 / 10000 ** (2 * (i + 1) / 164)), rtol=1e-5)
    assert not np.allclose(pe[1], pe[2])


def test_tree_invariants_unscheduled_matmul():
    ast = F.compact_ast(_matmul_relu())
    pre = ast.preorder
    # every node id appears once, followed eventually by its end marker
    assert (pre >= 0).sum() == ast.n_nodes == (pre == F.END_MARKER).sum()
    assert pre[0] == 0 and ast.node_kinds[0] == F.ROOT
    depth, max_depth = 0, 0
    for v in pre:
        depth += 1 if v >= 0 else -1
        assert depth >= 0
        max_depth = max(max_depth, depth)
    assert depth == 0 and max_depth == int(ast.depths.max()) + 1
    # leaves are exactly the stores: C init (constant), C update, D
    assert ast.n_leaves == 3 == int((ast.node_kinds == F.STORE).sum())
    assert ast.leaf_is_const.tolist() == [True, False, False]
    assert ast.leaf_buffers == ["C", "C", "D"]
    for p, nid in zip(ast.positions, ast.leaf_node_ids):
        assert pre[p] == nid and pre[p + 1] == F.END_MARKER        # a leaf closes right away
    assert ast.leaf_features.shape == (3, 164) and ast.leaf_features.dtype == np.float32
    # 64*64*128 multiply-adds: one float add and one float mul per iteration; relu = one max per output
    assert ast.flops == pytest.approx(2 * 64 * 64 * 128 + 64 * 64)
    upd = ast.leaf_features[1]
    assert upd[1] == pytest.approx(np.log2(64 * 64 * 128 + 1))    # float_addsub, slog-scaled
    assert upd[162] == pytest.approx(np.log2(3 + 1))              # 3 loops around the update
    init = ast.leaf_features[0]
    assert init[0:16].sum() == 0                                  # the init store computes nothing
    # ... writes only C, inside the k loop (guarded init): reused across k, 128 times, at distance 1
    assert init[57:60].tolist() == [0.0, 1.0, 0.0] and init[64:67].tolist() == [1.0, 0.0, 0.0]
    assert init[69] == pytest.approx(np.log2(128 + 1)) and init[67] == pytest.approx(1.0)
    assert init[75:147].sum() == 0                                # a single buffer slot


@pytest.mark.parametrize("make,n", [(_matmul_relu, 6), (_softmax, 4), (_conv, 4)])
def test_rows_match_tvm_per_store_feature(make, n):
    """For every stored buffer, our row of its last non-constant store equals TVM's row (all 164 dims)."""
    schs = _samples(make(), n)
    assert len(schs) >= n // 2
    for sch in schs:
        ast = F.compact_ast(sch)
        mine = F.rows_like_tvm(ast)
        ref = F.tvm_per_store_feature(sch, TARGET)
        assert mine.shape == ref.shape
        np.testing.assert_allclose(mine, ref, atol=2e-3, rtol=1e-4)
        # and therefore the summed ("pack-sum") representation agrees too
        np.testing.assert_allclose(mine.sum(0), ref.sum(0), atol=1e-2, rtol=1e-4)


def test_first_init_store_has_no_serial_reuse():
    """A decomposed init (the program's first store) cannot reuse data written before it
    (regression: its own touches were counted twice, faking serial reuse)."""
    for sch in _samples(_matmul_relu(), 6, seed0=20):
        ast = F.compact_ast(sch)
        assert ast.leaf_is_const[0]
        assert ast.leaf_features[0][65] == 0.0            # B0.reuse_type.serial_multiple_read_write


def test_featurize_many_equals_compact_ast():
    schs = _samples(_softmax(), 4, seed0=50) + _samples(_matmul_relu(), 3, seed0=60)
    many = F.featurize_many([s.mod for s in schs])
    forked = F.featurize_many([s.mod for s in schs], workers=2, batch=2)    # 4 batches over 2 processes
    assert len(many) == len(forked) == len(schs)
    for sch, a, c in zip(schs, many, forked):
        b = F.compact_ast(sch)
        for x in (a, c):
            np.testing.assert_array_equal(x.preorder, b.preorder)
            np.testing.assert_array_equal(x.positions, b.positions)
            np.testing.assert_allclose(x.leaf_features, b.leaf_features)
            assert x.leaf_buffers == b.leaf_buffers


def test_featurize_many_names_the_bad_program_from_a_worker():
    good = _samples(_softmax(), 2, seed0=50)
    import tvm
    two = tvm.IRModule({"a": good[0].mod["main"], "b": good[1].mod["main"]})
    with pytest.raises(TensorplanError, match="program 3 has 2 PrimFuncs"):
        F.featurize_many([good[0].mod, good[1].mod, good[0].mod, two], workers=2, batch=1)


def test_scheduling_changes_features_and_tree():
    mod = _matmul_relu()
    base = F.compact_ast(mod)
    schs = _samples(mod, 3, seed0=7)
    for sch in schs:
        a = F.compact_ast(sch)
        assert a.n_nodes > base.n_nodes                 # tiling adds loops
        assert a.flops == pytest.approx(base.flops)     # ... but not work
        ann = a.leaf_features[:, 16:49].sum()
        assert ann > 0                                  # parallel / vectorize / unroll appear


def test_bad_input_is_a_clear_error():
    with pytest.raises(TensorplanError, match="PrimFunc"):
        F.compact_ast("not a program")
