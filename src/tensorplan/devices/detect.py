"""Describe this machine: CPU from the OS plus two measured numbers (STREAM-style bandwidth, fp32 GEMM
FLOP/s), GPU from torch when CUDA is available.

Datasheet peaks overstate what kernels see (turbo vs AVX clocks, memory controllers, shared VMs), so
for `local` the roofline uses *measured* figures. They are cached in
`cache_dir()/device-<hash of hostname + CPU model>.json`, one entry per thread count, so only the first
call pays the ~seconds of measuring; `refresh=True` re-measures.

This module sits in the `devices` layer, so it carries its own tiny timing loop instead of importing
`tensorplan.measure`.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.paths import cache_dir
from tensorplan.devices.catalog import match_gpu_name
from tensorplan.devices.spec import DeviceSpec

CACHE_VERSION = 1

# The CPUs this process may use, read once at import: TVM's thread pool binds the *calling*
# thread to one core after a 1-thread kernel, and sched_getaffinity(0) reads that thread's mask,
# so asking later could make 'local' a 1-thread device (another store key) mid-run.
try:
    _PROCESS_AFFINITY = frozenset(os.sched_getaffinity(0))
except AttributeError:  # not Linux
    _PROCESS_AFFINITY = frozenset(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """CPUs this process may use (its affinity when tensorplan.devices was imported): the default
    thread count of every runtime, since the plan should use the machine it runs on."""
    return max(1, len(_PROCESS_AFFINITY))


# /proc/cpuinfo flag -> our ISA flag name
_X86_FLAGS = {"avx2": "avx2", "avx512f": "avx512f", "fma": "fma", "avx512_bf16": "bf16", "f16c": "fp16",
              "avx512_fp16": "fp16", "amx_tile": "amx", "avx512_vnni": "vnni", "avx_vnni": "vnni"}
_ARM_FLAGS = {"asimd": "neon", "neon": "neon", "sve": "sve", "sve2": "sve2", "fphp": "fp16", "asimdhp": "fp16",
              "bf16": "bf16", "i8mm": "i8mm"}
# /proc/cpuinfo flags that say how a CPU computes in reduced precision (tensorplan.precision.native reads
# them): kept verbatim beside `isa`, not in it, because `isa` is part of the device key and of the
# predictor's fixed feature vector, and it folds e.g. F16C (conversion only) and AVX512-FP16 (arithmetic)
# into one "fp16"
_X86_PRECISION_FLAGS = ("amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "avx512_bf16", "avx512_fp16", "avx512_vnni",
                        "avx_vnni", "avx_vnni_int8", "avx_ne_convert", "f16c", "avx512f", "avx2")
_ARM_PRECISION_FLAGS = ("bf16", "svebf16", "i8mm", "svei8mm", "asimddp", "fphp", "asimdhp", "sve", "sve2")


# ---------------------------------------------------------------------------------------------
# static description from the OS
# ---------------------------------------------------------------------------------------------
def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _parse_size_kb(s: str) -> float:
    s = s.strip().upper()
    if not s:
        return 0.0
    mult = {"K": 1, "M": 1024, "G": 1024 * 1024}.get(s[-1], None)
    try:
        return float(s[:-1]) * mult if mult else float(s) / 1024
    except ValueError:
        return 0.0


def machine_info(**extra: Any) -> dict[str, Any]:
    """What every benchmark JSON records about the machine it ran on: CPU model, cores, platform,
    Python and library versions, and the load average at the time of the call (the numbers of a
    shared machine mean little without it). `extra` is merged in (e.g. ``threads=2``)."""
    import importlib
    info: dict[str, Any] = {"cpu": cpu_info()["model"], "cores": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version(), "versions": {}}
    for lib in ("numpy", "scipy", "onnx", "onnxruntime", "torch", "tvm"):
        try:
            info["versions"][lib] = importlib.import_module(lib).__version__
        except (ImportError, AttributeError):
            continue
    with contextlib.suppress(OSError):
        info["loadavg"] = list(os.getloadavg())
    info.update(extra)
    return info


def cpu_info() -> dict[str, Any]:
    """Model, vendor, cores, usable threads, clock, caches and ISA flags of this CPU (no measuring)."""
    text = _read("/proc/cpuinfo")
    blocks = [b for b in text.split("\n\n") if b.strip()]
    first: dict[str, str] = {}
    cores_seen: set[tuple[str, str]] = set()
    mhz: list[float] = []
    for b in blocks:
        kv = {}
        for line in b.splitlines():
            if ":" in line:
                k, v = line.split(":", 1)
                kv[k.strip()] = v.strip()
        if not first:
            first = kv
        if "core id" in kv:
            cores_seen.add((kv.get("physical id", "0"), kv["core id"]))
        if "cpu MHz" in kv:
            with contextlib.suppress(ValueError):
                mhz.append(float(kv["cpu MHz"]))
    src: dict[str, str] = {}
    model = first.get("model name") or first.get("Hardware") or platform.processor() or platform.machine()
    if "model name" not in first and "CPU part" in first:
        model = f"{platform.machine()} CPU part {first['CPU part']}"
    if "cpu family" in first and "model" in first:
        # VMs often show a bare "AMD EPYC": family/model tell Zen 4 (25/17) from Zen 5 (26/2), so
        # two microarchitectures never share a device key (and a measured record's domain)
        model = f"{model} (family {first['cpu family']}, model {first['model']})"
    src["model"] = "/proc/cpuinfo"
    vendor_id = first.get("vendor_id", "")
    vendor = {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(vendor_id, vendor_id)
    if not vendor and "CPU implementer" in first:
        vendor = {"0x41": "Arm", "0x51": "Qualcomm", "0x48": "HiSilicon", "0x61": "Apple"}.get(first["CPU implementer"], "Arm")
    affinity = sorted(_PROCESS_AFFINITY)
    threads = len(affinity)
    src["threads"] = "os.sched_getaffinity(0) when tensorplan.devices was imported"
    online = os.cpu_count() or threads
    phys = len(cores_seen) if cores_seen else online
    # cores usable by this process: physical cores among the allowed logical CPUs
    sib = set()
    for c in affinity:
        s = _read(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").strip()
        sib.add(s or str(c))
    cores = min(len(sib), phys) if sib else threads
    src["cores"] = "/sys/devices/system/cpu/cpu*/topology/thread_siblings_list over os.sched_getaffinity"
    # clock: max frequency from cpufreq if exposed (VMs often hide it), else cpuinfo's current MHz
    fmax = _read("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").strip()
    if fmax.isdigit():
        clock, src["clock_ghz"] = int(fmax) / 1e6, "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
    elif mhz:
        clock, src["clock_ghz"] = max(mhz) / 1000, "/proc/cpuinfo 'cpu MHz' (current clock; cpufreq not exposed)"
    else:
        clock, src["clock_ghz"] = 0.0, "unknown (no cpufreq and no 'cpu MHz')"
    # caches from sysfs (lscpu reads the same files)
    l1 = l2 = l3 = 0.0
    for idx in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        level, ctype = _read(idx / "level").strip(), _read(idx / "type").strip()
        size = _parse_size_kb(_read(idx / "size"))
        if level == "1" and ctype in ("Data", "Unified"):
            l1 = size
        elif level == "2":
            l2 = size
        elif level == "3":
            l3 = size
    for k in ("l1_kb", "l2_kb", "l3_kb"):
        src[k] = "/sys/devices/system/cpu/cpu0/cache/index*/size"
    flags = set((first.get("flags") or first.get("Features") or "").split())
    table = _X86_FLAGS if "flags" in first else _ARM_FLAGS
    isa = sorted({ours for theirs, ours in table.items() if theirs in flags})
    if platform.machine() in ("aarch64", "arm64") and "neon" not in isa:
        isa.append("neon")  # NEON is mandatory on AArch64
    src["isa"] = "/proc/cpuinfo flags"
    precision_flags = sorted(f for f in (_X86_PRECISION_FLAGS if "flags" in first else _ARM_PRECISION_FLAGS)
                             if f in flags)
    src["precision_flags"] = "/proc/cpuinfo flags (verbatim)"
    mem_kb = 0.0
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = float(line.split()[1])
    src["mem_gb"] = "/proc/meminfo MemTotal"
    return dict(model=model, vendor=vendor, cores=cores, threads=threads, online_cpus=online, affinity=affinity,
                clock_ghz=round(clock, 3), l1_kb=l1, l2_kb=l2, l3_kb=l3, isa=isa, mem_gb=round(mem_kb / 2**20, 1),
                machine=platform.machine(), precision_flags=precision_flags, sources=src)


# ---------------------------------------------------------------------------------------------
# thread control and timing (self-contained: devices may not import measure/)
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    """Limit torch and BLAS/OpenMP pools in this process to n threads; restore afterwards."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        try:
            from threadpoolctl import threadpool_limits
        except ImportError:  # pragma: no cover - threadpoolctl comes with scikit-learn
            yield
        else:
            with threadpool_limits(limits=n):
                yield
    finally:
        torch.set_num_threads(old)


def _time_runs(fn: Callable[[], Any], *, warmup: int, min_runs: int, max_runs: int, budget_s: float) -> list[float]:
    for _ in range(warmup):
        fn()
    times: list[float] = []
    t_start = time.perf_counter()
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() - t_start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


# ---------------------------------------------------------------------------------------------
# measured numbers
# ---------------------------------------------------------------------------------------------
def measure_bandwidth(threads: int = 1, array_mb: float | None = None, runs: int = 10) -> dict[str, Any]:
    """STREAM-style copy (a=b) and triad (a=b+s*c) with torch on `threads` threads.

    Arrays default to max(4 x L3, 64 MiB) each so they stream from DRAM. Bytes counted as STREAM does:
    copy 2 x N x 4 (read b, write a), triad 3 x N x 4; write-allocate traffic is not counted. The
    figure is the best run (STREAM's convention: the least disturbed pass); the median is kept too.
    """
    import torch

    if array_mb is None:
        l3_mb = cpu_info()["l3_kb"] / 1024
        array_mb = min(max(4 * l3_mb, 64.0), 512.0)
    n = int(array_mb * 2**20 // 4)
    with _threads(threads):
        a = torch.empty(n, dtype=torch.float32)
        b = torch.empty(n, dtype=torch.float32)
        c = torch.empty(n, dtype=torch.float32)
        for arr, v in ((a, 0.0), (b, 1.0), (c, 2.0)):  # first touch (page faults) outside the timed region
            arr.fill_(v)

        def copy() -> None:
            a.copy_(b)

        def triad() -> None:
            torch.add(b, c, alpha=3.0, out=a)

        tc = _time_runs(copy, warmup=2, min_runs=runs, max_runs=runs, budget_s=0)
        tt = _time_runs(triad, warmup=2, min_runs=runs, max_runs=runs, budget_s=0)
        ok = bool(torch.allclose(a[:1024], torch.full((1024,), 7.0)))
    if not ok:  # pragma: no cover - would mean torch computed garbage
        raise TensorplanError("bandwidth probe: triad produced wrong values; torch build broken?")
    cb, tb = 2 * n * 4, 3 * n * 4
    return {
        "copy_gbs": cb / min(tc) / 1e9, "triad_gbs": tb / min(tt) / 1e9,
        "copy_gbs_median": cb / statistics.median(tc) / 1e9, "triad_gbs_median": tb / statistics.median(tt) / 1e9,
        "array_mb": array_mb, "threads": threads, "runs": runs,
        "method": (f"measured: STREAM-style copy/triad with torch {torch.__version__}, 3 arrays x {array_mb:.0f} MiB "
                   f"fp32, {threads} thread(s), bytes = read+write (copy 2N, triad 3N x 4 B), best of {runs}"),
    }


def _ort_matmul(n: int, threads: int) -> Callable[[], None]:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"])], "gemm",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [n, n]),
         helper.make_tensor_value_info("B", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [n, n])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)
    io = sess.io_binding()
    io.bind_cpu_input("A", a)
    io.bind_cpu_input("B", b)
    io.bind_output("C", "cpu", 0, np.float32, [n, n], c.ctypes.data)

    keep = (a, b, c)  # io binds raw pointers: the arrays must outlive the closure

    def run() -> None:
        assert keep
        sess.run_with_iobinding(io)

    run()
    if not np.allclose(c[:4, :4], a[:4] @ b[:, :4], rtol=1e-3, atol=1e-2):  # pragma: no cover
        raise TensorplanError("GEMM probe: ONNX Runtime MatMul result differs from numpy")
    return run


def _torch_matmul(n: int, threads: int) -> Callable[[], None]:
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    c = torch.empty(n, n)
    return lambda: torch.mm(a, b, out=c)


def _numpy_matmul(n: int, threads: int) -> Callable[[], None]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)
    return lambda: np.matmul(a, b, out=c)


GEMM_BACKENDS: dict[str, Callable[[int, int], Callable[[], None]]] = {
    "onnxruntime": _ort_matmul, "torch": _torch_matmul, "numpy": _numpy_matmul}


def measure_matmul(threads: int = 1, n: int = 1024, budget_s: float = 0.5,
                   backends: tuple[str, ...] = ("onnxruntime", "torch", "numpy")) -> dict[str, Any]:
    """fp32 GEMM n x n x n FLOP/s (2n^3 per call) with each backend on `threads` threads; the best counts.

    Per backend: best run over >= 3 runs within `budget_s`. The best backend is recorded because it is
    what a kernel library on this machine can reach (MLAS in ONNX Runtime is usually fastest here).
    """
    flop = 2.0 * n ** 3
    per: dict[str, dict[str, float]] = {}
    with _threads(threads):
        for name in backends:
            try:
                fn = GEMM_BACKENDS[name](n, threads)
            except ImportError:
                continue
            ts = _time_runs(fn, warmup=1, min_runs=3, max_runs=50, budget_s=budget_s)
            per[name] = {"gflops": flop / min(ts) / 1e9, "gflops_median": flop / statistics.median(ts) / 1e9,
                         "runs": len(ts)}
    if not per:
        raise TensorplanError(f"GEMM probe: none of the backends {backends} is installed")
    best = max(per, key=lambda k: per[k]["gflops"])
    return {"gflops": per[best]["gflops"], "backend": best, "per_backend": per, "n": n, "threads": threads,
            "method": (f"measured: fp32 GEMM {n}x{n}x{n} (2n^3 FLOP), {threads} thread(s), best run of each of "
                       f"{', '.join(per)}; best backend: {best}")}


# ---------------------------------------------------------------------------------------------
# local CPU spec with cached measurements
# ---------------------------------------------------------------------------------------------
def _cache_file(model: str) -> Path:
    h = hashlib.sha256(f"{socket.gethostname()}|{model}".encode()).hexdigest()[:16]
    return cache_dir() / f"device-{h}.json"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise measuring across processes (pytest -n 2 workers) so two probes never run at once."""
    lock = path.with_suffix(".lock")
    with open(lock, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _load_cache(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return d if d.get("version") == CACHE_VERSION else {}


def _measure_entry(threads: int, quick: bool) -> dict[str, Any]:
    bw = measure_bandwidth(threads, array_mb=16 if quick else None, runs=5 if quick else 10)
    mm = measure_matmul(threads, n=256 if quick else 1024, budget_s=0.1 if quick else 0.5)
    # the load average says whether a neighbour shared the cores while we measured (re-run with refresh)
    return {"bandwidth": bw, "matmul": mm, "quick": quick, "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "load_avg_1m": os.getloadavg()[0]}


def local_cpu(threads: int | None = None, *, refresh: bool = False, quick: bool = False) -> DeviceSpec:
    """This CPU at `threads` threads (None = every CPU this process may use), with measured peak/bandwidth.

    `quick` uses tiny probes (for tests); a quick entry is never served to a non-quick request.
    """
    info = cpu_info()
    max_t = info["threads"]
    t = max_t if threads is None else int(threads)
    if t < 1 or t > max_t:
        raise TensorplanError(f"device 'local-{t}t': this process may use {max_t} CPU(s) "
                              f"(os.sched_getaffinity); pick 1..{max_t} threads")
    path = _cache_file(info["model"])
    with _locked(path):
        cache = _load_cache(path)
        entry = cache.get("entries", {}).get(str(t))
        if refresh or entry is None or (entry.get("quick") and not quick):
            entry = _measure_entry(t, quick)
            cache = _load_cache(path) or {"version": CACHE_VERSION, "hostname": socket.gethostname(),
                                          "model": info["model"], "entries": {}}
            cache["entries"][str(t)] = entry
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(cache, indent=1))
            os.replace(tmp, path)
    bw, mm = entry["bandwidth"], entry["matmul"]
    name = "local" if threads is None else f"local-{t}t"
    src = dict(info["sources"])
    src["peak_fp32_gflops"] = mm["method"] + f" ({entry['when']}; cache {path})"
    src["mem_bw_gbs"] = bw["method"] + f"; figure = triad ({entry['when']}; cache {path})"
    cores = min(info["cores"], t)
    return DeviceSpec(
        name=name, kind="cpu", cores=cores, threads=t, clock_ghz=info["clock_ghz"],
        peak_fp32_gflops=round(mm["gflops"], 2), mem_bw_gbs=round(bw["triad_gbs"], 2),
        l1_kb=info["l1_kb"], l2_kb=info["l2_kb"], l3_kb=info["l3_kb"], isa=info["isa"], vendor=info["vendor"],
        sources=src, measured=True, model=info["model"], mem_gb=info["mem_gb"],
        extra={"copy_gbs": round(bw["copy_gbs"], 2), "gemm_backend": mm["backend"],
               "gemm_per_backend": mm["per_backend"], "quick": entry.get("quick", False),
               "hostname": socket.gethostname(), "measured_at": entry["when"],
               "load_avg_1m_when_measured": entry.get("load_avg_1m"), "precision_flags": info["precision_flags"]})


# ---------------------------------------------------------------------------------------------
# local GPU (torch)
# ---------------------------------------------------------------------------------------------
# fp32 lanes per SM by compute capability major.minor (CUDA C Programming Guide, arithmetic throughput table)
_LANES_PER_SM = {(7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128, (8, 9): 128, (9, 0): 128}


def local_gpu(index: int = 0) -> DeviceSpec | None:
    """The CUDA GPU `index` as torch sees it, datasheet peaks from the catalog when its name matches; None if no GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        return None
    p = torch.cuda.get_device_properties(index)
    mem_gb = p.total_memory / 2**30
    cat = match_gpu_name(p.name, mem_gb)
    cc = (p.major, p.minor)
    clock_khz = getattr(p, "clock_rate", 0) or 0
    src = {"cores": "torch.cuda.get_device_properties().multi_processor_count",
           "mem_gb": "torch.cuda.get_device_properties().total_memory",
           "l2_kb": "torch.cuda.get_device_properties().L2_cache_size"}
    if cat is not None:
        peak, bw, clock = cat.peak_fp32_gflops, cat.mem_bw_gbs, cat.clock_ghz
        for k in ("peak_fp32_gflops", "mem_bw_gbs", "clock_ghz", "l1_kb"):
            src[k] = f"catalog '{cat.name}': {cat.sources.get(k, '')}"
        l1, isa, threads = cat.l1_kb, cat.isa, cat.threads
    else:
        lanes = _LANES_PER_SM.get(cc, 128)
        clock = clock_khz / 1e6
        peak = p.multi_processor_count * lanes * 2 * clock
        bw, l1, isa, threads = 0.0, 0.0, ["fp16"], p.multi_processor_count * lanes
        src["peak_fp32_gflops"] = (f"derived: {p.multi_processor_count} SMs x {lanes} fp32 lanes (cc {cc[0]}.{cc[1]}) "
                                   f"x 2 x {clock:.3f} GHz (no catalog entry matches '{p.name}')")
        src["mem_bw_gbs"] = f"unknown: no catalog entry matches '{p.name}'"
        src["clock_ghz"] = "torch.cuda.get_device_properties().clock_rate"
    return DeviceSpec(
        name=f"local-gpu{index}" if index else "local-gpu", kind="gpu", cores=p.multi_processor_count,
        threads=threads, clock_ghz=round(clock, 3), peak_fp32_gflops=peak, mem_bw_gbs=bw, l1_kb=l1,
        l2_kb=(getattr(p, "L2_cache_size", 0) or 0) / 1024, l3_kb=0, isa=isa, vendor="NVIDIA", sources=src,
        measured=False, model=p.name, mem_gb=round(mem_gb, 1),
        extra={"compute_capability": f"{cc[0]}.{cc[1]}", "catalog": cat.name if cat else None})


def local_devices(*, refresh: bool = False, quick: bool = False) -> list[DeviceSpec]:
    """This machine: `local` (all usable CPUs), `local-1t`, `local-2t` (if >= 2 CPUs), then GPUs."""
    out = [local_cpu(None, refresh=refresh, quick=quick)]
    max_t = out[0].threads
    for t in (1, 2):
        if t <= max_t:  # t == max_t: same cache entry as 'local', measured just above
            out.append(local_cpu(t, refresh=refresh and t != max_t, quick=quick))
    try:
        import torch

        n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        n_gpu = 0
    out.extend(g for g in (local_gpu(i) for i in range(n_gpu)) if g is not None)
    return out

