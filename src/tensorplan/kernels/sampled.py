"""Schedules sampled from a kernel's meta_schedule design space (the CDMPP dataset's sampler).

Why: the hand-written default schedule is one point of a kernel's schedule space; a predictor
can rank many more points than anything can time. `sample_schedules` draws them the way the
CDMPP training data was drawn (post-order-apply design space, every random decision re-drawn
from a seed derived from (key, draw number), then the mandatory postprocessors), so the
predictor sees programs that look like what it learnt. Each sample keeps its trace as plain
JSON: `{"name": "sampled", "trace": [...]}` is a schedule a plan can name and the executor
rebuilds by replaying the trace on the same PrimFunc (`kernels.schedule.replay_trace`).

Kernels are lowered with `use_let=False` for sampling (as for meta_schedule tuning): the design
space's inlining rules copy a producer into every consumer, which would define a TIR `Let`
variable twice; `compile_kernel` lowers the same way for a "sampled" schedule, so a trace always
meets the PrimFunc it was drawn on.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from tensorplan.kernels.build import make_target
from tensorplan.kernels.lower import Lowered
from tensorplan.kernels.schedule import trace_json


def draw_seed(key: str, i: int) -> int:
    """The seed of draw `i` of the design space of `key` (the dataset's: its programs keep their
    seeds, so stored data stays valid)."""
    h = int(hashlib.sha1(f"{key}:{i}".encode()).hexdigest()[:8], 16)
    return 1 + h % 2147483646


class DesignSpace:
    """A kernel's meta_schedule design spaces and postprocessors for one target (built once per
    kernel; drawing a sample from it costs ~1-10 ms). `mod` holds one PrimFunc named 'main'.

    `without_tiling_fallback`: when the default rules cannot build a space (meta_schedule's
    MultiLevelTiling fails with a reverse-compute-at error on kernels that fuse several
    reductions, e.g. softmax + mean), build it again without that rule, which memory-bound
    kernels do not need. Off for the dataset, whose spaces stay what they were."""

    def __init__(self, mod: Any, target: Any, key: str, without_tiling_fallback: bool = False):
        from tvm.s_tir import meta_schedule as ms

        from tensorplan.kernels.tvm_intrin import load_tensor_intrinsics
        load_tensor_intrinsics()
        self.mod = mod
        self.key = key
        self.rules = "default"
        try:
            self.ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                                      search_strategy="replay-trace", num_threads=1)
            self.spaces = list(self.ctx.generate_design_space())
        except Exception:  # noqa: BLE001 - retried without multi-level tiling, else raised
            if not without_tiling_fallback:
                raise
            kind = str(target.kind.name)
            rules = [r for r in ms.ScheduleRule.create(kind) if type(r).__name__ != "MultiLevelTiling"]
            gen = ms.space_generator.PostOrderApply(sch_rules=rules, postprocs=kind, mutator_probs=kind)
            self.ctx = ms.TuneContext(mod=mod, target=target, space_generator=gen,
                                      search_strategy="replay-trace", num_threads=1)
            self.spaces = list(self.ctx.generate_design_space())
            self.rules = "no-multi-level-tiling"
        self.postprocs = list(self.ctx.space_generator.postprocs)

    def draw(self, i: int):
        """Draw i: design space i mod n_spaces, every decision re-drawn with `draw_seed(key, i)`,
        then the postprocessors -> (schedule, space index), or None for an invalid draw."""
        from tvm import s_tir
        if not self.spaces:
            return None
        space = i % len(self.spaces)
        sch = s_tir.Schedule(self.mod, seed=draw_seed(self.key, i))
        try:
            self.spaces[space].trace.apply_to_schedule(sch, remove_postproc=True,
                                                       decision_provider=lambda *a: None)
            for p in self.postprocs:
                if not p.apply(sch):
                    return None
        except Exception:  # noqa: BLE001 - an invalid random draw is a normal outcome
            return None
        return sch, space


@dataclass
class SampledSchedule:
    """One valid draw of a kernel's design space: `index` is the draw number, `trace` the
    replayable trace (plain JSON), `mod` the scheduled IRModule."""

    index: int
    trace: list
    mod: Any

    @property
    def schedule(self) -> dict:
        """The schedule dict a plan records and `apply_schedule` replays."""
        return {"name": "sampled", "trace": self.trace}


def sample_schedules(lowered: Lowered, n: int, threads: int | None = None, seed: int = 0, *,
                     start: int = 0, tries: int | None = None, space: DesignSpace | None = None,
                     ) -> list[SampledSchedule]:
    """The first `n` valid samples among draws start..start+tries-1 (default tries 4n) of the
    design space of `lowered` (lowered with `use_let=False`) for this CPU at `threads` threads.
    `seed` picks another deterministic stream of draws; `space` reuses a `DesignSpace` already
    built for this kernel (sampling in rounds)."""
    if n <= 0:
        return []
    if space is None:
        space = design_space(lowered, threads, seed)
    out: list[SampledSchedule] = []
    for i in range(start, start + (tries if tries is not None else 4 * n)):
        r = space.draw(i)
        if r is None:
            continue
        sch = r[0]
        out.append(SampledSchedule(index=i, trace=trace_json(sch), mod=sch.mod))
        if len(out) == n:
            break
    return out


def design_space(lowered: Lowered, threads: int | None = None, seed: int = 0, target: Any = None) -> DesignSpace:
    """The design space of a kernel lowered with `use_let=False`, for this CPU at `threads`, or for
    `target` (a TVM target or its tag, e.g. 'nvidia/nvidia-h100': the GPU's CUDA programs)."""
    import tvm
    tgt = make_target(None, threads) if target is None else \
        target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)
    return DesignSpace(tvm.IRModule({"main": lowered.func}), tgt, key=f"sampled:{seed}", without_tiling_fallback=True)


__all__ = ["SampledSchedule", "DesignSpace", "sample_schedules", "design_space", "draw_seed"]
