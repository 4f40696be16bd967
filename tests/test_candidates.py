"""Candidate enumeration: convexity, single output, linear rules, dedupe, completeness against
brute force, canonical hashing, and that each candidate runs as a standalone graph."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper

from conftest import prim_graph
from tensorplan.korch.fission import category, fission
from tensorplan.ir.reference import random_feeds, rel_error, run_reference
from tensorplan.korch.candidates import EnumerationStats, canonical_hash, enumerate_candidates


def branchy():
    """12 primitives: two branches joining, a MatMul in the middle, a residual around it."""
    W = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["a"]), n("Exp", ["a"], ["b"]), n("Sigmoid", ["a"], ["c"]),
             n("Neg", ["c"], ["c2"]), n("Add", ["b", "c2"], ["d"]), n("MatMul", ["d", "W"], ["e"]),
             n("Tanh", ["e"], ["f"]), n("Mul", ["f", "d"], ["g"]), n("ReduceSum", ["g", "ax"], ["h"]),
             n("Sub", ["g", "h"], ["i"]), n("Abs", ["i"], ["j"]), n("Add", ["j", "a"], ["y"])]
    return prim_graph(nodes, {"x": (4, 8)}, ["y"], {"W": W, "ax": np.array([1], np.int64)})


def _succ(prim):
    cons = prim.consumers()
    return {n.name: {c.name for o in n.outputs for c in cons.get(o, [])} for n in prim.nodes}


def _reach(prim):
    succ = _succ(prim)
    order = [n.name for n in prim.nodes]
    reach = {v: set() for v in order}
    for v in reversed(order):
        for s in succ[v]:
            reach[v] |= {s} | reach[s]
    return reach


def is_convex(prim, members: set[str], reach) -> bool:
    outside = set(reach) - members
    return not any((reach[a] & outside) and any(reach[o] & members for o in reach[a] & outside)
                   for a in members)


def sinks(prim, members: set[str]) -> list[str]:
    succ = _succ(prim)
    return [v for v in members if not (succ[v] & members)]


def test_properties_on_branchy_graph():
    prim = branchy()
    reach = _reach(prim)
    cands = enumerate_candidates(prim, max_nodes=16, max_reduces=None)
    sets = [frozenset(c.nodes) for c in cands]
    assert len(sets) == len(set(sets)), "duplicate node sets"
    byname = {n.name: n for n in prim.nodes}
    for c in cands:
        m = set(c.nodes)
        assert is_convex(prim, m, reach), c.nodes
        (sink,) = sinks(prim, m)
        assert byname[sink].outputs[0] == c.output
        nlin = sum(category(byname[x].op) == "linear" for x in m)
        assert nlin <= 1 and (nlin == 0 or len(m) == 1)
        assert c.kind == ("linear" if nlin else "memory")
        produced = {o for x in m for o in byname[x].outputs}
        assert not (set(c.inputs) & produced)


def brute_force(prim, max_nodes: int) -> set[frozenset]:
    reach = _reach(prim)
    names = [n.name for n in prim.nodes]
    cats = {n.name: category(n.op) for n in prim.nodes}
    out = set()
    for r in range(1, max_nodes + 1):
        for combo in itertools.combinations(names, r):
            m = set(combo)
            lin = [x for x in m if cats[x] == "linear"]
            if lin and len(m) > 1:
                continue
            if len(sinks(prim, m)) == 1 and is_convex(prim, m, reach):
                out.add(frozenset(m))
    return out


@pytest.mark.parametrize("cap", [3, 5, 12])
def test_complete_against_brute_force(cap):
    prim = branchy()
    got = {frozenset(c.nodes) for c in enumerate_candidates(prim, max_nodes=cap, max_reduces=None)}
    assert got == brute_force(prim, cap)


def test_reduce_cap_and_size_cap():
    prim = branchy()
    byname = {n.name: n for n in prim.nodes}
    for c in enumerate_candidates(prim, max_nodes=4, max_reduces=0):
        assert len(c.nodes) <= 4
        assert len(c.nodes) == 1 or not any(category(byname[x].op) == "reduce" for x in c.nodes)


def test_regions_split_at_linear_primitives():
    prim = branchy()
    st = EnumerationStats()
    cands = enumerate_candidates(prim, stats=st)
    assert st.linear == 1 and st.regions == 1  # the residuals around the MatMul join both sides
    mm = [c for c in cands if c.kind == "linear"]
    assert len(mm) == 1 and mm[0].region == -1
    n = helper.make_node
    W = np.ones((8, 8), np.float32)
    chain = prim_graph([n("Relu", ["x"], ["a"]), n("MatMul", ["a", "W"], ["b"]), n("Tanh", ["b"], ["c"]),
                   n("MatMul", ["c", "W"], ["d"]), n("Exp", ["d"], ["y"])], {"x": (2, 8)}, ["y"], {"W": W})
    st = EnumerationStats()
    cands = enumerate_candidates(chain, stats=st)
    assert st.regions == 3 and {c.region for c in cands if c.kind == "memory"} == {0, 1, 2}


def test_linear_epilogue_option():
    prim = branchy()
    byname = {n.name: n for n in prim.nodes}
    plain = enumerate_candidates(prim)
    epi = enumerate_candidates(prim, linear_epilogue=True)
    extra = [c for c in epi if c.kind == "linear" and len(c.nodes) > 1]
    assert extra and len(epi) == len(plain) + len(extra)
    for c in extra:
        ops = [byname[x].op for x in c.nodes]
        assert ops[0] == "MatMul" and all(category(o) == "elementwise" for o in ops[1:])


def test_identical_blocks_share_a_hash():
    """Two LayerNorm+Relu blocks with different weights but equal shapes hash equal."""
    r = np.random.default_rng(1)
    n = helper.make_node
    inits = {f"{p}{k}": r.standard_normal(16).astype(np.float32) for p in "sb" for k in "12"}
    nodes = [n("LayerNormalization", ["x", "s1", "b1"], ["l1"], axis=-1), n("Relu", ["l1"], ["r1"]),
             n("LayerNormalization", ["r1", "s2", "b2"], ["l2"], axis=-1), n("Relu", ["l2"], ["y"])]
    prim = prim_graph(nodes, {"x": (2, 16)}, ["y"], inits)
    half = len(prim.nodes) // 2
    first, second = [x.name for x in prim.nodes[:half]], [x.name for x in prim.nodes[half:]]
    assert canonical_hash(prim, first) == canonical_hash(prim, second)
    cands = enumerate_candidates(prim, max_nodes=16)
    st = {}
    for c in cands:
        st.setdefault(c.canonical_hash, []).append(c)
    assert len(st) < len(cands)  # sharing happens
    # and the hash tells different shapes apart
    prim2 = prim_graph(nodes, {"x": (3, 16)}, ["y"], inits)
    assert canonical_hash(prim2, [x.name for x in prim2.nodes[:half]]) != canonical_hash(prim, first)


def test_hash_distinguishes_attributes_and_small_constants():
    n = helper.make_node
    a = prim_graph([n("ReduceSum", ["x", "ax"], ["y"])], {"x": (4, 5)}, ["y"], {"ax": np.array([0], np.int64)})
    b = prim_graph([n("ReduceSum", ["x", "ax"], ["y"])], {"x": (4, 5)}, ["y"], {"ax": np.array([1], np.int64)})
    c = prim_graph([n("LeakyRelu", ["x"], ["y"], alpha=0.1)], {"x": (4, 5)}, ["y"])
    d = prim_graph([n("LeakyRelu", ["x"], ["y"], alpha=0.2)], {"x": (4, 5)}, ["y"])
    h = lambda p: canonical_hash(p, [x.name for x in p.nodes])  # noqa: E731
    assert h(a) != h(b) and h(c) != h(d)


def test_candidate_graph_runs_standalone_and_matches_the_whole_graph():
    prim = branchy()
    feeds = random_feeds(prim, 0)
    full = {**feeds, **run_reference(prim, feeds, keep_all=True)}
    for c in enumerate_candidates(prim, max_nodes=6):
        sub = c.graph(prim)
        assert sub.outputs == [c.output] and sub.inputs == list(c.inputs)
        got = run_reference(sub, {i: full[i] for i in c.inputs})
        assert rel_error(got[c.output], full[c.output]) < 1e-6


def test_zoo_model_counts_and_blowup_control():
    zoo = pytest.importorskip("tensorplan.zoo")
    prim = fission(zoo.load("tiny-attention")).graph
    st = EnumerationStats()
    cands = enumerate_candidates(prim, max_nodes=8, stats=st)
    assert st.candidates == len(cands) and st.unique_hashes <= len(cands)
    assert not st.truncated_sinks
    # every primitive has its singleton
    single = {c.nodes[0] for c in cands if len(c.nodes) == 1}
    assert single == {n.name for n in prim.nodes}
    # a larger cap only adds candidates
    more = enumerate_candidates(prim, max_nodes=12)
    assert {frozenset(c.nodes) for c in cands} <= {frozenset(c.nodes) for c in more}
