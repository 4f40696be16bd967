"""Devices: `DeviceSpec` (what a cost model knows about a processor), the catalog of known devices with
datasheet figures, and detection of this machine with measured bandwidth and GEMM FLOP/s.

`device(name_or_path)` turns a name or a saved spec into a `DeviceSpec` once, at the API boundary;
everything after it receives the spec.
"""
from __future__ import annotations

import re
from pathlib import Path

from tensorplan.errors import TensorplanError
from tensorplan.devices.catalog import CATALOG, ALIASES, catalog_names, lookup, match_gpu_name
from tensorplan.devices.detect import (cpu_info, local_cpu, local_devices, local_gpu, measure_bandwidth, measure_matmul,
                                       usable_cores)
from tensorplan.devices.spec import FEATURE_NAMES, FEATURE_VERSION, ISA_FLAGS, DeviceSpec

__all__ = ["DeviceSpec", "device", "resolve", "default_threads", "is_local", "usable_cores", "known_names", "CATALOG",
           "FEATURE_NAMES", "FEATURE_VERSION", "ISA_FLAGS", "cpu_info", "local_cpu", "local_gpu", "local_devices",
           "measure_bandwidth", "measure_matmul", "lookup", "match_gpu_name", "catalog_names"]

_LOCAL_T = re.compile(r"^local-(\d+)t$")


def known_names() -> list[str]:
    """Every name `device` accepts (canonical catalog names, then the local ones)."""
    return ["local", "local-1t", "local-2t", "local-<N>t", "local-gpu", *catalog_names()]


def _is_spec_file(name: str | Path) -> bool:
    s = str(name)
    return isinstance(name, Path) or s.endswith(".json") or "/" in s


def device(name_or_path: str | Path | DeviceSpec = "local", *, refresh: bool = False) -> DeviceSpec:
    """A device as a `DeviceSpec`: 'local' = this CPU with every usable thread (measured numbers,
    cached); 'local-Nt' = this CPU at N threads; 'local-gpu'/'cuda' = this machine's first CUDA GPU;
    a path to a spec saved with `DeviceSpec.save` (a `.json` file); otherwise a catalog name or
    alias, case-insensitive (e.g. 'h100', 'sd855-gpu', 'Adreno-640'). A spec (or any object with a
    spec's fields) is returned as is."""
    if not isinstance(name_or_path, (str, Path)):
        return name_or_path
    if _is_spec_file(name_or_path):
        return DeviceSpec.load(name_or_path)
    n = str(name_or_path).strip().lower().replace("_", "-")
    if n in ("local", "local-cpu", "cpu", "host"):
        return local_cpu(None, refresh=refresh)
    m = _LOCAL_T.match(n)
    if m:
        return local_cpu(int(m.group(1)), refresh=refresh)
    if n in ("local-gpu", "gpu", "cuda", "cuda:0", "local-gpu0"):
        g = local_gpu(0)
        if g is None:
            raise TensorplanError(f"device '{name_or_path}': no CUDA GPU is visible to torch on this machine; "
                                  "use 'local' (this CPU) or a catalog name such as 'h100'")
        return g
    spec = lookup(n)
    if spec is None:
        raise TensorplanError(f"unknown device '{name_or_path}'. Known: {', '.join(known_names())} "
                              f"(aliases such as 'h100', 'a100', 'adreno-640' work too; see `tensorplan devices`), "
                              "or a spec file saved with `tensorplan devices --save PATH.json`")
    return spec


# The name cdmpp/ and codl/ call; `device` is the one to use.
resolve = device


def default_threads(spec: DeviceSpec | None = None) -> int:
    """Threads a runtime on this machine uses for `spec`: a local CPU spec's own count ('local-1t'
    runs at 1), otherwise every usable core. Why: plans and timings should use the machine they
    run on, not a fixed count."""
    cores = usable_cores()
    if spec is not None and spec.kind == "cpu" and (spec.name == "local" or _LOCAL_T.match(spec.name)):
        return max(1, min(int(spec.threads), cores))
    return cores


def is_local(spec: DeviceSpec) -> bool:
    """Whether `spec` names this machine ('local', 'local-Nt', 'local-gpu'): only then does timing
    plans here say anything about the device."""
    name = str(getattr(spec, "name", ""))
    return name == "local" or bool(_LOCAL_T.match(name)) or name.startswith("local-gpu")
