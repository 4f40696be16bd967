"""`TunedCost`: a memory kernel's cost is that of its predicted-fastest sampled schedule (issue #59).

Why: the hand-written default schedule is one point of a kernel's schedule space. For each
memory candidate that lowers to TIR, schedules are drawn from its meta_schedule design space
(`kernels.sampled`, the CDMPP dataset's sampler), featurised (compact AST) and ranked by the
CDMPP predictor, together with the default schedule; the candidate's cost is the lowest
prediction. Only the kernels the solver chooses need timing: `top_schedules(prim, cand, k)`
hands `MeasuredCost(tvm_schedules=...)` the k predicted-fastest schedules, the default always
among them, so a measured plan is never worse than the default schedule's.

Where the time goes (candy's 307 memory candidates, one process, 2-core VM): a design-space
draw ~8 ms, its trace as JSON ~2 ms, featurising a program ~5 ms, predicting it ~0.4 ms in a
batch; per candidate, lowering twice ~6 ms, its design space ~20 ms, the default schedule ~14 ms.
So: sampling and featurising run in forked workers (`forkmap`; they inherit the graph), prediction
runs in the parent once per round over every candidate's new programs; a draw whose program is
structurally equal to an earlier one is not featurised again (candy: 4976 draws, 1754 distinct
programs); and draws come in rounds of `ROUND`: a candidate stops when a round improves its
predicted best by no more than `STABLE_GAIN` (candy: 299 of 307 stop after 16 draws).

Everything is cached in the measurement `Store`: a program of kind `tuned_prediction` keyed by
the candidate's canonical hash, the draw budget, the predictor's identity (file content hash),
the device domain and the threads; its measurement (method "predicted") holds the best
prediction and the `KEEP` best schedules with their traces. A second run featurises nothing.
"""
from __future__ import annotations

import hashlib
import math
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph

if TYPE_CHECKING:
    from tensorplan.korch.candidates import Candidate

PROGRAM_KIND = "tuned_prediction"
TUNED_VERSION = 1        # bump when sampling, features or ranking change so old predictions are not reused
ROUND = 8                # design-space draws per candidate per round
STABLE_GAIN = 0.02       # a round that improves the predicted best by no more than this ends the search
KEEP = 8                 # ranked schedules kept per candidate (with traces) for `top_schedules`
DEFAULT = {"name": "default"}


@dataclass
class RankedSchedule:
    """A schedule of a kernel with its predicted latency; `index` is its design-space draw
    (-1: the default schedule)."""

    schedule: dict
    predicted_s: float
    index: int = -1


@dataclass
class TunedPrediction:
    """A memory candidate's prediction: `ranked` predicted-fastest first (at most `KEEP`, the
    default always included), `draws` design-space draws made, `sampled` valid schedules among them."""

    best_s: float
    default_s: float
    ranked: list[RankedSchedule]
    draws: int
    sampled: int

    def to_extra(self) -> dict:
        return {"default_s": self.default_s, "draws": self.draws, "sampled": self.sampled,
                "ranked": [{"index": r.index, "predicted_s": r.predicted_s,
                            **({"trace": r.schedule["trace"]} if r.index >= 0 and "trace" in r.schedule else {})}
                           for r in self.ranked]}

    @classmethod
    def from_record(cls, rec: dict) -> "TunedPrediction":
        ex = rec.get("extra") or {}
        ranked = [RankedSchedule({"name": "sampled", **({"trace": r["trace"]} if "trace" in r else {})}
                                 if r["index"] >= 0 else dict(DEFAULT),
                                 float(r["predicted_s"]), int(r["index"])) for r in ex.get("ranked", [])]
        return cls(best_s=float(rec["min_s"]), default_s=float(ex.get("default_s", math.inf)), ranked=ranked,
                   draws=int(ex.get("draws", 0)), sampled=int(ex.get("sampled", 0)))


@dataclass
class _Search:
    """One candidate's search in progress (parent side)."""

    cand: Any
    prog_key: str
    default_s: float = math.inf
    ranked: list[RankedSchedule] = field(default_factory=list)
    draws: int = 0
    sampled: int = 0
    best_before: float = math.inf
    seen: set = field(default_factory=set)   # structural hashes of the programs drawn so far
    done: bool = False
    lowerable: bool = True


def model_identity(model: Any) -> tuple[Any, str]:
    """(estimator, identity): identity is the predictor file's name and content hash, so a
    retrained or recalibrated model never reuses old predictions."""
    from tensorplan.cdmpp.base import Estimator, load_estimator
    if isinstance(model, Estimator):
        with tempfile.TemporaryDirectory() as td:
            p = model.save(Path(td) / "m.pt")
            return model, f"{type(model).__name__}:{_file_hash(p)}"
    p = Path(model)
    if not p.exists():
        raise TensorplanError(f"tuned cost: predictor file '{p}' does not exist; pass a saved estimator "
                              "(tensorplan predictor train) or model=None for the shipped one")
    return load_estimator(p), f"{p.name}:{_file_hash(p)}"


def _file_hash(p: Path) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()[:16]


def _ast_row(a, mod) -> tuple | None:
    """(leaf features, positions, flops, task_io) of a featurised program; None for an empty one."""
    from tensorplan.cdmpp.tasks import task_io_of
    if a is None or a.n_leaves == 0:
        return None
    return a.leaf_features, a.positions, a.flops, task_io_of(mod)


def _search_round(prim: Graph, cand: Any, start: int, n_draws: int, threads: int, with_default: bool,
                  seen: frozenset = frozenset(), target: Any = None) -> dict:
    """Worker side (forked): lower the candidate, draw `n_draws` schedules from `start`,
    featurise them (and its default schedule in the first round). Plain, picklable results.
    A draw whose program equals one drawn before (structural hash in `seen`, or earlier in this
    round) is counted but not featurised again: small kernels have few distinct programs.
    `target` (a GPU's TVM target): draws from its CUDA design space; a GPU kernel has no
    hand-written default schedule (its default is the first valid draw, `TunedCost._finish`)."""
    import tvm_ffi
    from tensorplan.cdmpp.features import featurize_many
    from tensorplan.kernels.lower import lower
    from tensorplan.kernels.sampled import design_space
    from tensorplan.kernels.schedule import default_schedule, trace_json
    out: dict[str, Any] = {"default": None, "samples": [], "sample_s": 0.0, "featurize_s": 0.0, "error": None,
                           "valid": 0, "hashes": []}
    try:
        sub = cand.graph(prim)
    except Exception as e:  # noqa: BLE001 - no sub-graph, no kernel: the fallback costs it
        out["error"] = f"graph: {type(e).__name__}: {str(e)[:200]}"
        return out
    t0 = time.perf_counter()
    mods, rows = [], []
    if with_default and target is None:
        try:
            mods.append(default_schedule(lower(sub, list(cand.outputs)), threads=threads))
            rows.append(-1)
        except Exception as e:  # noqa: BLE001 - no default: the samples alone (or the fallback)
            out["error"] = f"default: {type(e).__name__}: {str(e)[:200]}"
    traces = {}
    try:
        low = lower(sub, list(cand.outputs), use_let=False)
        space = design_space(low, threads, target=target)
        for i in range(start, start + n_draws):
            r = space.draw(i)
            if r is None:
                continue
            out["valid"] += 1
            h = int(tvm_ffi.structural_hash(r[0].mod))
            if h in seen or h in out["hashes"]:
                continue
            out["hashes"].append(h)
            mods.append(r[0].mod)
            rows.append(i)
            traces[i] = trace_json(r[0])
    except Exception as e:  # noqa: BLE001 - no design space: the default alone (or the fallback)
        out["error"] = f"sample: {type(e).__name__}: {str(e)[:200]}"
    t1 = time.perf_counter()
    out["sample_s"] = t1 - t0
    if mods:
        try:
            asts = featurize_many(mods, workers=1)
        except Exception as e:  # noqa: BLE001 - featurised one by one below
            out["error"] = f"featurize: {type(e).__name__}: {str(e)[:200]}"
            asts = []
            from tensorplan.cdmpp.features import compact_ast
            for m in mods:
                try:
                    asts.append(compact_ast(m))
                except Exception:  # noqa: BLE001
                    asts.append(None)
        for i, a, m in zip(rows, asts, mods):
            row = _ast_row(a, m)
            if row is None:
                continue
            if i < 0:
                out["default"] = row
            else:
                out["samples"].append((i, traces[i], *row))
    out["featurize_s"] = time.perf_counter() - t1
    return out


class TunedCost:
    """Planner cost model (`tensorplan.cost.KernelCost` protocol): a memory kernel's predicted latency
    under its predicted-fastest schedule (module docstring).

    `device`: the device domain to predict for ('local': this CPU; a GPU such as 'h100': its CUDA
    programs, drawn from TVM's CUDA design space, no GPU needed); `store`: a `Store` or its path
    (default store); `threads`: the thread count kernels are scheduled for (default: the device's);
    `samples`: design-space draws per candidate at most (0: the default schedule only); `model`: an
    estimator or a predictor file (default: this CPU's calibration when `tensorplan calibrate` made
    one, else the shipped CDMPP; on a GPU the shipped H100 model); `fallback`: the KernelCost of
    every other candidate; `workers`: forked sampling workers (default every usable core); `adaptive`: stop a candidate's search when
    a round of `ROUND` draws improves its best by no more than `STABLE_GAIN`."""

    name = "tuned"

    def __init__(self, device: Any = "local", store: Any = None, threads: int | None = None, samples: int = 32,
                 model: Any = None, fallback: Any = None, workers: int | None = None, adaptive: bool = True):
        import re

        from tensorplan import devices
        from tensorplan.cdmpp.model import SHIPPED_MODEL
        from tensorplan.cdmpp.predict import SHIPPED_GPU_MODEL, local_model_path, resolve_device
        from tensorplan.measure.store import Store
        if samples < 0:
            raise TensorplanError(f"tuned cost: samples (design-space draws per kernel) must be >= 0, got {samples}")
        self.spec, self.device = resolve_device(device)
        self.threads = int(threads or devices.default_threads(self.spec))
        local = re.fullmatch(r"local-(\d+)t", self.device)
        self.gpu = self.spec.kind == "gpu"
        if model is None and self.gpu:
            model = SHIPPED_GPU_MODEL        # trained on the H100's own CUDA programs
        elif model is None:
            here = local_model_path(int(local.group(1))) if local else None
            model = here if here is not None and here.exists() else SHIPPED_MODEL
        self._target: Any = None             # a GPU's TVM target, built at the first search (cached
                                             # predictions need no TVM: a GPU machine without it reads them)
        self.model, self.model_id = model_identity(model)
        self.store = store if isinstance(store, Store) else Store(store)
        self.dev_key = self.store.put_device(self.spec)
        self.samples = int(samples)
        self.fallback = fallback
        self.workers = workers
        self.adaptive = bool(adaptive)
        # a `time.perf_counter()` value after which no new sampling round starts (the first round
        # always runs, so every kernel has its default and ROUND draws ranked): a caller's budget
        # holds on a loaded machine where the per-draw cost it planned with does not
        self.deadline: float | None = None
        self._pred: dict[str, TunedPrediction] = {}
        self._fallback_hashes: set[str] = set()
        self._fb: dict[str, float] = {}          # canonical hash -> the fallback's cost
        self.stats = {"searched": 0, "candidates": 0, "tuned": 0, "fallback": 0, "cache_hits": 0, "draws": 0,
                      "schedules_sampled": 0, "distinct_programs": 0, "schedules_featurised": 0, "rounds": 0, "sample_s": 0.0,
                      "featurise_s": 0.0, "predict_s": 0.0, "wall_s": 0.0, "top_handed_out": 0}

    # -- protocol -----------------------------------------------------------------------------
    def cost(self, prim: Graph, cand: "Candidate") -> float:
        return self.cost_many(prim, [cand])[0]

    def cost_many(self, prim: Graph, cands: Sequence["Candidate"], progress: bool = False) -> list[float]:
        t_start = time.perf_counter()
        cands = list(cands)
        first: dict[str, Any] = {}
        for c in cands:
            first.setdefault(c.canonical_hash, c)
        new = [c for h, c in first.items() if h not in self._pred and h not in self._fallback_hashes]
        self.stats["candidates"] += len(new)
        mem = [c for c in new if c.kind == "memory"]
        others = [c for c in new if c.kind != "memory"]
        searches = []
        if mem:
            keys = self.store.put_programs([(PROGRAM_KIND, self._payload(c)) for c in mem])
            for c, pk in zip(mem, keys):
                hit = self.store.get_measurement(pk, self.dev_key)
                if hit is not None and not (hit.get("extra") or {}).get("fallback"):
                    self._pred[c.canonical_hash] = TunedPrediction.from_record(hit)
                    self.stats["cache_hits"] += 1
                elif hit is not None:
                    others.append(c)
                    self.stats["cache_hits"] += 1
                else:
                    searches.append(_Search(c, pk))
        if searches:
            self.stats["searched"] += len(searches)
            self._search(prim, searches, progress)
            others += [s.cand for s in searches if not s.lowerable]
        for c in others:
            self._fallback_hashes.add(c.canonical_hash)
        self.stats["fallback"] += len(others)
        batched = getattr(self.fallback, "cost_many", None)
        todo = [c for h, c in first.items() if h in self._fallback_hashes and h not in self._fb]
        if todo and callable(batched):        # one batch (a measured fallback compiles in one go)
            self._fb.update((c.canonical_hash, float(v)) for c, v in zip(todo, batched(prim, todo, progress=progress)))
        self.stats["wall_s"] += time.perf_counter() - t_start
        return [self._value(prim, c) for c in cands]

    def _value(self, prim: Graph, c: "Candidate") -> float:
        p = self._pred.get(c.canonical_hash)
        if p is not None:
            return p.best_s
        if c.canonical_hash in self._fb:
            return self._fb[c.canonical_hash]
        if self.fallback is not None:
            v = float(self.fallback.cost(prim, c))
            self._fb[c.canonical_hash] = v
            return v
        if len(c.nodes) == 1:
            raise TensorplanError(f"tuned cost: primitive {c.nodes[0]} ({c.kind}) has no TIR kernel to predict; "
                                  "pass fallback=AnalyticalCost(...) or MeasuredCost(...)")
        return math.inf

    def predicted(self, cand: "Candidate") -> float | None:
        """The candidate's predicted latency under its predicted-fastest schedule (None: not tuned)."""
        p = self._pred.get(cand.canonical_hash)
        return None if p is None else p.best_s

    def prediction(self, cand: "Candidate") -> TunedPrediction | None:
        return self._pred.get(cand.canonical_hash)

    def top_schedules(self, prim: Graph, cand: "Candidate", k: int) -> list[dict]:
        """The k predicted-fastest schedules of a memory candidate (predicted-fastest first), the
        default schedule always among them (what `MeasuredCost(tvm_schedules=...)` times); [] for a
        candidate TunedCost does not tune."""
        if k < 1:
            raise TensorplanError(f"tuned cost: top_schedules needs k >= 1, got {k}")
        if cand.canonical_hash not in self._pred and cand.canonical_hash not in self._fallback_hashes:
            self.cost_many(prim, [cand])
        p = self._pred.get(cand.canonical_hash)
        if p is None:
            return []
        top = p.ranked[:k]
        if not self.gpu and not any(r.index < 0 for r in top):
            top = top[:k - 1] + [RankedSchedule(dict(DEFAULT), p.default_s)]
        self.stats["top_handed_out"] += sum(1 for r in top if r.index >= 0)
        return [dict(r.schedule) for r in top]

    def kernel_info(self, prim: Graph, cand: "Candidate") -> dict:
        """Backend "tvm" and the predicted-fastest schedule; the fallback's answer for the rest."""
        if cand.canonical_hash not in self._pred and cand.canonical_hash not in self._fallback_hashes:
            self.cost_many(prim, [cand])
        p = self._pred.get(cand.canonical_hash)
        if p is not None:
            return {"backend": "tvm", "schedule": dict(p.ranked[0].schedule)}
        info = getattr(self.fallback, "kernel_info", None)
        return info(prim, cand) if callable(info) else {"backend": "", "schedule": {}}

    def describe(self) -> dict:
        return {"name": self.name, "device": self.device, "threads": self.threads, "samples": self.samples,
                "adaptive": self.adaptive, "model": self.model_id, "store": str(self.store.path),
                **{k: round(v, 4) if isinstance(v, float) else v for k, v in self.stats.items()}}

    # -- internals ----------------------------------------------------------------------------
    def _payload(self, c: "Candidate") -> dict:
        key = {"canonical_hash": c.canonical_hash, "kind": c.kind, "samples": self.samples,
               "adaptive": self.adaptive, "predictor": self.model_id, "domain": self.device,
               "threads": self.threads, "version": TUNED_VERSION}
        # a GPU's programs do not depend on the host's threads: the key holds on any machine
        return {**key, "threads": 0, "target": "cuda"} if self.gpu else key

    def target(self) -> Any:
        """The TVM target kernels are drawn for: None on a CPU (`kernels.sampled`'s own), the GPU's CUDA tag."""
        if self.gpu and self._target is None:
            try:
                from tensorplan.cdmpp.predict import gpu_target
                self._target = gpu_target(self.spec, self.device)
            except ImportError as e:
                raise TensorplanError(f"tuned cost: pricing kernels for '{self.device}' draws their CUDA schedules with "
                                      f"TVM, which this machine lacks ({e}); price them where TVM is installed into "
                                      "the same store (predictions are cached there), then plan here") from None
        return self._target

    def _search(self, prim: Graph, searches: list[_Search], progress: bool) -> None:
        from tensorplan.forkmap import fork_map_iter
        from tensorplan.kernels.tvm_intrin import load_tensor_intrinsics
        from tensorplan.progress import progress_bar
        target = self.target()
        load_tensor_intrinsics()          # once, in the parent: forked workers inherit it
        budget = max(self.samples, 0) if not self.gpu else max(self.samples, 1)   # a GPU kernel needs one draw
        per_cand = 1 + budget             # the default, then every draw
        with progress_bar(f"ranking schedules of {len(searches)} kernels", len(searches) * per_cand,
                          progress) as advance:
            start, active = 0, list(searches)
            while active:
                n = min(ROUND, budget - start) if budget > start else 0
                first_round = start == 0
                round_t0 = time.perf_counter()

                def job(a: int, b: int, n=n, start=start, first_round=first_round, active=active) -> list:
                    return [_search_round(prim, s.cand, start, n, self.threads, first_round, frozenset(s.seen),
                                          target) for s in active[a:b]]
                results: list = [None] * len(active)
                for a, res in fork_map_iter(job, len(active), workers=self.workers, chunk=4):
                    results[a:a + len(res)] = res
                    advance(len(res) * (n + (1 if first_round else 0)))
                self.stats["rounds"] += 1
                self._predict_round(active, results, first_round, n)
                start += n
                still = []
                for s in active:
                    best = min([s.default_s] + [r.predicted_s for r in s.ranked])
                    gain = (s.best_before - best) / s.best_before if math.isfinite(s.best_before) else math.inf
                    stop = (not s.lowerable or start >= budget
                            or (self.adaptive and not first_round and gain <= STABLE_GAIN))
                    s.best_before = best
                    if stop:
                        s.done = True
                        advance(max(0, budget - start))
                    else:
                        still.append(s)
                per_draw = (time.perf_counter() - round_t0) / max(1, len(active) * (n + (1 if first_round else 0)))
                next_n = min(ROUND, budget - start) if budget > start else 0
                if still and self.deadline is not None and (
                        time.perf_counter() + per_draw * len(still) * next_n >= self.deadline):
                    # the next round would end after the deadline (timed from this round's pace)
                    for s in still:
                        s.done = True
                        advance(max(0, budget - start))
                    self.stats["cut_by_deadline"] = self.stats.get("cut_by_deadline", 0) + len(still)
                    still = []
                self._finish([s for s in active if s.done])
                active = still

    def _predict_round(self, active: list[_Search], results: list[dict], first_round: bool, n: int) -> None:
        from tensorplan.cdmpp.arrays import ProgramArrays
        rows, owners = [], []
        for s, r in zip(active, results):
            self.stats["sample_s"] += r["sample_s"]
            self.stats["featurise_s"] += r["featurize_s"]
            self.stats["draws"] += n
            s.draws += n
            if first_round and r["default"] is not None:
                rows.append(r["default"])
                owners.append((s, -1, None))
            for i, trace, *row in r["samples"]:
                rows.append(tuple(row))
                owners.append((s, i, trace))
            s.sampled += r["valid"]
            s.seen.update(r["hashes"])
            self.stats["schedules_sampled"] += r["valid"]
            self.stats["distinct_programs"] += len(r["samples"])
            if first_round and r["default"] is None and not r["samples"] and not s.seen:
                s.lowerable = False
        self.stats["schedules_featurised"] += len(rows)
        if not rows:
            return
        t0 = time.perf_counter()
        arr = ProgramArrays.from_programs([x[0] for x in rows], [x[1] for x in rows], device=self.device,
                                          flops=[x[2] for x in rows], task_io=[x[3] for x in rows])
        pred = np.asarray(self.model.predict(arr), dtype=np.float64)
        self.stats["predict_s"] += time.perf_counter() - t0
        for (s, i, trace), v in zip(owners, pred):
            if not (v > 0 and math.isfinite(v)):
                continue
            if i < 0:
                s.default_s = float(v)
            else:
                s.ranked.append(RankedSchedule({"name": "sampled", "trace": trace}, float(v), i))

    def _finish(self, done: list[_Search]) -> None:
        """Rank, cache and store the finished searches (one transaction)."""
        from tensorplan.measure.timer import Timing
        rows = []
        for s in done:
            if self.gpu and s.ranked:      # no hand-written GPU schedule: the default is TVM's first valid draw
                s.default_s = min(s.ranked, key=lambda r: r.index).predicted_s
            ranked = sorted(s.ranked, key=lambda r: r.predicted_s)
            if not ranked and not math.isfinite(s.default_s):
                s.lowerable = False
                rows.append((s.prog_key, self.dev_key, Timing.from_repeats([1e9], method="predicted"), "",
                             {"fallback": True}))
                continue
            cpu_default = math.isfinite(s.default_s) and not self.gpu
            if cpu_default:
                ranked.append(RankedSchedule(dict(DEFAULT), s.default_s))
                ranked.sort(key=lambda r: r.predicted_s)
            keep = ranked[:KEEP]
            if self.gpu:    # PyTorch builds what runs on a GPU: TVM's schedules are never compiled, so not kept
                keep = [RankedSchedule({"name": "sampled"}, r.predicted_s, r.index) for r in keep]
            if cpu_default and not any(r.index < 0 for r in keep):
                keep[-1] = RankedSchedule(dict(DEFAULT), s.default_s)
            p = TunedPrediction(best_s=ranked[0].predicted_s, default_s=s.default_s, ranked=keep, draws=s.draws,
                                sampled=s.sampled)
            self._pred[s.cand.canonical_hash] = p
            self.stats["tuned"] += 1
            rows.append((s.prog_key, self.dev_key, Timing.from_repeats([p.best_s], method="predicted"), "",
                         p.to_extra()))
        if rows:
            self.store.put_measurements(rows)


# ---------------------------------------------------------------------------------------------
# Report: how far tuned and default schedules are from the bandwidth bound
# ---------------------------------------------------------------------------------------------

@dataclass
class KernelTiming:
    """Measured seconds of one memory kernel under the default and under the tuned schedule."""

    cand: Any
    default_s: float
    tuned_s: float


@dataclass
class BandwidthRow:
    """One kernel: bytes moved, its bandwidth bound (bytes / bandwidth) and each schedule's
    distance to it (measured / bound; 1 = at the bound)."""

    kernel: str
    nbytes: int
    bound_s: float
    default_ratio: float
    tuned_ratio: float


@dataclass
class BandwidthReport:
    """Distance to the bandwidth bound over memory kernels, median and p90, tuned vs default."""

    bandwidth_gbs: float
    rows: list[BandwidthRow]
    default_median: float
    default_p90: float
    tuned_median: float
    tuned_p90: float

    def to_dict(self) -> dict:
        return {"bandwidth_gbs": self.bandwidth_gbs, "kernels": len(self.rows),
                "default": {"median": self.default_median, "p90": self.default_p90},
                "tuned": {"median": self.tuned_median, "p90": self.tuned_p90}}


def bandwidth_distance(prim: Graph, kernels: Sequence[KernelTiming], device: Any = "local") -> BandwidthReport:
    """Each kernel's measured time over its bandwidth bound (`cost.kernel_work` bytes / the device's
    `mem_bw_gbs`), for the default and the tuned schedule, with median and p90 of each."""
    from tensorplan import devices
    from tensorplan.cost import kernel_work
    spec = devices.device(device) if isinstance(device, str) else device
    bw = float(spec.mem_bw_gbs)
    if not bw > 0:
        raise TensorplanError(f"bandwidth_distance: device '{getattr(spec, 'name', spec)}' has no memory "
                              "bandwidth (mem_bw_gbs); measure it (tensorplan devices) or pick a catalog device")
    rows = []
    for k in kernels:
        if not (k.default_s > 0 and k.tuned_s > 0):
            raise TensorplanError(f"bandwidth_distance: kernel {k.cand.id} needs measured seconds > 0 for both "
                                  f"schedules, got default {k.default_s}, tuned {k.tuned_s}")
        _, nbytes = kernel_work(prim, k.cand)
        if nbytes <= 0:
            continue
        bound = nbytes / (bw * 1e9)
        rows.append(BandwidthRow(str(k.cand.id), int(nbytes), bound, k.default_s / bound, k.tuned_s / bound))
    if not rows:
        raise TensorplanError("bandwidth_distance: no kernel moves any bytes; pass memory kernels")
    d = np.array([r.default_ratio for r in rows])
    t = np.array([r.tuned_ratio for r in rows])
    return BandwidthReport(bw, rows, float(np.median(d)), float(np.percentile(d, 90)), float(np.median(t)),
                           float(np.percentile(t, 90)))


__all__ = ["TunedCost", "TunedPrediction", "RankedSchedule", "KernelTiming", "BandwidthRow", "BandwidthReport",
           "bandwidth_distance", "model_identity", "PROGRAM_KIND", "TUNED_VERSION"]
