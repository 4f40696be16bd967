"""The runtimes a user would otherwise deploy, built on the ORIGINAL model and timed fairly against a plan.

Why: a speed-up means something only against the best thing the user could have run instead, timed in
the same run on the same inputs at the same thread count. The peers are ONNX Runtime (default session
options), OpenVINO at fp32 (latency hint; its default on CPUs with bf16 units computes in bf16, so that
figure is timed too but labelled and never the headline) and `torch.compile` of the model's PyTorch
module where one exists; on request (`int8_calibration`), ONNX Runtime and OpenVINO int8 as their
quantizers make them (labelled int8, never the headline). Every peer's outputs are checked against
ONNX Runtime, so a wrong peer shows;
a peer that cannot be built is reported with why, never fatal. A run whose rounds spread (CoV above
10 %) or whose machine was busier than its cores (1-minute load) is flagged noisy.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from tensorplan.devices import usable_cores
from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph

#: The rounds of a run spread too much when any runner's CoV exceeds this.
MAX_COV = 0.10

ORT, OPENVINO, OPENVINO_DEFAULT, TORCH_COMPILE = "onnxruntime", "openvino", "openvino-default", "torch.compile"
ORT_INT8, OPENVINO_INT8 = "onnxruntime-int8", "openvino-int8"


@dataclass
class Peer:
    """One runtime built on the original model: `runner()` runs it once on the prepared inputs, or
    `skipped` says why it could not be built. `precision` is what it computes in ("fp32", "bf16", "int8");
    only fp32 peers compete for the headline baseline."""

    name: str
    label: str
    precision: str = "fp32"
    runner: Callable[[], Any] | None = field(default=None, repr=False, compare=False)
    build_s: float | None = None         # session creation / compile / first call, seconds
    max_rel_error: float | None = None   # of its outputs vs ONNX Runtime's (None: not comparable)
    error_note: str | None = None        # why the outputs could not be compared, when they could not
    skipped: str | None = None
    handle: Any = field(default=None, repr=False, compare=False)   # what the runner drives (ORT session, ...)

    @property
    def fp32(self) -> bool:
        return self.precision == "fp32"


@dataclass
class RunnerTiming:
    """One contender's interleaved rounds: median and CoV of the per-round times, and what it is."""

    name: str
    label: str
    median_ms: float
    cov: float
    rounds_ms: list[float]
    peer: bool = False                   # a baseline runtime (not the plan being judged)
    precision: str | None = None
    build_s: float | None = None
    max_rel_error: float | None = None


@dataclass
class PeerTimings:
    """Every contender of one interleaved run, the peers that could not be built, and whether the
    run was noisy (`noise_reason` says why)."""

    runners: dict[str, RunnerTiming]
    rounds: int
    method: str
    cores: int
    load_before: float
    load_after: float
    max_cov: float = MAX_COV
    noisy: bool = False
    noise_reason: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)   # peer name -> why it was not timed

    def best_peer(self) -> str | None:
        """The fastest fp32 peer (the headline baseline); a bf16 figure stands beside it, not in it."""
        fp32 = [t for t in self.runners.values() if t.peer and t.precision == "fp32"]
        return min(fp32, key=lambda t: t.median_ms).name if fp32 else None

    def speedup_over(self, peer: str, plan_name: str) -> float:
        """`peer`'s median over `plan_name`'s (above 1: the plan is faster)."""
        for n in (peer, plan_name):
            if n not in self.runners:
                raise TensorplanError(f"speed-up: '{n}' was not timed in this run (timed: {sorted(self.runners)})")
        return self.runners[peer].median_ms / self.runners[plan_name].median_ms

    def speedup_over_best(self, plan_name: str) -> float:
        """The headline: the best fp32 peer's median over the plan's."""
        best = self.best_peer()
        if best is None:
            raise TensorplanError("speed-up over the best peer: no fp32 peer was timed (pass peers= to "
                                  "time_interleaved)")
        return self.speedup_over(best, plan_name)


# ------------------------------------------------------------------------------------------------
# ONNX Runtime (the numerical reference and the first peer)
# ------------------------------------------------------------------------------------------------
def ort_cpu_session(model: str | bytes, threads: int, profile_prefix: str | None = None):
    """A CPU session on `model` (a path or the file's bytes) with default options but `threads`
    intra-op threads (one inter-op thread): ONNX Runtime as a user would deploy it."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    try:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own exception types
        where = f" {model}" if isinstance(model, str) else ""
        raise TensorplanError(f"ONNX Runtime refused the model{where}: {str(e).strip()[:300]}") from None


def ort_run(sess, feeds: dict[str, np.ndarray]) -> list:
    """`sess.run(None, feeds)`, ONNX Runtime's run-time failures as one clear TensorplanError."""
    try:
        return sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001
        raise TensorplanError(f"ONNX Runtime failed running the model: {str(e).strip()[:300]}") from None


def ort_peer(model: str | bytes, feeds: dict[str, np.ndarray], threads: int) -> tuple[Peer, dict[str, np.ndarray]]:
    """ONNX Runtime on the original model, and its outputs by name (the reference the others meet).
    Unlike the other peers it is required: a model ONNX Runtime refuses raises TensorplanError."""
    t0 = time.perf_counter()
    sess = ort_cpu_session(model, threads)
    names = [o.name for o in sess.get_outputs()]
    f = {i.name: feeds[i.name] for i in sess.get_inputs() if i.name in feeds}
    ref = dict(zip(names, ort_run(sess, f)))
    build_s = time.perf_counter() - t0
    return Peer(ORT, "ONNX Runtime", "fp32", runner=lambda: sess.run(None, f), build_s=build_s, max_rel_error=0.0,
                handle=sess), ref


# ------------------------------------------------------------------------------------------------
# OpenVINO
# ------------------------------------------------------------------------------------------------
def _ov_precision(t) -> str:
    """An OpenVINO element type as a short precision name ("f32" -> "fp32", "bf16", "f16" -> "fp16")."""
    name = t.get_type_name() if hasattr(t, "get_type_name") else str(t)
    return {"f32": "fp32", "f16": "fp16"}.get(name, name)


def openvino_default_precision() -> str:
    """What OpenVINO's CPU plugin computes in when not told (its default INFERENCE_PRECISION_HINT):
    bf16 on CPUs with bf16 units (`OPTIMIZATION_CAPABILITIES` lists BF16), else fp32. Raises
    TensorplanError without OpenVINO."""
    from tensorplan.kernels.openvino import VERSION, _core, available
    if not available():
        raise TensorplanError(f"OpenVINO is not installed (pip install openvino=={VERSION})")
    return _ov_precision(_core().get_property("CPU", "INFERENCE_PRECISION_HINT"))


def openvino_input_name(port: Any, feeds: dict) -> str:
    """The name under which `feeds` holds OpenVINO input `port`: a port can carry several tensor names
    (OpenVINO merges an input with a Reshape that only renames it, e.g. gpt2's input_ids and
    /gpt2/Reshape_output_0), and `get_any_name()` may pick the one the caller never gave."""
    return next((m for m in sorted(port.get_names()) if m in feeds), port.get_any_name())


def _openvino_peer(name: str, label: str, model, feeds: dict[str, np.ndarray], config: dict,
                   ref: dict[str, np.ndarray]) -> Peer:
    """One OpenVINO compiled model on the CPU with `config` (`model`: ONNX bytes or an `openvino.Model`),
    its inputs bound once (shared memory), its outputs checked against `ref`; labelled with the
    precision the compiled model reports."""
    import openvino as ov

    from tensorplan.kernels.openvino import _core
    t0 = time.perf_counter()
    try:
        core = _core()
        compiled = core.compile_model(core.read_model(model, b"") if isinstance(model, bytes) else model, "CPU",
                                      config)
        prec = _ov_precision(compiled.get_property("INFERENCE_PRECISION_HINT"))
        req = compiled.create_infer_request()
        keep = []
        for k, port in enumerate(compiled.inputs):
            n = openvino_input_name(port, feeds)
            if n not in feeds:
                return Peer(name, label, skipped=f"OpenVINO renamed input '{n}' (inputs given: {sorted(feeds)})")
            arr = np.ascontiguousarray(feeds[n])
            keep.append(arr)
            req.set_input_tensor(k, ov.Tensor(arr, shared_memory=True))
        req.infer()
    except Exception as e:  # noqa: BLE001 - OpenVINO raises RuntimeError with multi-line reports
        msg = str(e).strip().splitlines()
        return Peer(name, label, skipped=f"OpenVINO could not compile or run the model: "
                                         f"{msg[0][:200] if msg else type(e).__name__}")
    build_s = time.perf_counter() - t0
    outs: dict[str, np.ndarray] = {}
    for k, port in enumerate(compiled.outputs):
        for n in port.get_names():
            outs.setdefault(n, req.get_output_tensor(k).data.copy())
    got = [outs.get(n) for n in ref]
    if any(g is None for g in got) and len(compiled.outputs) == len(ref):   # renamed: compare in order
        got = [req.get_output_tensor(k).data.copy() for k in range(len(ref))]
    err, note = _compare(got, list(ref.values()))

    def run(req=req, keep=keep):
        req.infer()
    if name == OPENVINO_DEFAULT:
        label = f"OpenVINO default ({prec})"
    return Peer(name, label, prec, runner=run, build_s=build_s, max_rel_error=err, error_note=note, handle=compiled)


def openvino_peers(model: bytes, feeds: dict[str, np.ndarray], threads: int,
                   ref: dict[str, np.ndarray]) -> list[Peer]:
    """OpenVINO at fp32 (latency hint, `threads` threads, INFERENCE_PRECISION_HINT=f32) and, when its
    default on this CPU is not fp32 (bf16 units), OpenVINO as it comes, labelled with its precision."""
    from tensorplan.kernels.openvino import VERSION, available
    if not available():
        why = f"OpenVINO is not installed (pip install openvino=={VERSION})"
        return [Peer(OPENVINO, "OpenVINO (fp32)", skipped=why)]
    base = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": int(threads)}
    peers = [_openvino_peer(OPENVINO, "OpenVINO (fp32)", model, feeds, {**base, "INFERENCE_PRECISION_HINT": "f32"},
                            ref)]
    default = openvino_default_precision()
    if default != "fp32":
        peers.append(_openvino_peer(OPENVINO_DEFAULT, f"OpenVINO default ({default})", model, feeds, base, ref))
    return peers


# ------------------------------------------------------------------------------------------------
# int8 (on request): each runtime's own post-training quantizer, calibrated on the caller's samples
# ------------------------------------------------------------------------------------------------
def int8_peers(model: bytes, feeds: dict[str, np.ndarray], threads: int, ref: dict[str, np.ndarray],
               calibration: list[dict[str, np.ndarray]], *, openvino: bool = True, log=None) -> list[Peer]:
    """ONNX Runtime running `precision.ort_int8(model, calibration)` (static QDQ) and, with `openvino`,
    OpenVINO running `precision.openvino_int8(model, calibration)` (NNCF) with its CPU defaults beside
    the latency hint and `threads`; both labelled int8, checked against `ref`, skipped with why when
    quantizing fails."""
    import onnx

    from tensorplan.errors import CompileError
    from tensorplan.precision import openvino_int8, ort_int8
    proto = onnx.load_model_from_string(model)
    peers = []
    t0 = time.perf_counter()
    try:
        q = ort_int8(proto, calibration)
        sess = ort_cpu_session(q.SerializeToString(), threads)
        names = [o.name for o in sess.get_outputs()]
        f = {i.name: feeds[i.name] for i in sess.get_inputs() if i.name in feeds}
        got = dict(zip(names, ort_run(sess, f)))
        err, note = _compare([got.get(n) for n in ref], list(ref.values()))
        peers.append(Peer(ORT_INT8, "ONNX Runtime int8 (static, QDQ)", "int8", runner=lambda: sess.run(None, f),
                          build_s=time.perf_counter() - t0, max_rel_error=err, error_note=note, handle=sess))
    except TensorplanError as e:   # CompileError from the quantizer, or ONNX Runtime refusing the result
        peers.append(Peer(ORT_INT8, "ONNX Runtime int8 (static, QDQ)", "int8", skipped=str(e)))
    if log:
        log(f"ONNX Runtime int8: {peers[-1].skipped or f'quantized and built in {peers[-1].build_s:.1f} s'}")
    if not openvino:
        return peers + [Peer(OPENVINO_INT8, "OpenVINO int8 (NNCF)", "int8", skipped="skipped (openvino=False)")]
    t0 = time.perf_counter()
    try:
        ov_model = openvino_int8(proto, calibration)
    except CompileError as e:
        peers.append(Peer(OPENVINO_INT8, "OpenVINO int8 (NNCF)", "int8", skipped=str(e)))
    else:
        quantize_s = time.perf_counter() - t0
        base = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": int(threads)}
        p = _openvino_peer(OPENVINO_INT8, "OpenVINO int8 (NNCF)", ov_model, feeds, base, ref)
        p.precision = "int8"
        if p.build_s is not None:
            p.build_s += quantize_s
        peers.append(p)
    if log:
        log(f"OpenVINO int8: {peers[-1].skipped or f'quantized and compiled in {peers[-1].build_s:.1f} s'}")
    return peers


# ------------------------------------------------------------------------------------------------
# torch.compile
# ------------------------------------------------------------------------------------------------
def _flat_tensors(out) -> list[np.ndarray]:
    """A module's output (tensor, tuple/list, dict, or an object with `.logits`) as numpy arrays in order."""
    import torch
    if isinstance(out, torch.Tensor):
        return [out.detach().float().cpu().numpy() if out.dtype.is_floating_point else out.detach().cpu().numpy()]
    if isinstance(out, (tuple, list)):
        return [a for o in out for a in _flat_tensors(o)]
    if isinstance(out, dict):
        return [a for o in out.values() for a in _flat_tensors(o)]
    if hasattr(out, "logits"):
        return _flat_tensors(out.logits)
    return []


def torch_compile_peer(graph: Graph, opset: int, args: list[np.ndarray], ref: dict[str, np.ndarray] | None,
                       log=None, *, device: str = "cpu", mode: str | None = None) -> Peer:
    """`torch.compile` of the module behind `graph` (zoo models and PyTorch factories have one) on
    `args`, the values ONNX Runtime gets; skipped with why for an ONNX file or when it fails. Its
    outputs are checked against `ref` (ONNX Runtime's, by name) unless that is None. `device`: where
    the module and its inputs live ('cuda': each run ends with a synchronize, so a timing is the
    GPU's); `mode`: torch.compile's mode ('reduce-overhead' replays CUDA graphs), named in the peer."""
    from tensorplan.zoo.specs import torch_source

    name = TORCH_COMPILE if mode is None else f"{TORCH_COMPILE}-{mode}"
    label = "torch.compile" if mode is None else f"torch.compile (mode={mode})"
    src = torch_source(graph, opset)
    if src is None:
        return Peer(name, label, skipped=("no PyTorch module behind an ONNX file" if graph.source else
                                          "no PyTorch module behind a graph built in memory"))
    import torch

    module = src[0].eval().to(device)
    targs = [torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in args]
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    try:
        cm = torch.compile(module) if mode is None else torch.compile(module, mode=mode)
        t0 = time.perf_counter()
        with torch.inference_mode():
            for _ in range(1 if mode is None else 3):     # CUDA graphs are recorded on a later call
                out = cm(*targs)
        sync()
        compile_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - a baseline that does not compile is reported, not fatal
        return Peer(name, label, skipped=f"torch.compile failed: {type(e).__name__}: {str(e)[:200]}")
    if log:
        log(f"{label}: compiled in {compile_s:.1f} s")
    err, note = _compare(_flat_tensors(out), list(ref.values())) if ref is not None else (None, "not compared")

    def run():
        with torch.inference_mode():
            r = cm(*targs)
        sync()
        return r
    return Peer(name, label, "fp32", runner=run, build_s=compile_s, max_rel_error=err, error_note=note,
                handle=cm)


def _compare(got: list, want: list[np.ndarray]) -> tuple[float | None, str | None]:
    """Max relative error of `got` vs ONNX Runtime's outputs `want`, in order; (None, why) when they
    cannot be paired."""
    from tensorplan.ir.reference import rel_error
    if len(got) != len(want) or any(g is None for g in got):
        return None, f"{len(got)} outputs vs ONNX Runtime's {len(want)}: not compared"
    return max((float(rel_error(np.asarray(g), w)) for g, w in zip(got, want)), default=0.0), None


# ------------------------------------------------------------------------------------------------
# all peers, and timing them
# ------------------------------------------------------------------------------------------------
def peer_runners(graph: Graph, feeds: dict[str, np.ndarray], threads: int | None = None, opset: int = 17, *,
                 torch_compile: bool = True, openvino: bool = True, log=None,
                 int8_calibration: list[dict[str, np.ndarray]] | None = None) -> list[Peer]:
    """Every peer on the ORIGINAL model of `graph` (its ONNX file, or the graph exported when built in
    memory), each checked against ONNX Runtime: ONNX Runtime, OpenVINO fp32, OpenVINO's default when
    it is not fp32 on this CPU, and `torch.compile` where a PyTorch module exists; with
    `int8_calibration` (feeds of the model's inputs, e.g. `precision.load_calibration(...).feeds`)
    also ONNX Runtime and OpenVINO int8 quantized on those samples (`int8_peers`). Call it inside
    `measure.timer.pinned_threads(threads)` so torch's pool matches. A peer that fails is kept with
    `skipped` set; only ONNX Runtime refusing the model raises."""
    from tensorplan.zoo.specs import onnx_bytes

    threads = int(threads or usable_cores())
    model = onnx_bytes(graph, opset)
    ort, ref = ort_peer(model, feeds, threads)
    peers = [ort]
    if openvino:
        peers += openvino_peers(model, feeds, threads, ref)
    else:
        peers.append(Peer(OPENVINO, "OpenVINO (fp32)", skipped="skipped (openvino=False)"))
    if torch_compile:
        peers.append(torch_compile_peer(graph, opset, [feeds[n] for n in graph.inputs], ref, log))
    else:
        peers.append(Peer(TORCH_COMPILE, "torch.compile", skipped="skipped (torch_compile=False)"))
    if int8_calibration is not None:
        peers += int8_peers(model, feeds, threads, ref, int8_calibration, openvino=openvino, log=log)
    return peers


def runners_of(peers: list[Peer]) -> dict[str, Callable[[], Any]]:
    """{name: runner} of the peers that were built."""
    return {p.name: p.runner for p in peers if p.skipped is None and p.runner is not None}


def cov(values: list[float]) -> float:
    """Coefficient of variation (population standard deviation over the mean)."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.pstdev(values) / mean if mean > 0 else 0.0


def noise_reason(rounds: dict[str, list[float]], load_before: float, load_after: float, cores: int,
                 max_cov: float = MAX_COV) -> str | None:
    """Why a run's figures should not be trusted, or None: a runner's rounds spread by a CoV above
    `max_cov`, or the 1-minute load average above `cores` before or after the run."""
    why = [f"{n} CoV {c:.1%}" for n, c in ((n, cov(v)) for n, v in rounds.items())
           if math.isfinite(c) and c > max_cov]
    if why:
        why = [f"rounds spread above {max_cov:.0%} ({', '.join(why)})"]
    busy = [f"{when} {load:.2f}" for when, load in (("before", load_before), ("after", load_after)) if load > cores]
    if busy:
        why.append(f"1-minute load above the {cores} usable cores ({', '.join(busy)})")
    return "; ".join(why) or None


def _load_1m() -> float:
    try:
        return float(os.getloadavg()[0])
    except OSError:  # pragma: no cover - no load average on this OS
        return 0.0


def time_interleaved(runners: dict[str, Callable[[], Any]], rounds: int = 15, *, peers: list[Peer] = (),
                     labels: dict[str, str] | None = None, burst_s: float = 0.03, max_cov: float = MAX_COV,
                     cores: int | None = None, seed: int = 0) -> PeerTimings:
    """Time every runner against the others as the benchmarks do (`measure.timer.interleaved`): a
    fresh random order every round, a 50 ms pause before each contender so the previous one's
    spinning pool parks, then one untimed call and a ~`burst_s` burst whose median is the round's
    figure. `peers` names which runners are peers (their label, precision, build time, error) and
    carries the skipped ones; other runners (the plan, extra columns) get `labels` or their name.
    The run is flagged noisy per `noise_reason`, load measured before and after."""
    from tensorplan.measure.timer import interleaved
    if rounds < 1:
        raise TensorplanError(f"time_interleaved: rounds must be >= 1, got {rounds}")
    if not runners:
        raise TensorplanError("time_interleaved: no runners given")
    cores = int(cores or usable_cores())
    by_name = {p.name: p for p in peers}
    load_before = _load_1m()
    samples = interleaved(runners, rounds, burst_s=burst_s, seed=seed)
    load_after = _load_1m()
    out: dict[str, RunnerTiming] = {}
    for n, v in samples.items():
        p = by_name.get(n)
        ms = [x * 1e3 for x in v]
        out[n] = RunnerTiming(name=n, label=p.label if p else (labels or {}).get(n, n),
                              median_ms=statistics.median(ms), cov=cov(ms), rounds_ms=ms, peer=p is not None,
                              precision=p.precision if p else None, build_s=p.build_s if p else None,
                              max_rel_error=p.max_rel_error if p else None)
    reason = noise_reason(samples, load_before, load_after, cores, max_cov)
    method = (f"interleaved: {rounds} rounds, random order, 50 ms pause, untimed call + ~{burst_s * 1e3:.0f} ms "
              "burst, median of burst medians")
    return PeerTimings(runners=out, rounds=rounds, method=method, cores=cores, load_before=load_before,
                       load_after=load_after, max_cov=max_cov, noisy=reason is not None, noise_reason=reason,
                       skipped={p.name: p.skipped for p in peers if p.skipped is not None})


__all__ = ["MAX_COV", "Peer", "PeerTimings", "RunnerTiming", "cov", "int8_peers", "noise_reason",
           "openvino_default_precision",
           "openvino_peers", "ort_cpu_session", "ort_peer", "ort_run", "peer_runners", "runners_of",
           "time_interleaved", "torch_compile_peer"]
