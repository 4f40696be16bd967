"""Kernels as programs: primitive sub-graph -> TE/TIR (lower), default CPU schedules
(schedule), compiled callables (build); library kernels sharing one calling convention
(base): ONNX Runtime, PyTorch and TVM (vendor), OpenVINO (openvino), PyTorch-compiled
kernels for a torch device (torch_kernel).

Import the submodules directly; this package imports TVM lazily.

TVM's worker threads spin after each parallel kernel by default; between kernels of a
plan that run on ONNX Runtime / torch pools they would steal the cores those run on
(measured: YOLOX-nano plan 65 ms -> 28 ms end to end with spinning off on 2 cores). So
unless the user set it, TVM_THREAD_POOL_SPIN_COUNT=0 before TVM's pool starts.
"""
import os as _os

_os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")
from tensorplan.kernels.build import CompiledKernel, compile_kernel, local_target, make_target  # noqa: F401
from tensorplan.kernels.lower import Lowered, lower, lower_kernel, supported_ops  # noqa: F401
