"""Kernels as programs: primitive sub-graph -> TE/TIR (lower), default CPU schedules
(schedule), compiled callables (build), vendor linear kernels (linear).

Import the submodules directly; this package imports TVM lazily.
"""
from .build import CompiledKernel, compile_kernel, local_target, make_target  # noqa: F401
from .lower import Lowered, lower, lower_kernel, supported_ops  # noqa: F401
