"""Reduced precision (bf16, fp16, int8): the calibration samples, the accuracy of a reduced-precision
run against fp32, int8 quantization for ONNX Runtime and OpenVINO, and which precisions a device
runs natively.

Why a package of its own: the kernels (which build reduced-precision kernels), the search (which
picks a precision per kernel under a tolerance) and the peers (int8 baselines) all need the same
calibration, the same accuracy figures and the same quantizers. It sits above `ir` and `devices`
and below `kernels`: it imports only errors, ir, devices and the runtimes' own packages.
"""
from __future__ import annotations

from tensorplan.precision.accuracy import Accuracy, compare
from tensorplan.precision.calibration import RANDOM_WARNING, CalibrationSet, load_calibration
from tensorplan.precision.native import PRECISIONS, PrecisionSupport, check_precision, native_precisions
from tensorplan.precision.quantize import openvino_int8, ort_int8

__all__ = ["Accuracy", "CalibrationSet", "PRECISIONS", "PrecisionSupport", "RANDOM_WARNING", "check_precision",
           "compare", "load_calibration", "native_precisions", "openvino_int8", "ort_int8"]
