"""Known devices with datasheet figures; every figure names its source.

Figures are the vendors' published ones (boost clock, fp32 non-tensor peak, theoretical DRAM bandwidth).
Where a vendor publishes no FLOP/s figure (CPUs, mobile GPUs) the peak is *derived* as
cores x clock x fp32 FLOPs/cycle, and the source string says so and which document gives the
FLOPs/cycle (FMA width and count per core). Mobile CPU entries describe the big cores only
(`-cpu`: the prime + performance cluster CoDL-style co-execution uses) and the prime core alone
(`-prime`); memory bandwidth is the SoC's LPDDR peak, shared by CPU and GPU.
"""
from __future__ import annotations

from tensorplan.devices.spec import DeviceSpec

# -- document titles and URLs (one place, reused in the source strings) --------------------
_T4 = "NVIDIA T4 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"
_TURING = "NVIDIA Turing GPU Architecture whitepaper WP-09183-001, https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf"
_V100 = "NVIDIA Tesla V100 datasheet, https://images.nvidia.com/content/technologies/volta/pdf/tesla-volta-v100-datasheet-letter-fnl-web.pdf"
_VOLTA = "NVIDIA Tesla V100 GPU Architecture whitepaper WP-08608-001, https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet, https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
_AMPERE = "NVIDIA A100 Tensor Core GPU Architecture whitepaper, https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf"
_H100 = "NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_HOPPER = "NVIDIA H100 Tensor Core GPU Architecture whitepaper, https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
_H200 = "NVIDIA H200 Tensor Core GPU product page/datasheet, https://www.nvidia.com/en-us/data-center/h200/"
_ADA = "NVIDIA Ada GPU Architecture whitepaper, https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"
_X8380 = "Intel ARK: Intel Xeon Platinum 8380 Processor, https://www.intel.com/content/www/us/en/products/sku/212287/intel-xeon-platinum-8380-processor-60m-cache-2-30-ghz/specifications.html"
_ICX = "Intel 64 and IA-32 Architectures Optimization Reference Manual (Ice Lake server: 48 KiB L1D, 1.25 MiB L2, 2x 512-bit FMA units)"
_E7763 = "AMD EPYC 7763 product page, https://www.amd.com/en/products/processors/server/epyc/7003-series/amd-epyc-7763.html"
_ZEN3 = "AMD Software Optimization Guide for AMD EPYC 7003 Processors (Zen 3: 32 KiB L1D, 512 KiB L2, 2x 256-bit FMA)"
_E9654 = "AMD EPYC 9654 product page, https://www.amd.com/en/products/processors/server/epyc/4th-generation-9004-and-8004-series/amd-epyc-9654.html"
_ZEN4 = "AMD Software Optimization Guide for AMD EPYC 9004 Processors (Zen 4: 32 KiB L1D, 1 MiB L2, AVX-512 on 2x 256-bit FMA)"
_GRV = "AWS Graviton processor page, https://aws.amazon.com/ec2/graviton/"
_N1 = "Arm Neoverse N1 Technical Reference Manual, https://developer.arm.com/documentation/100616/latest (64 KiB L1D, 2x 128-bit FP/NEON FMA pipes)"
_V1 = "Arm Neoverse V1 Technical Reference Manual, https://developer.arm.com/documentation/101427/latest (64 KiB L1D, 2x 256-bit SVE / 4x 128-bit NEON FMA pipes)"
_C7G = "Amazon EC2 C7g instances (Graviton3: DDR5-4800, 64 cores), https://aws.amazon.com/ec2/instance-types/c7g/"
_SD855 = "Qualcomm Snapdragon 855 Mobile Platform product brief, https://www.qualcomm.com/products/mobile/snapdragon/smartphones/snapdragon-8-series-mobile-platforms/snapdragon-855-mobile-platform"
_SD865 = "Qualcomm Snapdragon 865 5G Mobile Platform product brief, https://www.qualcomm.com/products/mobile/snapdragon/smartphones/snapdragon-8-series-mobile-platforms/snapdragon-865-5g-mobile-platform"
_SD888 = "Qualcomm Snapdragon 888 5G Mobile Platform product brief, https://www.qualcomm.com/products/mobile/snapdragon/smartphones/snapdragon-8-series-mobile-platforms/snapdragon-888-5g-mobile-platform"
_AT855 = "AnandTech, 'The Snapdragon 855 Performance Preview' (cache sizes), https://www.anandtech.com/show/13786/snapdragon-855-performance-preview"
_AT865 = "AnandTech, 'The Snapdragon 865 Performance Preview' (cache sizes), https://www.anandtech.com/show/15207/the-snapdragon-865-performance-preview-setting-the-stage-for-flagship-android-2020"
_AT888 = "AnandTech, 'The Snapdragon 888 vs The Exynos 2100: Cortex-X1 & 5nm' (cache sizes), https://www.anandtech.com/show/16463/snapdragon-888-vs-exynos-2100-galaxy-s21-ultra"
_A76 = "Arm Cortex-A76 Technical Reference Manual, https://developer.arm.com/documentation/100798/latest (2x 128-bit NEON FMA pipes = 16 fp32 FLOP/cycle)"
_A77 = "Arm Cortex-A77 Technical Reference Manual, https://developer.arm.com/documentation/101111/latest (2x 128-bit NEON FMA pipes = 16 fp32 FLOP/cycle)"
_X1 = "Arm Cortex-X1 Technical Reference Manual, https://developer.arm.com/documentation/101433/latest (4x 128-bit NEON FMA pipes = 32 fp32 FLOP/cycle)"
_A78 = "Arm Cortex-A78 Technical Reference Manual, https://developer.arm.com/documentation/101430/latest (2x 128-bit NEON FMA pipes = 16 fp32 FLOP/cycle)"
_ADRENO = "Wikipedia 'Adreno' (ALU counts and clocks; Qualcomm publishes no FLOP figure), https://en.wikipedia.org/wiki/Adreno"
_K990 = "HiSilicon Kirin 990 product page, https://www.hisilicon.com/en/products/Kirin/Kirin-flagship-chips/Kirin-990"
_ATK980 = "AnandTech, 'HiSilicon Kirin 980' (same A76 complex: 512 KiB L2 per big core, 4 MiB L3), https://www.anandtech.com/show/13298/hisilicon-announces-the-kirin-980-first-a76-g76-on-7nm"
_G76 = "Arm Mali-G76 product page, https://developer.arm.com/Processors/Mali-G76 (3 execution engines x 8 fp32 FMA lanes per core)"
_NOTPUB = "not published by the vendor (0 = unknown)"


def _lpddr(mts: float, bus_bits: int = 64) -> float:
    return mts * bus_bits / 8 / 1000.0


def _server_cpu(name, model, vendor, cores, threads, base, flop_cycle, l1, l2, l3, channels, ddr_mts, isa,
                main_src, arch_src, aliases, extra_src=None, mem_src=None):
    peak = cores * base * flop_cycle
    bw = channels * ddr_mts * 8 / 1000.0
    src = {
        "cores": main_src, "threads": main_src, "clock_ghz": f"base clock; {main_src}",
        "peak_fp32_gflops": f"derived: {cores} cores x {base} GHz (base) x {flop_cycle} fp32 FLOP/cycle; FLOP/cycle from {arch_src}",
        "mem_bw_gbs": mem_src or f"derived: {channels} channels x DDR-{ddr_mts} x 8 B = {bw:.1f} GB/s; {main_src}",
        "l1_kb": arch_src, "l2_kb": arch_src, "l3_kb": main_src, "isa": arch_src,
    }
    if extra_src:
        src.update(extra_src)
    return DeviceSpec(name=name, kind="cpu", cores=cores, threads=threads, clock_ghz=base, peak_fp32_gflops=round(peak, 1),
                      mem_bw_gbs=round(bw, 1), l1_kb=l1, l2_kb=l2, l3_kb=l3, isa=isa, vendor=vendor, sources=src,
                      model=model, aliases=aliases)


def _nv_gpu(name, model, sms, cuda_cores, boost, peak_tflops, bw, mem_gb, l1_sm, l2, isa, sheet, arch, aliases, match,
            *, l2_src=None, tvm_tag=None):
    """`tvm_tag`: the TVM CUDA target to schedule for when TVM has no tag of this GPU's own (a GPU of
    the same die, whose per-block limits are this one's)."""
    src = {
        "cores": f"SM count; {arch}", "threads": f"fp32 CUDA cores ({cuda_cores}); {arch}",
        "clock_ghz": f"boost clock; {arch}",
        "peak_fp32_gflops": f"{sheet} (fp32, non-tensor; = {cuda_cores} cores x 2 x {boost} GHz)",
        "mem_bw_gbs": sheet, "mem_gb": sheet, "l1_kb": f"L1/shared per SM; {arch}", "l2_kb": l2_src or arch,
        "l3_kb": "no L3", "isa": arch,
    }
    extra = {"match": match, **({"tvm_tag": tvm_tag} if tvm_tag else {})}
    return DeviceSpec(name=name, kind="gpu", cores=sms, threads=cuda_cores, clock_ghz=boost,
                      peak_fp32_gflops=peak_tflops * 1000.0, mem_bw_gbs=bw, l1_kb=l1_sm, l2_kb=l2, l3_kb=0,
                      isa=isa, vendor="NVIDIA", sources=src, model=model, mem_gb=mem_gb, aliases=aliases,
                      extra=extra)


def _mobile_cpu(name, model, vendor, clusters, l1, l2, l3, bw_mts, isa, brief, cache_src, aliases):
    """clusters: list of (count, clock_ghz, flop_per_cycle, core_name, trm)."""
    cores = sum(c[0] for c in clusters)
    peak = sum(c[0] * c[1] * c[2] for c in clusters)
    clock = sum(c[0] * c[1] for c in clusters) / cores
    terms = " + ".join(f"{c[0]}x {c[3]} @ {c[1]} GHz x {c[2]}" for c in clusters)
    trms = "; ".join(sorted({c[4] for c in clusters}))
    bw = _lpddr(bw_mts)
    src = {
        "cores": brief, "threads": brief,
        "clock_ghz": f"derived: mean clock of the cores listed ({', '.join(f'{c[0]}x {c[1]} GHz' for c in clusters)}); {brief}",
        "peak_fp32_gflops": f"derived: {terms} fp32 FLOP/cycle = {peak:.1f} GFLOP/s; {trms}",
        "mem_bw_gbs": f"derived: LPDDR {bw_mts:.0f} MT/s x 64-bit bus = {bw:.1f} GB/s (shared with the GPU); {brief}",
        "l1_kb": trms, "l2_kb": f"per core ({'first listed core' if len(clusters) > 1 else 'this core'}); {cache_src}",
        "l3_kb": cache_src, "isa": trms,
    }
    return DeviceSpec(name=name, kind="cpu", cores=cores, threads=cores, clock_ghz=round(clock, 3),
                      peak_fp32_gflops=round(peak, 1), mem_bw_gbs=round(bw, 1), l1_kb=l1, l2_kb=l2, l3_kb=l3,
                      isa=isa, vendor=vendor, sources=src, model=model, aliases=aliases)


def _mobile_gpu(name, model, vendor, units, unit_desc, lanes, clock, flop_per_lane, bw_mts, isa, src_peak, brief, aliases):
    peak = units * lanes * flop_per_lane * clock
    bw = _lpddr(bw_mts)
    src = {
        "cores": f"{unit_desc}; {src_peak}", "threads": f"fp32 lanes in total; {src_peak}",
        "clock_ghz": src_peak,
        "peak_fp32_gflops": f"derived: {units * lanes} fp32 lanes x {flop_per_lane} (FMA) x {clock} GHz = {peak:.1f} GFLOP/s; {src_peak}",
        "mem_bw_gbs": f"derived: SoC LPDDR {bw_mts:.0f} MT/s x 64-bit = {bw:.1f} GB/s, shared with the CPU; {brief}",
        "l1_kb": _NOTPUB, "l2_kb": _NOTPUB, "l3_kb": _NOTPUB, "isa": src_peak,
    }
    return DeviceSpec(name=name, kind="gpu", cores=units, threads=units * lanes, clock_ghz=clock,
                      peak_fp32_gflops=round(peak, 1), mem_bw_gbs=round(bw, 1), isa=isa, vendor=vendor,
                      sources=src, model=model, aliases=aliases)


def _build() -> list[DeviceSpec]:
    tc = ["fp16", "tensor_cores"]
    return [
        # ---- NVIDIA data-centre and desktop GPUs ------------------------------------------
        _nv_gpu("t4", "NVIDIA Tesla T4", 40, 2560, 1.59, 8.1, 320, 16, 96, 4096, tc, _T4, _TURING,
                ["tesla-t4", "nvidia-t4"], ["t4"]),
        _nv_gpu("v100-sxm2", "NVIDIA Tesla V100-SXM2", 80, 5120, 1.53, 15.7, 900, 32, 128, 6144, tc, _V100, _VOLTA,
                ["v100", "tesla-v100", "nvidia-v100"], ["v100"]),
        _nv_gpu("a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", 108, 6912, 1.41, 19.5, 1555, 40, 192, 40960,
                tc + ["bf16", "tf32"], _A100, _AMPERE, ["a100", "a100-40gb", "nvidia-a100"], ["a100-sxm4-40gb", "a100-pcie-40gb", "a100 40gb"]),
        _nv_gpu("a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB", 108, 6912, 1.41, 19.5, 2039, 80, 192, 40960,
                tc + ["bf16", "tf32"], _A100, _AMPERE, ["a100-80gb"], ["a100-sxm4-80gb", "a100 80gb", "a100"]),
        _nv_gpu("h100-sxm", "NVIDIA H100 SXM5 80GB", 132, 16896, 1.98, 67.0, 3350, 80, 256, 51200,
                tc + ["bf16", "tf32", "fp8"], _H100, _HOPPER, ["h100", "h100-sxm5", "nvidia-h100"], ["h100 80gb hbm3", "h100-sxm", "h100 sxm", "h100"]),
        _nv_gpu("h100-pcie", "NVIDIA H100 PCIe 80GB", 114, 14592, 1.755, 51.0, 2000, 80, 256, 51200,
                tc + ["bf16", "tf32", "fp8"], _H100, _HOPPER, ["h100-pcie-80gb"], ["h100 pcie"]),
        # TVM 0.27 has no H200 tag; it is the H100's GH100 die (compute capability 9.0, same SM),
        # and the H100-scheduled programs of data/cdmpp-h100 ran on a lent H200 as domain h200
        _nv_gpu("h200-sxm", "NVIDIA H200 SXM 141GB", 132, 16896, 1.98, 67.0, 4800, 141, 256, 61440,
                tc + ["bf16", "tf32", "fp8"], _H200, _HOPPER, ["h200", "nvidia-h200"], ["h200"],
                l2_src="torch.cuda.get_device_properties(0).L2_cache_size on a lent NVIDIA H200, 2026-11-27 "
                       "(recorded spec of domain h200, data/cdmpp-h100/meta.json)", tvm_tag="nvidia/nvidia-h100"),
        _nv_gpu("rtx4090", "NVIDIA GeForce RTX 4090", 128, 16384, 2.52, 82.6, 1008, 24, 128, 73728,
                tc + ["bf16", "tf32", "fp8"], _ADA, _ADA, ["4090", "rtx-4090", "geforce-rtx-4090"], ["rtx 4090"]),
        # ---- server CPUs ---------------------------------------------------------------------
        _server_cpu("xeon-8380", "Intel Xeon Platinum 8380", "Intel", 40, 80, 2.3, 64, 48, 1280, 61440, 8, 3200,
                    ["avx2", "avx512f", "fma"], _X8380, _ICX, ["xeon-platinum-8380", "icelake-8380", "intel-8380"]),
        _server_cpu("epyc-7763", "AMD EPYC 7763 64-Core Processor", "AMD", 64, 128, 2.45, 32, 32, 512, 262144, 8, 3200,
                    ["avx2", "fma"], _E7763, _ZEN3, ["7763", "milan-7763", "amd-epyc-7763"]),
        _server_cpu("epyc-9654", "AMD EPYC 9654 96-Core Processor", "AMD", 96, 192, 2.4, 32, 32, 1024, 393216, 12, 4800,
                    ["avx2", "avx512f", "fma", "bf16"], _E9654, _ZEN4, ["9654", "genoa-9654", "amd-epyc-9654"]),
        _server_cpu("graviton2", "AWS Graviton2 (64x Arm Neoverse N1)", "AWS", 64, 64, 2.5, 16, 64, 1024, 32768, 8, 3200,
                    ["neon", "fp16"], _GRV, _N1, ["aws-graviton2", "neoverse-n1", "m6g", "c6g"]),
        _server_cpu("graviton3", "AWS Graviton3 (64x Arm Neoverse V1)", "AWS", 64, 64, 2.6, 32, 64, 1024, 32768, 8, 4800,
                    ["neon", "sve", "fp16", "bf16"], _GRV, _V1, ["aws-graviton3", "neoverse-v1", "c7g", "m7g"],
                    mem_src=f"derived: 8 channels x DDR5-4800 x 8 B = 307.2 GB/s; {_C7G}"),
        # ---- mobile SoCs: CPU big cores (-cpu), prime core (-prime), GPU (-gpu) --------------
        _mobile_cpu("sd855-cpu", "Snapdragon 855 Kryo 485 big cores (1 prime + 3 performance, Cortex-A76)", "Qualcomm",
                    [(1, 2.84, 16, "Cortex-A76", _A76), (3, 2.42, 16, "Cortex-A76", _A76)], 64, 512, 2048, 4266,
                    ["neon", "fp16"], _SD855, _AT855, ["snapdragon-855-cpu", "kryo-485", "sd855"]),
        _mobile_cpu("sd855-prime", "Snapdragon 855 Kryo 485 prime core (Cortex-A76)", "Qualcomm",
                    [(1, 2.84, 16, "Cortex-A76", _A76)], 64, 512, 2048, 4266, ["neon", "fp16"], _SD855, _AT855,
                    ["kryo-485-prime"]),
        _mobile_gpu("sd855-gpu", "Qualcomm Adreno 640 (Snapdragon 855)", "Qualcomm", 6, "128-lane ALU groups (Qualcomm publishes no shader-processor count)",
                    128, 0.585, 2, 4266, ["fp16"], _ADRENO, _SD855, ["adreno-640", "adreno640"]),
        _mobile_cpu("sd865-cpu", "Snapdragon 865 Kryo 585 big cores (1 prime + 3 performance, Cortex-A77)", "Qualcomm",
                    [(1, 2.84, 16, "Cortex-A77", _A77), (3, 2.42, 16, "Cortex-A77", _A77)], 64, 512, 4096, 5500,
                    ["neon", "fp16"], _SD865, _AT865, ["snapdragon-865-cpu", "kryo-585", "sd865"]),
        _mobile_cpu("sd865-prime", "Snapdragon 865 Kryo 585 prime core (Cortex-A77)", "Qualcomm",
                    [(1, 2.84, 16, "Cortex-A77", _A77)], 64, 512, 4096, 5500, ["neon", "fp16"], _SD865, _AT865,
                    ["kryo-585-prime"]),
        _mobile_gpu("sd865-gpu", "Qualcomm Adreno 650 (Snapdragon 865)", "Qualcomm", 8, "128-lane ALU groups (Qualcomm publishes no shader-processor count)",
                    128, 0.587, 2, 5500, ["fp16"], _ADRENO, _SD865, ["adreno-650", "adreno650"]),
        _mobile_cpu("sd888-cpu", "Snapdragon 888 Kryo 680 big cores (1 prime Cortex-X1 + 3 Cortex-A78)", "Qualcomm",
                    [(1, 2.84, 32, "Cortex-X1", _X1), (3, 2.42, 16, "Cortex-A78", _A78)], 64, 1024, 4096, 6400,
                    ["neon", "fp16"], _SD888, _AT888, ["snapdragon-888-cpu", "kryo-680", "sd888"]),
        _mobile_cpu("sd888-prime", "Snapdragon 888 Kryo 680 prime core (Cortex-X1)", "Qualcomm",
                    [(1, 2.84, 32, "Cortex-X1", _X1)], 64, 1024, 4096, 6400, ["neon", "fp16"], _SD888, _AT888,
                    ["kryo-680-prime", "cortex-x1"]),
        _mobile_gpu("sd888-gpu", "Qualcomm Adreno 660 (Snapdragon 888)", "Qualcomm", 8, "128-lane ALU groups (Qualcomm publishes no shader-processor count)",
                    128, 0.840, 2, 6400, ["fp16"], _ADRENO, _SD888, ["adreno-660", "adreno660"]),
        _mobile_cpu("kirin990-cpu", "HiSilicon Kirin 990 big cores (2x Cortex-A76 @ 2.86 + 2x @ 2.09 GHz)", "HiSilicon",
                    [(2, 2.86, 16, "Cortex-A76", _A76), (2, 2.09, 16, "Cortex-A76", _A76)], 64, 512, 4096, 4266,
                    ["neon", "fp16"], _K990, _ATK980, ["kirin-990-cpu", "kirin990"]),
        _mobile_cpu("kirin990-prime", "HiSilicon Kirin 990 prime core (Cortex-A76 @ 2.86 GHz)", "HiSilicon",
                    [(1, 2.86, 16, "Cortex-A76", _A76)], 64, 512, 4096, 4266, ["neon", "fp16"], _K990, _ATK980,
                    ["kirin-990-prime"]),
        _mobile_gpu("kirin990-gpu", "Arm Mali-G76 MP16 (Kirin 990)", "Arm", 16, "Mali shader cores (MP16); " + _K990,
                    24, 0.6, 2, 4266, ["fp16"], _G76 + "; 16 cores @ 600 MHz: " + _K990, _K990,
                    ["mali-g76-mp16", "mali-g76", "g76"]),
    ]


CATALOG: dict[str, DeviceSpec] = {d.name: d for d in _build()}

# alias (lower-case) -> canonical name
ALIASES: dict[str, str] = {}
for _d in CATALOG.values():
    for _a in [_d.name, *_d.aliases]:
        _a = _a.lower()
        assert _a not in ALIASES or ALIASES[_a] == _d.name, f"duplicate device alias {_a}"
        ALIASES[_a] = _d.name


def catalog_names() -> list[str]:
    return sorted(CATALOG)


def lookup(name: str) -> DeviceSpec | None:
    """Catalog entry by name or alias (case-insensitive, '_' and ' ' count as '-'); None if unknown."""
    n = name.strip().lower().replace("_", "-").replace(" ", "-")
    canon = ALIASES.get(n)
    return DeviceSpec.from_dict(CATALOG[canon].to_dict()) if canon else None


def match_gpu_name(gpu_name: str, memory_gb: float | None = None) -> DeviceSpec | None:
    """Catalog GPU for a driver-reported name (e.g. 'NVIDIA H100 80GB HBM3'); longest pattern wins."""
    g = gpu_name.lower().replace("_", " ")
    best, best_len = None, 0
    for d in CATALOG.values():
        if d.kind != "gpu":
            continue
        for pat in d.extra.get("match", []):
            if pat in g and len(pat) > best_len:
                best, best_len = d, len(pat)
    if best is not None and best.name.startswith("a100") and memory_gb is not None and "gb" not in g:
        best = CATALOG["a100-sxm4-80gb" if memory_gb > 60 else "a100-sxm4-40gb"]
    return DeviceSpec.from_dict(best.to_dict()) if best else None
