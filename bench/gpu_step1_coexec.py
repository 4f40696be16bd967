"""Issue 62, step 1: CoDL on this host's CPU and a CUDA GPU for real, in one call of the lent GPU machine.

    python bench/gpu_step1_coexec.py                 # device: everything below -> $OUT (about 8 minutes)
    python bench/gpu_step1_coexec.py --dry-run       # here: the same script on this CPU, GPU replaced (see below)

Phases, each written to $OUT/coexec_gpu.json as it ends (a killed call keeps what finished):
  1. machine   the host CPU and the GPU (also $OUT/machine.json).
  2. pytest    `pytest -m gpu` over the test files that hold `gpu` tests (collecting the whole
               suite would import TVM, which the machine lacks); log in $OUT/pytest_gpu.log.
  3. cli       `tensorplan coexec MODEL --processors cpu,cuda --json` as the product ships it today
               (it stops with a clear error until CUDA latency data exists: this step makes that data).
  4. collect   the CUDA side of the CoDL predictor: every conv/pool/FC part of the models' CoDL sweep
               (`partition.sweep_parts`: each dim, each share rho) run alone through `CudaCoexecutor` on
               the GPU (CUDA-event time of its compute stream) and on the host CPU (the executor's CPU
               side, its threads), the four data-sharing terms (GPU transform NHWC->NCHW, device->pinned
               host copy, host->device copy, GPU scatter back) over the CPU slices' sizes, and the
               executor's sync; written as `data/codl`-style files ($OUT/codl_cuda/ops.csv.gz,
               sharing.csv.gz) for `codl.data.load_compact`.
  5. fit       `CodlPredictor` + `SharingModel` on that data; accuracy on a 70/30 split per processor
               ($OUT/codl_cuda_predictor.json).
  6. models    per model: the plan (CoexecCost "overlap" composition, greedy chains) with each
               operator's choice (GPU only / CPU only / split dim + GPU share) and why (its predicted
               GPU-only, CPU-only and best-split times); each segment co-executed alone, predicted vs
               measured, exact against the unsplit result; the whole model under the CoDL plan, GPU
               only and CPU only with the same kernels (other operators on the CPU in ONNX Runtime, as
               `tensorplan coexec` does), interleaved, every output checked against ONNX Runtime, with
               ONNX Runtime (CPU) and PyTorch eager on the GPU for context.

No TVM anywhere on this path: the co-executor's kernels are PyTorch (cuDNN/cuBLAS on the GPU,
oneDNN on the CPU) and the checks use ONNX Runtime.

`--dry-run` runs every phase here, on the CPU, with `torch.cuda`'s streams, events and pinned
memory replaced by host stand-ins (`CpuStandIn`: events read the wall clock, streams are no-ops),
so `CudaCoexecutor`'s slicing, merging and timing code, the collection, fit, planning and the
whole-model runner all execute; its "cuda" numbers are this CPU's and say nothing about a GPU
(the JSON says `"dry_run": true`). Models and budgets are smaller so it ends in ~3 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

MODELS = ("yolov2", "vgg-16", "candy")
DRY_MODELS = ("tiny-cnn", "tiny-style")   # conv chains, pool, FC; pads, InstanceNorm, upsampling on the CPU
CBLK = 16                  # OC split granularity: the executors' and `tp.coexec`'s
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{time.perf_counter() - T0:5.0f}s] {msg}", flush=True)


# --------------------------------------------------------------------------------------
# The CPU stand-in for torch.cuda (dry run only)
# --------------------------------------------------------------------------------------


class _HostEvent:
    """A CUDA event's face over the wall clock (everything is synchronous on the CPU)."""

    def __init__(self, enable_timing: bool = False, **_):
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_HostEvent") -> float:
        return (end.t - self.t) * 1e3


class _HostStream:
    def __init__(self, device=None, **_):
        pass

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass


@contextlib.contextmanager
def CpuStandIn():
    """Replace torch.cuda's availability, streams, events and pinned allocations by host
    equivalents for the dry run; restored on exit."""
    import torch

    saved = {k: getattr(torch.cuda, k) for k in ("is_available", "Stream", "Event", "stream", "current_stream",
                                                  "synchronize")}
    empty = torch.empty

    def empty_unpinned(*a, pin_memory: bool = False, **kw):
        return empty(*a, **kw)

    torch.cuda.is_available = lambda: True
    torch.cuda.Stream = _HostStream
    torch.cuda.Event = _HostEvent
    torch.cuda.stream = lambda s=None: contextlib.nullcontext()
    torch.cuda.current_stream = lambda device=None: _HostStream()
    torch.cuda.synchronize = lambda device=None: None
    torch.empty = empty_unpinned
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(torch.cuda, k, v)
        torch.empty = empty


# --------------------------------------------------------------------------------------
# Phase 1-3: machine, pytest -m gpu, the shipped CLI
# --------------------------------------------------------------------------------------


def machine(dry: bool, cpu_threads: int) -> dict:
    import korch_gpu
    from tensorplan.devices.detect import cpu_info

    m = korch_gpu.machine("cpu" if dry else "cuda")
    info = cpu_info()
    m["host_cpu"] = {k: info.get(k) for k in ("model", "vendor", "cores", "threads", "clock_ghz", "l3_kb")
                     if k in info}
    m["coexec_cpu_threads"] = cpu_threads
    if not dry:
        from tensorplan.devices.detect import local_gpu
        g = local_gpu()
        m["gpu_spec"] = g.to_dict() if g is not None else None
        import torch
        m["tf32"] = {"cudnn": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32}
    m["dry_run"] = dry
    return m


def gpu_test_files() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text())


def run_pytest(out_dir: Path, timeout_s: float) -> dict:
    files = gpu_test_files()
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-rA", "-q", "-p", "no:cacheprovider", *files]
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}")
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
        text, rc = p.stdout + p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = f"{e.stdout or ''}{e.stderr or ''}\nTIMEOUT after {timeout_s:.0f}s", 124
    (out_dir / "pytest_gpu.log").write_text(text)
    lines = text.strip().splitlines()
    outcome = [ln for ln in lines if ln.startswith(("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"))]
    return {"command": " ".join(cmd[1:]), "files": files, "returncode": rc,
            "summary": lines[-1] if lines else "", "outcomes": outcome, "seconds": time.perf_counter() - t0}


def run_cli(model: str, timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "tensorplan", "coexec", model, "--processors", "cpu,cuda", "--json"]
    env = dict(os.environ, PYTHONPATH=f"{ROOT / 'src'}:{os.environ.get('PYTHONPATH', '')}")
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
        return {"command": "tensorplan " + " ".join(cmd[3:]), "returncode": p.returncode,
                "output_tail": (p.stdout + p.stderr)[-1500:]}
    except subprocess.TimeoutExpired:
        return {"command": "tensorplan " + " ".join(cmd[3:]), "returncode": 124, "output_tail": "timeout"}


# --------------------------------------------------------------------------------------
# Phase 4: the CUDA side's data
# --------------------------------------------------------------------------------------


def _spread(ts: list[float]) -> float:
    s = sorted(ts)
    return s[1] / s[0] - 1.0 if len(s) > 1 and s[0] > 0 else 1.0


class OpWeights:
    """Random weights of each full op, made once (VGG-16's first FC layer alone is 411 MB); a part
    takes its first `oc` output channels (an H part keeps them all, an OC part a slice)."""

    def __init__(self):
        self.full: dict = {}

    def job(self, op, part, proc: str):
        from tensorplan.codl.coexecutor import CoexecJob

        if op not in self.full:
            self.full[op] = CoexecJob.random([op], "OC" if op.kind == "fc" else "H", relu=True)
        j = self.full[op]
        w, b = j.weights[0]
        ws = (w[:part.oc] if w is not None else None, b[:part.oc] if b is not None else None)
        return CoexecJob([part], [ws], "OC" if part.kind == "fc" else "H", 1.0 if proc == "cuda" else 0.0,
                         [list(j.epilogues[0])])


def time_part(ex, job, *, budget_s: float, max_repeats: int = 20) -> list[float]:
    """Seconds of the one-part `job` alone on one side of `ex` (share 1: the GPU, share 0: the CPU),
    as the executor runs and times it: the GPU side's compute-stream events, the CPU side's host compute."""
    part, proc = job.ops[0], "cuda" if job.ratio >= 1.0 else "cpu"
    st = ex.prepare(job)
    x = np.random.default_rng(0).standard_normal(
        (1, part.ic) if part.kind == "fc" else (1, part.ic, part.ih, part.iw)).astype(np.float32)
    xh = ex.home_input(x)
    ts: list[float] = []
    t_end = time.perf_counter() + budget_s
    for k in range(2 + max_repeats):
        _, rt = ex.run(st, xh)
        if k >= 2:
            ts.append(rt.gpu if proc == "cuda" else rt.cpu)
            if len(ts) >= 3 and time.perf_counter() > t_end:
                break
    return ts


def collect_parts(ex, items, budget_s: float, per_part_s: float) -> tuple[list, dict]:
    """KernelSamples of the sweep's parts: first every op whole on each processor (the GPU part at
    share 1, the CPU part at share 0: what single-processor plans are priced with, and every kernel
    class the planner will ask about), then the other parts in a seeded random order, so a budget
    cut leaves every op, dim and share represented; (samples, counts)."""
    from tensorplan.codl.predictor import KernelSample
    from tensorplan.progress import progress_bar

    whole = [i for i, (_, op, _, _, _, part) in enumerate(items) if part == op]
    rest = [i for i in np.random.default_rng(62).permutation(len(items)) if items[i][5] != items[i][1]]
    order = whole + rest
    weights = OpWeights()
    samples, failed = [], []
    t_end = time.perf_counter() + budget_s
    with progress_bar(f"timing {len(items)} parts", len(items), enabled=sys.stderr.isatty()) as advance:
        for i in order:
            if time.perf_counter() > t_end:
                break
            model, op, proc, dim, ratio, part = items[i]
            try:
                ts = time_part(ex, weights.job(op, part, proc), budget_s=per_part_s)
            except Exception as e:  # noqa: BLE001 - a part that fails is reported, the rest go on
                failed.append(f"{proc} {part.short()}: {type(e).__name__}: {str(e)[:200]}")
                continue
            med = float(np.median(ts))
            samples.append(KernelSample(part, proc, float(min(ts)), float(np.std(ts) / med) if med > 0 else 0.0,
                                        _spread(ts), model, dim, ratio))
            advance()
    counts = {"parts": len(items), "measured": len(samples), "failed": len(failed), "failures": failed[:10],
              "by_proc": {p: sum(s.proc == p for s in samples) for p in ("cpu", "cuda")},
              "cut_by_budget": len(samples) + len(failed) < len(items), "budget_s": budget_s}
    return samples, counts


def collect_sharing(ex, sizes, repeats: int = 10) -> list[dict]:
    """The CUDA executor's data-sharing steps, each timed with events on one stream, min of repeats:
    trans_in (NHWC home slice -> NCHW on the GPU), map_in (device -> pinned host), map_out (pinned
    host -> device), trans_out (NCHW -> the NHWC home buffer's slice on the GPU)."""
    torch = ex.torch
    dev = ex.device
    rows = []
    for (h, w, c) in sizes:
        home = torch.randn(1, c, h + 2, w, device=dev).contiguous(memory_format=torch.channels_last)
        pin = torch.empty((1, c, h, w), pin_memory=True)
        tmp = torch.empty((1, c, h, w), device=dev)
        steps: dict[str, Callable[[], Any]] = {
            "trans_in": lambda: tmp.copy_(home[:, :, 1:h + 1]),
            "map_in": lambda: pin.copy_(tmp, non_blocking=True),
            "map_out": lambda: tmp.copy_(pin, non_blocking=True),
            "trans_out": lambda: home[:, :, 1:h + 1].copy_(tmp),
        }
        for term, fn in steps.items():
            best = math.inf
            for k in range(repeats + 2):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                if k >= 2:
                    best = min(best, a.elapsed_time(b) / 1e3)
            rows.append({"term": term, "bytes": 4 * h * w * c, "latency_s": best})
    return rows


def sharing_sizes(shapes, limit: int = 40) -> list[tuple[int, int, int]]:
    """(rows, width, channels) of the CPU side's input slices over the sweep's H shares, `limit`
    of them spread evenly over their byte sizes."""
    from tensorplan.codl.partition import RATIOS, h_split

    seen = set()
    for _, op in shapes:
        if op.kind == "fc":
            continue
        for r in RATIOS[1:-1]:
            sp = h_split(op, r)
            if sp.cpu is not None:
                seen.add((sp.cpu.ih, op.iw, op.ic))
    sizes = sorted(seen, key=lambda s: s[0] * s[1] * s[2])
    if len(sizes) > limit:
        sizes = [sizes[int(i)] for i in np.linspace(0, len(sizes) - 1, limit)]
    return sizes


def collect_sync(ex, n: int = 30) -> list[dict]:
    """The executor's own fixed cost of a split: total - max(GPU side, CPU side incl. its input
    copy), over `n` runs of a small half/half conv."""
    from tensorplan.codl.coexecutor import CoexecJob
    from tensorplan.codl.predictor import OpShape

    op = OpShape("conv", 16, 16, 16, 16, 3, 1, 1, 1, 1, 1)
    job = CoexecJob.random([op], "H", 0.5, relu=True)
    st = ex.prepare(job)
    xh = ex.home_input(np.random.default_rng(0).standard_normal((1, 16, 16, 16)).astype(np.float32))
    rows = []
    for k in range(n + 3):
        _, rt = ex.run(st, xh)
        if k >= 3:
            rows.append({"term": "sync", "bytes": 0, "latency_s": rt.sync})
    return rows


# --------------------------------------------------------------------------------------
# Phase 5: fit
# --------------------------------------------------------------------------------------


def fit(samples, sharing, max_spread: float = 0.05):
    """The predictor on the stable samples (fastest repeat within `max_spread` of the next, as
    `fit_local_cost` keeps; a processor and op kind left with none keeps all of its samples, so
    the planner can price every op), its 70/30 accuracy per processor, and the sharing model."""
    from tensorplan.codl.predictor import CodlPredictor, SharingModel, evaluate, random_split

    def group(s) -> tuple[str, str]:
        return s.proc, "dwconv" if s.op.g > 1 else s.op.kind

    keep = [s for s in samples if s.spread <= max_spread]
    covered = {group(s) for s in keep}
    keep += [s for s in samples if group(s) not in covered]
    train, test = random_split(keep)
    try:
        acc = evaluate(CodlPredictor(), train, test) if test else None
    except Exception as e:  # noqa: BLE001 - e.g. a class only the test part holds; the fit on all goes on
        acc = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    pred = CodlPredictor().fit(keep)
    sh = SharingModel().fit(sharing)
    return pred, sh, {"samples": len(samples), "kept_spread_le": max_spread, "kept": len(keep),
                      "split_70_30": acc, "classes": sorted(pred.models), "sharing": sh.to_dict()}


# --------------------------------------------------------------------------------------
# Phase 6: plan, explain, co-execute
# --------------------------------------------------------------------------------------


def choice(dim: str, ratio: float) -> str:
    if ratio >= 1.0:
        return "GPU only"
    if ratio <= 0.0:
        return "CPU only"
    return f"split {dim} {ratio:.1f} on the GPU"


def explain_ops(ops, cost, plan) -> list[dict]:
    """Per operator: the plan's choice and the predictions it chose between."""
    from tensorplan.codl.partition import RATIOS, dims_for, split

    rows = []
    for seg in plan.segments:
        for i in range(seg.start, seg.end):
            op = ops[i].shape
            d1 = "OC" if op.kind == "fc" else "H"
            gpu_only = cost.op_cost(op, d1, 1.0).total
            cpu_only = cost.op_cost(op, d1, 0.0).total
            real = [(d, r) for d in dims_for(op) for r in RATIOS[1:-1]
                    if (lambda sp: sp.cpu is not None and sp.gpu is not None)(split(op, d, r, CBLK))]
            best = min(((d, r, cost.op_cost(op, d, r)) for d, r in real), key=lambda t: t[2].total, default=None)
            picked = choice(seg.dim, seg.ratio)
            why = (f"{picked}" + (f" (chain of {seg.length} ops {seg.start}..{seg.end - 1})" if seg.length > 1 else "")
                   + f": predicted GPU only {gpu_only * 1e3:.3f} ms, CPU only {cpu_only * 1e3:.3f} ms, ")
            if best is None:
                why += f"no split with work on both sides ({op.oc} channels, blocks of {CBLK}; {op.oh} rows)"
                split_row = None
            else:
                b = best[2]
                why += (f"best split {best[0]} {best[1]:.1f} {b.total * 1e3:.3f} ms (GPU {b.gpu * 1e3:.3f}, CPU "
                        f"{b.cpu * 1e3:.3f}, sharing {(b.share_in + b.share_out) * 1e3:.3f}, sync "
                        f"{b.sync * 1e3:.3f} ms)")
                alone = {"GPU only": gpu_only, "CPU only": cpu_only}
                if picked in alone and b.total >= alone[picked]:
                    why += "; no split is predicted faster than " + picked.lower()
                split_row = {"dim": best[0], "ratio": best[1], **b.to_dict()}
            rows.append({"op": i, "name": ops[i].name, "shape": op.short(), "segment": [seg.start, seg.end],
                         "dim": seg.dim, "ratio": seg.ratio, "choice": picked, "predicted_gpu_only_s": gpu_only,
                         "predicted_cpu_only_s": cpu_only, "best_split": split_row, "why": why})
    return rows


def _job(graph, cos, seg):
    from tensorplan.codl.coexecutor import CoexecJob, epilogue_specs, op_weights

    return CoexecJob([c.shape for c in cos], [op_weights(graph, c) for c in cos], seg.dim, seg.ratio,
                     [epilogue_specs(graph, c.epilogue, c.node.outputs[0]) for c in cos], CBLK)


def run_segments(graph, ops, plan, ex, repeats: int) -> list[dict]:
    """Each planned segment alone on random input: warm-up, `repeats` timed runs, its output
    against the unsplit reference; predicted vs measured."""
    from tensorplan.codl.coexecutor import reference_output

    rng = np.random.default_rng(0)
    out = []
    for seg in plan.segments:
        cos = ops[seg.start:seg.end]
        job = _job(graph, cos, seg)
        f = cos[0].shape
        x = rng.standard_normal((1, f.ic) if f.kind == "fc" else (1, f.ic, f.ih, f.iw)).astype(np.float32)
        st = ex.prepare(job)
        xh = ex.home_input(x)
        ex.run(st, xh)
        runs = [ex.run(st, xh) for _ in range(repeats)]
        y = runs[-1][0].float().cpu().numpy()
        ref = reference_output(job, x)
        fastest = min((r[1] for r in runs), key=lambda r: r.total)
        out.append({"ops": [seg.start, seg.end], "names": [c.name for c in cos], "dim": seg.dim,
                    "ratio": seg.ratio, "choice": choice(seg.dim, seg.ratio), "predicted": seg.cost.to_dict(),
                    "measured_min": fastest.to_dict(),
                    "measured_median_s": float(np.median([r[1].total for r in runs])),
                    "relative_error": seg.cost.total / fastest.total - 1.0 if fastest.total > 0 else None,
                    "max_abs_err_vs_unsplit": float(np.abs(y - ref.reshape(y.shape)).max())})
    return out


@dataclass
class StepTimes:
    total: float = 0.0
    segments: float = 0.0
    cpu_ops: float = 0.0
    handoff: float = 0.0


@dataclass
class CudaModelRunner:
    """A whole model under one plan on `CudaCoexecutor`: planned segments co-executed with their
    tensors at home on the GPU (a segment reading the previous one's output takes it as is), every
    other operator on the CPU in ONNX Runtime (one session per maximal run, as `tp.coexec` runs
    them), tensors moved between the two only where a CPU operator or an output needs them."""

    graph: Any
    ops: Any
    plan: Any
    ex: Any
    cpu_threads: int
    steps: list = field(default_factory=list)
    prepared: dict = field(default_factory=dict)
    sessions: dict = field(default_factory=dict)
    last: StepTimes = field(default_factory=StepTimes)

    def __post_init__(self):
        from tensorplan.codl.coexecutor import model_steps
        from tensorplan.ir.to_onnx import ort_session

        self.steps = model_steps(self.graph, self.ops, self.plan)
        for k, (kind, what) in enumerate(self.steps):
            if kind == "cpu":
                sess = ort_session(self.graph.subgraph(what, f"{self.graph.name}.cpu{k}"), threads=self.cpu_threads,
                                   spinning=False)   # a spinning pool would take the cores the CPU side computes on
                self.sessions[k] = (sess, [i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()])
            else:
                seg = self.plan.segments[what]
                cos = self.ops[seg.start:seg.end]
                self.prepared[k] = (self.ex.prepare(_job(self.graph, cos, seg)), cos[0], cos[-1].output)

    def _host(self, vals: dict, name: str) -> np.ndarray:
        v = vals[name]
        if isinstance(v, np.ndarray):
            return v
        a = v.float().cpu().contiguous().numpy().reshape(self.graph.tensors[name].shape)
        vals[name] = a
        return a

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.ex.torch
        vals: dict[str, Any] = dict(feeds)
        tm = StepTimes()
        t_all = time.perf_counter()
        for k, (kind, _) in enumerate(self.steps):
            if kind == "cpu":
                sess, ins, outs = self.sessions[k]
                a = time.perf_counter()
                feed = {n: self._host(vals, n) for n in ins}
                b = time.perf_counter()
                vals.update(zip(outs, sess.run(outs, feed)))
                tm.handoff += b - a
                tm.cpu_ops += time.perf_counter() - b
                continue
            st, first, y_name = self.prepared[k]
            s = first.shape
            home = (1, s.ic) if s.kind == "fc" else (1, s.ic, s.ih, s.iw)
            a = time.perf_counter()
            x = vals[first.input]
            if isinstance(x, np.ndarray) or tuple(x.shape) != home:
                x = self.ex.home_input(np.reshape(self._host(vals, first.input), home))
            b = time.perf_counter()
            y, _ = self.ex.run(st, x)
            tm.handoff += b - a
            tm.segments += time.perf_counter() - b
            vals[y_name] = y
        outs = {o: self._host(vals, o) for o in self.graph.outputs}
        if self.ex.device.type == "cuda":
            torch.cuda.synchronize()
        tm.total = time.perf_counter() - t_all
        self.last = tm
        return outs


def _timed_run(runner: CudaModelRunner, feeds: dict, record: list) -> Callable[[], None]:
    """A runner for `interleaved` that keeps each run's step times in `record`."""
    def go() -> None:
        runner.run(feeds)
        record.append(runner.last)
    return go


def run_whole(name: str, graph, ops, plans: dict, ex, cpu_threads: int, rounds: int, dry: bool) -> dict:
    """The whole model under each plan, ONNX Runtime (CPU) on the full model and PyTorch eager on
    the GPU, interleaved round by round; every plan's outputs against ONNX Runtime."""
    import statistics

    import torch

    from tensorplan.ir.reference import random_feeds, rel_error
    from tensorplan.ir.to_onnx import ort_session
    from tensorplan.measure.timer import interleaved

    feeds = random_feeds(graph, 0)
    ort = ort_session(graph, threads=cpu_threads + 1, spinning=False)
    ref = dict(zip([o.name for o in ort.get_outputs()], ort.run(None, feeds)))
    runners: dict[str, Callable[[], Any]] = {"ort-cpu": lambda: ort.run(None, feeds)}
    errs, breakdown, stats = {}, {}, {}
    models = {}
    for key, plan in plans.items():
        r = CudaModelRunner(graph, ops, plan, ex, cpu_threads)
        out = r.run(feeds)
        errs[key] = max(rel_error(out[o], ref[o]) for o in graph.outputs if o in ref)
        models[key] = r
        breakdown[key] = []
        stats[key] = {"segments": len(r.prepared), "cpu_runs": len(r.sessions)}
        runners[key] = _timed_run(r, feeds, breakdown[key])
    try:
        from tensorplan import zoo
        module = zoo.build_torch(name)[0].to(ex.device).eval()
        xs = tuple(torch.from_numpy(feeds[k]).to(ex.device) for k in zoo.get_entry(name).input_shapes)
        with torch.inference_mode():
            y = module(*xs)
        y = y[0] if isinstance(y, (tuple, list)) else y
        errs["pytorch-gpu"] = rel_error(y.float().cpu().numpy(), ref[graph.outputs[0]])

        def eager():
            with torch.inference_mode():
                module(*xs)
            if ex.device.type == "cuda":
                torch.cuda.synchronize()
        runners["pytorch-gpu" if not dry else "pytorch-gpu (stand-in: cpu)"] = eager
    except Exception as e:  # noqa: BLE001 - context only; reported
        errs["pytorch-gpu"] = f"{type(e).__name__}: {str(e)[:200]}"
    for b in breakdown.values():
        b.clear()
    times = interleaved(runners, rounds, pause_s=0.0)
    med = {k: statistics.median(v) for k, v in times.items()}
    plans_out = {}
    for key in plans:
        bd = breakdown[key][-rounds:]
        plans_out[key] = {"median_s": med[key], "steps": stats[key], "max_rel_err_vs_ort": errs[key],
                          "median_breakdown_s": {f: float(np.median([getattr(t, f) for t in bd]))
                                                 for f in ("segments", "cpu_ops", "handoff", "total")},
                          "speedup_of_codl": med[key] / med["codl"] if "codl" in med else None}
    return {"rounds": rounds, "median_s": med, "plans": plans_out,
            "max_rel_err_vs_ort": errs, "rounds_s": {k: list(v) for k, v in times.items()}}


def half_split_plan(shapes, cost):
    """Every op alone, half on each processor (H; FC layers OC): the split path exercised end to end
    whatever the planner picks (on a server GPU it may keep everything on the GPU)."""
    from tensorplan.codl.partition import CoexecPlan, Segment

    segs = []
    for i, op in enumerate(shapes):
        dim = "OC" if op.kind == "fc" else "H"
        segs.append(Segment(i, i + 1, dim, 0.5, cost.op_cost(op, dim, 0.5)))
    return CoexecPlan(segs, "half")


def coexec_model(name: str, ex, cost, cpu_threads: int, repeats: int, rounds: int, dry: bool) -> dict:
    from tensorplan.codl.partition import chain_links, extract_ops, plan_ops
    from tensorplan.zoo.specs import load_model

    t0 = time.perf_counter()
    graph = load_model(name)
    ops = extract_ops(graph)
    shapes, links = [o.shape for o in ops], chain_links(graph, ops)
    plans = {"codl": plan_ops(shapes, cost, links, "greedy"), "gpu_only": plan_ops(shapes, cost, links, "gpu"),
             "cpu_only": plan_ops(shapes, cost, links, "cpu"), "split_half": half_split_plan(shapes, cost)}
    res: dict[str, Any] = {"model": name, "operators": len(graph.nodes), "partitionable_ops": len(ops),
                           "load_s": time.perf_counter() - t0, "plan": plans["codl"].to_dict(),
                           "predicted_total_s": {k: p.total for k, p in plans.items()}}
    res["ops"] = explain_ops(ops, cost, plans["codl"])
    counts = {}
    for r in res["ops"]:
        key = r["choice"] if r["choice"] in ("GPU only", "CPU only") else "split"
        counts[key] = counts.get(key, 0) + 1
    res["choices"] = counts
    log(f"{name}: {len(ops)} partitionable ops -> {counts}; predicted codl {plans['codl'].total * 1e3:.3f} ms, "
        f"gpu only {plans['gpu_only'].total * 1e3:.3f} ms, cpu only {plans['cpu_only'].total * 1e3:.3f} ms")
    res["segments"] = run_segments(graph, ops, plans["codl"], ex, repeats)
    seg_err = max(s["max_abs_err_vs_unsplit"] for s in res["segments"])
    pred = sum(s["predicted"]["total"] for s in res["segments"])
    meas = sum(s["measured_min"]["total"] for s in res["segments"])
    res["segments_total"] = {"predicted_s": pred, "measured_min_s": meas,
                             "relative_error": pred / meas - 1.0 if meas > 0 else None,
                             "max_abs_err_vs_unsplit": seg_err}
    log(f"{name}: {len(res['segments'])} segments co-executed: predicted {pred * 1e3:.3f} ms, measured "
        f"{meas * 1e3:.3f} ms (min), max abs err vs unsplit {seg_err:.1e}")
    res["whole_model"] = run_whole(name, graph, ops, plans, ex, cpu_threads, rounds, dry)
    w = res["whole_model"]
    log(f"{name}: whole model medians " + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in w["median_s"].items())
        + "; max rel err vs ORT " + ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in w["max_rel_err_vs_ort"].items()))
    res["seconds"] = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true",
                    help="on this CPU with torch.cuda replaced by host stand-ins (no GPU result)")
    ap.add_argument("--models", nargs="+", help=f"default {', '.join(MODELS)} (dry run: {', '.join(DRY_MODELS)})")
    ap.add_argument("--out", help="output folder (default $OUT; dry run /tmp/gpu_step1_dry)")
    ap.add_argument("--collect-budget-s", type=float, help="seconds for the part sweep at most (default 150; "
                    "dry run 40); less when the call's budget needs it for the models")
    ap.add_argument("--budget-s", type=float, default=480.0,
                    help="seconds the whole call should take; the sweep leaves --models-s of it to the models")
    ap.add_argument("--models-s", type=float, default=150.0, help="seconds kept for the models' phase")
    ap.add_argument("--per-part-s", type=float, default=0.02, help="timing budget per part (>= 3 runs)")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per segment")
    ap.add_argument("--rounds", type=int, help="interleaved whole-model rounds (default 30; dry run 5)")
    ap.add_argument("--skip-pytest", action="store_true")
    args = ap.parse_args(argv)
    dry = args.dry_run
    models = list(args.models or (DRY_MODELS if dry else MODELS))
    out = Path(args.out or ("/tmp/gpu_step1_dry" if dry else os.environ.get("OUT", "/tmp/out")))
    out.mkdir(parents=True, exist_ok=True)
    budget = args.collect_budget_s or (40.0 if dry else 150.0)
    rounds = args.rounds or (5 if dry else 30)

    import torch

    if not dry and not torch.cuda.is_available():
        print("gpu_step1_coexec: no CUDA GPU here; run with --dry-run for the CPU stand-in", file=sys.stderr)
        return 2
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    cpu_threads = max(1, usable - 1)
    # the executor's CPU side sets this count for each run and restores the old one; made the process
    # default, the switch is a no-op (the GPU side needs no host threads); on the loaded 2-core VM a
    # per-run switch 2 -> 1 -> 2 cost 10-15 ms a run of a 0.2 ms conv
    torch.set_num_threads(cpu_threads)
    doc: dict[str, Any] = {"command": "python bench/gpu_step1_coexec.py " + " ".join(argv if argv is not None
                                                                                       else sys.argv[1:]),
                           "dry_run": dry, "models": {},
                           "plans_note": ("codl: the greedy CoDL plan; gpu_only / cpu_only: the same segments at GPU "
                                          "share 1 / 0 with the same kernels; split_half: every op alone, half "
                                          "on each side (the split path run end to end whatever the planner "
                                          "picks); in all of them the tensors' home is "
                                          "the GPU (CoDL's) and operators outside segments run on the CPU in ONNX "
                                          "Runtime; ort-cpu: ONNX Runtime on the whole model; pytorch-gpu: the "
                                          "zoo's PyTorch module on the GPU, eager (context, not a plan)")}
    if dry:
        doc["note"] = ("DRY RUN: torch.cuda replaced by host stand-ins; every 'cuda' number is this CPU's, "
                       "not a GPU's")
    path = out / "coexec_gpu.json"

    def save():
        path.write_text(json.dumps(doc, indent=1, default=float) + "\n")

    doc["machine"] = machine(dry, cpu_threads)
    (out / "machine.json").write_text(json.dumps(doc["machine"], indent=1, default=float) + "\n")
    log(f"machine: {doc['machine'].get('gpu') or 'no GPU (dry run)'}, host {doc['machine']['host_cpu'].get('model')}"
        f", co-executor CPU side {cpu_threads} threads")
    save()
    if not args.skip_pytest:
        doc["pytest"] = run_pytest(out, 240.0)
        log(f"pytest -m gpu: {doc['pytest']['summary']} (rc {doc['pytest']['returncode']})")
        save()
    doc["cli"] = run_cli(models[0], 120.0)
    log(f"{doc['cli']['command']}: rc {doc['cli']['returncode']}: {doc['cli']['output_tail'][-200:].strip()}")
    save()

    stand_in = CpuStandIn() if dry else contextlib.nullcontext()
    with stand_in:
        from tensorplan.codl.coexecutor import CudaCoexecutor
        from tensorplan.codl.data import export_compact
        from tensorplan.codl.partition import CoexecCost, model_shapes, sweep_parts

        if not dry:
            torch.backends.cudnn.allow_tf32 = False          # fp32 exactness vs the unsplit result
            torch.backends.cuda.matmul.allow_tf32 = False
        ex = CudaCoexecutor("cpu" if dry else "cuda", cpu_threads=cpu_threads)
        shapes = model_shapes(models)
        items = [(m, op, proc, dim, r, part) for m, op in shapes
                 for proc, dim, r, part in sweep_parts(op, CBLK, gpu="cuda", cpu="cpu")]
        budget = max(20.0, min(budget, args.budget_s - args.models_s - (time.perf_counter() - T0)))
        log(f"collect: {len(shapes)} op shapes, {len(items)} parts, budget {budget:.0f}s")
        samples, counts = collect_parts(ex, items, budget, args.per_part_s)
        if not samples:
            doc["collection"] = counts
            doc["ok"] = False
            save()
            log(f"collect: no part ran on the co-executor: {counts['failures'][:3]}")
            return 1
        sharing = collect_sharing(ex, sharing_sizes(shapes)) + collect_sync(ex)
        files = export_compact(samples, sharing, out / "codl_cuda")
        doc["collection"] = {**counts, "sharing_rows": len(sharing), "files": {k: str(v) for k, v in files.items()},
                             "cpu_threads": cpu_threads}
        log(f"collect: {counts['measured']} parts measured ({counts['by_proc']}), {counts['failed']} failed; "
            f"{len(sharing)} sharing rows")
        save()
        pred, sh, facts = fit(samples, sharing)
        doc["predictor"] = facts
        (out / "codl_cuda_predictor.json").write_text(json.dumps({"predictor": pred.to_dict(),
                                                                  "sharing": sh.to_dict()}, indent=1) + "\n")
        acc = facts["split_70_30"] or {}
        log("fit: " + (", ".join(f"{p} acc10 {m['acc10']:.2f} rmspe {m['rmspe']:.2f} (n {m['n']})"
                                 for p, m in acc.get("by_proc", {}).items()) or str(acc.get("error")))
            + f"; {facts['kept']} of {facts['samples']} samples kept; sync {sh.sync_s * 1e6:.1f} us")
        save()
        cost = CoexecCost(pred, sh, "cpu", "cuda", CBLK, "overlap")
        for name in models:
            try:
                doc["models"][name] = coexec_model(name, ex, cost, cpu_threads, args.repeats, rounds, dry)
            except Exception as e:  # noqa: BLE001 - keep the other models' results
                import traceback
                traceback.print_exc()
                doc["models"][name] = {"model": name, "error": f"{type(e).__name__}: {str(e)[:500]}"}
            save()
    bad = [n for n, r in doc["models"].items() if "error" in r]
    for n, r in doc["models"].items():
        if "error" in r:
            continue
        errs = {k: v for k, v in r["whole_model"]["max_rel_err_vs_ort"].items()
                if k != "pytorch-gpu" and (not isinstance(v, float) or v > 1e-4)}
        if errs or r["segments_total"]["max_abs_err_vs_unsplit"] > 1e-3:
            bad.append(f"{n}: not exact {errs} / segments {r['segments_total']['max_abs_err_vs_unsplit']:.1e}")
    doc["ok"] = not bad
    save()
    log(f"wrote {path}" + ("" if not bad else f"; CHECKS FAILED: {bad}"))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
