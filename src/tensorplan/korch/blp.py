"""Kernel selection: Korch's binary linear program, plus greedy and no-fusion baselines.

BLP (korch.md §3), one binary `x_k` per candidate with finite cost:

    minimise   sum_k cost_k * x_k
    (C1)  sum_{k: t in out(k)} x_k >= 1          for every graph output t
    (C2)  sum_{j: t in out(j)} x_j - x_k >= 0    for every k and every input t of k
                                                  (graph inputs/constants are free)

Recomputation is implicit: a primitive may sit inside several chosen kernels. Single-
output convex kernels need no ordering constraints (their dependency graph inherits
acyclicity from the primitive DAG); multi-output region kernels are intervals of one
topological order, and `check_selection` proves every selection acyclic anyway.

Valid cuts (`cuts=True`; they never remove every optimal solution):
- producer cut: `sum_{k: out(k)=t} x_k <= 1` over the single-output producers of t — with
  positive costs a second one can be dropped without breaking C1/C2 (a multi-output region
  kernel may be needed for its other outputs, so it is left out of the cut);
- coverage cut: `sum_{k contains p} x_k >= 1` for every primitive p — every primitive
  of the (pruned) graph is an ancestor of an output, and following any path from p to
  that output back through the chosen kernels shows some chosen kernel contains p.
  This tightens the LP relaxation (measured in bench/korch_candidates.py).

`recompute=False` adds `sum_{k contains p} x_k <= 1` (each primitive computed once):
the ablation of Korch's recomputation.

Costs are scaled to microseconds inside the solver so HiGHS' absolute tolerances are
meaningful. Every returned selection is checked (`check_selection`); failures and
solver give-ups raise `PlanError`.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tensorplan.errors import PlanError
from tensorplan.ir.graph import Graph
from tensorplan.korch.candidates import Candidate

_SCALE = 1e6  # seconds -> microseconds inside the solver


@dataclass
class Selection:
    """A chosen set of candidates and how it was found."""

    chosen: list[int]  # candidate ids
    objective_s: float
    method: str  # "blp" | "greedy" | "none"
    status: str  # "optimal" | "time_limit" | "time_limit_greedy_better" | "time_limit_greedy_fallback" | "heuristic"
    solve_s: float = 0.0
    mip_gap: float | None = None
    dual_bound_s: float | None = None
    variables: int = 0
    constraints: int = 0
    options: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "status": self.status, "objective_s": self.objective_s,
                "solve_s": self.solve_s, "mip_gap": self.mip_gap, "dual_bound_s": self.dual_bound_s,
                "variables": self.variables, "constraints": self.constraints,
                "kernels": len(self.chosen), **self.options}


def _available(prim: Graph) -> set[str]:
    return set(prim.inputs) | set(prim.constants())


def check_selection(prim: Graph, cands: Sequence[Candidate], chosen: Sequence[int]) -> list[int]:
    """Verify a selection; return the chosen ids in a topological execution order.

    Raises PlanError if a graph output is not produced, an input of a chosen kernel is never
    produced, or no topological order exists (a cycle)."""
    by_id = {c.id: c for c in cands}
    ks = [by_id[i] for i in chosen]
    avail = _available(prim)
    produced = set(avail)
    for c in ks:
        produced.update(c.outputs)
    for t in prim.outputs:
        if t not in produced:
            raise PlanError(f"selection does not produce graph output '{t}'")
    for c in ks:
        for t in c.inputs:
            if t not in produced:
                raise PlanError(f"kernel {c.id} (nodes {list(c.nodes)[:3]}) needs '{t}', which no chosen kernel produces")
    done = set(avail)
    order: list[int] = []
    pending = list(ks)
    while pending:
        rest = [c for c in pending if not all(t in done for t in c.inputs)]
        ready = [c for c in pending if all(t in done for t in c.inputs)]
        if not ready:
            raise PlanError(f"chosen kernels form a cycle through kernel {rest[0].id}")
        for c in ready:
            order.append(c.id)
            done.update(c.outputs)
        pending = rest
    return order


def dominated(cands: Sequence[Candidate], costs: np.ndarray, max_group: int = 400) -> set[int]:
    """Indices of candidates another candidate dominates: same outputs, a subset of the inputs,
    no higher cost. With recomputation allowed, swapping a dominated kernel for its dominator
    keeps every constraint satisfied and never raises the objective, so dropping them keeps an
    optimum (not valid with recompute=False: the dominator may contain more primitives)."""
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(cands):
        if math.isfinite(costs[i]):
            groups.setdefault(c.outputs, []).append(i)
    out: set[int] = set()
    for idx in groups.values():
        if len(idx) < 2 or len(idx) > max_group:
            continue
        ins = {i: frozenset(cands[i].inputs) for i in idx}
        for k in idx:
            for j in idx:
                if j != k and ins[j] <= ins[k] and (costs[j] < costs[k] or (costs[j] == costs[k] and (
                        len(ins[j]) < len(ins[k]) or j < k))) and j not in out:
                    out.add(k)
                    break
    return out


def solve_blp(prim: Graph, cands: Sequence[Candidate], costs: Sequence[float], *,
              recompute: bool = True, cuts: bool = True, presolve: bool = True, time_limit: float = 60.0,
              mip_rel_gap: float = 1e-4, require_optimal: bool = False) -> Selection:
    """Solve Korch's BLP with scipy.optimize.milp (HiGHS).

    `mip_rel_gap` (HiGHS's own default, 0.01 %) stops once the plan is provably within that
    fraction of the optimum: kernel costs carry ~1 % timing noise, and proving the last 0.01 %
    took YOLOv4 past 120 s instead of 13 s (`python bench/korch_candidates.py`).
    `presolve` drops dominated candidates first (see `dominated`; only with recomputation).
    A time-out with an incumbent returns it with status "time_limit" and its MIP gap
    (unless `require_optimal`); a time-out without one, or infeasibility, raises PlanError."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    costs = np.asarray(costs, dtype=np.float64)
    if len(costs) != len(cands):
        raise PlanError(f"{len(costs)} costs for {len(cands)} candidates")
    drop = dominated(cands, costs) if (presolve and recompute) else set()
    var_of = [i for i, c in enumerate(costs) if math.isfinite(c) and i not in drop]
    vidx = {cands[i].id: v for v, i in enumerate(var_of)}
    V = len(var_of)
    avail = _available(prim)
    producers: dict[str, list[int]] = {}
    containing: dict[str, list[int]] = {}
    for v, i in enumerate(var_of):
        c = cands[i]
        for o in c.outputs:
            producers.setdefault(o, []).append(v)
        for n in c.nodes:
            containing.setdefault(n, []).append(v)

    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lb: list[float] = []
    ub: list[float] = []
    upper = np.ones(V)

    def add_row(entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(lb)
        for col, val in entries:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        lb.append(lo)
        ub.append(hi)

    for t in prim.outputs:
        if t in avail:
            continue
        ps = producers.get(t, [])
        if not ps:
            raise PlanError(f"graph output '{t}' cannot be produced: every candidate producing it has "
                            "infinite cost (could not be built)")
        add_row([(p, 1.0) for p in ps], 1.0, np.inf)
    for v, i in enumerate(var_of):
        for t in cands[i].inputs:
            if t in avail:
                continue
            ps = producers.get(t, [])
            if not ps:
                upper[v] = 0.0
                continue
            add_row([(p, 1.0) for p in ps] + [(v, -1.0)], 0.0, np.inf)
    n_model_rows = len(lb)
    if cuts:
        for t, ps in producers.items():
            single = [p for p in ps if len(cands[var_of[p]].outputs) == 1]
            if len(single) > 1:
                add_row([(p, 1.0) for p in single], -np.inf, 1.0)
        for n in prim.nodes:
            ks = containing.get(n.name, [])
            if ks:
                add_row([(k, 1.0) for k in ks], 1.0, np.inf)
    if not recompute:
        for n in prim.nodes:
            ks = containing.get(n.name, [])
            if len(ks) > 1:
                add_row([(k, 1.0) for k in ks], -np.inf, 1.0)

    c = costs[var_of] * _SCALE
    A = coo_matrix((vals, (rows, cols)), shape=(len(lb), V)).tocsr()
    t0 = time.perf_counter()
    res = milp(c, integrality=np.ones(V), bounds=Bounds(np.zeros(V), upper),
               constraints=LinearConstraint(A, np.array(lb), np.array(ub)) if len(lb) else None,
               options={"time_limit": float(time_limit), "mip_rel_gap": float(mip_rel_gap), "disp": False})
    solve_s = time.perf_counter() - t0
    opts = {"recompute": recompute, "cuts": cuts, "presolve": presolve, "dominated": len(drop),
            "time_limit": time_limit, "mip_rel_gap": mip_rel_gap, "model_rows": n_model_rows}
    if res.status == 2:
        raise PlanError(f"the BLP is infeasible ({res.message}); some tensor can only be produced by "
                        "candidates that could not be built")
    if res.x is None:
        if require_optimal:
            raise PlanError(f"the BLP solver stopped without a solution after {solve_s:.1f}s ({res.message}); "
                            "raise --time-limit or lower the candidate size cap")
        # A time-out with no incumbent still deserves a plan: fall back to greedy fusion over
        # the same candidates (always feasible) and say so in the status.
        fb = greedy_fusion(prim, cands, costs)
        fb.method, fb.status, fb.solve_s = "blp", "time_limit_greedy_fallback", solve_s + fb.solve_s
        fb.variables, fb.constraints = V, len(lb)
        fb.options = {**opts, "fallback": f"no BLP incumbent after {solve_s:.1f}s ({res.message})"}
        return fb
    status = "optimal" if res.status == 0 else "time_limit"
    if status != "optimal" and require_optimal:
        raise PlanError(f"the BLP solver hit its {time_limit}s time limit (gap {getattr(res, 'mip_gap', None)}); "
                        "raise --time-limit or lower the candidate size cap")
    chosen = [cands[var_of[v]].id for v in range(V) if res.x[v] > 0.5]
    check_selection(prim, cands, chosen)
    obj = float(sum(costs[var_of[v]] for v in range(V) if res.x[v] > 0.5))
    dual = getattr(res, "mip_dual_bound", None)
    sel = Selection(chosen, obj, "blp", status, solve_s,
                    mip_gap=float(res.mip_gap) if getattr(res, "mip_gap", None) is not None else None,
                    dual_bound_s=float(dual) / _SCALE if dual is not None else None,
                    variables=V, constraints=len(lb), options=opts)
    if status == "time_limit":
        # A timed-out incumbent can be worse than greedy fusion over the same candidates
        # (YOLOv4 at size cap 16: 211.1 vs 210.8 predicted ms); keep whichever is cheaper.
        gr = greedy_fusion(prim, cands, costs)
        sel.solve_s += gr.solve_s                    # the comparison is part of the solve either way
        if gr.objective_s < obj:
            sel.chosen, sel.objective_s = gr.chosen, gr.objective_s
            sel.status = "time_limit_greedy_better"
            sel.options = {**opts, "fallback": f"greedy fusion ({gr.objective_s * 1e3:.3f} ms) beat the BLP "
                                               f"incumbent ({obj * 1e3:.3f} ms) at the {time_limit}s time limit"}
    return sel


def _singletons(prim: Graph, cands: Sequence[Candidate]) -> dict[str, Candidate]:
    out = {}
    for c in cands:
        if len(c.nodes) == 1:
            out.setdefault(c.nodes[0], c)
    missing = [n.name for n in prim.nodes if n.name not in out]
    if missing:
        raise PlanError(f"no singleton candidate for primitive(s) {missing[:3]}")
    return out


def no_fusion(prim: Graph, cands: Sequence[Candidate], costs: Sequence[float]) -> Selection:
    """Every primitive its own kernel: the 'fission without fusion' baseline."""
    t0 = time.perf_counter()
    single = _singletons(prim, cands)
    cost_of = {c.id: float(costs[k]) for k, c in enumerate(cands)}
    chosen = [single[n.name].id for n in prim.nodes]
    bad = [i for i in chosen if not math.isfinite(cost_of[i])]
    if bad:
        raise PlanError(f"singleton kernel {bad[0]} has infinite cost; the cost model must cost every primitive")
    check_selection(prim, cands, chosen)
    return Selection(chosen, sum(cost_of[i] for i in chosen), "none", "heuristic",
                     time.perf_counter() - t0, variables=len(chosen))


def greedy_fusion(prim: Graph, cands: Sequence[Candidate], costs: Sequence[float]) -> Selection:
    """Greedy producer-into-consumer merging over the same candidates and costs, no recomputation.

    Starts from singletons; repeatedly applies the merge of a producer kernel into its only
    consumer kernel with the largest saving cost(P)+cost(C)-cost(P∪C) > 0, where P∪C must be
    an existing candidate (so it is convex and single-output). This is what rule-based fusers
    (TVM FuseOps, XLA) do; comparing it to the BLP isolates the value of the global search."""
    t0 = time.perf_counter()
    single = _singletons(prim, cands)
    cost_of = {c.id: float(costs[k]) for k, c in enumerate(cands)}
    by_set: dict[frozenset, Candidate] = {}
    for k, c in enumerate(cands):
        if math.isfinite(costs[k]) and c.kind != "region":
            by_set.setdefault(frozenset(c.nodes), c)
    cons = prim.consumers()
    node_of_out = {o: n.name for n in prim.nodes for o in n.outputs if o}
    byname = {n.name: n for n in prim.nodes}
    group_of: dict[str, int] = {}  # node -> group key
    groups: dict[int, Candidate] = {}
    for n in prim.nodes:
        c = single[n.name]
        if not math.isfinite(cost_of[c.id]):
            raise PlanError(f"singleton kernel for '{n.name}' has infinite cost")
        groups[c.id] = c
        group_of[n.name] = c.id
    outputs = set(prim.outputs)

    def merge_option(pid: int) -> tuple[float, int, Candidate] | None:
        p = groups[pid]
        if len(p.outputs) != 1 or p.output in outputs:
            return None
        users = {group_of[u.name] for u in cons.get(p.output, [])}
        if len(users) != 1:
            return None
        cid = users.pop()
        merged = by_set.get(frozenset(p.nodes) | frozenset(groups[cid].nodes))
        if merged is None:
            return None
        gain = cost_of[p.id] + cost_of[groups[cid].id] - cost_of[merged.id]
        return (gain, cid, merged) if gain > 0 else None

    heap: list[tuple[float, int, int]] = []
    version: dict[int, int] = {g: 0 for g in groups}
    for gid in groups:
        opt = merge_option(gid)
        if opt:
            heapq.heappush(heap, (-opt[0], gid, version[gid]))
    while heap:
        _, pid, ver = heapq.heappop(heap)
        if pid not in groups or version.get(pid) != ver:
            continue
        opt = merge_option(pid)
        if opt is None:
            continue
        gain, cid, merged = opt
        groups.pop(pid)
        groups.pop(cid)
        new_key = merged.id
        groups[new_key] = merged
        for nname in merged.nodes:
            group_of[nname] = new_key
        version[new_key] = version.get(new_key, 0) + 1
        # the merged group and the groups feeding it may now have new options
        affected = {new_key} | {group_of[node_of_out[i]] for nname in merged.nodes
                                for i in byname[nname].inputs
                                if i in node_of_out and group_of.get(node_of_out[i]) != new_key}
        for g in affected:
            version[g] = version.get(g, 0) + 1
            o = merge_option(g)
            if o:
                heapq.heappush(heap, (-o[0], g, version[g]))
    chosen = sorted(g.id for g in groups.values())
    check_selection(prim, cands, chosen)
    return Selection(chosen, sum(cost_of[i] for i in chosen), "greedy", "heuristic",
                     time.perf_counter() - t0, variables=len(cands))


def select(prim: Graph, cands: Sequence[Candidate], costs: Sequence[float], method: str = "blp",
           **kw) -> Selection:
    """Dispatch: "blp" (Korch), "greedy" (greedy fusion) or "none" (no fusion)."""
    if method == "blp":
        return solve_blp(prim, cands, costs, **kw)
    if method == "greedy":
        return greedy_fusion(prim, cands, costs)
    if method == "none":
        return no_fusion(prim, cands, costs)
    raise PlanError(f"unknown selection method '{method}' (use blp, greedy or none)")


def recomputed_primitives(cands: Sequence[Candidate], chosen: Sequence[int]) -> int:
    """How many primitives are computed by more than one chosen kernel."""
    by_id = {c.id: c for c in cands}
    seen: dict[str, int] = {}
    for i in chosen:
        for n in by_id[i].nodes:
            seen[n] = seen.get(n, 0) + 1
    return sum(1 for v in seen.values() if v > 1)
