"""int8 post-training quantization as users know it: ONNX Runtime static quantization (QDQ) and
OpenVINO through NNCF, both calibrated on the samples of a `CalibrationSet`.

Why both: each runtime only runs its own int8 format fast (ONNX Runtime fuses QDQ pairs into its
integer kernels, OpenVINO reads NNCF's FakeQuantize), so a plan's int8 kernel and the int8 peers need
the quantizer of the runtime that will run them. Both take an fp32 ONNX model and return the
quantized model; neither touches the caller's model. A failure is one `CompileError` naming the model
and the step, never the quantizer's traceback.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from tensorplan.errors import CompileError

if TYPE_CHECKING:  # pragma: no cover
    import openvino

#: The pinned NNCF (pyproject.toml); other versions may work but were not measured.
NNCF_VERSION = "3.4.0"

#: Calibration methods of `ort_int8`: MinMax (the range seen) or Percentile (clips outliers, 99.999th).
ORT_METHODS = ("minmax", "percentile")

# Above this many bytes of weights ONNX Runtime's quantizer must write external data (protobuf's 2 GiB)
_EXTERNAL_DATA_BYTES = 1_800_000_000


def _name(model: onnx.ModelProto, name: str | None) -> str:
    return name or model.graph.name or "model"


def _feeds(model: onnx.ModelProto, calibration: list[dict[str, np.ndarray]], what: str,
           name: str) -> list[dict[str, np.ndarray]]:
    """`calibration` restricted to the model's inputs, each sample checked to hold all of them."""
    if not calibration:
        raise CompileError(f"{what} of '{name}': no calibration samples given (int8 needs at least one)")
    inits = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in inits]
    out = []
    for k, sample in enumerate(calibration):
        missing = [n for n in inputs if n not in sample]
        if missing:
            raise CompileError(f"{what} of '{name}': calibration sample {k} lacks input(s) {missing} "
                               f"(has {sorted(sample)})")
        out.append({n: np.ascontiguousarray(sample[n]) for n in inputs})
    return out


def _weight_bytes(model: onnx.ModelProto) -> int:
    return sum(len(t.raw_data) for t in model.graph.initializer)


@contextlib.contextmanager
def _quiet_quantizer() -> Iterator[None]:
    """Keep the quantizers' chatter out of tensorplan's output (the CLI's progress, `--json` on stdout):
    NNCF's banner and progress bars (printed to stdout), NNCF's and ONNX Runtime's Python-logging
    notices, ONNX Runtime's C++ session warnings. Errors still raise; their message is what the caller
    reports."""
    import onnxruntime as ort
    nncf_logger = logging.getLogger("nncf")
    level = nncf_logger.level
    nncf_logger.setLevel(logging.ERROR)
    logging.disable(logging.WARNING)          # ONNX Runtime's quantizer warns through the root logger
    ort.set_default_logger_severity(3)        # errors only (the default, 2, also prints warnings)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        ort.set_default_logger_severity(2)
        logging.disable(logging.NOTSET)
        nncf_logger.setLevel(level)


def _first_line(e: BaseException) -> str:
    """The informative part of a quantizer's or OpenVINO's message (OpenVINO opens with the C++ source
    location, "Exception from src/...:105:")."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    told = [ln for ln in lines if not ln.startswith(("Exception from ", "Check '"))]
    return "; ".join(told[:2] or lines[:1] or [type(e).__name__])[:300]


# ------------------------------------------------------------------------------------------------
# ONNX Runtime
# ------------------------------------------------------------------------------------------------
def ort_int8(model: onnx.ModelProto, calibration: list[dict[str, np.ndarray]], *, method: str = "minmax",
             per_channel: bool = True, reduce_range: bool | None = None, name: str | None = None) -> onnx.ModelProto:
    """`model` quantized by ONNX Runtime's static quantization: QDQ format, uint8 activations with
    int8 weights (U8S8: the operand pair of the integer GEMM/conv kernels of ONNX Runtime on x86,
    which ran S8S8 QDQ models markedly slower on the development CPU), weights per output channel
    where the operator allows, activation ranges from `calibration` by `method` ("minmax" or
    "percentile"). `reduce_range` (7-bit weights, ONNX Runtime's advice against saturation on CPUs
    without VNNI) defaults to whether this CPU lacks int8 dot-product units. The model is
    pre-processed as ONNX Runtime advises (`quant_pre_process`: shape inference and graph
    optimisation) first; the caller's proto is left as it was. Raises CompileError naming the model
    and the step on failure."""
    name = _name(model, name)
    if reduce_range is None:
        from tensorplan.precision.native import native_precisions
        reduce_range = not native_precisions()["int8"].native
    if method not in ORT_METHODS:
        raise CompileError(f"ONNX Runtime int8 of '{name}': calibration method {method!r} is not one of "
                           f"{ORT_METHODS}")
    feeds = _feeds(model, calibration, "ONNX Runtime int8", name)
    try:
        from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                              quant_pre_process, quantize_static)
    except ImportError as e:  # pragma: no cover - onnxruntime is a pinned dependency
        raise CompileError(f"ONNX Runtime int8 of '{name}': onnxruntime.quantization is unavailable: {e}") from None

    class _Reader(CalibrationDataReader):
        """Hands ONNX Runtime's calibrator one sample per call."""

        def __init__(self) -> None:
            self._it = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._it, None)

    external = _weight_bytes(model) > _EXTERNAL_DATA_BYTES
    calib = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile}[method]
    with tempfile.TemporaryDirectory(prefix="tensorplan-int8-") as tmp:
        src, pre, out = (os.path.join(tmp, f) for f in ("fp32.onnx", "pre.onnx", "int8.onnx"))
        step = "writing the model for the quantizer"
        try:
            # a file, not the proto: quant_pre_process moves a proto's initializers to external data
            # it then cannot find (and would leave the caller's proto rewritten)
            if external:   # saving as external data rewrites the proto it is given
                work = onnx.ModelProto()
                work.CopyFrom(model)
                onnx.save(work, src, save_as_external_data=True, all_tensors_to_one_file=True)
            else:
                onnx.save(model, src)
            step = "pre-processing (quant_pre_process)"
            # static shapes: ONNX shape inference is enough, the symbolic pass is not needed
            quant_pre_process(src, pre, skip_symbolic_shape=True, save_as_external_data=external,
                              all_tensors_to_one_file=True)
            step = "calibration and quantization (quantize_static)"
            with _quiet_quantizer():
                quantize_static(pre, out, _Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
                                reduce_range=reduce_range, activation_type=QuantType.QUInt8,
                                weight_type=QuantType.QInt8,
                                calibrate_method=calib, use_external_data_format=external,
                                calibration_providers=["CPUExecutionProvider"])
            step = "reading the quantized model back"
            return onnx.load(out)
        except Exception as e:  # noqa: BLE001 - the quantizer raises many types; one clear error
            raise CompileError(f"ONNX Runtime int8 of '{name}' failed in {step}: {_first_line(e)}") from None


# ------------------------------------------------------------------------------------------------
# OpenVINO (NNCF)
# ------------------------------------------------------------------------------------------------
def looks_like_transformer(model: onnx.ModelProto) -> bool:
    """Whether `model` has attention (a Softmax beside MatMuls): NNCF then uses its transformer
    scheme, which keeps the accuracy-critical softmax/normalisation paths in floating point."""
    ops = {n.op_type for n in model.graph.node}
    return "Softmax" in ops and bool(ops & {"MatMul", "Gemm"})


def openvino_int8(model: onnx.ModelProto, calibration: list[dict[str, np.ndarray]], *,
                  model_type: str | None = None, name: str | None = None) -> "openvino.Model":
    """`model` read by OpenVINO and quantized by NNCF post-training quantization (FakeQuantize int8,
    target CPU, every calibration sample used for the statistics). `model_type` "transformer" or
    "cnn" picks NNCF's scheme; None decides by `looks_like_transformer`. Compile the result with
    `openvino.Core().compile_model(result, "CPU", ...)`. Raises CompileError naming the model and the
    step on failure. NNCF's progress bars and notices are not shown."""
    name = _name(model, name)
    if model_type not in (None, "transformer", "cnn"):
        raise CompileError(f"OpenVINO int8 of '{name}': model_type {model_type!r} is not 'transformer', 'cnn' "
                           "or None (decide from the model)")
    feeds = _feeds(model, calibration, "OpenVINO int8", name)
    try:
        import openvino as ov
    except Exception as e:  # noqa: BLE001 - ImportError or a missing shared library
        raise CompileError(f"OpenVINO int8 of '{name}': OpenVINO does not import: {_first_line(e)}") from None
    try:
        with _quiet_quantizer():                       # NNCF's banner prints to stdout
            import nncf
    except Exception as e:  # noqa: BLE001
        raise CompileError(f"OpenVINO int8 of '{name}': NNCF does not import ({_first_line(e)}); "
                           f"pip install nncf=={NNCF_VERSION}") from None
    transformer = looks_like_transformer(model) if model_type is None else model_type == "transformer"
    kwargs: dict[str, Any] = {"subset_size": len(feeds), "target_device": nncf.TargetDevice.CPU}
    if transformer:
        kwargs["model_type"] = nncf.ModelType.TRANSFORMER
    step = "reading the model into OpenVINO"
    try:
        with tempfile.TemporaryDirectory(prefix="tensorplan-int8-") as tmp:
            if _weight_bytes(model) > _EXTERNAL_DATA_BYTES:   # beyond protobuf's 2 GiB: through a file
                path = os.path.join(tmp, "model.onnx")
                work = onnx.ModelProto()
                work.CopyFrom(model)   # saving as external data rewrites the proto it is given
                onnx.save(work, path, save_as_external_data=True, all_tensors_to_one_file=True)
                ov_model = ov.Core().read_model(path)
            else:
                ov_model = ov.Core().read_model(model.SerializeToString(), b"")
            step = "NNCF post-training quantization"
            with _quiet_quantizer():
                return nncf.quantize(ov_model, nncf.Dataset(feeds), **kwargs)
    except Exception as e:  # noqa: BLE001 - OpenVINO and NNCF raise many types; one clear error
        raise CompileError(f"OpenVINO int8 of '{name}' failed in {step}: {_first_line(e)}") from None


__all__ = ["NNCF_VERSION", "ORT_METHODS", "looks_like_transformer", "openvino_int8", "ort_int8"]
