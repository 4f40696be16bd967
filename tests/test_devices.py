"""Devices: catalog figures and their sources, name resolution, spec (de)serialisation and features,
and real probes of this machine (bandwidth, GEMM FLOP/s) with their cache."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tensorplan.devices.catalog import CATALOG, match_gpu_name
from tensorplan.devices.spec import FEATURE_NAMES, DeviceSpec
from tensorplan.devices.detect import cpu_info, local_cpu, local_gpu, measure_bandwidth, measure_matmul
from tensorplan.devices import device
from tensorplan.errors import TensorplanError

REQUIRED = ["t4", "v100", "a100", "h100", "h200", "rtx4090", "xeon-8380", "epyc-7763", "epyc-9654",
            "graviton2", "graviton3", "sd855-cpu", "sd855-prime", "sd855-gpu", "sd865-cpu", "sd865-prime",
            "sd865-gpu", "sd888-cpu", "sd888-prime", "sd888-gpu", "kirin990-cpu", "kirin990-prime", "kirin990-gpu"]
FIGURES = ["cores", "threads", "clock_ghz", "peak_fp32_gflops", "mem_bw_gbs", "l1_kb", "l2_kb", "l3_kb", "isa"]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One cache dir for the tests that measure this machine, so each thread count is measured once."""
    d = tmp_path_factory.mktemp("tpcache")
    old = os.environ.get("TENSORPLAN_CACHE")
    os.environ["TENSORPLAN_CACHE"] = str(d)
    yield d
    if old is None:
        os.environ.pop("TENSORPLAN_CACHE", None)
    else:
        os.environ["TENSORPLAN_CACHE"] = old


# ---- catalog -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", REQUIRED)
def test_catalog_has_device_with_sourced_figures(name):
    d = device(name)
    assert d.peak_fp32_gflops > 0 and d.mem_bw_gbs > 0 and d.clock_ghz > 0 and d.cores >= 1
    for f in FIGURES:
        assert d.sources.get(f), f"{d.name}: figure {f} has no source"
    # every peak is either a vendor figure with a document, or derived with its formula stated
    src = d.sources["peak_fp32_gflops"]
    assert "http" in src or "derived" in src


def test_derived_peaks_match_their_formula():
    """Where the source says 'derived: A x B GHz x C', the stored number is that product."""
    checked = 0
    for d in CATALOG.values():
        src = d.sources["peak_fp32_gflops"]
        m = re.match(r"derived: (\d+) cores x ([\d.]+) GHz \(base\) x (\d+) fp32", src)
        if m:
            assert d.peak_fp32_gflops == pytest.approx(int(m[1]) * float(m[2]) * int(m[3]), rel=1e-3), d.name
            checked += 1
        m = re.search(r"= ([\d.]+) GFLOP/s", src)
        if m:
            assert d.peak_fp32_gflops == pytest.approx(float(m[1]), rel=1e-3), d.name
            checked += 1
    assert checked >= 15


def test_known_datasheet_numbers():
    assert device("h100").peak_fp32_gflops == 67000 and device("h100").mem_bw_gbs == 3350
    assert device("T4").mem_bw_gbs == 320 and device("t4").cores == 40
    assert device("H200").mem_bw_gbs == 4800
    assert device("sd855-gpu").peak_fp32_gflops == pytest.approx(898.6, abs=0.1)   # Adreno 640
    assert device("kirin990-gpu").peak_fp32_gflops == pytest.approx(460.8, abs=0.1)  # Mali-G76 MP16
    # the Snapdragon 888 prime core (Cortex-X1) has twice the FMA width of the A78s around it
    assert device("sd888-prime").peak_fp32_gflops == pytest.approx(2 * device("sd855-prime").peak_fp32_gflops, rel=1e-2)
    # a mobile CPU cluster and its GPU share the SoC's DRAM bandwidth
    assert device("sd865-cpu").mem_bw_gbs == device("sd865-gpu").mem_bw_gbs == pytest.approx(44.0)


@pytest.mark.parametrize("alias,canon", [("H100", "h100-sxm"), ("sd855_gpu", "sd855-gpu"), ("Adreno-640", "sd855-gpu"),
                                         ("a100", "a100-sxm4-40gb"), ("Mali-G76 MP16", "kirin990-gpu"),
                                         ("RTX 4090", "rtx4090"), ("EPYC-7763", "epyc-7763")])
def test_device_aliases_case_insensitive(alias, canon):
    assert device(alias).name == canon


def test_device_unknown_lists_known_names():
    with pytest.raises(TensorplanError) as e:
        device("tpu-v9")
    msg = str(e.value)
    assert "tpu-v9" in msg and "h100-sxm" in msg and "local" in msg and "sd855-gpu" in msg


@pytest.mark.parametrize("gpu_name,expected", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"), ("Tesla T4", "t4"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"), ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"), ("NVIDIA H200", "h200-sxm"), ("Tesla V100-SXM2-16GB", "v100-sxm2"),
    ("NVIDIA GeForce GTX 1080", None)])
def test_match_gpu_name(gpu_name, expected):
    m = match_gpu_name(gpu_name, 80)
    assert (m.name if m else None) == expected


# ---- spec ------------------------------------------------------------------------------------------
def test_spec_roundtrip_and_key():
    d = device("epyc-9654")
    d2 = DeviceSpec.from_dict(json.loads(json.dumps(d.to_dict())))
    assert d2 == d and d2.key() == d.key()
    # re-measured throughput does not change identity; a different core count does
    d2.mem_bw_gbs *= 0.9
    d2.sources["mem_bw_gbs"] = "measured: again"
    assert d2.key() == d.key()
    d2.cores = 48
    assert d2.key() != d.key()
    assert len({CATALOG[n].key() for n in CATALOG}) == len(CATALOG)


def test_spec_validation():
    with pytest.raises(TensorplanError, match="kind"):
        DeviceSpec(name="x", kind="tpu", cores=1, threads=1, clock_ghz=1, peak_fp32_gflops=1, mem_bw_gbs=1)
    with pytest.raises(TensorplanError, match="mem_bw_gbs"):
        DeviceSpec.from_dict({"name": "x", "kind": "cpu", "cores": 1, "threads": 1, "clock_ghz": 1,
                              "peak_fp32_gflops": 1})


def test_feature_vector_order_and_scale():
    vecs = {n: CATALOG[n].feature_vector() for n in CATALOG}
    for n, v in vecs.items():
        assert v.shape == (len(FEATURE_NAMES),) and v.dtype == np.float32 and np.isfinite(v).all(), n
    i = {name: k for k, name in enumerate(FEATURE_NAMES)}
    assert vecs["h100-sxm"][i["is_gpu"]] == 1 and vecs["epyc-7763"][i["is_gpu"]] == 0
    assert vecs["h100-sxm"][i["log10_peak_gflops"]] == pytest.approx(math.log10(1 + 67000))
    assert vecs["h100-sxm"][i["log10_peak_gflops"]] > vecs["t4"][i["log10_peak_gflops"]]
    assert vecs["epyc-9654"][i["isa_avx512f"]] == 1 and vecs["epyc-7763"][i["isa_avx512f"]] == 0
    assert vecs["graviton3"][i["isa_sve"]] == 1 and vecs["graviton3"][i["isa_neon"]] == 1
    # log scaling keeps a phone GPU and a data-centre GPU within a few units per feature (inputs to an MLP)
    assert np.abs(vecs["h200-sxm"] - vecs["sd855-gpu"]).max() < 6


# ---- this machine --------------------------------------------------------------------------------
def test_cpu_info_matches_os():
    from tensorplan.devices.detect import _PROCESS_AFFINITY

    info = cpu_info()
    # the process's CPUs as read at import: once an earlier test in this worker has run a 1-thread
    # TVM kernel, TVM has bound this thread to one core and sched_getaffinity(0) reads that
    assert info["threads"] == len(_PROCESS_AFFINITY) >= len(os.sched_getaffinity(0))
    assert 1 <= info["cores"] <= info["threads"]
    flags = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            flags = line.split(":", 1)[1].split()
            break
    if "avx2" in flags:
        assert "avx2" in info["isa"]
    else:
        assert "avx2" not in info["isa"]
    if Path("/sys/devices/system/cpu/cpu0/cache/index0").exists():
        assert info["l1_kb"] > 0 and info["l2_kb"] > 0


def test_bandwidth_probe_is_real():
    r = measure_bandwidth(threads=1, array_mb=8, runs=3)
    # 8 MiB arrays may sit in cache: only sanity bounds (a real copy of 16 MiB is neither free nor glacial)
    assert 0.3 < r["copy_gbs"] < 5000 and 0.3 < r["triad_gbs"] < 5000
    assert r["triad_gbs"] >= r["triad_gbs_median"] * 0.999  # best >= median
    assert "read+write" in r["method"]


def test_matmul_probe_is_real():
    r = measure_matmul(threads=1, n=192, budget_s=0.05)
    assert set(r["per_backend"]) >= {"onnxruntime", "torch", "numpy"}
    assert r["gflops"] == max(v["gflops"] for v in r["per_backend"].values())
    assert r["backend"] in r["per_backend"]
    # 2*192^3 FLOP in >1 GFLOP/s on any machine that runs this suite, < 10 TFLOP/s on one core
    assert 1.0 < r["gflops"] < 10_000


def test_local_cpu_cache_and_refresh(tmp_cache):
    t0 = time.perf_counter()
    a = local_cpu(1, quick=True)
    first = time.perf_counter() - t0
    files = list(tmp_cache.glob("device-*.json"))
    assert len(files) == 1
    t0 = time.perf_counter()
    b = local_cpu(1, quick=True)
    second = time.perf_counter() - t0
    assert b.peak_fp32_gflops == a.peak_fp32_gflops and b.mem_bw_gbs == a.mem_bw_gbs
    assert second < first and second < 0.5
    assert a.measured and a.name == "local-1t" and a.threads == 1
    assert "measured" in a.sources["mem_bw_gbs"] and "measured" in a.sources["peak_fp32_gflops"]
    time.sleep(1.1)  # the timestamp has 1 s resolution
    c = local_cpu(1, quick=True, refresh=True)
    assert c.extra["measured_at"] != a.extra["measured_at"]
    cached = json.loads(files[0].read_text())
    assert cached["entries"]["1"]["when"] == c.extra["measured_at"]


def test_local_thread_count_out_of_range():
    with pytest.raises(TensorplanError, match="local-999t"):
        device("local-999t")


def test_device_local_measures_once(shared_cache):
    d = device("local-1t")
    assert d.kind == "cpu" and d.threads == 1 and d.measured and not d.extra["quick"]
    assert d.peak_fp32_gflops > 1 and d.mem_bw_gbs > 0.5
    assert d.extra["gemm_backend"] in ("onnxruntime", "torch", "numpy")
    t0 = time.perf_counter()
    again = device("local-1t")
    assert time.perf_counter() - t0 < 0.5 and again.key() == d.key()


def test_local_gpu_absent_or_described():
    g = local_gpu()
    import torch

    if not torch.cuda.is_available():
        assert g is None
        with pytest.raises(TensorplanError, match="no CUDA GPU"):
            device("local-gpu")


@pytest.mark.gpu
def test_local_gpu_properties():
    import torch

    g = local_gpu()
    assert g.kind == "gpu" and g.cores == torch.cuda.get_device_properties(0).multi_processor_count
    assert g.peak_fp32_gflops > 0 and g.mem_gb > 0


def test_cli_devices_json(shared_cache):
    from typer.testing import CliRunner

    from tensorplan.cli import app

    r = CliRunner().invoke(app, ["devices", "--json", "--quick"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    names = [d["name"] for d in out["local"]]
    assert names[0] == "local" and "local-1t" in names
    assert all(d["measured"] and d["mem_bw_gbs"] > 0 for d in out["local"] if d["kind"] == "cpu")
    assert {d["name"] for d in out["catalog"]} >= {"h100-sxm", "sd855-gpu", "kirin990-gpu"}


def test_cli_devices_saves_this_cpu_and_every_command_takes_the_file(shared_cache, tmp_path):
    from typer.testing import CliRunner

    from tensorplan.cli import app

    path = tmp_path / "my-cpu.json"
    r = CliRunner().invoke(app, ["devices", "--local", "--quick", "--save", str(path)])
    assert r.exit_code == 0, r.output
    saved = device(path)
    assert saved.key() == device("local").key() and saved.to_dict() == json.loads(path.read_text())
    r = CliRunner().invoke(app, ["orchestrate", "tiny-mlp", "--cost", "analytical", "--device", str(path),
                                 "--no-race", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["device"] == "local"


def test_default_threads_follow_the_device_and_this_machine(shared_cache):
    from tensorplan.devices import default_threads, usable_cores
    # in a fresh process: here, a TVM kernel run at 1 thread earlier in this worker may have bound the
    # calling thread to one core, which is why usable_cores reads the affinity once, at import
    code = "import os; from tensorplan.devices import usable_cores; print(usable_cores(), len(os.sched_getaffinity(0)))"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    mine, theirs = map(int, got.stdout.split())
    assert mine == theirs >= 1
    assert default_threads(device("local-1t")) == 1
    assert default_threads(device("local")) == default_threads(device("h100")) == default_threads() == usable_cores()


def test_machine_info_describes_this_machine():
    from tensorplan.devices.detect import machine_info
    info = machine_info(threads=2)
    assert info["cpu"] and info["cores"] == os.cpu_count() and info["threads"] == 2
    assert info["versions"]["numpy"] == np.__version__ and "onnxruntime" in info["versions"]
    assert len(info["loadavg"]) == 3
