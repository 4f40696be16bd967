"""`OptimizeSummary`: what `optimize` did and found, kept in the plan (`stats["optimize"]`).

Why its own module: the CPU and the GPU paths of `optimize` (`workflows.optimize`,
`workflows.optimize_gpu`) and the report (`workflows.optimize_report`) read and write it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tensorplan.errors import PlanError
from tensorplan.runtime.plan import Plan
from tensorplan.workflows.lazy_loop import Iteration
from tensorplan.workflows.precision_search import PrecisionSearch


@dataclass
class OptimizeSummary:
    """What `optimize` did and found; kept in the plan as `stats["optimize"]`."""

    model: str
    device: str
    budget_s: float
    samples: int                       # at most this many schedules sampled per TIR kernel (plus its default)
    draws: int                         # schedules sampled in this run (0 when the store had the predictions)
    searched: int                      # TIR kernels whose schedules were sampled in this run
    top_k: int                         # predicted-fastest schedules timed per chosen TIR kernel
    candidates: int
    unique_kernels: int                # what a fully measured orchestrate compiles and times
    measured: int                      # of them compiled and timed in this run
    from_store: int                    # of them measured by an earlier run (nothing timed now)
    stop: str                          # "stable" | "budget" | "iterations"
    iterations: list[Iteration] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    solo_sum_ms: float = 0.0           # the kept plan's kernels, timed (or predicted) alone, summed
    predicted_plan_ms: float | None = None    # the plan-time model's prediction of the kept plan
    plan_model_runs: int = 0                  # plans measured end to end it was fitted on
    # race finalists: {name: {"kernels", "solo_sum_ms", "predicted_ms", "measured_ms"}}
    finalists: dict[str, dict[str, float]] = field(default_factory=dict)
    measured_plan_ms: float | None = None     # the kept plan run end to end (median)
    max_rel_err: float | None = None   # against ONNX Runtime on the model as given
    tolerance: float | None = None
    reference: str = ""
    peers_ms: dict[str, float] = field(default_factory=dict)
    peer_notes: dict[str, str] = field(default_factory=dict)   # a peer's label, or why it did not run
    timings: dict[str, Any] = field(default_factory=dict)      # workflows.peers.PeerTimings, as data
    best_peer: str | None = None
    speedup_over_best: float | None = None
    noisy: str | None = None           # why the timing run is not to be trusted, or None
    artifacts: dict[str, str] = field(default_factory=dict)
    total_s: float = 0.0
    precision: PrecisionSearch | None = None  # the reduced-precision search, when one ran

    @property
    def reduced(self) -> bool:
        """Whether the kept plan runs kernels below fp32 (its check is then the accuracy tolerance)."""
        return self.precision is not None and bool(self.precision.reduced)

    @property
    def measured_share(self) -> float:
        """Share of the unique kernels compiled and timed now (the issue's "<= 10 %" figure)."""
        return self.measured / max(self.unique_kernels, 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(replace(self, precision=None))
        d["precision"] = self.precision.to_dict() if self.precision is not None else None
        d["measured_share"] = self.measured_share
        return d

    def take_timings(self, timings: Any, found: list) -> None:
        """Keep an interleaved timing run (`workflows.peers.PeerTimings`, the plan as runner
        "tensorplan") and the peers it timed (`found`): medians, labels, noise, the best fp32 peer."""
        self.timings = asdict(timings)
        self.measured_plan_ms = timings.runners["tensorplan"].median_ms
        self.peers_ms = {n: t.median_ms for n, t in timings.runners.items() if t.peer}
        self.peer_notes = {**{p.name: p.label for p in found if p.skipped is None and p.label != p.name},
                           **timings.skipped}
        self.noisy = timings.noise_reason
        self.best_peer = timings.best_peer()
        if self.best_peer is not None:
            self.speedup_over_best = timings.speedup_over_best("tensorplan")

    def timed_line(self, extra_ms: dict[str, float] | None = None) -> str:
        """One log line: the plan, `extra_ms` and the peers, the speed-up, the noise."""
        return ("timed, interleaved: " + ", ".join(f"{k} {v:.3f} ms" for k, v in
                                                   {"tensorplan": self.measured_plan_ms, **(extra_ms or {}),
                                                    **self.peers_ms}.items())
                + (f" -> {self.speedup_over_best:.2f}x over {self.best_peer}" if self.best_peer else "")
                + (f" (noisy run: {self.noisy})" if self.noisy else ""))

    @classmethod
    def from_plan(cls, plan: Plan) -> "OptimizeSummary":
        d = dict(plan.stats.get("optimize") or {})
        if not d:
            raise PlanError("this plan was not made by `optimize` (no stats.optimize)")
        d.pop("measured_share", None)
        d["iterations"] = [Iteration(**it) for it in d.get("iterations") or []]
        if d.get("precision") is not None:
            d["precision"] = PrecisionSearch.from_dict(d["precision"])
        return cls(**d)


__all__ = ["OptimizeSummary"]
