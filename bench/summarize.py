"""Render docs/results.md from the JSON files in bench/results/ (no number is typed by hand).

Usage: python bench/summarize.py [--korch-dir bench/results/korch_rewrite] [--out docs/results.md]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RES = ROOT / "bench" / "results"


def repeats_section(rows: list[dict]) -> list[str]:
    """Run-to-run spread of a model near the 1.5x line: the main run plus the repeats of the same
    command in bench/results/korch_repeats/<model>/run*/ (this VM has slow and fast phases, so one
    run does not settle which side of the line a model is on)."""
    out = []
    for r0 in rows:
        name = r0["model"]
        runs = [r0] + [json.loads(p.read_text()) for p in
                       sorted(RES.glob(f"korch_repeats/{name}/run*/korch_{name}.json"))]
        if len(runs) < 3:
            continue
        runs.sort(key=lambda r: r.get("started", 0))
        lines = ["| run (UTC) | plan | tensorplan ms | ONNX Runtime ms | speed-up | × bound | × bound in run |",
                 "|---|---|---:|---:|---:|---:|---:|"]
        for r in runs:
            when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.get("started", 0)))
            lines.append(f"| {when} | {r['race']['chosen']} | {r['median_ms']['tensorplan']:.2f} | "
                         f"{r['median_ms']['onnxruntime']:.2f} | {r['speedup_vs_best_baseline']:.2f}× | "
                         f"{r['vs_roofline']:.2f} | {(r.get('vs_roofline_in_run') or float('nan')):.2f} |")
        xb = [r["vs_roofline"] for r in runs]
        xi = [r["vs_roofline_in_run"] for r in runs if r.get("vs_roofline_in_run")]
        sp = [r["speedup_vs_best_baseline"] for r in runs]
        out += ["", f"**{name} run to run.** {len(runs)} runs of the same command (the main run above plus "
                f"`python bench/korch_bench.py --models {name} --results-dir "
                f"bench/results/korch_repeats/{name}/runN --force`), back to back: × bound "
                f"{min(xb):.2f}–{max(xb):.2f} (median {statistics.median(xb):.2f}; {sum(x <= 1.5 for x in xb)} of "
                f"{len(xb)} within 1.5×), × the bound at each round's measured GEMM rate "
                f"{min(xi):.2f}–{max(xi):.2f} (median {statistics.median(xi):.2f}), speed-up over the best baseline "
                f"{min(sp):.2f}–{max(sp):.2f}×. The VM's fast and slow phases move the plan and ONNX Runtime "
                "together, the GEMM probe less; a run in a slow phase can also flip the race to the OpenVINO "
                "finalist, which slows down less there.", ""] + lines
    return out


def load(name: str) -> dict | None:
    p = RES / name
    return json.loads(p.read_text()) if p.exists() else None


def devices_section() -> list[str]:
    d = load("device_numbers.json")
    if not d:
        return []
    out = ["## This machine", "", f"`{d['command']}` — {d['machine'].get('model')}, "
           f"{d['machine'].get('cores')} cores, load average at start {d['machine'].get('load_avg_at_start')}.", "",
           "| threads | copy GB/s | triad GB/s | GEMM GFLOP/s (best backend) |", "|---|---|---|---|"]
    for k, s in d["summary"].items():
        out.append(f"| {k} | {s['copy_gbs']:.1f} | {s['triad_gbs']:.1f} | {s['gemm_gflops_best_backend']:.0f} |")
    return out + [""]


def store_section() -> list[str]:
    d = load("store_throughput.json")
    if not d:
        return []
    return ["## Measurement store", "", f"`{d['command']}`: batched inserts "
            f"{d['median_measurements_per_s']:,.0f} measurements/s, {d['median_programs_per_s']:,.0f} programs/s, "
            f"single puts {d['median_single_put_per_s']:,.0f}/s (median of {len(d['trials'])} trials of "
            f"{d['records']:,} records; goal ≥ {d['goal_measurements_per_s']:,}/s).", ""]


def import_section() -> list[str]:
    d = load("import_check.json")
    if not d:
        return []
    out = ["## Import and reference executor vs ONNX Runtime", "",
           f"`python bench/import_check.py`; relative error = {d['rel_error']}; tolerance {d['tolerance']}.", "",
           "| model | opset | nodes | import s (median) | max rel. error | pass |", "|---|---|---|---|---|---|"]
    for r in d["rows"]:
        if r.get("error"):
            out.append(f"| {r['model']} | {r['opset']} | – | – | – | NO: {r['error'][:120]} |")
            continue
        out.append(f"| {r['model']} | {r['opset']} | {r['nodes']} | {r['import_s_median']:.3f} | "
                   f"{r['max_rel_error']:.1e} | {'yes' if r['passed'] else 'NO'} |")
    ok = sum(bool(r.get("passed")) for r in d["rows"])
    out += ["", f"{ok} of {len(d['rows'])} model × opset imports pass ({len({r['model'] for r in d['rows']})} models)."]
    return out + [""]


def kernels_section() -> list[str]:
    d = load("korch_kernels.json")
    if not d:
        return []
    out = ["## Memory-bound kernels: default TVM schedules", "",
           "`python bench/korch_kernels.py`; bandwidth compared with a copy of the same bytes timed in "
           "the same run.", "",
           "| kernel | TVM default ms | GB/s | copy GB/s (same run) | fraction | ONNX Runtime ms | naive TVM ms |",
           "|---|---|---|---|---|---|---|"]
    for s in d["schedules"]:
        naive = f"{s['naive_ms']:.1f}" if s.get("naive_ms") else "–"
        out.append(f"| {s['kernel']} | {s['tvm_default_ms']:.2f} | {s['tvm_default_gbs']:.1f} | "
                   f"{s['copy_same_bytes_gbs']:.1f} | {s['fraction_of_copy_now']:.2f} | {s['ort_ms']:.2f} | {naive} |")
    ov = d.get("overhead", {}).get("call_overhead_us", {})
    if ov:
        out += ["", "Per-call overhead (µs): " + ", ".join(f"{k} {v:.2f}" for k, v in ov.items()) + "."]
    return out + [""]


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def _day(epoch: float | None) -> str:
    import time
    return "–" if epoch is None else time.strftime("%Y-%m-%d", time.gmtime(epoch))


def plan_backends(r: dict) -> dict[str, int] | None:
    """Kernels per backend of the plan a Korch run kept: recorded in the run's JSON, or read from the plan
    file it wrote when that file is still the one from that run (written between its start and end)."""
    if r.get("plan_backends"):
        return r["plan_backends"]
    p = Path(r.get("plan_path") or "")
    if not p.is_file() or not (r.get("started", 0) - 1 <= p.stat().st_mtime <= r.get("finished", 0) + 1):
        return None
    out: dict[str, int] = {}
    for k in json.loads(p.read_text()).get("kernels", []):
        out[k.get("backend") or "?"] = out.get(k.get("backend") or "?", 0) + 1
    return out


def korch_section(kdir: Path) -> list[str]:
    rows = []
    for p in sorted(kdir.glob("korch_*.json")):
        r = json.loads(p.read_text())
        if "median_ms" in r:
            rows.append(r)
    if not rows:
        return []
    systems = ["onnxruntime", "ort-control", "pytorch", "torch.compile", "tvm-relax", "tensorplan", "no-rewrite",
               "no-regions", "greedy", "no-recompute", "no-fission"]
    out = ["## Korch on this CPU (end to end)", "",
           f"`python bench/korch_bench.py --results-dir {kdir.resolve().relative_to(ROOT)}` — every system timed "
           "in one process, interleaved (random order each round"
           + (f"; per round {'one untimed call, then ' if rows[0].get('untimed_lead_call') else ''}"
              f"a ~{rows[0]['burst_ms']:.0f} ms back-to-back burst, its median kept"
              if rows[0].get("burst_ms") else "") + "), 2 threads, medians over rounds in ms. "
           "`vs best` = best baseline / tensorplan (>1 means the plan is faster). `no-rewrite` is the plan "
           "without the exact algebraic rewrites of `rewrite/` (one file per rule family, `rewrite/passes.py`) (raced like the plan); `no-regions` is "
           "the plan from Korch's kernels alone (no ONNX Runtime region candidates); `tvm-relax` is the untuned "
           "default build, timed separately. `ort-control` is a second, identical ONNX Runtime session "
           "timed like the others: its distance from `onnxruntime` is this run's noise floor. `ORT regions` = "
           "region kernels after merging / primitives they cover; `backends` = the kept plan's kernels per "
           "backend (`openvino`: a region compiled by OpenVINO, see below). `paired` = the median over rounds of "
           "the per-round ratio best baseline / tensorplan (both ran in every round, seconds apart, so a slow "
           "phase of the shared machine moves both; runs before 2026-11-24 did not record rounds). `run` is the day the model's run started: "
           "a model re-run after a change has its own row from that run (every ratio is within one run).", "",
           "| model | " + " | ".join(systems) + " | vs best | paired | kernels | backends | ORT regions | predicted ms "
           "| load avg (1 min, start→end) | run |",
           "|---|" + "---|" * (len(systems) + 8)]
    ratios = []
    for r in rows:
        m = r["median_ms"]
        cells = [f"{m[s]:.1f}" if s in m else "–" for s in systems]
        ratios.append(r["speedup_vs_best_baseline"])
        la = [r.get("loadavg_start"), r.get("loadavg_end")]
        load_avg = "–" if None in la else f"{la[0][0]:.1f}→{la[1][0]:.1f}"
        reg = r.get("ort_regions") or {}
        regs = f"{reg.get('kernels_after_merge', 0)} / {reg.get('primitives', 0)} of {r.get('primitives')}" \
            if reg else "–"
        out.append(f"| {r['model']} | " + " | ".join(cells) + f" | {r['speedup_vs_best_baseline']:.2f} | "
                   + (f"{r['speedup_paired_median']:.2f}" if "speedup_paired_median" in r else "–")
                   + f" | {r['kernels_per_inference']} | "
                   + (", ".join(f"{b} {c}" for b, c in sorted((plan_backends(r) or {}).items())) or "–")
                   + f" | {regs} | {r['predicted_ms']:.1f} | {load_avg} | "
                   f"{_day(r.get('started'))} |")
    out += ["", f"Geomean speed-up over the best baseline: **{_geo(ratios):.2f}×** over {len(ratios)} models."]
    ctl = [abs(r["median_ms"]["ort-control"] / r["median_ms"]["onnxruntime"] - 1) for r in rows
           if "ort-control" in r["median_ms"]]
    same = {r["model"]: abs(r["median_ms"]["no-rewrite"] / r["median_ms"]["tensorplan"] - 1) for r in rows
            if not r.get("rewrites") and "no-rewrite" in r["median_ms"]}
    if ctl:
        line = (f"Noise floor: the two identical ONNX Runtime sessions land {statistics.median(ctl) * 100:.0f} % "
                f"apart (median over models, at most {max(ctl) * 100:.0f} %)")
        if same:
            worst = max(same, key=same.get)
            line += (f", but two identical *plans* (`tensorplan` and `no-rewrite` where no rewrite fired, "
                     f"{len(same)} models, each its own executor) land {statistics.median(same.values()) * 100:.0f} % "
                     f"apart, at most {same[worst] * 100:.0f} % ({worst}): differences below that are not results")
        out += ["", line + "."]

    # -- roofline distance of every system, and where the optimisation time goes -----------------
    base = ["onnxruntime", "pytorch", "torch.compile", "tensorplan"]
    out += ["", "### Distance to the roofline bound, optimisation time", "",
            "Bound = max(FLOPs / peak, minimum bytes / bandwidth) of the model *as given* (peak and bandwidth: "
            "the best measured on this machine, `roofline` in each JSON); × = median latency / bound. "
            "`GFLOP` shows the model as given → what the plan computes after the rewrites. Optimisation "
            "time of the final plan in seconds: enumerate (candidates and regions) / profile (costing: kernels "
            "already in the measurement store cost nothing, so it is near zero where the store was warm and "
            "the compile + timing time where it was not) / solve (BLP). "
            "`cold profile s` is the compile + timing time this run spent on kernels not yet in the store. "
            "`× tensorplan in run`: the plan's distance with each round's bound taken at the GEMM rate "
            "measured in that round (the peak's 1024³ GEMM is timed as one more system in every round): the "
            "distance left when the shared machine's slow phases are taken out; `gemm GFLOP/s` = median "
            "(min–max) of that probe over the rounds.", "",
            "| model | bound ms | GFLOP | " + " | ".join(f"× {s}" for s in base) +
            " | × tensorplan in run | gemm GFLOP/s | rewrites | enumerate s | profile s | solve s | solver | candidates (unique) | cold profile s |",
            "|---|" + "---|" * (len(base) + 11)]
    for r in rows:
        m, rf = r["median_ms"], r["roofline"]
        rw = r.get("rewrites") or []
        sp = r.get("optimise_split_s") or {}
        sv = (r.get("systems", {}).get("tensorplan") or {}).get("solver") or {}
        gap = sv.get("mip_gap")
        cs = r.get("cost_stats") or {}
        gfl = f"{rf['gflops']:.2f}" + (f" → {rf['rewritten_gflops']:.2f}" if rw and "rewritten_gflops" in rf else "")
        out.append(f"| {r['model']} | {rf['bound_ms']:.1f} | {gfl} | "
                   + " | ".join(f"{m[s] / rf['bound_ms']:.2f}" if s in m else "–" for s in base)
                   + (f" | {r['vs_roofline_in_run']:.2f}" if "vs_roofline_in_run" in r else " | –")
                   + (f" | {statistics.median(gp):.0f} ({min(gp):.0f}–{max(gp):.0f})"
                      if (gp := r.get("gemm_probe_gflops")) else " | –")
                   + f" | {len(rw)} | {sp.get('enumerate_s', 0):.2f} | {sp.get('profile_s', 0):.2f} | "
                   f"{sp.get('solve_s', 0):.2f} | {sv.get('status')}"
                   + ("" if gap is None else f", gap {gap:.1e}")
                   + f" | {r.get('candidates')} ({r.get('unique_candidates')}) | "
                   f"{cs.get('compile_s', 0) + cs.get('measure_s', 0):.1f} |")
    far = [(r["model"], r["median_ms"]["tensorplan"] / r["roofline"]["bound_ms"]) for r in rows
           if "tensorplan" in r["median_ms"] and r["median_ms"]["tensorplan"] / r["roofline"]["bound_ms"] > 1.5]
    near = sum(1 for r in rows if "tensorplan" in r["median_ms"]) - len(far)
    prof = {m["model"]: m for m in (load("ort_profile.json") or {}).get("models", [])}
    if far:
        why = []
        for name, x in far:
            p = prof.get(name)
            if not p:
                why.append(f"{name} ({x:.2f}×)")
                continue
            peak = next(r for r in rows if r["model"] == name)["roofline"]["peak_gflops"]
            conv = p["share"].get("Conv", 0.0)
            rest = ", ".join(f"{op} {sh:.0%}" for op, sh in list(p["share"].items())[:4] if op != "Conv")
            cls = "; ".join(f"{k} {c['gflops_per_s']:.0f} GFLOP/s over {c['ms'] / p['kernel_ms']:.0%} of the time"
                            for k, c in (p.get("conv_classes") or {}).items())
            text = (f"{name} ({x:.2f}×: convolutions are {conv:.0%} of ONNX Runtime's kernel time on the "
                    f"rewritten graph, then {rest}; by kind, under the profiler: {cls}, against the "
                    f"{peak:.0f} GFLOP/s the bound assumes")
            wi = p.get("what_if") or {}
            if wi.get("median_ms"):
                acts = " and ".join(f"{n} {k.replace('silu', 'SiLU').replace('hardswish', 'HardSwish')}"
                                    for k, n in wi["swapped"].items() if n)
                text += (f". A timing probe that swaps its {acts} activations for Relu, which ONNX Runtime fuses "
                         f"into the convolution for free (not an equivalent model), runs {wi['ratio']:.2f}× the time "
                         f"({wi['median_ms']['as_is']:.2f} → {wi['median_ms']['activations_as_relu']:.2f} ms, "
                         f"interleaved): free activations alone would put it near {x * wi['ratio']:.2f}× the bound")
                si = wi.get("silu")
                if si:
                    ms = si["ms_at"]
                    text += (f". Its SiLUs compute {si['values'] / 1e6:.1f} M values per inference; as one separate "
                             f"pass over them ONNX Runtime's QuickGelu costs {ms['quickgelu']:.2f} ms "
                             f"({si['gvalues_per_s']['quickgelu']:.1f} Gvalues/s) and a Relu pass, the memory traffic "
                             f"alone, {ms['relu']:.2f} ms: a SiLU operator as fast as a copy would save at most "
                             f"{ms['quickgelu'] - ms['relu']:.2f} ms, so only fusing it into the convolution pays")
                par = wi["median_ms"].get("as_is_inter_op_parallel")
                if par:
                    text += (f". ONNX Runtime's inter-operator parallel executor (independent branches on the "
                             f"two cores) runs it in {par:.2f} ms instead")
            why.append(text + ")")
        out += ["", f"**Off the bound.** {near} of {near + len(far)} plans run within 1.5× of the bound; not "
                + "; ".join(why) + ". What is left is the MobileNet-style blocks: ONNX Runtime's CPU convolution "
                "cannot fuse SiLU (it runs a separate QuickGelu pass; it fuses Relu, LeakyRelu, Sigmoid, Tanh, Clip, "
                "HardSigmoid and HardSwish); a depthwise convolution does 9 multiply-adds per value it reads and runs at "
                "a fifth of the peak; and every block writes its expanded, full-resolution intermediate to memory "
                "and reads it back, traffic the bound (model inputs, outputs and weights only) does not count. A "
                "kernel that fuses the 1x1 expansion, the activation and the depthwise convolution, so the "
                "intermediate stays in cache, would attack all three; neither ONNX Runtime nor PyTorch's oneDNN path "
                "runs one, and a Korch kernel holds at most one linear primitive. Per-operator shares and the probe: `python bench/ort_profile.py --models "
                + ",".join(n for n, _ in far) + "` (`bench/results/ort_profile.json`)."]

    out += repeats_section(rows)

    # -- what the numbers say ----------------------------------------------------------------------
    rewritten = [r for r in rows if r.get("rewrites") and "no-rewrite" in r["median_ms"]]
    if rewritten:
        parts = [f"{r['model']} {r['median_ms']['no-rewrite'] / r['median_ms']['tensorplan']:.2f}× "
                 f"({len(r['rewrites'])} rewrites)" for r in rewritten]
        out += ["", "**Rewrites.** The exact rewrites fired on " + ", ".join(parts) + " (plan without them / "
                "with them, same run). They move 1x1 convolutions in front of the upsampling that feeds them "
                "(through the Concat), so the convolution runs on 4–64× fewer pixels, and compute a 3x3 "
                "convolution of a nearest-upsampled map as four 2x2 convolutions of the small map, one per "
                "output phase (2.25× fewer multiply-adds; candy's decoder), write Mish as "
                "Sigmoid/Mul/Sub/Div (ONNX Runtime's Softplus is a scalar loop: two thirds of its YOLOv4 time) "
                "and YOLOX's Focus stem (strided Slices + Concat + 3x3 Conv) as one stride-2 6x6 convolution, "
                "and compute candy's 9x9 32->3 output convolution as one stride-4 12x12 convolution with 48 "
                "output channels (one per 4x4 output phase) + DepthToSpace, since ORT's and oneDNN's kernels "
                "pad 3 output channels to a 16-lane block (3x fewer padded multiply-adds; the layer alone 3.6x "
                "faster in ONNX Runtime), and fold SegFormer's per-stage token projection and the 1x1 fuse "
                "convolution after it into one 1x1 convolution of the stage's feature map (two channel maps in a "
                "row are one: 11.4 -> 8.6 GFLOP, and no token/image layout passes in the decoder) and run each "
                "Mix-FFN's fc1/fc2 as 1x1 convolutions on the narrow side of its token <-> image layout changes "
                "(the Transposes and ORT's NCHWc reorders move 32-256 instead of 128-1024 channels), and compute "
                "EfficientViT's ReLU linear attention in the channel-major layout of its qkv map (q, k, v sliced "
                "on channels, the two attention products reassociated through (AB)^T = B^T A^T), so the full-map "
                "token transposes of each attention block go; ONNX Runtime "
                "and torch.compile compute the model as written."]
        flat = [r for r in rewritten if r["median_ms"]["no-rewrite"] / r["median_ms"]["tensorplan"] < 1.05]
        if flat:
            out[-1] += (" On " + ", ".join(r["model"] for r in flat) + " the plan without them is as fast (within "
                        "5 %): the rules were written against ONNX Runtime's kernels, and there both plans are one "
                        "OpenVINO region, whose own graph transformations and kernels do not share the weaknesses "
                        "the rules work around (e.g. YOLOv4's Softplus).") if all(
                set((r["systems"].get(k) or {}).get("backends") or {}) == {"openvino"}
                for r in flat for k in ("tensorplan", "no-rewrite")) else (
                " On " + ", ".join(r["model"] for r in flat) + " the plan without them is as fast (within 5 %).")
    nr = [r["ablations"]["no-regions"]["slowdown"] for r in rows if "no-regions" in (r.get("ablations") or {})]
    if nr:
        pm = [r["measured_ms"] / r["predicted_ms"] for r in rows if r.get("predicted_ms")]
        one_region = [r for r in rows if r.get("kernels_per_inference") == 1
                      and (r.get("ort_regions") or {}).get("kernels_after_merge") == 1]
        ov = [r["model"] for r in one_region if (plan_backends(r) or {}).get("openvino")]
        single = [r["model"] for r in one_region if r["model"] not in ov]
        raced = [r for r in rows if r.get("race")]
        inductor = [r["model"] for r in raced if r["race"].get("chosen") == "inductor"]
        nr_vs = [r["median_ms"][r["best_baseline"]] / r["median_ms"]["no-regions"] for r in rows
                 if "no-regions" in r["median_ms"]]
        out += ["", f"**Korch's kernels alone** (`no-regions`) reach {_geo(nr_vs):.2f}× of the best baseline "
                f"(geomean); region candidates make the plan {_geo(nr):.2f}× faster than that (geomean). "
                + (f"For {len(single)} of {len(rows)} models ({', '.join(single)}) the final plan is one ONNX "
                   "Runtime session over the (rewritten) model: there the plan ties ORT unless a rewrite fired, "
                   "and loses to torch.compile where that is faster. " if single else "")
                + (f"For {len(ov)} of {len(rows)} ({', '.join(ov)}) it is one OpenVINO region over the rewritten model, which "
                   "ran faster than the same operators as one ONNX Runtime session (the race runs a one-session "
                   "finalist on both backends). " if ov else "")
                + (f"For {len(inductor)} ({', '.join(inductor)}) the kept plan is the whole rewritten graph "
                   "as one PyTorch Inductor program (Inductor-generated C++ loops between PyTorch's "
                   "convolution and GEMM calls), which won the race against the BLP's plan and the ONNX "
                   "Runtime session. " if inductor else "") +
                f"For {len(raced)} models the BLP plan was raced end to end against other finalists (the "
                "fewest-kernels plan, the BLP without recomputation, the whole graph as one Inductor "
                "program, a one-session plan on the other region backend and thread count; `race` in each "
                "JSON) and lost in "
                f"{sum(1 for r in raced if r['race']['chosen'] != 'blp')} of them. What holds the rest back: "
                "our memory-bound kernels rarely beat the *marginal* cost ORT pays for the same operators "
                "inside a region (it fuses them into its convolutions / attention in its blocked layout), and "
                "solo kernel timings under-predict in-plan time (measured / predicted "
                f"{min(pm):.2f}–{max(pm):.2f}× for the final plans), more so for every kernel boundary a mixed "
                "plan adds."]
        for r in rows:
            if r.get("kernels_per_inference", 1) > 1 and "onnxruntime" in r["median_ms"]:
                m = r["median_ms"]
                out += ["", f"**{r['model']}** runs a real Korch plan ({r['kernels_per_inference']} kernels, "
                        f"{(r.get('ort_regions') or {}).get('kernels_after_merge', 0)} of them ORT regions): "
                        f"{m['onnxruntime'] / m['tensorplan']:.2f}× faster than ONNX Runtime and "
                        f"{r['speedup_vs_best_baseline']:.2f}× of the best baseline ({r['best_baseline']}); "
                        f"Korch's kernels alone (`no-regions`) reach "
                        f"{m[r['best_baseline']] / m['no-regions']:.2f}× of it."]
    return out + [""]


def standalone_section(kdir: Path) -> list[str]:
    out = []
    mixed: dict[str, list[float]] = {}  # model -> standalone timings of its multi-kernel plan
    for fname, cmd, note in (("korch_standalone.json", "python bench/korch_standalone.py --models candy,segformer-b0,"
                              "efficientvit-b1,yolox-nano,yolov4,resnet-50,bert-base", ""),
                             ("korch_standalone_yolo.json", "python bench/korch_standalone.py --models yolox-nano,"
                              "yolov4 --out bench/results/korch_standalone_yolo.json",
                              " (a later run: the two plans after the Mish and Focus rewrites)"),
                             ("korch_standalone_2026-11-23.json", "python bench/korch_standalone.py --models "
                              "candy,segformer-b0,efficientvit-b1,yolox-nano,resnet-50,bert-base "
                              "--out bench/results/korch_standalone_2026-11-23.json",
                              " (the six plans korch_bench kept on 2026-11-23 on this VM, "
                              "candy after the output-phase rule, SegFormer-b0 after the token-linear rules)"),
                             ("korch_standalone_2026-11-24.json", "python bench/korch_standalone.py --models "
                              "candy,segformer-b0,efficientvit-b1,yolox-nano,resnet-50,bert-base,yolov4 "
                              "--out bench/results/korch_standalone_2026-11-24.json",
                              " (the latest run: the seven plans korch_bench kept on 2026-11-24, six OpenVINO "
                              "regions and YOLOX-nano's ONNX Runtime session, EfficientViT-b1 after the "
                              "linear-attention rule)")):
        d = load(fname)
        if not d:
            continue
        if not out:
            out = ["### The final plans alone", "",
                   "The plan korch_bench wrote for each model, timed in a fresh process against the baselines "
                   "only (no ablation plans, no cost-model kernels alive), interleaved with the same bursts; "
                   "medians in ms, 2 threads."]
        out += ["", f"`{cmd}`{note}:", "",
                "| model | tensorplan | onnxruntime | pytorch | torch.compile | vs best | kernels | max rel. err "
                "| load avg (1 min) |", "|---|---|---|---|---|---|---|---|---|"]
        ratios = []
        for name, r in d["models"].items():
            m = r["median_ms"]
            ratios.append(r["speedup_vs_best_baseline"])
            if r["kernels"] > 1:
                mixed.setdefault(name, []).append(m["tensorplan"])
            out.append(f"| {name} | {m['tensorplan']:.1f} | {m['onnxruntime']:.1f} | {m['pytorch']:.1f} | "
                       f"{m['torch.compile']:.1f} | {r['speedup_vs_best_baseline']:.2f} ({r['best_baseline']}) | "
                       f"{r['kernels']} | {r['max_rel_err']:.1e} | {r['loadavg'][0]:.1f} |")
        if len(ratios) > 1:
            out += ["", f"Geomean over the best baseline: **{_geo(ratios):.2f}×** over {len(ratios)} models."]
    # the spread of the mixed (multi-kernel) plans: every timing of such a plan in the JSONs
    for name, alone in mixed.items():
        p = kdir / f"korch_{name}.json"
        bench = json.loads(p.read_text()) if p.exists() else {}
        bm = bench.get("median_ms", {})
        same = [bm[k] for k in ("tensorplan", "no-rewrite", "no-recompute", "greedy", "no-fission") if k in bm]
        if not same or bench.get("kernels_per_inference", 1) <= 1:  # no longer a mixed plan
            continue
        out += ["", f"The mixed plan of {name} ({bench.get('kernels_per_inference')} kernels, ORT and TVM) is the "
                f"most sensitive to what else runs: in korch_bench's crowded process its plan and the near-identical "
                f"ablation plans (no-rewrite, no-recompute, greedy, no-fission) measured {min(same):.0f}–"
                f"{max(same):.0f} ms, alone it measured {min(alone):.0f}–{max(alone):.0f} ms in the runs above, "
                "while the single-session plans move with ONNX Runtime. Each kernel boundary wakes a thread "
                "pool; on 2 shared cores every wake-up can wait behind other work."]
    return out + ([""] if out else [])


def export_section() -> list[str]:
    """`tensorplan export`: each benchmark model as one ONNX file for stock ONNX Runtime (export.json)."""
    d = load("export.json")
    if not d:
        return []
    out = ["### The plan as one ONNX file (`tensorplan export`)", "",
           "`python bench/export_bench.py`: each model's plan, or where none is "
           "cached its exact rewrites, written as one ONNX file, checked against ONNX Runtime on the original model "
           "and timed against it in ONNX Runtime, both sessions in one process, interleaved (random order, per "
           "round one untimed call then a ~30 ms burst), medians in ms, 2 threads, spinning as the plan chose. "
           "`exact`: the file is the plan itself (one ONNX Runtime session over the whole rewritten model).", "",
           "| model | exported from | exact | plan kernels left out | rewrites | GFLOP | ONNX Runtime, original "
           "| exported | speed-up | max rel. err | load avg (1 min) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = []
    for r in d["models"]:
        tm = r["timing"]
        ratios.append(tm["speedup"])
        rw = sum(r["rewrites"].values())
        left = ", ".join(f"{c} {b}" for b, c in sorted(r["outside_ort"].items())) or "none"
        out.append(f"| {r['model']} | {r['target']} | {('yes' if r['exact'] else 'no') if r['target'] == 'plan' else 'n/a (no plan cached)'} | {left if r['target'] == 'plan' else 'n/a'} | {rw} | {r['gflop'][0]:.2f} → {r['gflop'][1]:.2f} | {tm['original_ms']:.1f} | "
                   f"{tm['exported_ms']:.1f} | {tm['speedup']:.2f}× | {r['max_rel_err']:.1e} | {r['loadavg'][0]:.1f} |")
    out += ["", f"Geomean speed-up of the exported file over the original, both in ONNX Runtime: "
            f"**{_geo(ratios):.2f}×** over {len(ratios)} models. Where the file is not the plan (a plan that runs "
            "Inductor or TVM kernels), `tensorplan run` runs the plan itself; the table of the previous section "
            "has those timings.", ""]
    return out


def openvino_section() -> list[str]:
    """OpenVINO's CPU runtime against ONNX Runtime on the Korch models (openvino_probe.json; a probe)."""
    d = load("openvino_probe.json")
    if not d:
        return []
    dflt = d.get("openvino_default_precision")
    out = ["### OpenVINO: fp32, and its default precision beside", "",
           f"`python bench/openvino_probe.py --models ...` (OpenVINO {d['openvino']}, pinned in pyproject.toml): the "
           "same ONNX files in ONNX Runtime and in OpenVINO's CPU runtime, 2 threads, latency hint, fp32 "
           "(`INFERENCE_PRECISION_HINT=f32`), interleaved as above "
           f"({d['rounds']} rounds, 50 ms pauses, bursts), outputs checked against ONNX Runtime. "
           + (f"OpenVINO's default on this CPU computes in {dflt}: that figure is beside, labelled, never a "
              "baseline of an fp32 plan. " if dflt and dflt != "fp32" else "")
           + "Medians in ms:", "",
           "| model | ONNX Runtime | OpenVINO fp32 | ORT / OpenVINO | OpenVINO default | max rel. err | noisy |",
           "|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        m = r["median_ms"]
        beside = (f"{m['openvino-default']:.2f} ({r.get('openvino_default_precision')})"
                  if "openvino-default" in m else "–")
        out.append(f"| {r['model']} | {m['onnxruntime']:.2f} | {m['openvino']:.2f} | {r['openvino_speedup']:.2f}× | "
                   f"{beside} | {r['max_rel_err']:.1e} | {'yes' if r.get('noisy') else 'no' if 'noisy' in r else '–'} |")
    faster = [r for r in d["rows"] if r["openvino_speedup"] > 1.05]
    out += ["", f"OpenVINO fp32 is more than 5 % faster than ONNX Runtime on {len(faster)} of {len(d['rows'])} models "
            f"here (geomean {_geo([r['openvino_speedup'] for r in d['rows']]):.2f}×), so every benchmark's best "
            "baseline includes it (workflows/peers.py). tensorplan also uses it as a region backend next to ONNX "
            "Runtime (Korch's minimum over profilers: `MeasuredCost` times every region candidate in both, "
            "kernels/openvino.py), so the BLP takes it where it wins, and the finalists' race runs a one-session "
            "plan on both (workflows/race.py). Where OpenVINO is slower than ONNX Runtime ("
            + ", ".join(f"{r['model']} {r['openvino_speedup']:.2f}×" for r in d["rows"] if r["openvino_speedup"] < 0.95)
            + ") the plan stays an ONNX Runtime session.", ""]
    return out


def beyond_zoo_section() -> list[str]:
    """Models outside the zoo: operators without a tensorplan rule run in ONNX Runtime (beyond_zoo.json)."""
    d = load("beyond_zoo.json")
    if not d:
        return []
    out = ["## Models outside the zoo: operators without a tensorplan rule", "",
           "`python bench/beyond_zoo.py`: int8 models from ONNX Runtime's quantizer, an LSTM, com.microsoft contrib "
           "ops, torch's MultiheadAttention and a half-precision CNN, each through `tensorplan demo`'s workflow. "
           "*Foreign* operators have no numpy rule here; ONNX Runtime runs them one node at a time in the reference "
           "executor and they stay opaque in plans (`ir.ort_node`). Interleaved medians in ms (random order, 50 ms "
           "pauses, bursts), 2 threads; the tolerance is 1e-4 for fp32 outputs and 8 machine epsilons for fp16.", "",
           "| model | foreign operators | reference vs ORT | plan kernels | plan vs ORT | ONNX Runtime | tensorplan "
           "| speed-up | torch.compile |", "|---|---|---|---|---|---|---|---|---|"]
    for r in d["rows"]:
        kern = ", ".join(f"{b} {c}" for b, c in sorted(r["plan_backends"].items()))
        tc = f"{r['torch_compile_ms']:.3f}" if r.get("torch_compile_ms") else "n/a (ONNX file)"
        out.append(f"| {r['model']} | {', '.join(r['foreign_ops']) or 'none'} | {r['reference_rel_error']:.1e} | "
                   f"{r['plan_kernels']} ({kern}) | {r['plan_rel_error']:.1e} (tol {r['tolerance']:.0e}) | "
                   f"{r['ort_ms']:.3f} | {r['plan_ms']:.3f} | {r['speedup_vs_ort']:.2f}× | {tc} |")
    one = [r for r in d["rows"] if r["plan_kernels"] == 1 and set(r["plan_backends"]) == {"ort"}]
    out += ["", f"{len(one)} of {len(d['rows'])} plans are one ONNX Runtime session over the whole model (no mix "
            "of kernels won the race), so there the plan ties ONNX Runtime: what these models gain is that they "
            "import, plan, run and check at all (before, a foreign operator failed the import, MultiheadAttention's "
            "fast path failed the PyTorch export and the fp16 model failed the fp32 check of 1e-4). Geomean "
            f"tensorplan / ONNX Runtime speed-up: {_geo([r['speedup_vs_ort'] for r in d['rows']]):.2f}×.", ""]
    return out


def planning_section() -> list[str]:
    """Fission, candidate counts and BLP solve times on every zoo model (korch_candidates.json)."""
    d = load("korch_candidates.json")
    if not d:
        return []
    rows = sorted(d["models"], key=lambda r: r["model"])
    caps = sorted({int(c) for r in rows for c in r["caps"]})
    cap = 8 if 8 in caps else caps[0]
    out = ["## Fission, candidate kernels and the BLP on every zoo model", "",
           f"`python bench/korch_candidates.py --check` (resumable; one line per model, opset "
           f"{rows[0]['opset']}). Fission error = max relative error of the primitive graph run by the reference "
           f"executor vs ONNX Runtime on the original model (random inputs, fp32). Candidates at the default size cap "
           f"of {cap} primitives (`orchestrate --max-nodes`); unique = distinct canonical hashes, i.e. measurements "
           "needed. BLP costs are the roofline model's (`AnalyticalCost`), a planning signal only: the solve "
           "times and counts are the point. `solve s` is the median of the repeated solves with the valid cuts "
           "and dominance presolve; the other two columns drop one of them (same time limit, "
           f"{rows[0]['caps'][str(cap)]['blp'].get('time_limit', 120):.0f} s; the solver stops at a relative "
           f"MIP gap of {rows[0]['caps'][str(cap)]['blp'].get('mip_rel_gap', 1e-6):g}).", "",
           "| model | operators | primitives | opaque | fission error | regions | candidates (unique) "
           "| enumerate s | BLP status | kernels | solve s | no cuts s | no presolve s | BLP / greedy | BLP / no fusion |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["caps"].get(str(cap))
        if not c:
            continue
        e, b = c["enumeration"], c["blp"]
        err = r.get("fission_max_rel_error_vs_ort")
        opaque = ", ".join(sorted({str(o) for o in r["fission"].get("opaque", [])})) or "–"
        nc = c["blp_no_cuts"]
        nc_s = f"{nc['solve_s_median']:.2f}" + (f" ({nc['status']})" if nc["status"] != "optimal" else "")
        npre = c.get("blp_no_presolve")
        npre_s = (f"{npre['solve_s_median']:.2f}" + (f" ({npre['status']})" if npre["status"] != "optimal" else "")
                  if npre else "–")
        out.append(f"| {r['model']} | {r['operators']} | {r['primitives']} | {opaque} | "
                   f"{'–' if err is None else f'{err:.1e}'} | {e['regions']} | {e['candidates']} ({e['unique_hashes']}) | "
                   f"{e['seconds']:.2f} | {b['status']}, gap {b['mip_gap'] or 0:.0e} | {b['kernels']} | "
                   f"{b['solve_s_median']:.2f} | {nc_s} | {npre_s} | "
                   f"{1 / c['speedup_blp_vs_greedy_predicted']:.2f} | {1 / c['speedup_blp_vs_nofusion_predicted']:.2f} |")
    errs = [r["fission_max_rel_error_vs_ort"] for r in rows if r.get("fission_max_rel_error_vs_ort") is not None]
    if errs:
        out += ["", f"Fission matches ONNX Runtime on {sum(e <= 1e-4 for e in errs)} of {len(errs)} models checked "
                f"(worst {max(errs):.1e}, tolerance 1e-4); BLP / greedy and BLP / no fusion are predicted-latency "
                "ratios (< 1: the BLP's plan is cheaper)."]
    hit = [(r["model"], r["caps"][str(cap)]["blp"]) for r in rows
           if str(cap) in r["caps"] and r["caps"][str(cap)]["blp"]["status"] != "optimal"]
    if hit:
        out += ["", "Hit the time limit with the cuts: " + ", ".join(
            f"{m} ({b['status']}, MIP gap {b['mip_gap']:.0e})" for m, b in hit)
            + "; the cheaper of the incumbent and greedy fusion is verified and used."]
    return out + [""]


def winograd_section() -> list[str]:
    """bench/winograd_probe.py: the opt-in Winograd rewrite on ONNX Runtime, with and without."""
    p = RES / "winograd_probe.json"
    if not p.exists():
        return []
    d = json.loads(p.read_text())
    rows = [r for r in d["results"] if "median_ms" in r]
    out = ["## Winograd F(4x4, 3x3) from ONNX operators (opt-in)", "",
           "`python bench/winograd_probe.py` — ONNX Runtime on each model after the default rewrites, "
           "without and with every eligible 3x3 convolution as Winograd (`tensorplan orchestrate --winograd`; "
           f"rewrite/passes.py), interleaved, {d['rounds']} rounds, {d['threads']} threads; the most frequent "
           "eligible convolution shape is also timed alone.", "",
           "| model | eligible convs | direct ms | Winograd ms | speedup | top conv alone (direct → Winograd ms) "
           "| max rel. error |", "|---|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        m, c = r["median_ms"], r["top_conv_alone_ms"]
        out.append(f"| {r['model']} | {r['eligible_convs']} | {m['direct']:.2f} | {m['winograd']:.2f} | "
                   f"{r['speedup']:.2f}× | {c['direct']:.3f} → {c['winograd']:.3f} ({r['top_conv_alone_speedup']:.2f}×) "
                   f"| {r['max_rel_error']:.1e} |")
    extra = []
    for r in rows:
        po = r["per_op_ms"]["winograd"]
        top = sorted(((k, v) for k, v in po.items() if k in ("Transpose", "DepthToSpace", "MatMul", "Conv")),
                     key=lambda kv: -kv[1])
        extra.append(f"{r['model']}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in top))
    out += ["", "The GEMMs get 4× fewer multiply-adds, but built from ONNX operators the tile transforms are "
            "separate passes over a tensor 2.25× the input (a depthwise 6x6 stride-4 convolution, a Transpose, "
            "a MatMul and a DepthToSpace) that cost ONNX Runtime about as much as the GEMMs save, and they break its "
            "blocked-layout chain of convolutions. Per-operator time with Winograd (ORT profiler): "
            + "; ".join(extra) + ". So the rule is off by default; fused transform kernels would be needed "
            "to make it pay.", ""]
    return out


def korch_gpu_section() -> list[str]:
    """bench/korch_gpu.py: plans of PyTorch-built kernels on a CUDA GPU vs eager and torch.compile."""
    d = load("korch_gpu.json")
    if not d or not d.get("summary"):
        return []
    mach, pk = d["machine"], d["peaks"]
    rows = [(k, d["models"][k]) for k in d["summary"]["models"]]
    systems = ["tensorplan", "torch.compile-cudagraphs", "torch.compile", "torch.compile-max-autotune", "pytorch",
               "greedy", "no-fusion", "tensorplan (no CUDA graph)"]
    out = ["## Korch on a GPU (PyTorch-built kernels)", "",
           f"`python bench/korch_gpu.py --models {' '.join(k for k, _ in rows)}` on one {mach['gpu']} "
           f"(driver {mach['driver']}, torch {mach['versions']['torch']}, Triton {mach['versions']['triton']}; "
           f"{mach['nproc']} CPU cores), results of separate calls folded together with `--merge`, every model "
           f"on the same machine. Each unique candidate kernel is built by `kernels.torch_kernel` (Inductor fuses a "
           f"memory-bound candidate into one Triton kernel; linear primitives call cuDNN/cuBLAS) and timed as "
           f"CUDA-graph replays; the BLP picks the kernels; the plan runs as one CUDA graph "
           f"(`runtime.torch_runner`). Baselines on the same GPU, interleaved, median ms over rounds of "
           f"~50 ms bursts; TF32 off everywhere; outputs checked against ONNX Runtime. Roofline: "
           f"{pk['fp32_matmul_gflops'] / 1e3:.1f} TFLOP/s fp32 and {pk['copy_gbs']:.0f} GB/s, measured in the run.", "",
           "| model | " + " | ".join(systems) + " | speedup vs best baseline | kernels (BLP / no fusion) | "
           "predicted → measured ms | × roofline | max rel. error |",
           "|---|" + "---:|" * (len(systems) + 5)]
    for k, r in rows:
        m = r["median_ms"]
        o = r["orchestrate"]
        errs = [v for v in r["max_rel_err_vs_ort"].values() if isinstance(v, float)]
        out.append(f"| {k} | " + " | ".join(f"{m[s]:.3f}" if s in m else "-" for s in systems) +
                   f" | {r['speedup_vs_best_baseline']:.2f}× ({r['best_baseline']}) | "
                   f"{o['tensorplan']['kernels']} / {o['no-fusion']['kernels']} | "
                   f"{o['tensorplan']['predicted_ms']:.3f} → {m['tensorplan']:.3f} | {r['vs_roofline']:.1f}× | "
                   f"{max(errs):.1e} |")
    t = {k: r["orchestrate"]["tensorplan"]["timing"] for k, r in rows}
    cm = {k: r["cost_model"] for k, r in rows}
    out += ["", f"Geomean speedup over the best baseline per model: "
            f"{d['summary']['geomean_speedup_vs_best_baseline']:.2f}×. Optimisation time (s): " + "; ".join(
                f"{k}: enumerate {t[k]['enumerate_s']:.1f}, profile {t[k]['profile_s']:.0f} "
                f"({cm[k]['kernels_timed']} kernels, of which pre-compiling in parallel {cm[k]['warm_s']:.0f}), "
                f"solve {t[k]['solve_s']:.1f}" for k in t) + ".",
            "", f"The plan is faster than every baseline on {sum(r['speedup_vs_best_baseline'] > 1 for _, r in rows)} "
            f"of {len(rows)} models; greedy fusion over the same measured kernels lands within "
            f"{max(abs(r['median_ms']['greedy'] / r['median_ms']['tensorplan'] - 1) for _, r in rows) * 100:.1f} % of "
            "the BLP here (why the margins differ per model was not profiled). Every system is far from the "
            "roofline bound: these are small models at batch 1, and the plans have "
            f"{min(r['orchestrate']['tensorplan']['kernels'] for _, r in rows)}-"
            f"{max(r['orchestrate']['tensorplan']['kernels'] for _, r in rows)} kernels, each a launch of a few "
            "microseconds even inside a CUDA graph. Without a CUDA graph the same plan is "
            f"{min(r['median_ms']['tensorplan (no CUDA graph)'] / r['median_ms']['tensorplan'] for _, r in rows):.1f}-"
            f"{max(r['median_ms']['tensorplan (no CUDA graph)'] / r['median_ms']['tensorplan'] for _, r in rows):.1f}× "
            "slower (Python launches each kernel), which is why the runner captures one.", ""]
    return out

#: the CDMPP evaluation: `make bench`'s "cdmpp-accuracy" step writes the first (the product's models);
#: until it has run on this checkout, the last published run (research/run_experiments.py "cdmpp-eval",
#: the same harness with the research variants added) is shown, and the section says which
CDMPP_EVAL = RES / "cdmpp_eval.json"
CDMPP_EVAL_RESEARCH = ROOT / "research" / "cdmpp" / "results" / "cdmpp_eval.json"
#: the models the product ships or trains (`tensorplan predictor train --model`); the rest are research variants
PRODUCT_MODELS = ("cdmpp", "cdmpp-nocmd", "cdmpp-nocmd-parts", "xgboost", "xgboost-hier", "mlp", "tlp", "roofline")


def cdmpp_section() -> list[str]:
    """CDMPP against its baselines on the three splits of one evaluation run (MAPE, lower is better)."""
    path = CDMPP_EVAL if CDMPP_EVAL.exists() else CDMPP_EVAL_RESEARCH
    if not path.exists():
        return []
    d = json.loads(path.read_text())
    research = path == CDMPP_EVAL_RESEARCH
    sp = d["splits"]
    net, dev, smp = sp.get("network", {}), sp.get("device", {}), sp.get("sample", {})

    def cell(split, model, *keys):
        r = split.get("models", {}).get(model)
        for k in keys:
            r = r.get(k) if isinstance(r, dict) else None
        return f"{r:.1f}" if isinstance(r, (int, float)) else "–"

    holdout = ",".join(net.get("holdout_networks", []))
    cmd = (f"`python research/cdmpp/evaluate_variants.py --devices local-1t,local-2t --holdout {holdout} "
           f"--time-scale {d.get('time_scale')} --out {path.relative_to(ROOT)}` (the harness of `tensorplan "
           "predictor evaluate` with the research variants added; `make bench BENCH_ARGS=--only=cdmpp-accuracy` "
           "reruns the product's models into bench/results/cdmpp_eval.json, which this section then shows)"
           if research else
           f"`tensorplan predictor evaluate --devices local-1t,local-2t --holdout {holdout} --time-scale "
           f"{d.get('time_scale')} --out {path.relative_to(ROOT)}` (`make bench` step `cdmpp-accuracy`)")
    out = ["## CDMPP: prediction accuracy", "",
           f"{cmd}. One run, seed {d.get('seed')}, "
           f"on {d['machine'].get('cpu')} ({d['machine'].get('cpus')} cores). MAPE in % on each split's test "
           "records: held-out networks (their kernels never seen in training), a held-out thread count "
           f"({dev.get('source')} -> {dev.get('target')}: zero-shot, and few-shot with KMeans-chosen target "
           "samples), and a random sample split.", "",
           "| model | held-out networks | device zero-shot | device few-shot (KMeans) | sample split |",
           "|---|---|---|---|---|"]
    for m in PRODUCT_MODELS:
        if m not in net.get("models", {}) and m not in smp.get("models", {}):
            continue
        out.append(f"| {m} | {cell(net, m, 'mape_pct')} | {cell(dev, m, 'zero_shot', 'mape_pct')} | "
                   f"{cell(dev, m, 'fewshot_kmeans', 'mape_pct')} | {cell(smp, m, 'mape_pct')} |")
    s = d.get("summary", {})
    if s.get("network_best_model"):
        out += ["", f"Best research variant on held-out networks: {s['network_best_model']} "
                    f"{s['network_best_mape_pct']:.1f} %; on the sample split: {s.get('sample_best_model')} "
                    f"{s.get('sample_best_mape_pct', float('nan')):.1f} % (research/notes/cdmpp.md explains the variants)."]
    return out + [""]


def predict_tuned_section() -> list[str]:
    """`predict` with tuned picks against measurement and ONNX Runtime (bench/predict_tuned.py)."""
    res = load("predict_tuned.json")
    if not res or not res.get("rows"):
        return []
    m = res["machine"]
    out = ["## CDMPP: tuned predictions against this CPU and ONNX Runtime", "",
           "`python bench/predict_tuned.py` — `predict(model, device, tuned=N, measure=True)`: the tuned total (each "
           "kernel's predicted-fastest of its first N sampled schedules, none timed), the picks compiled and timed "
           "one kernel at a time (per-kernel MAPE on the picks, whole-network predicted/measured), the untuned total "
           "(default schedules) and ONNX Runtime on the same ONNX file in the same run (interleaved, median). "
           f"{m['cpu']}, {m['cores']} cores; `noisy`: the 1-minute load exceeded the cores (rerun those rows on a "
           "quiet machine).", "",
           "| model | in dataset | device | N | kernels | untuned pred ms | tuned pred ms | picks meas ms | pred/meas | "
           "per-kernel MAPE (picks) | defaults meas ms | ONNX Runtime ms | tuned pred / ORT | noisy |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(x, d=2):
        return "-" if x is None else f"{x:.{d}f}"
    for r in res["rows"]:
        out.append(f"| {r['model']} | {'yes' if r['in_dataset'] else 'no'} | {r.get('device', 'local')} | "
                   f"{r['tuned']} | {r['kernels']} | {f(r['untuned_predicted_ms'])} | {f(r['tuned_predicted_ms'])} | "
                   f"{f(r.get('tuned_measured_ms'))} | {f(r.get('tuned_pred_over_meas'))} | "
                   f"{f(r.get('tuned_kernel_mape_pct'), 0)} % | {f(r.get('untuned_measured_ms'))} | {f(r['ort_ms'])} | "
                   f"{f(r.get('tuned_predicted_over_ort'))} | {'yes' if r.get('noisy') else 'no'} |")
    return out + [""]


def optimize_section() -> list[str]:
    """`tensorplan optimize` on this CPU (bench/optimize_bench.py -> optimize_bench.json)."""
    d = load("optimize_bench.json")
    if not d or not d.get("per_model"):
        return []
    m = d["machine"]
    out = ["## `tensorplan optimize`: time to plan, what was measured, speed-up over the best peer", "",
           "`python bench/optimize_bench.py --models ...` — per model, `optimize` from a cold store (budget in the "
           "table), where run the same with Korch's kernels only (`regions=False`, store warm) and a fully measured "
           "`orchestrate` (every unique candidate compiled and timed), then every plan and the peers (ONNX Runtime, "
           "OpenVINO fp32, OpenVINO's default precision beside, torch.compile) interleaved in one run, "
           f"{m.get('threads')} threads, on {m.get('cpu')} ({m.get('platform', '')[:40]}). `measured` = kernels "
           "compiled and timed by `optimize` / unique candidates (what the fully measured run times); `vs full` = "
           "optimize plan's latency / the fully measured plan's; `vs best` = best fp32 peer / plan (> 1: the plan "
           "is faster); `plan ms` = the plan-time model's prediction of the kept plan / its measured median in the "
           "timing run; `noisy` = the run's own flag (CoV of rounds > 10 % or load above the cores).", "",
           "| model | budget s | time to plan s (predict / measure / race) | measured | vs full | vs best (optimize) | "
           "vs best (Korch kernels only) | plan ms predicted / measured | best fp32 peer | OpenVINO default | "
           "final plan | rewrites | noisy |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in d["per_model"].items():
        if "error" in r:
            out.append(f"| {name} | {r.get('budget_s', 0):.0f} | failed: {r['error'][:80]} | | | | | | | | | | |")
            continue
        o, t = r["optimize"], r["timing"]
        ph = o.get("phases", {})
        sp = r.get("speedup_over_best", {})
        med = t["median_ms"]
        best = t.get("best_peer")
        dflt = [k for k, v in t.get("peer_precision", {}).items() if v != "fp32"]
        beside = ", ".join(f"{med[k]:.1f} ms ({t['peer_precision'][k]})" for k in dflt if k in med) or "–"
        pm = o.get("predicted_plan_ms")
        plan_ms = f"{pm:.1f} / {med['optimize']:.1f}" if pm and "optimize" in med else "–"
        out.append(
            f"| {name} | {r.get('budget_s', o.get('budget_s', 0)):.0f} | {o['total_s']:.0f} "
            f"({ph.get('predict_s', 0):.0f} / {ph.get('measure_s', 0):.0f} / "
            f"{ph.get('race_s', 0):.0f}) | {o['measured']}/{o['unique_kernels']} ({100 * o['measured_share']:.0f} %) | "
            + (f"{r['optimize_vs_full']:.2f}" if "optimize_vs_full" in r else "–") + " | "
            + (f"**{sp['optimize']:.2f}×**" if "optimize" in sp else "–") + " | "
            + (f"{sp['korch-kernels']:.2f}× ({r['korch_kernels']['kernels']} kernels: "
               + ", ".join(f"{b} {n}" for b, n in r["korch_kernels"]["backends"].items()) + ")"
               if "korch-kernels" in sp else "–")
            + f" | {plan_ms} | {best} {med.get(best, float('nan')):.1f} ms | {beside} | {o['kernels']} kernel(s): "
            + ", ".join(f"{b} {n}" for b, n in o["backends"].items())
            + f" | {', '.join(f'{k} ×{v}' for k, v in o.get('rewrites', {}).items()) or 'none'} | "
            + ("yes" if t.get("noisy") else "no") + " |")
    for key, title in (("korch_models", "Korch benchmark models"), ("other_models", "other zoo models")):
        g = d.get(key) or {}
        if g.get("models"):
            gm = g.get("geomean_speedup_over_best")
            gk = g.get("geomean_korch_kernels_over_best")
            out += ["", f"{title} ({', '.join(g['models'])}): geomean speed-up over the best fp32 peer "
                    + (f"**{gm:.2f}×**" if gm else "–") + ", Korch's kernels only "
                    + (f"{gk:.2f}×" if gk else "–") + f"; median time to plan {g['median_time_to_plan_s']:.0f} s, "
                    f"median share measured {100 * g['median_measured_share']:.0f} %; {g['mixed_plans']} final "
                    "plan(s) mix more than one kernel."]
    return out + [""]


def tuned_bandwidth_section() -> list[str]:
    """Tuned vs default memory kernels against the bandwidth bound (bench/tuned_bandwidth.py)."""
    d = load("tuned_bandwidth.json")
    if not d or not d.get("per_model"):
        return []
    out = ["## Tuned memory kernels against the bandwidth bound (issue 59)", "",
           "`python bench/tuned_bandwidth.py --models ... --budget 3m` — per model, `optimize` with Korch's kernels only "
           "(no regions, no race: the solver's plan) from a cold store; each TVM memory kernel of the plan compiled "
           "with the default schedule and with the one `optimize` kept (fastest measured of the predictor's top 3 "
           "and the default), timed interleaved. Distance = measured time / (bytes moved / measured bandwidth); "
           "1 = at the bound (below 1: the bytes counted were partly cache-resident). `timed / sampled` = upper "
           "bound of the share of sampled schedules compiled and timed (kernels timed x 3 / draws).", "",
           "| model | memory kernels | distance default: median / p90 | tuned: median / p90 | summed ms default -> tuned | "
           "timed / sampled | load |", "|---|---|---|---|---|---|---|"]
    for name, r in d["per_model"].items():
        if "default_median" not in r:
            out.append(f"| {name} | {r.get('memory_kernels', 0)} | – | – | – | – | |")
            continue
        share = r.get("share_of_sampled_timed_upper_bound")
        out.append(f"| {name} | {r['memory_kernels']} | {r['default_median']:.2f} / {r['default_p90']:.2f} | "
                   f"{r['tuned_median']:.2f} / {r['tuned_p90']:.2f} | {r['default_sum_ms']:.1f} -> {r['tuned_sum_ms']:.1f} | "
                   + (f"{100 * share:.0f} %" if share is not None else "–") + f" | {r['loadavg'][0]:.1f} |")
    sm = d.get("summary") or {}
    if sm.get("kernels"):
        out += ["", f"All {sm['kernels']} kernels: default {sm['default_median']:.2f} / {sm['default_p90']:.2f}, tuned "
                f"{sm['tuned_median']:.2f} / {sm['tuned_p90']:.2f} (median / p90); tuned faster by > 5 % on "
                f"{sm['tuned_faster']}, slower on {sm['tuned_slower']}."]
    return out + [""]


def precision_section() -> list[str]:
    """`optimize --precision auto` against OpenVINO's default precision (bench/precision_bench.py): one
    table at the stated tolerance (precision_bench.json), one matched to OpenVINO default's own error
    per model (precision_bench_match.json)."""
    runs = [(f, d) for f in ("precision_bench.json", "precision_bench_match.json")
            if (d := load(f)) and d.get("per_model")]
    if not runs:
        return []
    d0 = runs[0][1]
    native = ", ".join(f"{k} {'native via ' + v['via'] if v['native'] else 'not native (' + v['via'] + ')'}"
                       for k, v in d0.get("native_precisions", {}).items())
    m = d0.get("machine", {})
    cpu = (m.get("device") or {}).get("model") or m.get("cpu") or "?"
    out = ["## Reduced precision: `optimize --precision auto` vs OpenVINO's default (issue 63)", "",
           f"`python bench/precision_bench.py --budget 4m [--tolerance T]` — per model, `optimize --precision auto "
           "--tolerance T` (4-minute budget), then the kept plan and the peers (OpenVINO as it comes, OpenVINO fp32, "
           "ONNX Runtime fp32, ONNX Runtime int8 QDQ, OpenVINO int8 NNCF) interleaved in one run, each with its "
           "error against ONNX Runtime fp32 on the 8 calibration inputs (random: numerical drift, not task "
           f"accuracy). CPU: {cpu}, {m.get('threads', '?')} threads; {native}. OpenVINO's default here computes "
           f"in {d0.get('openvino_default_precision', '?')}. `error` = max |out - ref| / max |ref|.", ""]
    for fname, d in runs:
        tol = d.get("tolerance")
        what = ("matched per model to OpenVINO default's own error on the same inputs (equal or better accuracy "
                "by construction)" if tol == "openvino-default" else f"{tol} of the outputs' range")
        avg = (d.get("machine") or {}).get("loadavg")
        load_txt = (f" Load average when it ended (1/5/15 min): {', '.join(f'{x:.1f}' for x in avg)} on "
                    f"{(d.get('machine') or {}).get('nproc', '?')} cores." if avg else "")
        out += [f"**Tolerance {what}** (`bench/results/{fname}`).{load_txt}", "",
                "| model | kept precision | tensorplan ms (error) | OpenVINO default ms (error) | speed-up over it | "
                "accuracy ≥ it | ORT int8 ms (error) | OpenVINO int8 ms (error) | noisy |",
                "|---|---|---|---|---|---|---|---|---|"]
        for name, r in d["per_model"].items():
            if "error" in r and "timing" not in r:
                out.append(f"| {name} | failed: {str(r['error'])[:80]} | | | | | | | |")
                continue
            t, a = r["timing"], r.get("accuracy", {})

            def cell(k: str) -> str:
                ms = t["median_ms"].get(k)
                err = (a.get(k) or {}).get("error")
                return f"{ms:.2f} ({err:.2g})" if ms is not None and err is not None else "–"
            sp = r.get("speedup_over_openvino_default")
            out.append(f"| {name} | {t.get('precision', {}).get('tensorplan', '?')} | {cell('tensorplan')} | "
                       f"{cell(r.get('baseline', 'openvino-default'))} | " + (f"**{sp:.2f}×**" if sp else "–") +
                       f" | {'yes' if r.get('accuracy_at_least_openvino_default') else 'no'} | "
                       f"{cell('onnxruntime-int8')} | {cell('openvino-int8')} | " + ("yes" if t.get("noisy") else "no")
                       + " |")
        groups = []
        for key, label in (("korch_models", "the 7 Korch models"), ("other_models", "the other models")):
            g = d.get(key) or {}
            if g.get("models"):
                gm = g.get("geomean_speedup_over_openvino_default")
                groups.append(f"{label} ({len(g['models'])}): geomean **{gm:.2f}×** over OpenVINO's default, "
                              f"accuracy at least as good on {g['accuracy_at_least_openvino_default']} of "
                              f"{len(g['models'])}, reduced-precision kernels kept on {g['reduced_plans']}, median "
                              f"time to plan {g['median_time_to_plan_s']:.0f} s" if gm else f"{label}: –")
        out += ["", "; ".join(groups) + ".", ""]
    return out


def ray_section() -> list[str]:
    """Measurement jobs on a local Ray cluster vs in-process (bench/ray_bench.py -> ray_bench.json)."""
    d = load("ray_bench.json")
    if not d:
        return []
    c, r, n = d["collect"], d["per_record"], d["noop_job"]
    flags = "; ".join(d.get("noise_flags") or []) or "none"
    return ["## Measurement on a Ray cluster (issue 61)", "",
            f"`{d['command']}` — `dataset collect` of {d['network']} ({d['programs_per_task']} programs per task, "
            f"threads {d['threads']}) in-process and on a local Ray cluster ({d['cluster']['nodes']}, "
            f"{d['cluster']['worker_cpus']} CPUs: the same cores), {d['rounds']} interleaved trials each, medians. "
            f"Noise: {flags}.", "",
            "| mode | records/s (median) | s per record | no-op job: streamed / round trip |",
            "|---|---|---|---|",
            f"| in-process | {c['in-process']['median_records_per_s']:.2f} | {r['in_process_s'] * 1e3:.0f} ms | "
            f"{n['in-process']['stream_s_per_job'] * 1e6:.1f} us / {n['in-process']['round_trip_median_s'] * 1e6:.1f} us |",
            f"| Ray cluster | {c['ray']['median_records_per_s']:.2f} | {r['ray_s'] * 1e3:.0f} ms "
            f"(+{r['difference_s'] * 1e3:.0f} ms) | {n['ray']['stream_s_per_job'] * 1e3:.1f} ms / "
            f"{n['ray']['round_trip_median_s'] * 1e3:.1f} ms |", "",
            f"The cluster's first trial (workers starting) ran {d['cold_cluster_trial']['records_per_s']:.2f} "
            "records/s. On one machine the cluster only adds overhead; it pays when machines are added.", ""]


def conformance_section() -> list[str]:
    """ONNX backend node tests (bench/onnx_conformance.py): pass / clear error / wrong per op family,
    next to ONNX Runtime on the same cases."""
    d = load("onnx_conformance.json")
    if not d:
        return []
    import re
    fams = d["summary"]["families"]
    order = ["elementwise", "reduce / arg", "conv / pool", "linear / quant", "normalization / nn",
             "shape / layout", "control / other"]
    out = ["## ONNX backend node tests", "",
           f"`{d['command']}` ({d['seconds']:.0f} s): the {d['summary']['total']['cases']} node test cases "
           f"onnx {d['onnx']} generates, each imported with shape-like inputs (axes, sizes, scales, pads, "
           "split sizes, slice bounds, shapes) frozen as constants, run by the reference executor and, where "
           "a fission rule applies, fissioned and run again, against the expected outputs (rtol 1e-3 for "
           "fp32/fp64, a few ulps for fp16). *Clear error*: one `TensorplanError` naming the node, op and "
           "what is unsupported; *wrong*: numbers, shape or dtype differ, or a traceback (the unfrozen "
           "variant counts too). ONNX Runtime "
           f"{d['onnxruntime']} (CPU provider) runs the same cases as given. `tests/test_onnx_conformance.py` "
           "runs them in `make test` and fails on any wrong result not on its short known list.", "",
           "| op family | cases | pass | clear error | wrong | ONNX Runtime pass | both pass | ORT passes, tensorplan does not |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for fam in order + sorted(set(fams) - set(order)):
        f = fams.get(fam)
        if not f:
            continue
        out.append(f"| {fam} | {f['cases']} | {f['pass']} | {f['error']} | {f['wrong']} | {f['ort_pass']} | "
                   f"{f['both_pass']} | {f['ort_only']} |")
    t = d["summary"]["total"]
    out.append(f"| **all** | {t['cases']} | {t['pass']} | {t['error']} | {t['wrong']} | {t['ort_pass']} | "
               f"{t['both_pass']} | {t['ort_only']} |")
    rows = d["cases"]

    def cls(r: dict) -> str:
        if r["status"] == "wrong" or r.get("unfrozen", {}).get("status") == "wrong":
            return "wrong"
        return r["status"]
    gap = d["summary"].get("ort_only_by_reason") or {}
    out += ["", f"ONNX Runtime passes {t['ort_pass']} cases, tensorplan {t['pass']}. The {t['ort_only']} that ONNX "
            "Runtime passes and tensorplan does not, by reason: "
            + "; ".join(f"{why} ({len(names)}: {', '.join(names[:4])}{' …' if len(names) > 4 else ''})"
                        for why, names in gap.items())
            + ". Each gets one clear error naming the node or input. Models below opset 11 are converted by "
            "`onnx.version_converter` and checked node by node (ir/onnx_import.py `_UPGRADES`); opsets 27 and 28, "
            "which the pinned ONNX Runtime refuses too, are refused with the supported range."]
    wrong = [r for r in rows if cls(r) == "wrong"]
    if wrong:
        out += ["", "Wrong results (each on the test's known list with its reason):", ""]
        for r in wrong:
            msg = r["message"] if r["status"] == "wrong" else "unfrozen: " + r["unfrozen"]["message"]
            out.append(f"- `{r['name']}` ({r['stage']}; ONNX Runtime: {r.get('ort', '?')}): {msg[:160]}")
    reasons: dict[str, int] = {}
    for r in rows:
        if r["status"] == "error":
            m = re.sub(r"'[^']*'", "…", r["message"].split(": ", 1)[-1])
            m = re.sub(r"\(\d+[^)]*\)", "(…)", m)
            m = re.sub(r"\b\d+\b", "N", m)[:110]
            reasons[m] = reasons.get(m, 0) + 1
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:8]
    if top:
        out += ["", "Most frequent clear errors:", "", "| cases | error |", "|---:|---|"]
        out += [f"| {n} | {m.replace('|', '/')} |" for m, n in top]
    return out + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--korch-dir", default=str(RES / "korch_rewrite"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "results.md"))
    a = ap.parse_args()
    lines = ["# Results", "",
             "Generated by `python bench/summarize.py` from `bench/results/*.json`; each section names the "
             "command that produced its numbers. Machines: 2-core AMD EPYC development VMs (Zen 5 for the older "
             "sections, Zen 4 for the `optimize` one; each JSON records its machine), shared and noisy — compare "
             "within a row, not across runs. CDMPP: [research/notes/cdmpp.md](../research/notes/cdmpp.md); "
             "CoDL: [research/notes/codl.md](../research/notes/codl.md).", ""]
    for sec in (devices_section(), store_section(), import_section(), kernels_section(), planning_section(),
                korch_section(Path(a.korch_dir)), standalone_section(Path(a.korch_dir)), export_section(), openvino_section(), beyond_zoo_section(), winograd_section(),
                korch_gpu_section(), cdmpp_section(), predict_tuned_section(), optimize_section(), tuned_bandwidth_section(), precision_section(), ray_section(), conformance_section()):
        lines += sec
    Path(a.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
