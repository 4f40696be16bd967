"""Run one partitioned operator or operator chain on two processors at once and merge.

`ProcessPair` — this CPU-only machine's stand-in for a CPU+GPU SoC: the "GPU" is a worker
process pinned to its own core (1 thread, NHWC — the tensors' home layout, like CoDL's
GPU image type), the "CPU" is this process pinned to another core (1 thread, NCHW).
Tensors live in `multiprocessing.shared_memory` (the stand-in for the SoC's shared
DRAM). Per segment the worker starts at once on its rows/channels, while this process
maps its slice out of the home buffer, transforms it NHWC→NCHW, computes, transforms
back and maps it in; then it waits for the worker (sync). Inside a chain each side runs
its ops back to back on its own rows (halos recomputed), sharing only at the ends.

`CudaCoexecutor` — CPU + CUDA GPU: the GPU side runs on a compute stream (channels-last),
the CPU slice goes device→pinned host on a copy stream, an event is the pre-sync, the
CPU computes with host threads, and its result goes back on the copy stream, which the
compute stream waits on (no device-wide synchronize inside the pipeline).

Both return the merged output and a per-component timing (map/transform in and out,
compute per side, sync) to compare against the predictor's terms.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from multiprocessing.connection import Client, Listener
from typing import Any, Sequence

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph, Node
from tensorplan.codl.partition import chain_rows, part_shape, split
from tensorplan.codl.data import PartKernel, map_out, trans_in, trans_out
from tensorplan.codl.predictor import OpShape

# --------------------------------------------------------------------------------------
# Jobs: what to run
# --------------------------------------------------------------------------------------

EpiSpec = tuple  # ("relu",) | ("leaky", a) | ("clip", lo, hi) | ("affine", scale[C], shift[C]) | ...


@dataclass
class CoexecJob:
    """A segment: ops (one, or an H chain), their weights/bias, epilogues, dim and GPU share."""

    ops: list[OpShape]
    weights: list[tuple[np.ndarray | None, np.ndarray | None]]
    dim: str = "H"
    ratio: float = 0.5
    epilogues: list[list[EpiSpec]] = field(default_factory=list)
    cblk: int = 16

    def __post_init__(self):
        if not self.ops:
            raise TensorplanError("CoexecJob needs at least one op")
        if len(self.weights) != len(self.ops):
            raise TensorplanError(f"CoexecJob: {len(self.weights)} weight entries for {len(self.ops)} ops")
        if not self.epilogues:
            self.epilogues = [[] for _ in self.ops]
        if self.dim == "OC" and len(self.ops) != 1:
            raise TensorplanError("OC splits apply to single ops; chains split along H")
        if self.ops[0].kind == "fc" and (self.dim != "OC" or len(self.ops) != 1):
            raise TensorplanError(f"{self.ops[0].short()}: fully connected layers split along OC, alone")

    @classmethod
    def random(cls, ops: Sequence[OpShape], dim: str = "H", ratio: float = 0.5, seed: int = 0,
               relu: bool = False) -> "CoexecJob":
        """Job with fan-in-scaled random weights (outputs O(1), so fp32 errors stay ~1e-6)."""
        rng = np.random.default_rng(seed)
        ws = []
        for op in ops:
            if op.kind == "conv":
                fan = (op.ic // op.g) * op.k * op.k
                ws.append(((rng.standard_normal((op.oc, op.ic // op.g, op.k, op.k)) / math.sqrt(fan)).astype(np.float32),
                           (rng.standard_normal(op.oc) * 0.1).astype(np.float32)))
            elif op.kind == "fc":
                ws.append(((rng.standard_normal((op.oc, op.ic)) / math.sqrt(op.ic)).astype(np.float32),
                           (rng.standard_normal(op.oc) * 0.1).astype(np.float32)))
            else:
                ws.append((None, None))
        epi = [[("relu",)] if relu and op.kind == "conv" else [] for op in ops]
        return cls(list(ops), ws, dim, ratio, epi)


def epilogue_specs(graph: Graph, nodes: Sequence[Node], x: str) -> list[EpiSpec]:
    """Row-local elementwise nodes (fused after an op) as channel-sliceable specs."""
    specs: list[EpiSpec] = []
    cur = x
    for n in nodes:
        a = n.attrs
        c = [graph.tensors[i].data if i and i in graph.tensors and graph.tensors[i].data is not None else None
             for i in n.inputs]
        if n.op == "Relu":
            specs.append(("relu",))
        elif n.op == "LeakyRelu":
            specs.append(("leaky", float(a.get("alpha", 0.01))))
        elif n.op == "Sigmoid":
            specs.append(("sigmoid",))
        elif n.op == "Tanh":
            specs.append(("tanh",))
        elif n.op == "Clip":
            lo = float(c[1]) if len(c) > 1 and c[1] is not None else float(a.get("min", -np.inf))
            hi = float(c[2]) if len(c) > 2 and c[2] is not None else float(a.get("max", np.inf))
            specs.append(("clip", lo, hi))
        elif n.op == "HardSigmoid":
            specs.append(("hardsigmoid", float(a.get("alpha", 0.2)), float(a.get("beta", 0.5))))
        elif n.op == "HardSwish":
            specs.append(("hardswish",))
        elif n.op == "Elu":
            specs.append(("elu", float(a.get("alpha", 1.0))))
        elif n.op == "Identity":
            pass
        elif n.op == "BatchNormalization":
            sc, b, m, v = (np.asarray(t, np.float64) for t in c[1:5])
            k = sc / np.sqrt(v + float(a.get("epsilon", 1e-5)))
            specs.append(("affine", k.astype(np.float32), (b - m * k).astype(np.float32)))
        elif n.op == "PRelu":
            specs.append(("prelu", np.asarray(c[1], np.float32).reshape(-1)))
        elif n.op in ("Add", "Mul", "Sub", "Div"):
            other_first = n.inputs[0] != cur
            k = np.asarray(c[0] if other_first else c[1], np.float32).reshape(-1)
            if n.op == "Add":
                specs.append(("affine", np.ones_like(k), k))
            elif n.op == "Mul":
                specs.append(("affine", k, np.zeros_like(k)))
            elif n.op == "Sub":
                specs.append(("affine", -np.ones_like(k), k) if other_first else ("affine", np.ones_like(k), -k))
            else:
                if other_first:
                    raise TensorplanError(f"node '{n.name}': constant / tensor is not a supported epilogue")
                specs.append(("affine", 1.0 / k, np.zeros_like(k)))
        else:
            raise TensorplanError(f"node '{n.name}' ({n.op}) is not a supported fused epilogue")
        cur = n.outputs[0]
    return specs


def _slice_spec(spec: EpiSpec, c0: int, c1: int) -> EpiSpec:
    out = []
    for v in spec:
        if isinstance(v, np.ndarray) and v.size > 1:
            v = v[c0:c1]
        out.append(v)
    return tuple(out)


def _epilogue_fn(spec: EpiSpec):
    import torch

    F = torch.nn.functional
    kind = spec[0]
    if kind == "relu":
        return torch.relu
    if kind == "leaky":
        return lambda y: F.leaky_relu(y, spec[1])
    if kind == "sigmoid":
        return torch.sigmoid
    if kind == "tanh":
        return torch.tanh
    if kind == "clip":
        return lambda y: torch.clamp(y, spec[1], spec[2])
    if kind == "hardsigmoid":
        return lambda y: torch.clamp(y * spec[1] + spec[2], 0.0, 1.0)
    if kind == "hardswish":
        return F.hardswish
    if kind == "elu":
        return lambda y: F.elu(y, spec[1])
    if kind in ("affine", "prelu"):
        def per_c(v):
            t = torch.from_numpy(np.asarray(v, np.float32).reshape(-1))
            return t.reshape(1, -1, 1, 1) if t.numel() > 1 else t.reshape(())

        if kind == "prelu":
            s = per_c(spec[1])
            return lambda y: torch.where(y >= 0, y, y * (s if y.dim() == 4 or s.dim() == 0 else s.reshape(1, -1)))
        k, b = per_c(spec[1]), per_c(spec[2])

        def aff(y):
            if y.dim() == 2:
                return y * k.reshape(1, -1 if k.dim() else 1) + b.reshape(1, -1 if b.dim() else 1)
            return y * k + b
        return aff
    raise TensorplanError(f"unknown epilogue spec {kind!r}")


# --------------------------------------------------------------------------------------
# Side plans: what each processor runs for a job
# --------------------------------------------------------------------------------------


@dataclass
class SidePlan:
    """One processor's share of a job: input rows/channels to read from the home buffer,
    the parts to run, and the output rows/channels to write back."""

    parts: list[OpShape]
    weights: list[tuple[np.ndarray | None, np.ndarray | None]]
    epilogues: list[list[EpiSpec]]
    in_rows: tuple[int, int]
    in_ch: tuple[int, int]
    out_rows: tuple[int, int]
    out_ch: tuple[int, int]

    @property
    def in_bytes(self) -> int:
        p = self.parts[0]
        if p.kind == "fc":
            return 4 * (self.in_ch[1] - self.in_ch[0])
        return 4 * (self.in_rows[1] - self.in_rows[0]) * p.iw * (self.in_ch[1] - self.in_ch[0])

    @property
    def out_bytes(self) -> int:
        p = self.parts[-1]
        if p.kind == "fc":
            return 4 * (self.out_ch[1] - self.out_ch[0])
        return 4 * (self.out_rows[1] - self.out_rows[0]) * p.ow * (self.out_ch[1] - self.out_ch[0])


def side_plans(job: CoexecJob) -> tuple[SidePlan | None, SidePlan | None]:
    """(gpu side, cpu side) for the job's dim and ratio; None for an empty side."""
    ops = job.ops
    if job.dim == "H":
        g, c = chain_rows(ops, job.ratio)
        out = []
        for rr in (g, c):
            if rr[0] is None:
                out.append(None)
                continue
            parts = [part_shape(o, r) for o, r in zip(ops, rr)]
            out.append(SidePlan(parts, list(job.weights), [list(e) for e in job.epilogues],
                                (rr[0].r0, rr[0].r1), (0, ops[0].ic), (rr[-1].o0, rr[-1].o1), (0, ops[-1].oc)))
        return out[0], out[1]
    op = ops[0]
    sp = split(op, "OC", job.ratio, job.cblk)
    w, b = job.weights[0]
    res = []
    for part, (c0, c1) in ((sp.gpu, (0, sp.oc_gpu)), (sp.cpu, (sp.oc_gpu, op.oc))):
        if part is None:
            res.append(None)
            continue
        ws = (w[c0:c1] if w is not None else None, b[c0:c1] if b is not None else None)
        epi = [_slice_spec(s, c0, c1) for s in job.epilogues[0]]
        in_ch = (c0, c1) if op.per_channel else (0, op.ic)
        rows = (0, op.ih) if op.kind != "fc" else (0, 1)
        res.append(SidePlan([part], [ws], [epi], rows, in_ch, (0, op.oh) if op.kind != "fc" else (0, 1), (c0, c1)))
    return res[0], res[1]


def _build_kernels(side: SidePlan, layout: str) -> list[PartKernel]:
    return [PartKernel(p, layout, w, b, [_epilogue_fn(s) for s in e])
            for p, (w, b), e in zip(side.parts, side.weights, side.epilogues)]


def memory_overhead(job: CoexecJob) -> dict[str, int]:
    """Extra bytes co-execution needs over running the job on one processor: the CPU side's
    private input/output copies (mapped + transformed), weights held by both sides (H split
    replicates them; OC slices them) and the halo rows both sides read."""
    gpu, cpu = side_plans(job)
    if gpu is None or cpu is None:
        extra_w = 0
    else:
        extra_w = sum(4 * (w.size if w is not None else 0) + 4 * (b.size if b is not None else 0)
                      for w, b in job.weights) if job.dim == "H" else 0
    priv = 0 if cpu is None else 2 * cpu.in_bytes + 2 * cpu.out_bytes
    halo = 0
    if job.dim == "H" and gpu is not None and cpu is not None:
        p = job.ops[0]
        halo = 4 * max(gpu.in_rows[1] - cpu.in_rows[0], 0) * p.iw * p.ic
    weights = sum(4 * (w.size if w is not None else 0) for w, _ in job.weights)
    return {"cpu_private_buffers": priv, "replicated_weights": extra_w, "halo_input": halo,
            "total_extra": priv + extra_w, "weights": weights}


# --------------------------------------------------------------------------------------
# Two-process stand-in
# --------------------------------------------------------------------------------------


@dataclass
class RunTiming:
    """Measured components of one co-executed segment (seconds, wall clock)."""

    total: float
    map_in: float = 0.0
    trans_in: float = 0.0
    cpu: float = 0.0
    trans_out: float = 0.0
    map_out: float = 0.0
    gpu: float = 0.0
    start_latency: float = 0.0   # command sent -> worker starts
    sync: float = 0.0            # total − the busier side's own span (pre + post sync)
    events: dict[str, list[tuple[str, float, float]]] = field(default_factory=dict)

    @property
    def share_in(self) -> float:
        return self.map_in + self.trans_in

    @property
    def share_out(self) -> float:
        return self.trans_out + self.map_out

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("total", "map_in", "trans_in", "cpu", "trans_out", "map_out", "gpu",
                                               "start_latency", "sync", "share_in", "share_out")}


def _home_shape(op_first: OpShape) -> tuple[int, ...]:
    return (1, op_first.ic) if op_first.kind == "fc" else (1, op_first.ih, op_first.iw, op_first.ic)


def _out_shape(op_last: OpShape) -> tuple[int, ...]:
    return (1, op_last.oc) if op_last.kind == "fc" else (1, op_last.oh, op_last.ow, op_last.oc)


def _nbytes(shape) -> int:
    return 4 * int(np.prod(shape))


def _side_input(home: np.ndarray, side: SidePlan) -> np.ndarray:
    if home.ndim == 2:
        return home[:, side.in_ch[0]:side.in_ch[1]]
    return home[:, side.in_rows[0]:side.in_rows[1], :, side.in_ch[0]:side.in_ch[1]]


def _worker_entry(address: str, authkey: bytes, core: int) -> None:
    conn = Client(address, family="AF_UNIX", authkey=authkey)
    _worker_main(conn, core)


def _worker_main(conn, core: int | None) -> None:
    import torch

    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    from multiprocessing import resource_tracker

    jobs: dict[int, Any] = {}
    shms: dict[int, list] = {}
    with torch.inference_mode():
        while True:
            msg = conn.recv()
            cmd = msg[0]
            if cmd == "run":
                jid = msg[1]
                t0 = time.perf_counter()
                side, kernels, home_in, home_out = jobs[jid]
                x = _side_input(home_in, side)
                if x.ndim == 4:
                    xt = torch.from_numpy(x).permute(0, 3, 1, 2)
                    if not xt.is_contiguous(memory_format=torch.channels_last):
                        xt = xt.contiguous(memory_format=torch.channels_last)
                else:
                    xt = torch.from_numpy(np.ascontiguousarray(x))
                for k in kernels:
                    xt = k(xt)
                t1 = time.perf_counter()
                y = xt.permute(0, 2, 3, 1).numpy() if xt.dim() == 4 else xt.numpy()
                if home_out.ndim == 2:
                    home_out[:, side.out_ch[0]:side.out_ch[1]] = y
                else:
                    map_out(home_out, y, side.out_rows[0], side.out_rows[1], side.out_ch[0], side.out_ch[1])
                t2 = time.perf_counter()
                conn.send(("done", t0, t1, t2))
            elif cmd == "ping":
                conn.send(("pong", time.perf_counter()))
            elif cmd == "setup":
                _, jid, side, in_name, in_shape, out_name, out_shape = msg
                try:
                    a = shared_memory.SharedMemory(name=in_name)
                    b = shared_memory.SharedMemory(name=out_name)
                    for s in (a, b):  # the creator owns (and unlinks) these segments
                        try:
                            resource_tracker.unregister(s._name, "shared_memory")
                        except Exception:
                            pass
                    home_in = np.ndarray(in_shape, np.float32, buffer=a.buf)
                    home_out = np.ndarray(out_shape, np.float32, buffer=b.buf)
                    kernels = _build_kernels(side, "nhwc")
                    # warm up once (first-call reorders, page faults)
                    x = _side_input(home_in, side)
                    xt = torch.from_numpy(np.ascontiguousarray(x))
                    if xt.dim() == 4:
                        xt = xt.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
                    for k in kernels:
                        xt = k(xt)
                    jobs[jid] = (side, kernels, home_in, home_out)
                    shms[jid] = [a, b]
                    conn.send(("ok",))
                except Exception as e:  # report, keep serving
                    conn.send(("error", f"{type(e).__name__}: {e}"))
            elif cmd == "free":
                jobs.pop(msg[1], None)
                for s in shms.pop(msg[1], []):
                    s.close()
                conn.send(("ok",))
            elif cmd == "stop":
                for lst in shms.values():
                    for s in lst:
                        s.close()
                conn.send(("bye",))
                return


@dataclass
class PreparedJob:
    jid: int
    job: CoexecJob
    gpu: SidePlan | None
    cpu: SidePlan | None
    cpu_kernels: list[PartKernel]
    shm_in: Any
    shm_out: Any
    home_in: np.ndarray
    home_out: np.ndarray
    cpu_buf: np.ndarray | None
    owns_input: bool = True   # False: the input home buffer is another job's output buffer


class ProcessPair:
    """Two single-core processes on disjoint cores sharing memory: "cpu" (this process, NCHW)
    and "cpu2" (a worker, NHWC, the GPU stand-in). Use as a context manager."""

    def __init__(self, cores: tuple[int, int] | None = None):
        avail = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0, 1]
        if cores is None:
            if len(avail) < 2:
                raise TensorplanError("ProcessPair needs two CPU cores; this process may use only "
                                      f"{avail}")
            cores = (avail[0], avail[1])
        if cores[0] == cores[1]:
            raise TensorplanError(f"ProcessPair cores must differ, got {cores}")
        self.cores = cores
        self._jobs: dict[int, PreparedJob] = {}
        self._next = 0
        self._old_aff = None
        self._old_threads = None
        # A fresh interpreter (not fork: this process may already run OpenMP threads; not
        # multiprocessing-spawn: that re-imports the caller's __main__).
        key = os.urandom(16)
        listener = Listener(family="AF_UNIX", authkey=key)
        code = ("import sys; from tensorplan.codl.coexecutor import _worker_entry; "
                "_worker_entry(sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3]))")
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self._proc = subprocess.Popen([sys.executable, "-c", code, listener.address, key.hex(), str(cores[1])],
                                      env=env)
        listener._listener._socket.settimeout(120)
        try:
            self._conn = listener.accept()
        except OSError as e:
            self._proc.kill()
            raise TensorplanError(f"co-executor worker did not connect within 120 s: {e}") from None
        finally:
            listener.close()
        self._call(("ping",))
        self._pin()

    def _pin(self) -> None:
        import torch

        if hasattr(os, "sched_setaffinity"):
            self._old_aff = os.sched_getaffinity(0)
            os.sched_setaffinity(0, {self.cores[0]})
        self._old_threads = torch.get_num_threads()
        torch.set_num_threads(1)

    def __enter__(self) -> "ProcessPair":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        import torch

        for jid in list(self._jobs):
            self.free(jid)
        if self._proc.poll() is None:
            try:
                self._conn.send(("stop",))
                if self._conn.poll(10):
                    self._conn.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        self._conn.close()
        if self._old_aff is not None:
            os.sched_setaffinity(0, self._old_aff)
            self._old_aff = None
        if self._old_threads is not None:
            torch.set_num_threads(self._old_threads)
            self._old_threads = None

    def _call(self, msg) -> tuple:
        self._conn.send(msg)
        r = self._conn.recv()
        if r[0] == "error":
            raise TensorplanError(f"co-executor worker: {r[1]}")
        return r

    def prepare(self, job: CoexecJob, input_from: PreparedJob | None = None) -> PreparedJob:
        """Allocate the home buffers, pre-slice and pre-pack weights on both sides.

        `input_from`: a job whose output *is* this job's input (same home shape); its output
        buffer becomes this job's input buffer, so consecutive operators pass the tensor
        without a copy, as CoDL keeps tensors in the GPU's memory between operators."""
        gpu, cpu = side_plans(job)
        in_shape, out_shape = _home_shape(job.ops[0]), _out_shape(job.ops[-1])
        if input_from is not None and input_from.home_out.shape != in_shape:
            raise TensorplanError(f"prepare: input_from's output {input_from.home_out.shape} is not this "
                                  f"job's input {in_shape}")
        b = shared_memory.SharedMemory(create=True, size=max(_nbytes(out_shape), 4))
        home_out = np.ndarray(out_shape, np.float32, buffer=b.buf)
        if input_from is None:
            a = shared_memory.SharedMemory(create=True, size=max(_nbytes(in_shape), 4))
            home_in = np.ndarray(in_shape, np.float32, buffer=a.buf)
            home_in[...] = 0
        else:
            a, home_in = input_from.shm_out, input_from.home_out
        jid = self._next
        self._next += 1
        if gpu is not None:
            self._call(("setup", jid, gpu, a.name, in_shape, b.name, out_shape))
        cpu_kernels = _build_kernels(cpu, "nchw") if cpu is not None else []
        cpu_buf = np.empty(_side_input(home_in, cpu).shape, np.float32) if cpu is not None else None
        pj = PreparedJob(jid, job, gpu, cpu, cpu_kernels, a, b, home_in, home_out, cpu_buf, input_from is None)
        self._jobs[jid] = pj
        return pj

    def free(self, pj: PreparedJob | int) -> None:
        jid = pj if isinstance(pj, int) else pj.jid
        p = self._jobs.pop(jid, None)
        if p is None:
            return
        if p.gpu is not None and self._proc.poll() is None:
            self._call(("free", jid))
        for s in ((p.shm_in, p.shm_out) if p.owns_input else (p.shm_out,)):
            s.close()
            s.unlink()

    def load_input(self, pj: PreparedJob, x_nchw: np.ndarray) -> None:
        """Put the input into the home buffer (NHWC): the tensor "already lives on the GPU"."""
        x = np.asarray(x_nchw, np.float32)
        if pj.home_in.ndim == 2:
            pj.home_in[...] = x.reshape(pj.home_in.shape)
        else:
            pj.home_in[...] = x.transpose(0, 2, 3, 1)

    def output(self, pj: PreparedJob) -> np.ndarray:
        """The merged output as NCHW (or (1, OC) for fc)."""
        o = pj.home_out
        return o.copy() if o.ndim == 2 else o.transpose(0, 3, 1, 2).copy()

    def run(self, pj: PreparedJob, x_nchw: np.ndarray | None = None) -> RunTiming:
        """Co-execute once (input already in the home buffer unless `x_nchw` is given)."""
        import torch

        if x_nchw is not None:
            self.load_input(pj, x_nchw)
        ev_cpu: list[tuple[str, float, float]] = []
        t0 = time.perf_counter()
        if pj.gpu is not None:
            self._conn.send(("run", pj.jid))
        rt = RunTiming(0.0)
        t_cpu_end = t0
        if pj.cpu is not None:
            with torch.inference_mode():
                side = pj.cpu
                a = time.perf_counter()
                xm = _side_input(pj.home_in, side)
                np.copyto(pj.cpu_buf, xm)
                b = time.perf_counter()
                xt = trans_in(pj.cpu_buf) if pj.cpu_buf.ndim == 4 else torch.from_numpy(pj.cpu_buf)
                c = time.perf_counter()
                for k in pj.cpu_kernels:
                    xt = k(xt)
                d = time.perf_counter()
                y = trans_out(xt) if xt.dim() == 4 else xt.numpy()
                e = time.perf_counter()
                if pj.home_out.ndim == 2:
                    pj.home_out[:, side.out_ch[0]:side.out_ch[1]] = y
                else:
                    map_out(pj.home_out, y, side.out_rows[0], side.out_rows[1], side.out_ch[0], side.out_ch[1])
                f = time.perf_counter()
            rt.map_in, rt.trans_in, rt.cpu, rt.trans_out, rt.map_out = b - a, c - b, d - c, e - d, f - e
            ev_cpu = [("map in", a, b), ("transform in", b, c), ("compute", c, d), ("transform out", d, e),
                      ("map out", e, f)]
            t_cpu_end = f
        ev_gpu: list[tuple[str, float, float]] = []
        t_gpu_end = t0
        if pj.gpu is not None:
            msg = self._conn.recv()
            _, g0, g1, g2 = msg
            rt.gpu = g2 - g0
            rt.start_latency = g0 - t0
            ev_gpu = [("compute", g0, g1), ("write home", g1, g2)]
            t_gpu_end = g2
        t_end = time.perf_counter()
        rt.total = t_end - t0
        rt.sync = max(rt.total - max(t_cpu_end - t0, rt.gpu), 0.0) if pj.gpu is not None else 0.0
        rt.events = {"cpu": [(n, s - t0, e - t0) for n, s, e in ev_cpu],
                     "gpu": [(n, s - t0, e - t0) for n, s, e in ev_gpu]}
        _ = t_gpu_end
        return rt

    def measure_sync(self, n: int = 100) -> list[float]:
        """Round-trip times of an empty command (the sync constant of this stand-in)."""
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            self._conn.send(("ping",))
            self._conn.recv()
            out.append(time.perf_counter() - t0)
        return out


def reference_output(job: CoexecJob, x_nchw: np.ndarray) -> np.ndarray:
    """The unsplit result of the job (plain torch conv/pool/linear, NCHW), for checking."""
    import torch

    F = torch.nn.functional
    x = torch.from_numpy(np.ascontiguousarray(x_nchw, np.float32))
    with torch.inference_mode():
        for op, (w, b), epi in zip(job.ops, job.weights, job.epilogues):
            if op.kind == "fc":
                x = F.linear(x.reshape(1, -1), torch.from_numpy(w), torch.from_numpy(b))
            else:
                fill = -math.inf if (op.kind == "pool" and op.pool == "max") else 0.0
                x = F.pad(x, (op.pl, op.pr, op.pt, op.pb), value=fill)
                if op.kind == "conv":
                    x = F.conv2d(x, torch.from_numpy(w), torch.from_numpy(b) if b is not None else None, op.s,
                                 0, 1, op.g)
                else:
                    x = (F.max_pool2d if op.pool == "max" else F.avg_pool2d)(x, op.k, op.s)
            for s in epi:
                x = _epilogue_fn(s)(x)
    return x.numpy()


# --------------------------------------------------------------------------------------
# CPU + CUDA GPU
# --------------------------------------------------------------------------------------


class CudaCoexecutor:
    """Co-execution on this host's CPU and a CUDA GPU (tensors' home: the GPU, channels-last).

    The CPU slice is transformed to NCHW on the GPU (the "transform"), copied to a pinned
    host buffer on a copy stream (the "map"), an event marks it ready (pre-sync); the GPU
    part runs on the compute stream meanwhile; the CPU result is copied back on the copy
    stream and the compute stream waits on that event before the output is used."""

    def __init__(self, device: str = "cuda", cpu_threads: int | None = None):
        import torch

        if not torch.cuda.is_available():
            raise TensorplanError("CudaCoexecutor: no CUDA device (torch.cuda.is_available() is False); "
                                  "use ProcessPair (processors cpu,cpu2) on a CPU-only machine")
        self.torch = torch
        self.device = torch.device(device)
        self.compute = torch.cuda.Stream(self.device)
        self.copy = torch.cuda.Stream(self.device)
        # keep one of the cores this process may use free to drive the GPU
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
        self.cpu_threads = cpu_threads or max(1, usable - 1)

    def prepare(self, job: CoexecJob) -> dict:
        torch = self.torch
        gpu, cpu = side_plans(job)
        st = {"job": job, "gpu": gpu, "cpu": cpu}
        if gpu is not None:
            st["gpu_fns"] = [self._gpu_fn(p, w, b, e) for p, (w, b), e in zip(gpu.parts, gpu.weights, gpu.epilogues)]
        if cpu is not None:
            st["cpu_kernels"] = _build_kernels(cpu, "nchw")
            shp = _side_input(np.empty(_home_shape(job.ops[0]), np.float32), cpu).shape
            nchw = (shp[0], shp[3], shp[1], shp[2]) if len(shp) == 4 else shp
            st["pin_in"] = torch.empty(nchw, pin_memory=True)
            oshape = _out_shape(job.ops[-1])
            ncout = ((1, cpu.out_ch[1] - cpu.out_ch[0], cpu.out_rows[1] - cpu.out_rows[0], oshape[2])
                     if len(oshape) == 4 else (1, cpu.out_ch[1] - cpu.out_ch[0]))
            st["pin_out"] = torch.empty(ncout, pin_memory=True)
        st["ev_in"] = torch.cuda.Event(enable_timing=True)
        st["ev_out"] = torch.cuda.Event(enable_timing=True)
        st["ev_g0"] = torch.cuda.Event(enable_timing=True)
        st["ev_g1"] = torch.cuda.Event(enable_timing=True)
        st["ev_c0"] = torch.cuda.Event(enable_timing=True)
        return st

    def _gpu_fn(self, op: OpShape, w, b, epi):
        torch = self.torch
        F = torch.nn.functional
        dev = self.device
        wt = torch.from_numpy(w).to(dev).contiguous(memory_format=torch.channels_last) if w is not None and w.ndim == 4 \
            else (torch.from_numpy(w).to(dev) if w is not None else None)
        bt = torch.from_numpy(b).to(dev) if b is not None else None
        epis = []
        for s in epi:
            s2 = tuple(torch.from_numpy(v).to(dev) if isinstance(v, np.ndarray) else v for v in s)
            epis.append(_cuda_epilogue(s2))

        def fn(x):
            if op.kind == "fc":
                y = F.linear(x, wt, bt)
            else:
                fill = -math.inf if (op.kind == "pool" and op.pool == "max") else 0.0
                x = F.pad(x, (op.pl, op.pr, op.pt, op.pb), value=fill) if (op.pt or op.pb or op.pl or op.pr) else x
                if op.kind == "conv":
                    y = F.conv2d(x, wt, bt, op.s, 0, 1, op.g)
                else:
                    y = (F.max_pool2d if op.pool == "max" else F.avg_pool2d)(x, op.k, op.s)
            for e in epis:
                y = e(y)
            return y
        return fn

    def home_input(self, x_nchw: np.ndarray):
        t = self.torch.from_numpy(np.ascontiguousarray(x_nchw, np.float32)).to(self.device)
        return t.contiguous(memory_format=self.torch.channels_last) if t.dim() == 4 else t

    def run(self, st: dict, x) -> tuple[Any, RunTiming]:
        """x: the home input on the GPU (from `home_input`). Returns (output on GPU, timing)."""
        torch = self.torch
        job, gpu, cpu = st["job"], st["gpu"], st["cpu"]
        last = job.ops[-1]
        shape = _out_shape(last)
        out = (torch.empty((1, shape[3], shape[1], shape[2]), device=self.device).contiguous(
            memory_format=torch.channels_last) if len(shape) == 4 else torch.empty(shape, device=self.device))
        cur = torch.cuda.current_stream(self.device)
        self.compute.wait_stream(cur)
        self.copy.wait_stream(cur)
        rt = RunTiming(0.0)
        t0 = time.perf_counter()
        if cpu is not None:
            with torch.cuda.stream(self.copy):
                st["ev_c0"].record(self.copy)
                xs = x[:, cpu.in_ch[0]:cpu.in_ch[1], cpu.in_rows[0]:cpu.in_rows[1]] if x.dim() == 4 \
                    else x[:, cpu.in_ch[0]:cpu.in_ch[1]]
                st["pin_in"].copy_(xs.contiguous(), non_blocking=True)  # transform on GPU + map (D2H)
                st["ev_in"].record(self.copy)
        if gpu is not None:
            with torch.cuda.stream(self.compute):
                st["ev_g0"].record(self.compute)
                xg = x[:, gpu.in_ch[0]:gpu.in_ch[1], gpu.in_rows[0]:gpu.in_rows[1]] if x.dim() == 4 \
                    else x[:, gpu.in_ch[0]:gpu.in_ch[1]]
                for fn in st["gpu_fns"]:
                    xg = fn(xg)
                if out.dim() == 4:
                    out[:, gpu.out_ch[0]:gpu.out_ch[1], gpu.out_rows[0]:gpu.out_rows[1]] = xg
                else:
                    out[:, gpu.out_ch[0]:gpu.out_ch[1]] = xg
                st["ev_g1"].record(self.compute)
        if cpu is not None:
            a = time.perf_counter()
            st["ev_in"].synchronize()                       # pre-sync
            b = time.perf_counter()
            old = torch.get_num_threads()
            torch.set_num_threads(self.cpu_threads)
            with torch.inference_mode():
                y = st["pin_in"]
                for k in st["cpu_kernels"]:
                    y = k(y)
                st["pin_out"].copy_(y)
            torch.set_num_threads(old)
            c = time.perf_counter()
            with torch.cuda.stream(self.copy):
                yd = st["pin_out"].to(self.device, non_blocking=True)   # map back (H2D)
                if out.dim() == 4:
                    out[:, cpu.out_ch[0]:cpu.out_ch[1], cpu.out_rows[0]:cpu.out_rows[1]] = yd
                else:
                    out[:, cpu.out_ch[0]:cpu.out_ch[1]] = yd
                st["ev_out"].record(self.copy)
            self.compute.wait_event(st["ev_out"])
            rt.cpu = c - b
            rt.start_latency = b - a
        cur.wait_stream(self.compute)
        st["ev_end"] = torch.cuda.Event(enable_timing=True)
        st["ev_end"].record(cur)
        st["ev_end"].synchronize()                          # measurement only, after the pipeline
        rt.total = time.perf_counter() - t0
        if gpu is not None:
            rt.gpu = st["ev_g0"].elapsed_time(st["ev_g1"]) / 1e3
        if cpu is not None:
            rt.map_in = st["ev_c0"].elapsed_time(st["ev_in"]) / 1e3
        rt.sync = max(rt.total - max(rt.gpu, rt.map_in + rt.cpu), 0.0)
        return out, rt


def _cuda_epilogue(spec):
    import torch

    F = torch.nn.functional
    kind = spec[0]
    table = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "hardswish": F.hardswish}
    if kind in table:
        return table[kind]
    if kind == "leaky":
        return lambda y: F.leaky_relu(y, spec[1])
    if kind == "clip":
        return lambda y: torch.clamp(y, spec[1], spec[2])
    if kind == "hardsigmoid":
        return lambda y: torch.clamp(y * spec[1] + spec[2], 0.0, 1.0)
    if kind == "elu":
        return lambda y: F.elu(y, spec[1])
    if kind == "affine":
        k, b = spec[1], spec[2]
        return lambda y: y * (k.reshape(1, -1, 1, 1) if y.dim() == 4 else k) + (b.reshape(1, -1, 1, 1) if y.dim() == 4 else b)
    if kind == "prelu":
        s = spec[1]
        return lambda y: torch.where(y >= 0, y, y * (s.reshape(1, -1, 1, 1) if y.dim() == 4 and s.numel() > 1 else s))
    raise TensorplanError(f"unknown epilogue spec {kind!r}")


# --------------------------------------------------------------------------------------
# Whole model on the two-process stand-in
# --------------------------------------------------------------------------------------


def op_weights(graph: Graph, co) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(weight, bias) of a `CoOp` in the layout the kernels expect (fc: (OC, IC))."""
    n = co.node
    t = graph.tensors
    if co.shape.kind == "pool":
        return None, None
    w = t[n.inputs[1]].data.astype(np.float32)
    b = t[n.inputs[2]].data.astype(np.float32).reshape(-1) if len(n.inputs) > 2 and n.inputs[2] else None
    if co.shape.kind == "fc":
        trans_b = int(n.attrs.get("transB", 0)) if n.op == "Gemm" else 0
        w = w if trans_b else w.T
        if b is not None and b.size != co.shape.oc:
            b = np.broadcast_to(b, (co.shape.oc,)).copy()
    return np.ascontiguousarray(w), b


def default_data_dir():
    from pathlib import Path

    for cand in (Path.cwd() / "data" / "codl", Path(__file__).resolve().parents[3] / "data" / "codl"):
        if (cand / "ops.csv.gz").exists():
            return cand
    raise TensorplanError("no CoDL training data found (data/codl/ops.csv.gz); run "
                          "`python bench/codl_predictor.py --collect` or pass --data")


def fit_local_cost(data_dir=None, pair: "ProcessPair | None" = None, max_spread: float = 0.05):
    """CoexecCost for the stand-in processors from the measured data (sync from the data, or
    measured on `pair` when the data has none)."""
    from tensorplan.codl.partition import CoexecCost
    from tensorplan.codl.data import load_compact
    from tensorplan.codl.predictor import CodlPredictor, SharingModel

    samples, sharing = load_compact(data_dir or default_data_dir())
    pred = CodlPredictor().fit([s for s in samples if s.spread <= max_spread] or samples)
    if not any(r["term"] == "sync" for r in sharing):
        if pair is None:
            raise TensorplanError("the CoDL data has no sync measurement; pass a ProcessPair to measure it")
        sharing = sharing + [{"term": "sync", "bytes": 0, "latency_s": float(np.median(pair.measure_sync(50)))}]
    return CoexecCost(pred, SharingModel().fit(sharing), "cpu", "cpu2", 16, "overlap")


def model_steps(graph: Graph, ops: Sequence[Any], plan: Any) -> list[tuple[str, Any]]:
    """Execution steps of a whole model in graph order: ``("segment", i)`` runs plan segment i
    (its ops and their fused epilogues) on both processors; ``("cpu", [node names])`` runs a
    maximal run of the other nodes on the CPU alone (one ONNX Runtime session, 1 thread).

    A segment runs at the position of its first node: its later nodes' inputs are produced
    inside the segment (chain links and epilogues have a single consumer), so nothing between
    them in graph order can need them."""
    owner: dict[str, int] = {}
    for i, seg in enumerate(plan.segments):
        for c in ops[seg.start:seg.end]:
            owner[c.node.name] = i
            for e in c.epilogue:
                owner[e.name] = i
    steps: list[tuple[str, Any]] = []
    run: list[str] = []
    started: set[int] = set()
    for n in graph.nodes:
        i = owner.get(n.name)
        if i is None:
            run.append(n.name)
            continue
        if run:
            steps.append(("cpu", run))
            run = []
        if i not in started:
            started.add(i)
            steps.append(("segment", i))
    if run:
        steps.append(("cpu", run))
    return steps


class ModelRunner:
    """One plan of a whole model, prepared: partitioned segments on the pair, every other
    operator on the CPU side alone (one ONNX Runtime session, 1 thread, per maximal run).

    A segment that reads the previous segment's output takes that home buffer as its own input
    (no copy), as CoDL keeps tensors in the GPU's memory between operators; a tensor crosses
    to NCHW only where a CPU-only operator or a graph output needs it."""

    def __init__(self, graph: Graph, ops: Sequence[Any], plan: Any, pair: "ProcessPair"):
        from tensorplan.ir.to_onnx import ort_session

        self.graph, self.pair = graph, pair
        self.steps = model_steps(graph, ops, plan)
        self.cpu_sessions: dict[int, tuple] = {}
        self.prepared: dict[int, tuple] = {}
        produced_by: dict[str, int] = {}      # segment output tensor -> its step
        in_place: set[str] = set()            # tensors a segment reads straight from a home buffer
        try:
            for k, (kind, what) in enumerate(self.steps):
                if kind == "cpu":
                    sess = ort_session(graph.subgraph(what, f"{graph.name}.cpu{k}"), threads=1)
                    self.cpu_sessions[k] = (sess, [i.name for i in sess.get_inputs()],
                                            [o.name for o in sess.get_outputs()])
                    continue
                seg = plan.segments[what]
                cos = ops[seg.start:seg.end]
                job = CoexecJob([c.shape for c in cos], [op_weights(graph, c) for c in cos], seg.dim, seg.ratio,
                                [epilogue_specs(graph, c.epilogue, c.node.outputs[0]) for c in cos], 16)
                src = self.prepared.get(produced_by.get(cos[0].input, -1))
                if src is not None and src[0].home_out.shape != _home_shape(cos[0].shape):
                    src = None                # e.g. an FC reading a flattened conv output
                self.prepared[k] = (pair.prepare(job, src[0] if src else None), cos[0].input, cos[-1].output,
                                    src is not None)
                produced_by[cos[-1].output] = k
                if src is not None:
                    in_place.add(cos[0].input)
        except BaseException:
            self.free()
            raise
        seg_first = {ops[seg.start].node.name for seg in plan.segments}
        cons = graph.consumers()
        self.need_nchw = {y for y in produced_by if y in graph.outputs or y not in in_place
                          or any(n.name not in seg_first for n in cons.get(y, []))}

    def stats(self) -> dict[str, int]:
        return {"segments": len(self.prepared), "cpu_runs": len(self.cpu_sessions),
                "zero_copy_inputs": sum(p[3] for p in self.prepared.values()),
                "cpu_nodes": sum(len(w) for kind, w in self.steps if kind == "cpu")}

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], "StepTimes"]:
        """One inference: (all values, seconds spent in segments / CPU-only ops / hand-off / total)."""
        vals = dict(feeds)
        tm = StepTimes(0.0)
        t_all = time.perf_counter()
        for k, (kind, _) in enumerate(self.steps):
            if kind == "cpu":
                sess, ins, outs = self.cpu_sessions[k]
                a = time.perf_counter()
                res = sess.run(outs, {n: vals[n] for n in ins})
                tm.cpu_ops += time.perf_counter() - a
                vals.update(zip(outs, res))
                continue
            pj, x_name, y_name, zero_copy = self.prepared[k]
            a = time.perf_counter()
            if not zero_copy:
                self.pair.load_input(pj, vals[x_name])
            b = time.perf_counter()
            self.pair.run(pj)
            c = time.perf_counter()
            if y_name in self.need_nchw:
                vals[y_name] = self.pair.output(pj).reshape(self.graph.tensors[y_name].shape)
            d = time.perf_counter()
            tm.segments += c - b
            tm.handoff += (b - a) + (d - c)
        tm.total = time.perf_counter() - t_all
        return vals, tm

    def free(self) -> None:
        for pj, *_ in reversed(list(self.prepared.values())):   # readers of a shared buffer first
            self.pair.free(pj)
        self.prepared = {}


@dataclass
class StepTimes:
    """Seconds of one whole-model run: in co-executed segments, in CPU-only operators, handing
    tensors between layouts, and in total."""

    total: float
    segments: float = 0.0
    cpu_ops: float = 0.0
    handoff: float = 0.0

    @classmethod
    def median(cls, rounds: Sequence["StepTimes"]) -> "StepTimes":
        return cls(**{k: float(np.median([getattr(r, k) for r in rounds]))
                      for k in ("total", "segments", "cpu_ops", "handoff")})

    def to_dict(self) -> dict[str, float]:
        return {"segments": self.segments, "cpu_ops": self.cpu_ops, "handoff": self.handoff, "total": self.total}


@dataclass
class PlanRun:
    """One plan of a whole model, run round after round: its steps, times and error vs ONNX Runtime."""

    steps: dict[str, int]            # `ModelRunner.stats()`
    rounds: list[StepTimes]
    max_rel_err_vs_ort: float
    speedup_vs_ort: dict[int, float]  # ORT thread count -> ORT's median / this plan's median

    @property
    def median(self) -> StepTimes:
        return StepTimes.median(self.rounds)

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "median_s": self.median.to_dict(), "rounds": [r.to_dict() for r in self.rounds],
                "max_rel_err_vs_ort": self.max_rel_err_vs_ort,
                **{f"speedup_vs_ort_{t}t": v for t, v in self.speedup_vs_ort.items()}}


@dataclass
class ModelRun:
    """Whole-model runs of several plans and of ONNX Runtime on the full model, interleaved."""

    plans: dict[str, PlanRun]
    ort_rounds: list[dict[int, float]]   # per round: ORT thread count -> seconds

    @property
    def ort_median_s(self) -> dict[int, float]:
        return {t: float(np.median([r[t] for r in self.ort_rounds])) for t in self.ort_rounds[0]}

    def to_dict(self) -> dict[str, Any]:
        return {"ort_median_s": {f"ort_{t}t": v for t, v in self.ort_median_s.items()},
                "ort_rounds": [{f"ort_{t}t": v for t, v in r.items()} for r in self.ort_rounds],
                "plans": {k: v.to_dict() for k, v in self.plans.items()}}


def run_model(graph: Graph, ops: Sequence[Any], plans: Any, pair: "ProcessPair", repeats: int = 5,
              feeds: dict[str, np.ndarray] | None = None) -> ModelRun:
    """Run the whole model under each plan (`plans`: one plan, named "plan", or {name: plan}, e.g.
    CoDL, CPU only, GPU only) and ONNX Runtime on the full model at 1 thread and at the pair's core
    count, interleaved round by round on the same cores; every plan's outputs are checked against
    ONNX Runtime."""
    from tensorplan.ir.reference import random_feeds, rel_error
    from tensorplan.ir.to_onnx import ort_session

    plans = plans if isinstance(plans, dict) else {"plan": plans}
    feeds = feeds or random_feeds(graph, 0)
    ort_threads = tuple(dict.fromkeys((1, len(pair.cores))))
    runners: dict[str, ModelRunner] = {}
    try:
        for name, plan in plans.items():
            runners[name] = ModelRunner(graph, ops, plan, pair)
        stats = {name: r.stats() for name, r in runners.items()}
        # full-model ORT baselines; the pool threads of the multi-thread session keep the pair's cores
        # and do not spin after a run (that would steal the cores from the co-execution rounds)
        old = os.sched_getaffinity(0) if hasattr(os, "sched_setaffinity") else None
        if old is not None:
            os.sched_setaffinity(0, set(pair.cores))
        try:
            base = {t: ort_session(graph, threads=t, spinning=False) for t in ort_threads}
        finally:
            if old is not None:
                os.sched_setaffinity(0, old)
        in_names = {t: [i.name for i in b.get_inputs()] for t, b in base.items()}

        def run_base(t: int) -> float:
            a = time.perf_counter()
            base[t].run(None, {n: feeds[n] for n in in_names[t]})
            return time.perf_counter() - a

        top = ort_threads[-1]
        ref = dict(zip([o.name for o in base[top].get_outputs()],
                       base[top].run(None, {n: feeds[n] for n in in_names[top]})))
        run_base(ort_threads[0])
        errs = {}
        for name, r in runners.items():            # warm-up, and the outputs to check
            vals, _ = r.run(feeds)
            errs[name] = max(rel_error(vals[o], ref[o]) for o in graph.outputs if o in ref)
        rounds: dict[str, list[StepTimes]] = {name: [] for name in runners}
        ort_rounds: list[dict[int, float]] = []
        for _ in range(repeats):                    # interleaved: every plan, then ORT at each thread count
            for name, r in runners.items():
                rounds[name].append(r.run(feeds)[1])
            ort_rounds.append({t: run_base(t) for t in ort_threads})
    finally:
        for r in runners.values():
            r.free()
    out = ModelRun({}, ort_rounds)
    ort_med = out.ort_median_s
    for name, rs in rounds.items():
        med = StepTimes.median(rs).total
        out.plans[name] = PlanRun(stats[name], rs, errs[name], {t: v / med for t, v in ort_med.items()})
    return out


@dataclass
class SegmentRun:
    """One planned segment co-executed on the pair: predicted vs measured, and its exactness."""

    start: int
    end: int                       # ops [start, end) of `partition.extract_ops`
    names: list[str]
    dim: str
    ratio: float
    predicted: Any                 # `partition.Breakdown`
    measured: RunTiming            # the fastest of the repeats (interference only adds time)
    measured_median_s: float
    max_abs_err: float | None      # vs the unsplit result (None: not checked)
    memory: dict[str, int]         # `memory_overhead`, bytes

    def to_dict(self) -> dict[str, Any]:
        return {"ops": [self.start, self.end], "names": self.names, "dim": self.dim, "ratio": self.ratio,
                "predicted": self.predicted.to_dict(), "measured_min": self.measured.to_dict(),
                "measured_median_s": self.measured_median_s, "max_abs_err": self.max_abs_err, "memory": self.memory}


def run_segments(graph: Graph, ops: Sequence[Any], plan: Any, pair: "ProcessPair", repeats: int = 5,
                 max_segments: int | None = None, check: bool = True, seed: int = 0) -> list[SegmentRun]:
    """Co-execute each planned segment alone on random input: a warm-up, then `repeats` timed runs;
    with `check`, its output against the unsplit reference."""
    rng = np.random.default_rng(seed)
    out = []
    for seg in plan.segments[:max_segments]:
        cos = ops[seg.start:seg.end]
        job = CoexecJob([c.shape for c in cos], [op_weights(graph, c) for c in cos], seg.dim, seg.ratio,
                        [epilogue_specs(graph, c.epilogue, c.node.outputs[0]) for c in cos], 16)
        first = cos[0].shape
        x = rng.standard_normal((1, first.ic) if first.kind == "fc" else (1, first.ic, first.ih, first.iw)
                                ).astype(np.float32)
        pj = pair.prepare(job)
        try:
            pair.load_input(pj, x)
            pair.run(pj)  # warm-up
            runs = [pair.run(pj) for _ in range(repeats)]
            err = float(np.abs(pair.output(pj) - reference_output(job, x).reshape(
                pair.output(pj).shape)).max()) if check else None
        finally:
            pair.free(pj)
        out.append(SegmentRun(seg.start, seg.end, [c.name for c in cos], seg.dim, seg.ratio, seg.cost,
                              min(runs, key=lambda r: r.total), float(np.median([r.total for r in runs])), err,
                              memory_overhead(job)))
    return out
