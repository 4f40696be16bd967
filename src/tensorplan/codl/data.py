"""Training data for the CoDL-style predictor: partitioned operators measured on this CPU.

The kernels measured here (`PartKernel`) are exactly the ones the co-executor runs, so
the predictor learns the latency of what is executed: one processor per core, one
thread, oneDNN conv with weights pre-packed once (as CoDL converts weights once), in
the processor's preferred layout ("cpu": NCHW, "cpu2": NHWC = the tensors' home).

Sweep (CoDL §6): every conv/pool/FC shape of the given models × dims {H, OC} × GPU
share ρ: the "cpu2" (GPU stand-in) part at ρ ∈ 0.1..1 and the "cpu" part at ρ ∈ 0..0.9,
each part measured alone. Data-sharing terms (map = copy between the home buffer and
private memory; transform = NHWC↔NCHW) are measured over the CPU parts' sizes.

Records go to `tensorplan.measure.store.Store` (kinds "codl-op", "codl-share"),
resumable through a store job; `export_compact` writes them to small gzip CSVs under
`data/codl/` so results can be re-derived without re-measuring.
"""
from __future__ import annotations

import csv
import gzip
import io
import math
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.codl.predictor import KernelSample, OpShape, explicit_pad_bytes, processor

OP_KIND = "codl-op"
SHARE_KIND = "codl-share"
PROCS = ("cpu", "cpu2")

# --------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------


def _torch():
    import torch  # noqa: WPS433 (torch is heavy; import on use)

    return torch


def _memfmt(layout: str):
    torch = _torch()
    return torch.channels_last if layout == "nhwc" else torch.contiguous_format


Epilogue = Callable[["object"], "object"]


class PartKernel:
    """Runs one part (an `OpShape`) in one layout with weights prepared once.

    Input: a logical NCHW torch tensor (for fc: (1, IC)) in `layout`'s memory format
    holding the part's *unpadded* input rows; the part's own pads are applied here.
    Output: a tensor in the same layout (fc: (1, OC))."""

    def __init__(self, op: OpShape, layout: str, weight: np.ndarray | None = None,
                 bias: np.ndarray | None = None, epilogue: Sequence[Epilogue] = (), seed: int = 0):
        torch = _torch()
        self.op, self.layout, self.epilogue = op, layout, list(epilogue)
        self.fmt = _memfmt(layout)
        rng = np.random.default_rng(seed)
        if op.kind == "conv" and weight is None:
            fan_in = (op.ic // op.g) * op.k * op.k
            weight = (rng.standard_normal((op.oc, op.ic // op.g, op.k, op.k)) / math.sqrt(fan_in)).astype(np.float32)
            bias = (rng.standard_normal(op.oc) * 0.1).astype(np.float32)
        if op.kind == "fc" and weight is None:
            weight = (rng.standard_normal((op.oc, op.ic)) / math.sqrt(op.ic)).astype(np.float32)
            bias = (rng.standard_normal(op.oc) * 0.1).astype(np.float32)
        self.w = torch.from_numpy(np.ascontiguousarray(weight, dtype=np.float32)) if weight is not None else None
        self.b = torch.from_numpy(np.ascontiguousarray(bias, dtype=np.float32)) if bias is not None else None
        self._packed = None
        self.sym = not explicit_pad_bytes(op)  # the predictor prices the same copy
        if op.kind == "conv":
            self._prepack()

    def _prepack(self) -> None:
        """Reorder the weights once into oneDNN's blocked format for this layout (CoDL converts
        weights once too); falls back to plain `conv2d` if this torch build lacks the op."""
        torch = _torch()
        op = self.op
        pad = [op.pt, op.pl] if self.sym else [0, 0]
        try:
            shape = [1, op.ic, op.ih + (0 if self.sym else op.pt + op.pb), op.iw + (0 if self.sym else op.pl + op.pr)]
            self._packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
                self.w.to_mkldnn(), pad, [op.s, op.s], [1, 1], op.g, shape)
            self._pad = pad
            x = torch.zeros(shape).contiguous(memory_format=self.fmt)
            self._conv(x)
        except (RuntimeError, AttributeError, NotImplementedError):
            self._packed = None

    def _conv(self, x):
        torch = _torch()
        op = self.op
        if self._packed is not None:
            return torch.ops.mkldnn._convolution_pointwise(x, self._packed, self.b, self._pad, [op.s, op.s],
                                                           [1, 1], op.g, "none", [], "")
        pad = [op.pt, op.pl] if self.sym else [0, 0]
        return torch.nn.functional.conv2d(x, self.w, self.b, op.s, pad, 1, op.g)

    def __call__(self, x):
        torch = _torch()
        F = torch.nn.functional
        op = self.op
        if op.kind == "fc":
            y = F.linear(x, self.w, self.b)
        elif op.kind == "conv":
            if not self.sym:
                x = F.pad(x, (op.pl, op.pr, op.pt, op.pb)).contiguous(memory_format=self.fmt)
            y = self._conv(x)
        else:
            if not self.sym:
                x = F.pad(x, (op.pl, op.pr, op.pt, op.pb), value=-math.inf if op.pool == "max" else 0.0)
            y = (F.max_pool2d if op.pool == "max" else F.avg_pool2d)(x, op.k, op.s)
        for fn in self.epilogue:
            y = fn(y)
        if op.kind != "fc":
            y = y.contiguous(memory_format=self.fmt)
        return y

    def example_input(self, seed: int = 0):
        torch = _torch()
        g = torch.Generator().manual_seed(seed)
        if self.op.kind == "fc":
            return torch.randn(1, self.op.ic, generator=g)
        return torch.randn(1, self.op.ic, self.op.ih, self.op.iw, generator=g).contiguous(memory_format=self.fmt)


# --------------------------------------------------------------------------------------
# Data sharing primitives (the same functions the co-executor calls)
# --------------------------------------------------------------------------------------


def map_in(home: np.ndarray, r0: int, r1: int, out: np.ndarray | None = None) -> np.ndarray:
    """Copy rows [r0, r1) of the home NHWC buffer into private memory (the "map")."""
    src = home[:, r0:r1]
    if out is None:
        return np.array(src, copy=True)
    np.copyto(out, src)
    return out


def trans_in(x_nhwc: np.ndarray):
    """NHWC rows → a contiguous NCHW torch tensor (the CPU-friendly type)."""
    torch = _torch()
    return torch.from_numpy(x_nhwc).permute(0, 3, 1, 2).contiguous()


def trans_out(y_nchw) -> np.ndarray:
    """NCHW result → NHWC array (the home layout)."""
    return y_nchw.permute(0, 2, 3, 1).contiguous().numpy()


def map_out(home: np.ndarray, y_nhwc: np.ndarray, o0: int, o1: int, c0: int = 0, c1: int | None = None) -> None:
    """Write rows [o0, o1) (channels [c0, c1)) back into the home NHWC buffer (the "unmap")."""
    home[:, o0:o1, :, c0:c1] = y_nhwc


CODL_MODELS = ("yolov2", "vgg-16", "posenet", "retinaface", "candy")


# --------------------------------------------------------------------------------------
# Collection into the store
# --------------------------------------------------------------------------------------


def _device_key(store) -> str:
    from tensorplan.devices import resolve

    return store.put_device(resolve("local-1t"))


def _pin(core: int | None):
    if core is not None and hasattr(os, "sched_setaffinity"):
        old = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {core})
        return old
    return None


def collect(store, sweep: Iterable[tuple[str, OpShape, str, str, float, OpShape]], *, budget_s: float = 0.05,
            core: int | None = 0, progress: bool = True) -> dict:
    """Measure each (model, full op, proc, dim, ρ, part) of `sweep` (see
    `tensorplan.codl.partition.sweep_items`) alone on its stand-in processor; resumable (parts
    already in store job "codl-collect" are skipped). Returns counts."""
    from tensorplan.measure.timer import measure, pinned_threads

    torch = _torch()
    dev = _device_key(store)
    job = store.job("codl-collect")
    done = job.done_keys()
    items = []
    for m, op, proc, dim, r, part in sweep:
        payload = {"op": part.to_dict(), "proc": proc, "layout": processor(proc)["layout"]}
        items.append((m, op, proc, dim, r, part, payload))
    todo = [it for it in items if _item_key(it[6]) not in done]
    counts = {"parts": len(items), "measured": 0, "skipped": len(items) - len(todo)}
    old = _pin(core)
    try:
        with pinned_threads(1):
            it = _progress(todo, "codl: measuring parts", progress)
            batch = []
            for m, op, proc, dim, r, part, payload in it:
                k = PartKernel(part, processor(proc)["layout"])
                x = k.example_input()
                with torch.inference_mode():
                    t = measure(lambda: k(x), warmup=2, min_repeats=5, max_repeats=50, budget_s=budget_s)
                pk = store.put_program(OP_KIND, payload)
                batch.append((pk, dev, t, "", {"model": m, "dim": dim, "ratio": r, "full_op": op.to_dict()}))
                if len(batch) >= 50:
                    _flush(store, job, batch)
                    counts["measured"] += len(batch)
                    batch = []
            _flush(store, job, batch)
            counts["measured"] += len(batch)
    finally:
        if old is not None:
            os.sched_setaffinity(0, old)
    return counts


def _item_key(payload: dict) -> str:
    from tensorplan.measure.store import content_key

    return content_key(OP_KIND, payload)


def _flush(store, job, batch) -> None:
    if not batch:
        return
    store.put_measurements(batch)
    for pk, *_ in batch:
        job.mark_done(pk)


def _progress(items, desc, enabled):
    if not enabled:
        return items
    from rich.progress import track

    return track(items, description=desc, transient=True)


def collect_sharing(store, sizes: Sequence[tuple[int, int, int]], *, budget_s: float = 0.03,
                    core: int | None = 0) -> int:
    """Measure map/transform in and out for (rows, width, channels) slices; kind "codl-share"."""
    from tensorplan.measure.timer import measure, pinned_threads

    torch = _torch()
    dev = _device_key(store)
    rows = []
    old = _pin(core)
    try:
        with pinned_threads(1), torch.inference_mode():
            for (h, w, c) in sizes:
                home = np.random.default_rng(0).standard_normal((1, h + 2, w, c)).astype(np.float32)
                buf = np.empty((1, h, w, c), np.float32)
                x = map_in(home, 1, h + 1)
                xt = trans_in(x)
                yn = trans_out(xt)
                fns = {"map_in": lambda: map_in(home, 1, h + 1, buf), "trans_in": lambda: trans_in(x),
                       "trans_out": lambda: trans_out(xt), "map_out": lambda: map_out(home, yn, 1, h + 1)}
                for term, fn in fns.items():
                    t = measure(fn, warmup=2, min_repeats=5, max_repeats=200, budget_s=budget_s)
                    pk = store.put_program(SHARE_KIND, {"term": term, "shape": [h, w, c]})
                    rows.append((pk, dev, t, "", {"bytes": 4 * h * w * c}))
    finally:
        if old is not None:
            os.sched_setaffinity(0, old)
    store.put_measurements(rows)
    return len(rows)


def put_sync(store, timings: Sequence[float]) -> None:
    """Store measured sync round-trips (from the co-executor) as "codl-share" term "sync"."""
    from tensorplan.measure.timer import Timing

    dev = _device_key(store)
    pk = store.put_program(SHARE_KIND, {"term": "sync", "shape": [0, 0, 0]})
    store.put_measurement(pk, dev, Timing.from_repeats(list(timings), method="co-executor command round trip"),
                          "", {"bytes": 0})


# --------------------------------------------------------------------------------------
# Loading samples
# --------------------------------------------------------------------------------------


def _spread(repeats: Sequence[float]) -> float:
    s = sorted(repeats)
    return s[1] / s[0] - 1.0 if len(s) > 1 and s[0] > 0 else 1.0


def samples_from_store(store, stat: str = "min") -> list[KernelSample]:
    """Measured parts as samples. `stat="min"`: on a shared machine interference only adds
    time, so the fastest repeat is the reproducible estimate (its `spread` to the 2nd
    fastest says how well it is pinned down); "median" is the timer's default."""
    out = []
    for r in store.measurements(kind=OP_KIND):
        p = r["payload"]
        ex = r.get("extra") or {}
        lat = float(r["min_s"] if stat == "min" else r["median_s"])
        out.append(KernelSample(OpShape.from_dict(p["op"]), p["proc"], lat, float(r["cov"]),
                                _spread(r.get("repeats") or []), ex.get("model", ""), ex.get("dim", ""),
                                float(ex.get("ratio", 1.0))))
    return out


def sharing_rows_from_store(store, stat: str = "min") -> list[dict]:
    rows = []
    for r in store.measurements(kind=SHARE_KIND):
        rows.append({"term": r["payload"]["term"], "bytes": int((r.get("extra") or {}).get("bytes", 0)),
                     "latency_s": float(r["min_s"] if stat == "min" and r["payload"]["term"] != "sync"
                                        else r["median_s"])})
    return rows


# --------------------------------------------------------------------------------------
# Compact files (data/codl/)
# --------------------------------------------------------------------------------------

_OP_COLS = ["kind", "ih", "iw", "ic", "oc", "k", "s", "pt", "pb", "pl", "pr", "pool", "g"]


def export_compact(samples: Sequence[KernelSample], sharing: Sequence[dict], out_dir: str | Path) -> dict[str, Path]:
    """Write `ops.csv.gz` (one row per measured part, µs) and `sharing.csv.gz`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(_OP_COLS + ["proc", "latency_us", "cov", "spread", "model", "dim", "ratio"])
    for s in samples:
        d = s.op.to_dict()
        w.writerow([d[c] for c in _OP_COLS] + [s.proc, f"{s.latency_s * 1e6:.2f}", f"{s.cov:.4f}",
                                              f"{s.spread:.4f}", s.model, s.dim, f"{s.ratio:.1f}"])
    p_ops = out / "ops.csv.gz"
    p_ops.write_bytes(gzip.compress(buf.getvalue().encode(), mtime=0))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["term", "bytes", "latency_us"])
    for r in sharing:
        w.writerow([r["term"], r["bytes"], f"{r['latency_s'] * 1e6:.3f}"])
    p_sh = out / "sharing.csv.gz"
    p_sh.write_bytes(gzip.compress(buf.getvalue().encode(), mtime=0))
    return {"ops": p_ops, "sharing": p_sh}


def load_compact(data_dir: str | Path) -> tuple[list[KernelSample], list[dict]]:
    """Read what `export_compact` wrote."""
    d = Path(data_dir)
    p_ops, p_sh = d / "ops.csv.gz", d / "sharing.csv.gz"
    if not p_ops.exists():
        raise TensorplanError(f"{p_ops}: no CoDL training data; run `python bench/codl_predictor.py --collect`")
    samples = []
    for row in csv.DictReader(io.StringIO(gzip.decompress(p_ops.read_bytes()).decode())):
        op = OpShape(row["kind"], *(int(row[c]) for c in _OP_COLS[1:11]), pool=row["pool"], g=int(row["g"]))
        samples.append(KernelSample(op, row["proc"], float(row["latency_us"]) * 1e-6, float(row["cov"]),
                                    float(row["spread"]), row["model"], row["dim"], float(row["ratio"])))
    sharing = []
    if p_sh.exists():
        for row in csv.DictReader(io.StringIO(gzip.decompress(p_sh.read_bytes()).decode())):
            sharing.append({"term": row["term"], "bytes": int(row["bytes"]),
                            "latency_s": float(row["latency_us"]) * 1e-6})
    return samples, sharing
