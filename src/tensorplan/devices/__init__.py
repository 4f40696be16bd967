"""Devices: `DeviceSpec` (what a cost model knows about a processor), the catalog of known devices with
datasheet figures, and detection of this machine with measured bandwidth and GEMM FLOP/s.

`resolve(name)` is the one entry point the rest of tensorplan uses to turn a device name into a spec.
"""
from __future__ import annotations

import re

from tensorplan.errors import TensorplanError
from tensorplan.devices.catalog import CATALOG, ALIASES, catalog_names, lookup, match_gpu_name
from tensorplan.devices.detect import cpu_info, local_cpu, local_devices, local_gpu, measure_bandwidth, measure_matmul
from tensorplan.devices.spec import FEATURE_NAMES, FEATURE_VERSION, ISA_FLAGS, DeviceSpec

__all__ = ["DeviceSpec", "resolve", "known_names", "CATALOG", "FEATURE_NAMES", "FEATURE_VERSION", "ISA_FLAGS",
           "cpu_info", "local_cpu", "local_gpu", "local_devices", "measure_bandwidth", "measure_matmul",
           "lookup", "match_gpu_name", "catalog_names"]

_LOCAL_T = re.compile(r"^local-(\d+)t$")


def known_names() -> list[str]:
    """Every name `resolve` accepts (canonical catalog names, then the local ones)."""
    return ["local", "local-1t", "local-2t", "local-<N>t", "local-gpu", *catalog_names()]


def resolve(name: str | DeviceSpec, *, refresh: bool = False) -> DeviceSpec:
    """Device name -> spec. 'local' = this CPU with all usable threads (measured numbers, cached);
    'local-Nt' = this CPU at N threads; 'local-gpu'/'cuda' = this machine's first CUDA GPU;
    otherwise a catalog name or alias, case-insensitive (e.g. 'h100', 'sd855-gpu', 'Adreno-640').
    """
    if isinstance(name, DeviceSpec):
        return name
    n = str(name).strip().lower().replace("_", "-")
    if n in ("local", "local-cpu", "cpu", "host"):
        return local_cpu(None, refresh=refresh)
    m = _LOCAL_T.match(n)
    if m:
        return local_cpu(int(m.group(1)), refresh=refresh)
    if n in ("local-gpu", "gpu", "cuda", "cuda:0", "local-gpu0"):
        g = local_gpu(0)
        if g is None:
            raise TensorplanError(f"device '{name}': no CUDA GPU is visible to torch on this machine; "
                                  "use 'local' (this CPU) or a catalog name such as 'h100'")
        return g
    spec = lookup(n)
    if spec is None:
        raise TensorplanError(f"unknown device '{name}'. Known: {', '.join(known_names())} "
                              f"(aliases such as 'h100', 'a100', 'adreno-640' work too; see `tensorplan devices`)")
    return spec
