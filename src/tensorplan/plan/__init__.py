"""Korch-style kernel orchestration: candidates, BLP selection, verified plans.

`orchestrate(model, ...)` is the whole pipeline; the pieces are usable alone:
`enumerate_candidates` (candidates.py), `solve_blp` / `greedy_fusion` (blp.py),
`Plan` / `verify` (plan.py).
"""
from .blp import Selection, check_selection, greedy_fusion, no_fusion, select, solve_blp
from .candidates import Candidate, EnumerationStats, canonical_hash, enumerate_candidates
from .orchestrate import orchestrate
from .plan import SCHEMA, Plan, PlanKernel, plan_buffers, topo_order, verify

__all__ = ["Candidate", "EnumerationStats", "canonical_hash", "enumerate_candidates", "Selection",
           "check_selection", "greedy_fusion", "no_fusion", "select", "solve_blp", "orchestrate",
           "SCHEMA", "Plan", "PlanKernel", "plan_buffers", "topo_order", "verify"]
