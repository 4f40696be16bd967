"""Buffer planning for a plan: tensor lifetimes in kernel order and reusable arena slots.

Why a module of its own: the executor fills in the buffers of a plan that has none, and the plan
module runs the executor (`Plan.run`); keeping the allocator apart lets both use it without
importing each other.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tensorplan.ir.graph import Graph

if TYPE_CHECKING:
    from tensorplan.runtime.plan import Plan


def plan_buffers(plan: "Plan", prim: Graph) -> None:
    """Fill `plan.buffers` and `plan.slots`: lifetimes of every kernel-produced tensor in
    `order`, and slots from a greedy interval-colouring allocator (best fit by size; graph
    outputs live to the end). Graph inputs and constants are owned by the caller."""
    order = plan.order
    pos = {kid: i for i, kid in enumerate(order)}
    last: dict[str, int] = {}
    first: dict[str, int] = {}
    for kid in order:
        k = plan.kernel(kid)
        for o in k.outputs:
            first.setdefault(o, pos[kid])
        for i in k.inputs:
            last[i] = max(last.get(i, -1), pos[kid])
    end = len(order)
    bufs = []
    for t, f in first.items():
        lu = end if t in prim.outputs else last.get(t, f)
        bufs.append({"tensor": t, "bytes": int(prim.tensors[t].nbytes), "first_use": f, "last_use": lu})
    bufs.sort(key=lambda b: (b["first_use"], -b["bytes"]))
    slots: list[int] = []
    free_at: list[int] = []  # step after which the slot is free
    for b in bufs:
        cands = [s for s in range(len(slots)) if free_at[s] < b["first_use"]]
        fit = [s for s in cands if slots[s] >= b["bytes"]]
        if fit:
            s = min(fit, key=lambda s: slots[s])
        elif cands:
            s = max(cands, key=lambda s: slots[s])
            slots[s] = b["bytes"]
        else:
            slots.append(b["bytes"])
            free_at.append(-1)
            s = len(slots) - 1
        b["slot"] = s
        free_at[s] = b["last_use"]
    plan.buffers = bufs
    plan.slots = slots


__all__ = ["plan_buffers"]
