"""Default CPU schedules for memory-bound kernels (and an optional meta_schedule tuner, and
replay of sampled schedules' traces).

Untuned TVM loop nests are 50-250x slower than ONNX Runtime on this class of
machine, so a kernel's measured cost only means something with a real
schedule. The rules (stack.md, measured at 40-45 GB/s):

* inline every injective block; reductions stay as blocks;
* "rows": when the output is computed row by row from reductions over its
  inner dims (softmax, layernorm), fuse the outer loops, run them in
  parallel and `compute_at` every reduction inside, so a row is read from
  cache, not memory; each reduction is `rfactor`ed into vector lanes;
* otherwise "root": each remaining block on its own — spatial blocks fused,
  split into vector lanes, outer part parallel; row reductions rfactored;
  column reductions reordered so the contiguous spatial loop is vectorised.

A schedule is described by plain data (`{"name": "default", "parallel": ...}`)
so a plan can name it and the executor rebuild the same kernel.
"""
from __future__ import annotations

from typing import Any

from tensorplan.devices import usable_cores
from tensorplan.errors import CompileError
from tensorplan.kernels.lower import Lowered

LANES = (64, 32, 16, 8, 4)
PARALLEL_MIN_WORK = 1 << 14  # elements below which a thread-pool launch costs more than it saves


def _s():
    import tvm
    from tvm import s_tir
    return tvm, s_tir


def _extent(sch, loop) -> int:
    e = sch.get(loop).extent
    return int(e)


def _prod(xs) -> int:
    p = 1
    for x in xs:
        p *= int(x)
    return p


def _is_reduction(sch, block) -> bool:
    b = sch.get(block)
    return any(int(iv.iter_type) == 2 for iv in b.iter_vars)  # 2 == CommReduce


def _n_spatial(sch, block) -> int:
    return sum(1 for iv in sch.get(block).iter_vars if int(iv.iter_type) == 0)


def _pick_lanes(n: int, cap: int = 64) -> int | None:
    for v in LANES:
        if v <= cap and n % v == 0 and n >= v:
            return v
    return None


def _vectorize_tail(sch, loop, allow_pad: bool = True):
    """Split `loop` into [outer, lanes] and vectorise the lanes; returns (outer, inner|None)."""
    n = _extent(sch, loop)
    v = _pick_lanes(n)
    if v is None:
        if n < 4 or not allow_pad:
            return loop, None
        v = 16 if n > 16 else 4
    if v == n:
        try:
            sch.vectorize(loop)
            return None, loop
        except Exception:  # noqa: BLE001
            return loop, None
    outer, inner = sch.split(loop, [None, v])
    try:
        sch.vectorize(inner)
    except Exception:  # noqa: BLE001
        return outer, None
    return outer, inner


def _row_rfactor(sch, block, red_loops: list, vectorize: bool = True):
    """rfactor the fused reduce loops of `block` into 16 (or fewer) vector lanes."""
    if not red_loops:
        return
    k = sch.fuse(*red_loops) if len(red_loops) > 1 else red_loops[0]
    n = _extent(sch, k)
    v = _pick_lanes(n, cap=16)
    if v is None or n < 2 * v:
        return
    ko, ki = sch.split(k, [None, v])
    rf = sch.rfactor(ki, factor_axis=0)
    if vectorize:
        _vectorize_rf_lane(sch, rf)
    return rf


def _vectorize_rf_lane(sch, rf) -> None:
    """rfactor puts the lane loop outside the remaining reduce loop; move it innermost
    (it is spatial in the rf block) and vectorise it."""
    loops = sch.get_loops(rf)
    if len(loops) < 2:
        return
    try:
        sch.reorder(loops[-1], loops[-2])
        sch.vectorize(sch.get_loops(rf)[-1])
    except Exception:  # noqa: BLE001
        pass


INNER_MIN = 64  # the vectorised inner loop covers the smallest suffix of dims with >= this many elements


def _schedule_spatial_root(sch, block, parallel: bool | None, threads: int):
    """Outer dims fused and parallel, the innermost dims (a suffix with >= INNER_MIN elements)
    fused and vectorised. Not one flat loop: index math of broadcast operands ([C,1,1]
    scales, pads, layout maps) then stays loop-invariant in the vector loop instead of
    becoming a per-lane div/mod gather."""
    loops = sch.get_loops(block)
    if not loops:
        return
    ext = [_extent(sch, x) for x in loops]
    n = _prod(ext)
    k = len(loops) - 1
    while k > 0 and _prod(ext[k:]) < INNER_MIN:
        k -= 1
    inner_l, outer_l = loops[k:], loops[:k]
    inner = sch.fuse(*inner_l) if len(inner_l) > 1 else inner_l[0]
    io, _ii = _vectorize_tail(sch, inner)
    if outer_l:
        outer = sch.fuse(*outer_l) if len(outer_l) > 1 else outer_l[0]
    else:
        outer = io
    if outer is not None and _want_parallel(parallel, n, _extent(sch, outer), threads):
        sch.parallel(outer)


def _want_parallel(parallel: bool | None, work: int, outer_extent: int, threads: int) -> bool:
    if parallel is False or threads <= 1 or outer_extent < 2:
        return False
    if parallel is True:
        return True
    return work >= PARALLEL_MIN_WORK


def _schedule_reduction_root(sch, block, hint: dict | None, parallel: bool | None, threads: int):
    loops = sch.get_loops(block)
    b = sch.get(block)
    kinds = [int(iv.iter_type) for iv in b.iter_vars]
    ns = sum(1 for k in kinds if k == 0)
    sp, rd = list(loops[:ns]), list(loops[ns:])
    if hint is None or hint.get("kind") != "reduce":
        # windows (pooling) / matmul fallback: parallel over spatial loops, reductions inner
        work = _prod(_extent(sch, x) for x in loops)
        if hint and hint.get("kind") == "matmul" and len(sp) >= 2:
            _schedule_matmul(sch, block, sp, rd, parallel, threads)
            return
        if len(sp) >= 2:
            last = sp[-1]
            outer = sch.fuse(*sp[:-1]) if len(sp) > 2 else sp[0]
            try:
                sch.reorder(outer, *rd, last)
                sch.decompose_reduction(block, rd[0])
                _vectorize_tail(sch, last, allow_pad=False)
            except Exception:  # noqa: BLE001
                pass
            if _want_parallel(parallel, work, _extent(sch, outer), threads):
                sch.parallel(outer)
        elif sp:
            if _want_parallel(parallel, work, _extent(sch, sp[0]), threads):
                sch.parallel(sp[0])
        return
    order = hint["order"]
    ext = {("s", i): _extent(sch, x) for i, x in enumerate(sp)}
    ext.update({("r", i): _extent(sch, x) for i, x in enumerate(rd)})
    eff = [tuple(o) for o in order if ext.get(tuple(o), 1) > 1]
    work = _prod(ext.values())
    first_r = next((k for k, o in enumerate(eff) if o[0] == "r"), len(eff))
    row_style = all(o[0] == "r" for o in eff[first_r:])
    if row_style:
        outer = sch.fuse(*sp) if len(sp) > 1 else (sp[0] if sp else None)
        if outer is not None and _want_parallel(parallel, work, _extent(sch, outer), threads):
            sch.parallel(outer)
        if outer is not None:
            _rfactor_under(sch, block, rd, outer)
        else:
            _row_rfactor(sch, block, rd)
        return
    # column style: keep the input's memory order, vectorise the inner spatial loops
    loop_of = {("s", i): x for i, x in enumerate(sp)}
    loop_of.update({("r", i): x for i, x in enumerate(rd)})
    unit = [loop_of[o] for o in map(tuple, order) if ext.get(o, 1) == 1 and o in loop_of]
    unit += [x for k, x in enumerate(sp) if ("s", k) not in set(map(tuple, order))]
    ordered = unit + [loop_of[o] for o in eff]
    sch.reorder(*ordered)
    head = unit + [loop_of[o] for o in eff[:first_r]]
    last_r = max(k for k, o in enumerate(eff) if o[0] == "r")
    inner_s = [loop_of[o] for o in eff[last_r + 1:] if o[0] == "s"]
    mid = [loop_of[o] for o in eff[first_r:last_r + 1]]
    if not inner_s:
        return
    init_at = mid[0]
    outer = sch.fuse(*head) if len(head) > 1 else (head[0] if head else None)
    inner = sch.fuse(*inner_s) if len(inner_s) > 1 else inner_s[0]
    outer_ext = _extent(sch, outer) if outer is not None else 1
    if outer is not None and outer_ext >= 2 * threads:
        if _want_parallel(parallel, work, outer_ext, threads):
            sch.parallel(outer)
        sch.decompose_reduction(block, init_at)
        _vec_init_and_update(sch, block, inner)
        return
    # too little outer work: tile the inner spatial loop into column strips of up to
    # 256 accumulators (L1-resident), parallel over strips, reduce loops in between,
    # 16-lane vectors innermost.
    n = _extent(sch, inner)
    v = _pick_lanes(n, cap=16) or 1
    w = 1
    while w * 2 * v <= 256 and n % (w * 2 * v) == 0:
        w *= 2
    io, ij, ii = sch.split(inner, [None, w, v])
    sch.reorder(io, *mid, ij, ii)
    if outer is not None:
        io = sch.fuse(outer, io)
    if _want_parallel(parallel, work, _extent(sch, io), threads):
        sch.parallel(io)
    sch.decompose_reduction(block, mid[0])
    if v > 1:
        try:
            sch.vectorize(ii)
        except Exception:  # noqa: BLE001
            pass


def _vec_init_and_update(sch, block, inner):
    try:
        _vectorize_tail(sch, inner, allow_pad=False)
    except Exception:  # noqa: BLE001
        pass


def _schedule_matmul(sch, block, sp, rd, parallel, threads):
    """A simple register-tiled matmul: [.., i, j] x k with j vectorised by 16."""
    i, j = sp[-2], sp[-1]
    nj = _extent(sch, j)
    ni = _extent(sch, i)
    vj = _pick_lanes(nj, cap=16)
    ti = 4 if ni % 4 == 0 else (2 if ni % 2 == 0 else 1)
    if vj is None:
        if sp[:-1]:
            outer = sch.fuse(*sp[:-1]) if len(sp) > 2 else sp[0]
            if _want_parallel(parallel, 1 << 20, _extent(sch, outer), threads):
                sch.parallel(outer)
        return
    jo, ji = sch.split(j, [None, vj])
    io, ii = sch.split(i, [None, ti])
    k = rd[0]
    sch.reorder(*sp[:-2], io, jo, k, ii, ji)
    outer = sch.fuse(*sp[:-2], io, jo)
    if _want_parallel(parallel, 1 << 20, _extent(sch, outer), threads):
        sch.parallel(outer)
    sch.decompose_reduction(block, k)
    sch.vectorize(ji)
    if ti > 1:
        sch.unroll(ii)


def _try_rows(lowered: Lowered, func, parallel: bool | None, threads: int):
    """The fused "rows" strategy; returns a schedule or None when it does not apply."""
    tvm, s_tir = _s()
    sch = s_tir.Schedule(func)
    sch.work_on("main")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    if len(lowered.out_blocks) != 1:
        return None
    oname = lowered.out_blocks[0]
    reds = [n for n in names if n != oname]
    if not reds or any(lowered.hints.get(n, {}).get("kind") != "reduce" for n in reds):
        return None
    o = sch.get_sblock(oname)
    if _is_reduction(sch, o) and lowered.hints.get(oname, {}).get("kind") != "reduce":
        return None
    n_sp = _n_spatial(sch, o)
    top = n_sp - 1 if not _is_reduction(sch, o) else n_sp
    for p in range(top, 0, -1):
        trial = s_tir.Schedule(func)
        trial.work_on("main")
        try:
            if _rows_at(trial, oname, reds, p, lowered, parallel, threads):
                return trial
        except Exception:  # noqa: BLE001 - this p does not work; try a coarser one
            continue
    return None


def _row_style(sch, block, hint: dict | None) -> bool:
    """True when the reduce axes are the innermost non-unit dims of the reduced input."""
    if not hint or hint.get("kind") != "reduce":
        return False
    b = sch.get(block)
    ns = sum(1 for iv in b.iter_vars if int(iv.iter_type) == 0)
    exts = [int(iv.dom.extent) for iv in b.iter_vars]
    ext = {("s", i): exts[i] for i in range(ns)}
    ext.update({("r", i): exts[ns + i] for i in range(len(exts) - ns)})
    eff = [tuple(o) for o in hint["order"] if ext.get(tuple(o), 1) > 1]
    first_r = next((k for k, o in enumerate(eff) if o[0] == "r"), len(eff))
    return first_r < len(eff) and all(o[0] == "r" for o in eff[first_r:])


def _rows_at(sch, oname, reds, p, lowered, parallel, threads) -> bool:
    """rfactor every row reduction at root, then compute them all inside the output's
    outer `p` loops (fused, parallel). False when that would recompute work."""
    # 1. rfactor row-style reductions while each still owns its loop nest
    members: list[str] = []   # blocks to move under `outer`, consumer-first order
    for n in reversed(reds + ([oname] if _is_reduction(sch, sch.get_sblock(oname)) else [])):
        blk = sch.get_sblock(n)
        rf_name = None
        if _row_style(sch, blk, lowered.hints.get(n)):
            b = sch.get(blk)
            nr = sum(1 for iv in b.iter_vars if int(iv.iter_type) == 2)
            loops = sch.get_loops(blk)
            rf = _row_rfactor(sch, blk, list(loops[len(loops) - nr:]), vectorize=False)
            if rf is not None:
                rf_name = sch.get(rf).name_hint
        if n != oname:
            members.append(n)
        if rf_name:
            members.append(rf_name)
    root_blocks = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    totals = {n: _prod(_extent(sch, x) for x in sch.get_loops(sch.get_sblock(n))) for n in root_blocks}
    # 2. fuse the output's outer loops
    o = sch.get_sblock(oname)
    loops = sch.get_loops(o)
    outer = sch.fuse(*loops[:p]) if p > 1 else loops[0]
    n_outer = _extent(sch, outer)
    if n_outer < 2:
        return False
    # 3. move producers under it (consumers first), check no work is repeated
    for n in members:
        sch.compute_at(sch.get_sblock(n), outer, preserve_unit_loops=False)
    for n in members:
        ls = sch.get_loops(sch.get_sblock(n))
        if _prod(_extent(sch, x) for x in ls[1:]) * n_outer > totals[n]:
            return False
    # 4. vectorise: rf lanes innermost; the output's inner loops
    for n in members:
        if n.endswith("_rf"):
            _vectorize_rf_lane(sch, sch.get_sblock(n))
    o = sch.get_sblock(oname)
    ls = sch.get_loops(o)[1:]
    if not _is_reduction(sch, o) and ls:
        inner = sch.fuse(*ls) if len(ls) > 1 else ls[0]
        _vectorize_tail(sch, inner)
    if _want_parallel(parallel, sum(totals.values()), n_outer, threads):
        sch.parallel(outer)
    return True


def _rfactor_under(sch, blk, red_loops, outer) -> None:
    """rfactor a reduction that sits under `outer` and move the rf block back under it."""
    try:
        rf = _row_rfactor(sch, blk, red_loops, vectorize=False)
    except Exception:  # noqa: BLE001
        return
    if rf is None:
        return
    try:
        sch.compute_at(rf, outer, preserve_unit_loops=False)
    except Exception:  # noqa: BLE001
        pass
    _vectorize_rf_lane(sch, rf)


def _inline_all(sch, names: list[str], lowered: Lowered) -> None:
    keep = set(lowered.out_blocks) | set(lowered.hints)
    for n in reversed(names):
        if n in keep:
            continue
        try:
            sch.compute_inline(sch.get_sblock(n))
        except Exception:  # noqa: BLE001 - a block that cannot inline stays a root block
            pass


def inlined_module(lowered: Lowered):
    """IRModule with every injective intermediate inlined (Let variables re-made unique:
    inlining one producer into two consumers would otherwise define a Let var twice)."""
    tvm, s_tir = _s()
    sch = s_tir.Schedule(tvm.IRModule({"main": lowered.func}))
    sch.work_on("main")
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    _inline_all(sch, names, lowered)
    return tvm.tirx.transform.ConvertSSA()(sch.mod)


def default_schedule(lowered: Lowered, parallel: bool | None = None, threads: int | None = None):
    """The default schedule of a lowered kernel as an IRModule ready for `tvm.compile` (parallel
    loops sized for `threads`, default every usable core)."""
    tvm, s_tir = _s()
    threads = int(threads or usable_cores())
    func = inlined_module(lowered)
    try:
        sch = _try_rows(lowered, func, parallel, threads)
    except Exception:  # noqa: BLE001
        sch = None
    if sch is not None:
        return sch.mod
    sch = s_tir.Schedule(func)
    sch.work_on("main")
    root = sch.get_sblock("root")
    for b in sch.get_child_blocks(root):
        name = sch.get(b).name_hint
        try:
            if _is_reduction(sch, b):
                _schedule_reduction_root(sch, b, lowered.hints.get(name), parallel, threads)
            else:
                _schedule_spatial_root(sch, b, parallel, threads)
        except Exception as e:  # noqa: BLE001 - keep the (correct) unscheduled block
            _ = e
    return sch.mod


def naive_schedule(lowered: Lowered):
    """Intermediates inlined, nothing else: the naive loop nest the default schedule beats."""
    return inlined_module(lowered)


def apply_schedule(lowered: Lowered, schedule: dict | None, threads: int | None = None, target=None,
                   name: str = "kernel") -> Any:
    """Schedule data -> IRModule. `{"name": "default"|"naive"|"tuned"|"sampled", ...}`; "sampled"
    replays its `trace` on the kernel's PrimFunc (lowered with `use_let=False`, kernels/sampled.py)."""
    schedule = schedule or {"name": "default"}
    sname = schedule.get("name", "default")
    if sname == "default":
        return default_schedule(lowered, parallel=schedule.get("parallel"), threads=threads)
    if sname == "naive":
        return naive_schedule(lowered)
    if sname == "tuned":
        return tuned_schedule(lowered, target, trials=int(schedule.get("trials", 16)))
    if sname == "sampled":
        return replay_trace(lowered, schedule.get("trace"), name=name)
    raise CompileError(f"kernel '{name}': unknown schedule '{sname}' (expected default, naive, tuned or sampled)")


# --------------------------------------------------------------------------------------
# Sampled schedules: traces as plain JSON, replayed on the PrimFunc they were drawn on
# --------------------------------------------------------------------------------------
def _plain(o: Any) -> Any:
    """TVM ffi containers / IntImm -> plain JSON values (trace JSON for storage)."""
    if o is None or isinstance(o, (bool, int, float)):
        return o
    if isinstance(o, str):
        return str(o)
    if isinstance(o, dict) or hasattr(o, "items"):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)) or hasattr(o, "__len__") and hasattr(o, "__getitem__") and not hasattr(o, "value"):
        return [_plain(x) for x in o]
    if hasattr(o, "value"):
        return o.value
    return str(o)


def trace_json(sch) -> list:
    """A schedule's trace (with its postprocessor steps) as plain JSON; `replay_trace` rebuilds it."""
    return _plain(sch.trace.as_json())


def replay_trace(lowered: Lowered, trace: Any, name: str = "kernel"):
    """The IRModule of `trace` (a plain-JSON schedule trace) replayed on the lowered kernel's
    PrimFunc; a trace that is not a list or does not apply is a `CompileError` naming the kernel."""
    tvm, s_tir = _s()
    if not isinstance(trace, list) or not trace:
        raise CompileError(f"kernel '{name}': a sampled schedule needs its 'trace' (a non-empty JSON list), got "
                           f"{type(trace).__name__}; take the schedule from kernels.sampled.sample_schedules")
    sch = s_tir.Schedule(tvm.IRModule({"main": lowered.func}))
    try:
        s_tir.Trace.apply_json_to_schedule(trace, sch)
    except Exception as e:  # noqa: BLE001 - TVM's message, shortened, inside our error
        msg = str(e).strip().splitlines()
        raise CompileError(f"kernel '{name}' ({'+'.join(lowered.ops)}): its sampled schedule's trace does not "
                           f"apply to the kernel ({msg[-1][:200] if msg else type(e).__name__}); the trace was "
                           "drawn for another kernel or TVM version: re-sample it (TunedCost)") from None
    return sch.mod


# --------------------------------------------------------------------------------------
# Optional: meta_schedule tuning with an in-process builder
# --------------------------------------------------------------------------------------
_INPROC_BUILDER = None


def _inproc_builder():
    global _INPROC_BUILDER
    if _INPROC_BUILDER is None:
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
        from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export

        @derived_object
        class InProcBuilder(PyBuilder):
            """Builds candidates in this process: the LocalBuilder's workers each spend
            17-23 s importing tensor intrinsics on a 2-core machine."""

            def build(self, build_inputs):
                out = []
                for bi in build_inputs:
                    try:
                        out.append(BuilderResult(default_export(default_build(bi.mod, bi.target, None)), None))
                    except Exception as e:  # noqa: BLE001
                        out.append(BuilderResult(None, str(e)))
                return out
        _INPROC_BUILDER = InProcBuilder()
    return _INPROC_BUILDER


def tuned_schedule(lowered: Lowered, target, trials: int = 16, work_dir: str | None = None):
    """meta_schedule `tune_tir` under a per-kernel trial budget (in-process builder).

    Returns the best scheduled IRModule; falls back to the default schedule when
    tuning finds nothing that builds. (A schedule found once and kept is a "sampled" one:
    its trace replays exactly; tuning again may find another.)
    """
    import tempfile

    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tensorplan.kernels.tvm_intrin import load_tensor_intrinsics
    load_tensor_intrinsics()
    mod = tvm.IRModule({"main": lowered.func})
    with tempfile.TemporaryDirectory() as td:
        db = ms.tune_tir(mod, target, work_dir or td, max_trials_global=trials,
                         num_trials_per_iter=min(trials, 16), builder=_inproc_builder(),
                         cost_model="xgb", database="memory", num_tuning_cores=1, seed=1)
        sch = ms.tir_integration.compile_tir(db, mod, target)
    if sch is None:
        return default_schedule(lowered)
    return sch.mod
