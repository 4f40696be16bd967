"""Discrete-event simulation of CoDL co-execution on a mobile SoC (no phone needed).

A SoC profile (JSON in `soc_profiles/`) gives the processors' MACE constants (threads;
GPU compute units, warp, max work-group, cache), per-sub-kernel efficiencies, data-sharing
bandwidths and the sync behaviour. Kernel time = Σ_sub units(MACE formula) × t_unit, with
t_unit = work per unit / (rate × efficiency); `calibrate()` sets the two rates from
*calibration inputs only* (SD855: YOLOv2 CPU-only and GPU-only latency, Fig. 3 component
times; other SoCs: spec-sheet ratios to SD855) — the published CoDL results it is
compared with (`published.json`) are never read here.

The simulator replays a plan: the GPU in-order queue (transform, map, GPU compute,
unmap + transform back) and the CPU thread (pre-sync wait, compute, post-sync), with
lognormal kernel noise and pre-sync jitter from a seeded RNG (deterministic per seed).
What it can test: planner logic (greedy vs optimal, chain behaviour, sensitivity).
What it cannot: predictor accuracy or real speedups — planning and simulating with the
same kernel model is circular; results read as "planner quality given this model".
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.codl.partition import CoexecCost, CoexecPlan, chain_links, chain_rows, extract_ops, part_shape, plan_ops, split
from tensorplan.codl.predictor import FlopsLinear, KernelSample, OpShape, SharingModel, mace_cpu_units, mace_gpu_units

PROFILE_DIR = Path(__file__).with_name("soc_profiles")
SOCS = ("sd855", "sd865", "sd888", "kirin990")
SYSTEMS = ("cpu", "gpu", "ulayer", "codl-nochain", "codl", "ideal")


def load_profile(name: str) -> dict:
    p = PROFILE_DIR / f"{name}.json"
    if not p.exists():
        raise TensorplanError(f"unknown SoC profile '{name}'; known: {', '.join(SOCS)}")
    return json.loads(p.read_text())


def _read(name: str) -> dict:
    return json.loads((PROFILE_DIR / name).read_text())


# --------------------------------------------------------------------------------------
# Kernel-time model of a SoC
# --------------------------------------------------------------------------------------

def _cpu_unit_work(sub: str, op: OpShape) -> tuple[float, str]:
    """(flop-equivalents per unit, efficiency key) of a MACE CPU sub-kernel."""
    if sub in ("direct", "depthwise"):
        return 1.0, sub
    if sub == "gemm_comp":
        return 512.0, "gemm_comp"
    if sub == "gemm_pack_rhs":
        return 64.0, "gemm_pack_rhs"
    if sub.startswith("wino"):
        ot = int(sub[4])
        if sub.endswith("gemm"):
            return 512.0, "wino_gemm"
        if sub.endswith("tr_in"):
            return 2.0 * (ot + 2) ** 3, "wino_tr"
        return 2.0 * (ot + 2) ** 2 * ot, "wino_tr"
    if sub == "gemv":
        return 64.0, "gemv"
    return float(op.k * op.k), "pool"


def _gpu_unit_work(sub: str, op: OpShape, warp: int) -> tuple[float, str]:
    if sub.startswith("gpu_direct"):
        owblk = 4 if op.k == 1 else (5 if op.k == 3 else 4)
        return 2.0 * warp * owblk * 4 * 4 * op.k * op.k, "direct"
    if sub.startswith("gpu_depthwise"):
        return 2.0 * warp * 4 * 4, "depthwise"
    if sub == "gpu_fc":
        return 2.0 * warp * 4 * 4, "fc"
    return 1.0 * warp * 4, "pool"


class SocModel:
    """Kernel latencies of one SoC: processors "cpu", "gpu" (image type) and "gpu_buffer"."""

    def __init__(self, prof: dict, cpu_rate_gflops: float, gpu_rate_gflops_per_cu: float):
        self.prof = prof
        self.cpu_rate = cpu_rate_gflops * 1e9
        self.gpu_rate = gpu_rate_gflops_per_cu * 1e9
        self.bias = 1.0  # multiply predictions (for robustness experiments)

    def kernel_time(self, op: OpShape, proc: str) -> float:
        return self._kt(op, proc) * self.bias

    @lru_cache(maxsize=200000)
    def _kt(self, op: OpShape, proc: str) -> float:
        c, g = self.prof["cpu"], self.prof["gpu"]
        if proc == "cpu":
            t = 0.0
            for sub, n in mace_cpu_units(op, c["threads"]).items():
                work, key = _cpu_unit_work(sub, op)
                t += n * work / (self.cpu_rate * c["eff"][key])
            return t + 20e-6  # per-op dispatch
        if proc in ("gpu", "gpu_buffer"):
            t = 0.0
            for sub, n in mace_gpu_units(op, g["cu"], g["warp"], g["kwg"], g["cache"], g["adreno"]).items():
                if sub == "gpu_fc":  # GEMV is bandwidth-like: charge its FLOPs over all CUs
                    t += op.flops / (self.gpu_rate * g["cu"] * g["eff"]["fc"])
                    continue
                work, key = _gpu_unit_work(sub, op, g["warp"])
                t += n * work / (self.gpu_rate * g["eff"][key])
            if proc == "gpu_buffer" and op.kind == "conv":
                t *= g.get("buffer_slowdown", 1.0)
            return t + 30e-6  # kernel launch
        raise TensorplanError(f"SocModel: unknown processor '{proc}' (cpu | gpu | gpu_buffer)")

    def other_time(self, nbytes: int, proc: str) -> float:
        o = self.prof["other_ops"]
        bw = o["cpu_gbps"] if proc == "cpu" else o["gpu_gbps"]
        return o["launch_ms"] * 1e-3 + nbytes / (bw * 1e9)


def sharing_model(prof: dict, transform: bool = True) -> SharingModel:
    """CoDL's data-sharing terms for the SoC: transform and map linear in bytes, sync constant
    (the predictor's 1 ms upper bound)."""
    s = prof["sharing"]
    tr = (0.0, 1.0 / (s["trans_gbps"] * 1e9)) if transform else (0.0, 0.0)
    mp = (0.0, 1.0 / (s["map_gbps"] * 1e9))
    return SharingModel({"map_in": mp, "trans_in": tr, "trans_out": tr, "map_out": mp}, s["sync_ms"] * 1e-3)


def _other_nodes(graph: Graph, ops) -> list[tuple[str, int]]:
    taken = {o.node.name for o in ops} | {e.name for o in ops for e in o.epilogue}
    out = []
    for n in graph.nodes:
        if n.name in taken:
            continue
        nb = sum(graph.tensors[t].nbytes for t in list(n.inputs) + list(n.outputs)
                 if t and t in graph.tensors and graph.tensors[t].data is None)
        out.append((n.name, nb))
    return out


def _single_proc_time(model: SocModel, graph: Graph, proc: str) -> float:
    ops = extract_ops(graph)
    return (sum(model._kt(o.shape, proc) for o in ops)
            + sum(model.other_time(nb, proc) for _, nb in _other_nodes(graph, ops)))


def calibrate(name: str, graphs: dict[str, Graph] | None = None) -> SocModel:
    """The SoC's kernel model with rates fitted to the calibration inputs (never to the
    published results). SD855: YOLOv2 CPU-only/GPU-only latencies and Fig. 3 sharing
    times; other SoCs: SD855's rates × spec-sheet ratios."""
    prof = load_profile(name)
    cal = _read("calibration.json")
    if name != "sd855":
        base = calibrate("sd855", graphs)
        r = cal["spec_ratios_vs_sd855"][name]
        sd = load_profile("sd855")
        m = SocModel(prof, base.cpu_rate / 1e9 * r["cpu"],
                     base.gpu_rate / 1e9 * r["gpu"] * sd["gpu"]["cu"] / prof["gpu"]["cu"])
        prof["sharing"] = dict(base.prof["sharing"])
        return m
    return _calibrate_sd855(prof, cal["sd855"], graphs)


_CAL_CACHE: dict[str, SocModel] = {}


def _calibrate_sd855(prof: dict, cal: dict, graphs: dict[str, Graph] | None) -> SocModel:
    if "sd855" in _CAL_CACHE:
        return _CAL_CACHE["sd855"]
    from tensorplan.zoo.specs import load_model

    g = (graphs or {}).get("yolov2") or load_model("yolov2")
    unit = SocModel(prof, 1.0, 1.0)
    ops = extract_ops(g)
    others = _other_nodes(g, ops)
    kc = sum(unit._kt(o.shape, "cpu") - 20e-6 for o in ops)
    kg = sum(unit._kt(o.shape, "gpu") - 30e-6 for o in ops)
    fixed_c = 20e-6 * len(ops) + sum(unit.other_time(nb, "cpu") for _, nb in others)
    fixed_g = 30e-6 * len(ops) + sum(unit.other_time(nb, "gpu") for _, nb in others)
    tc, tg = cal["yolov2_cpu_only_ms"] * 1e-3, cal["yolov2_gpu_only_ms"] * 1e-3
    if tc <= fixed_c or tg <= fixed_g:
        raise TensorplanError("sd855 calibration: fixed costs exceed the YOLOv2 anchors; check other_ops")
    m = SocModel(prof, kc / (tc - fixed_c), kg / (tg - fixed_g))
    # sharing bandwidths from Fig. 3 (the CPU half of an H split of <112,112,32,64> K3)
    f3 = cal["fig3_conv"]
    h, w, ic, oc, k, s = f3["op"]
    op = OpShape("conv", h, w, ic, oc, k, s, 1, 1, 1, 1)
    sp = split(op, "H", f3["ratio"])
    nb = sp.cpu_in_bytes
    prof["sharing"].update(trans_gbps=nb / (f3["transform_ms"] * 1e-3) / 1e9,
                           map_gbps=nb / (f3["map_ms"] * 1e-3) / 1e9, presync_ms=f3["presync_ms"],
                           postsync_ms=f3["postsync_ms"], unmap_ms=f3["unmap_ms"],
                           sync_ms=cal["psync_upper_bound_ms"])
    g = prof["gpu"]
    g["buffer_slowdown"] = cal["image_vs_buffer_3x3"]
    _CAL_CACHE["sd855"] = m
    return m


# --------------------------------------------------------------------------------------
# Event simulation
# --------------------------------------------------------------------------------------

@dataclass
class SimResult:
    latency_s: float
    events: dict[str, list[tuple[str, float, float]]] = field(default_factory=dict)
    breakdown: dict[str, float] = field(default_factory=dict)
    plan: dict | None = None

    def to_dict(self) -> dict:
        return {"latency_ms": self.latency_s * 1e3, "breakdown_ms": {k: v * 1e3 for k, v in self.breakdown.items()},
                "plan": self.plan}


class Simulator:
    """Replays segments on a SoC: GPU in-order queue + one CPU thread group, seeded noise."""

    def __init__(self, model: SocModel, seed: int = 0, noise: bool = True):
        self.m = model
        self.p = model.prof
        self.rng = np.random.default_rng(seed)
        self.noise = noise
        self.t = 0.0
        self.events: dict[str, list[tuple[str, float, float]]] = {"cpu": [], "gpu": []}
        self.acc = {"compute_cpu": 0.0, "compute_gpu": 0.0, "sharing": 0.0, "sync": 0.0, "other": 0.0}

    def _n(self, x: float) -> float:
        if not self.noise or x <= 0:
            return x
        cov = self.p["noise"]["kernel_cov"]
        return x * float(self.rng.lognormal(-0.5 * cov * cov, cov))

    def _ev(self, proc: str, label: str, t0: float, dt: float) -> float:
        if dt > 0:
            self.events[proc].append((label, t0, t0 + dt))
        return t0 + dt

    def other(self, name: str, nbytes: int, proc: str = "gpu") -> None:
        dt = self._n(self.m.other_time(nbytes, "cpu" if proc == "cpu" else "gpu"))
        self.t = self._ev("cpu" if proc == "cpu" else "gpu", name, self.t, dt)
        self.acc["other"] += dt

    def segment(self, ops: Sequence[OpShape], dim: str, ratio: float, gpu_proc: str = "gpu",
                transform: bool = True, cblk: int = 4, share: bool = True) -> None:
        """One op (any dim) or an H chain at one ratio."""
        s = self.p["sharing"]
        if dim == "H":
            g, c = chain_rows(ops, ratio)
            gparts = [part_shape(o, r) for o, r in zip(ops, g)] if g[0] is not None else []
            cparts = [part_shape(o, r) for o, r in zip(ops, c)] if c[0] is not None else []
            in_b = 4 * c[0].in_rows * ops[0].iw * ops[0].ic if cparts else 0
            out_b = 4 * c[-1].out_rows * ops[-1].ow * ops[-1].oc if cparts else 0
        else:
            sp = split(ops[0], "OC", ratio, cblk)
            gparts = [sp.gpu] if sp.gpu else []
            cparts = [sp.cpu] if sp.cpu else []
            in_b, out_b = sp.cpu_in_bytes, sp.cpu_out_bytes
        t = self.t
        if cparts and share:
            tr = in_b / (s["trans_gbps"] * 1e9) if transform else 0.0
            mp = in_b / (s["map_gbps"] * 1e9)
            t = self._ev("gpu", "transform in", t, self._n(tr))
            t = self._ev("gpu", "map", t, self._n(mp))
            self.acc["sharing"] += t - self.t
        tg = t
        for p in gparts:
            dt = self._n(self.m.kernel_time(p, gpu_proc))
            tg = self._ev("gpu", f"gpu {p.short()}", tg, dt)
            self.acc["compute_gpu"] += dt
        end = tg
        if cparts:
            pre = 0.0
            if share:
                mu, cov = s["presync_ms"] * 1e-3, s["presync_cov"]
                pre = float(self.rng.lognormal(math.log(mu) - 0.5 * cov * cov, cov)) if self.noise else mu
            tc = self._ev("cpu", "pre-sync", t, pre)
            for p in cparts:
                dt = self._n(self.m.kernel_time(p, "cpu"))
                tc = self._ev("cpu", f"cpu {p.short()}", tc, dt)
                self.acc["compute_cpu"] += dt
            post = s["postsync_ms"] * 1e-3 if share else 0.0
            self.acc["sync"] += pre + post
            end = max(tg, tc + post)
            if share:
                tr = out_b / (s["trans_gbps"] * 1e9) if transform else 0.0
                t2 = self._ev("gpu", "unmap", end, s["unmap_ms"] * 1e-3)
                end = self._ev("gpu", "transform out", t2, self._n(tr))
                self.acc["sharing"] += end - t2 + s["unmap_ms"] * 1e-3
        self.t = end


def _ulayer_predictor(model: SocModel, shapes: Sequence[OpShape], rng: np.random.Generator) -> FlopsLinear:
    """µLayer's FLOPs linear regression, fitted on noisy simulated measurements of OC parts."""
    samples = []
    cov = model.prof["noise"]["kernel_cov"]
    for op in shapes:
        for r in (0.1, 0.3, 0.5, 0.7, 0.9, 1.0):
            sp = split(op, "OC", r, 4)
            for proc, part in (("gpu_buffer", sp.gpu), ("cpu", sp.cpu)):
                if part is not None:
                    t = model.kernel_time(part, proc) * float(rng.lognormal(0, cov))
                    samples.append(KernelSample(part, proc, t))
            if sp.cpu is None:
                samples.append(KernelSample(op, "cpu", model.kernel_time(op, "cpu") * float(rng.lognormal(0, cov))))
    return FlopsLinear().fit(samples)


def plan_for(system: str, graph: Graph, model: SocModel, seed: int = 0, delta: float = 0.3
             ) -> tuple[list, CoexecPlan, dict]:
    """(ops, plan, execution options) of a system on a SoC."""
    prof = model.prof
    ops = extract_ops(graph)
    if not ops:
        raise TensorplanError(f"model '{graph.name}' has no partitionable Conv/Pool/FC operator at batch 1: nothing for "
                              "CoDL to split between CPU and GPU")
    shapes = [o.shape for o in ops]
    links = chain_links(graph, ops)
    image = prof.get("image", True)
    sh = sharing_model(prof, transform=image)
    if system == "ulayer":
        pred = _ulayer_predictor(model, shapes, np.random.default_rng(seed + 7))
        cost = CoexecCost(pred, sharing_model(prof, transform=False), "cpu", "gpu_buffer", 4, "codl")
        return ops, plan_ops(shapes, cost, links, "none", dims=("OC",)), {"gpu_proc": "gpu_buffer", "transform": False}
    cost = CoexecCost(model, sh, "cpu", "gpu", 4, "codl")
    dims = None if image else ("OC",)  # buffer-type platforms (Kirin) search OC only (CoDL)
    opts = {"gpu_proc": "gpu", "transform": image}
    if system in ("cpu", "gpu"):  # single processor, tensors in its own best type: no sharing
        return ops, plan_ops(shapes, cost, links, system), dict(opts, share=False)
    if system == "codl-nochain":
        return ops, plan_ops(shapes, cost, links, "none", dims), opts
    if system == "codl":
        return ops, plan_ops(shapes, cost, links, "greedy" if image else "none", dims, delta), opts
    if system == "ideal":
        free = CoexecCost(model, SharingModel({k: (0.0, 0.0) for k in ("map_in", "trans_in", "trans_out", "map_out")},
                                              0.0), "cpu", "gpu", 4, "codl")
        return ops, plan_ops(shapes, free, links, "none", dims), dict(opts, share=False)
    raise TensorplanError(f"unknown system '{system}'; use one of {', '.join(SYSTEMS)}")


def simulate(graph: Graph, soc: str | SocModel, system: str = "codl", seed: int = 0, noise: bool = True,
             delta: float = 0.3) -> SimResult:
    """Simulated end-to-end latency of `graph` on the SoC under `system`."""
    model = soc if isinstance(soc, SocModel) else calibrate(soc)
    ops, plan, opts = plan_for(system, graph, model, seed, delta)
    sim = Simulator(model, seed, noise)
    seg_of = {}
    for s in plan.segments:
        seg_of[s.start] = s
    node_op = {o.node.name: o.index for o in ops}
    in_op = {e.name for o in ops for e in o.epilogue}
    others = dict(_other_nodes(graph, ops))
    other_proc = "cpu" if system == "cpu" else "gpu"
    for n in graph.nodes:
        if n.name in node_op:
            i = node_op[n.name]
            s = seg_of.get(i)
            if s is not None:
                sim.segment([o.shape for o in ops[s.start:s.end]], s.dim, s.ratio, opts["gpu_proc"],
                            opts["transform"], share=opts.get("share", True))
        elif n.name not in in_op:
            sim.other(n.name, others.get(n.name, 0), other_proc)
    return SimResult(sim.t, sim.events, dict(sim.acc), plan.to_dict())


def plot_timeline(events: dict[str, list[tuple[str, float, float]]], path: str, title: str = "") -> str:
    """Gantt chart of both processors' events (seconds) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"compute": "#4c72b0", "gpu": "#4c72b0", "cpu": "#55a868", "transform": "#dd8452", "map": "#c44e52",
              "unmap": "#c44e52", "sync": "#8172b3", "pre-sync": "#8172b3", "write": "#937860"}
    fig, ax = plt.subplots(figsize=(12, 2.6))
    for y, proc in enumerate(("gpu", "cpu")):
        for label, a, b in events.get(proc, []):
            key = next((k for k in colors if label.startswith(k)), None)
            ax.barh(y, (b - a) * 1e3, left=a * 1e3, color=colors.get(key, "#999999"), edgecolor="none")
    ax.set_yticks([0, 1], ["GPU side", "CPU side"])
    ax.set_xlabel("time (ms)")
    ax.set_title(title)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=k) for k, c in colors.items() if k in
                       ("compute", "cpu", "transform", "map", "pre-sync")], loc="upper right", fontsize=7, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
