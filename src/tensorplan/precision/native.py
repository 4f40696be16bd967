"""Which precisions a device computes natively, and through which instructions.

Why: a reduced precision only pays where the hardware has units for it. bf16 on a CPU without
AMX-BF16 or AVX512-BF16 is converted to fp32 and back around every operation, so it runs slower than
fp32; fp16 on x86 without AVX512-FP16/AMX-FP16 is the same; int8 without VNNI/AMX-INT8 uses 16-bit
multiply-adds and gains much less. `check_precision` turns that into a warning instead of a plan
that is silently slow.

The local CPU is read from /proc/cpuinfo (`devices.cpu_info()["precision_flags"]`, the flags
verbatim); a `DeviceSpec` carries them in `extra["precision_flags"]` when it was detected here, else
its coarse `isa` list is used (catalog entries).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tensorplan.devices.spec import DeviceSpec
from tensorplan.errors import TensorplanError

PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16", "int8")

# (flag, how it is named) in order of preference, per precision, on x86
_X86_UNITS = {
    "bf16": (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16")),
    "fp16": (("amx_fp16", "AMX-FP16"), ("avx512_fp16", "AVX512-FP16")),
    "int8": (("amx_int8", "AMX-INT8"), ("avx512_vnni", "AVX512-VNNI"), ("avx_vnni", "AVX-VNNI")),
}
_ARM_UNITS = {
    "bf16": (("bf16", "Arm BF16 (BFDOT/BFMMLA)"), ("svebf16", "SVE BF16")),
    "fp16": (("fphp", "Armv8.2 FP16 arithmetic"),),
    "int8": (("i8mm", "Arm I8MM (SMMLA)"), ("svei8mm", "SVE I8MM"), ("asimddp", "Arm dot product (SDOT)")),
}
# the coarse `isa` names of a DeviceSpec without verbatim flags (catalog entries)
_X86_ISA_UNITS = {"bf16": (("amx", "AMX"), ("bf16", "AVX512-BF16")), "fp16": (),
                  "int8": (("amx", "AMX"), ("vnni", "VNNI"))}
_ARM_ISA_UNITS = {"bf16": (("bf16", "Arm BF16"),), "fp16": (("fp16", "Armv8.2 FP16 arithmetic"),),
                  "int8": (("i8mm", "Arm I8MM"),)}


@dataclass
class PrecisionSupport:
    """How a device computes in `precision`: `native` when it has units for it, `via` which ones (or
    how it is emulated), `note` what that means for speed. `may_gain`: whether it can still run faster
    than fp32 here, so `--precision auto` measures it (native, or int8 through integer SIMD without
    dot-product units: 16-bit multiply-adds still do twice fp32's lanes; emulated bf16/fp16 never
    gain). None means `native`."""

    precision: str
    native: bool
    via: str
    note: str
    may_gain: bool | None = None

    def __post_init__(self) -> None:
        if self.may_gain is None:
            self.may_gain = self.native

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _device(spec: DeviceSpec | None) -> tuple[str, str, set[str], set[str], bool]:
    """(name, kind, verbatim flags, coarse isa, whether the flags are verbatim) of `spec` or the local CPU."""
    if spec is None:
        from tensorplan.devices.detect import cpu_info
        info = cpu_info()
        arch = "arm" if info["machine"] in ("aarch64", "arm64") else "x86"
        return f"this CPU ({info['model']})", arch, set(info["precision_flags"]), set(info["isa"]), True
    flags = (spec.extra or {}).get("precision_flags")
    if spec.kind == "gpu":
        return spec.name, "gpu", set(), set(spec.isa), False
    arm = bool({"neon", "sve", "sve2"} & set(spec.isa))
    return spec.name, "arm" if arm else "x86", set(flags or ()), set(spec.isa), flags is not None


def _units_present(units, have: set[str]) -> str | None:
    """The preferred unit `have` offers, naming the others it also has; None when it has none."""
    names = [label for flag, label in units if flag in have]
    if not names:
        return None
    return names[0] + (f" (also {', '.join(names[1:])})" if len(names) > 1 else "")


def native_precisions(spec: DeviceSpec | None = None) -> dict[str, PrecisionSupport]:
    """Per precision in PRECISIONS, whether `spec` (default: this machine's CPU, from /proc/cpuinfo,
    nothing measured) runs it natively and through what: bf16 native with AMX-BF16 or AVX512-BF16,
    fp16 with AVX512-FP16/AMX-FP16 (x86) or Armv8.2 FP16, int8 with AMX-INT8, AVX512-VNNI or AVX-VNNI
    (x86) or I8MM/dot product (Arm), fp32 always. GPUs: fp16 everywhere, bf16 and int8 per the
    catalog's `isa` (tensor cores)."""
    name, kind, flags, isa, verbatim = _device(spec)
    out = {"fp32": PrecisionSupport("fp32", True, _fp32_units(kind, flags | isa), "the reference precision")}
    if kind == "gpu":
        tc = "tensor_cores" in isa
        out["fp16"] = PrecisionSupport("fp16", True, "tensor cores" if tc else "CUDA fp16 arithmetic",
                                       "half the bytes of fp32 and, with tensor cores, many times its FLOP/s")
        out["bf16"] = (PrecisionSupport("bf16", True, "tensor cores (bf16)", "fp32's range at fp16's cost")
                       if "bf16" in isa else
                       PrecisionSupport("bf16", False, "converted to fp32 (no bf16 units)",
                                        "this GPU has no bf16 arithmetic: bf16 would be emulated; use fp16"))
        out["int8"] = (PrecisionSupport("int8", True, "tensor cores (int8)", "needs calibration; the fastest")
                       if tc else
                       PrecisionSupport("int8", False, "dp4a/CUDA cores", "no int8 tensor cores: small gain"))
        return {p: out[p] for p in PRECISIONS}
    units = (_ARM_UNITS if kind == "arm" else _X86_UNITS) if verbatim else \
        (_ARM_ISA_UNITS if kind == "arm" else _X86_ISA_UNITS)
    have = flags if verbatim else isa
    for p in ("bf16", "fp16", "int8"):
        via = _units_present(units[p], have)
        if via is not None:
            out[p] = PrecisionSupport(p, True, via, _NATIVE_NOTE[p])
        else:
            out[p] = _emulated(p, kind, have, verbatim, name)
            if not verbatim:
                out[p].note += (" (read from the device's ISA list, which may leave such units out; a spec "
                                "detected on the machine itself carries its /proc/cpuinfo flags)")
    return {p: out[p] for p in PRECISIONS}


_NATIVE_NOTE = {
    "bf16": "bf16 arithmetic units: about half the time of fp32 in compute-bound layers",
    "fp16": "fp16 arithmetic units",
    "int8": "int8 dot-product units (needs calibration data)",
}


def _fp32_units(kind: str, have: set[str]) -> str:
    if kind == "x86":
        return "AVX-512" if "avx512f" in have else "AVX2/FMA" if "avx2" in have else "SSE"
    return "SVE" if "sve" in have else "NEON" if kind == "arm" else "CUDA cores"


def _emulated(p: str, kind: str, have: set[str], verbatim: bool, device: str) -> PrecisionSupport:
    """The support entry of a precision `device` has no units for."""
    if p == "bf16":
        need = "AMX-BF16 or AVX512-BF16" if kind == "x86" else "the Arm BF16 extension"
        return PrecisionSupport("bf16", False, "converted to and from fp32 around each operation",
                                f"no bf16 units ({need}) on {device}: bf16 would be emulated and slower than fp32")
    if p == "fp16":
        if kind == "x86":
            conv = "F16C conversion, computed in fp32" if "f16c" in have or not verbatim else "converted in software"
            return PrecisionSupport("fp16", False, conv,
                                    f"no fp16 arithmetic (AVX512-FP16 / AMX-FP16) on {device}: fp16 would be "
                                    "converted to fp32, no faster and usually slower than fp32")
        return PrecisionSupport("fp16", False, "converted to fp32",
                                f"no FP16 arithmetic (Armv8.2 FP16) on {device}: fp16 would be emulated")
    vnni = "AMX-INT8, AVX512-VNNI or AVX-VNNI" if kind == "x86" else "I8MM or the dot-product extension"
    via = ("16-bit multiply-adds (AVX2/AVX-512 without VNNI)" if kind == "x86" else "widening NEON multiplies")
    simd = bool({"avx2", "avx512f", "avx512bw"} & have) if kind == "x86" else True   # NEON is baseline on Arm
    return PrecisionSupport("int8", False, via,
                            f"no int8 dot-product units ({vnni}) on {device}: int8 gains less over fp32 "
                            "(measured, not assumed), and weights are quantized to 7 bits against saturation",
                            may_gain=simd)


def check_precision(precision: str, spec: DeviceSpec | None = None) -> str | None:
    """None when `spec` (default: this CPU) runs `precision` natively; otherwise a warning saying it
    would be emulated (and slower) and why. Raises TensorplanError for a precision not in PRECISIONS."""
    if precision not in PRECISIONS:
        raise TensorplanError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    s = native_precisions(spec)[precision]
    return None if s.native else f"{precision} is not native here ({s.via}): {s.note}"


__all__ = ["PRECISIONS", "PrecisionSupport", "check_precision", "native_precisions"]
