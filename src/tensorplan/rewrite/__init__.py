"""Exact algebraic graph rewrites, one file per rule family; passes.py holds the ordered pass list
and `rewrite`, re-exported here so callers import from `tensorplan.rewrite`."""
from tensorplan.rewrite.passes import PASSES, RULES, WINOGRAD, RewriteResult, output_phase_factor, rewrite, winograd_convs

__all__ = ["PASSES", "RULES", "WINOGRAD", "RewriteResult", "output_phase_factor", "rewrite", "winograd_convs"]
