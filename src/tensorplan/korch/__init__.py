"""Korch (ASPLOS'24): operator fission into primitives (`fission`), candidate fused kernels
(`candidates`, and `regions` of original operators), and the binary linear program that
picks the optimal set (`blp`). The planner sees costs only through `tensorplan.cost`.
"""
from tensorplan.korch.blp import Selection, check_selection, greedy_fusion, no_fusion, select, solve_blp
from tensorplan.korch.candidates import Candidate, EnumerationStats, canonical_hash, enumerate_candidates

__all__ = ["Candidate", "EnumerationStats", "canonical_hash", "enumerate_candidates", "Selection",
           "check_selection", "greedy_fusion", "no_fusion", "select", "solve_blp"]
