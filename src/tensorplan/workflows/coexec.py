"""CoDL's public face: co-execute a model on two processors (`coexec`) or simulate it on a SoC (`simulate`).

`coexec` plans per-operator splits (H or OC dimension at a ratio) and operator chains with the
CoDL latency predictor fitted on the measured data, then runs every planned segment on the real
processors and, with `whole_model`, the whole model end to end against ONNX Runtime, so the
plan's prediction meets a measurement. `simulate` plans and replays the model on a simulated
mobile SoC for every system (CPU only, GPU only, µLayer-like, CoDL without and with chains, an
ideal sharing-free bound): planner quality given the SoC model, not a device measurement.
Both load the model once and take a `Graph` or any model spec `zoo.specs.load_model` accepts.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tensorplan.codl.coexecutor import ModelRun, SegmentRun
from tensorplan.codl.partition import CoexecPlan
from tensorplan.codl.simulate import SYSTEMS, SimResult
from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph

# the real processor pairs `coexec` can run; cpu2 is a second pinned CPU process standing in for the GPU
PROCESSOR_PAIRS = (("cpu", "cpu2"), ("cpu", "cuda"))


def _graph(graph_or_spec: Graph | str | Path) -> Graph:
    from tensorplan.zoo.specs import load_model

    return graph_or_spec if isinstance(graph_or_spec, Graph) else load_model(graph_or_spec)


@dataclass
class CoexecResult:
    """A model's co-execution plan, run: each segment predicted vs measured, and the whole model."""

    model: str
    processors: tuple[str, str]
    method: str
    plan: CoexecPlan
    segments: list[SegmentRun]
    whole_model: ModelRun | None = None
    note: str = ("segments: partitionable ops (Conv/Pool/FC with fused elementwise epilogues); "
                 "whole_model: every operator, the others on the CPU alone")

    @property
    def predicted_s(self) -> float:
        """Predicted seconds of the segments run (the plan's, over `segments`)."""
        return sum(s.predicted.total for s in self.segments)

    @property
    def measured_min_s(self) -> float:
        """Sum over segments of each one's fastest run."""
        return sum(s.measured.total for s in self.segments)

    @property
    def measured_median_s(self) -> float:
        return sum(s.measured_median_s for s in self.segments)

    @property
    def relative_error(self) -> float | None:
        """predicted / measured (min) - 1 over the segments."""
        return self.predicted_s / self.measured_min_s - 1.0 if self.measured_min_s > 0 else None

    @property
    def events(self) -> dict[str, list[tuple[str, float, float]]]:
        """Both processors' events of the segments' fastest runs, laid end to end (seconds)."""
        out: dict[str, list[tuple[str, float, float]]] = {"cpu": [], "gpu": []}
        t_off = 0.0
        for s in self.segments:
            for proc in ("cpu", "gpu"):
                out[proc] += [(f"{n} [{s.start}:{s.end}]", a + t_off, b + t_off)
                              for n, a, b in s.measured.events.get(proc, [])]
            t_off += s.measured.total
        return out

    def save_timeline(self, path: str | Path) -> Path:
        """A Gantt chart of both processors over the segments' fastest runs, as a PNG."""
        from tensorplan.codl.simulate import plot_timeline

        plot_timeline(self.events, str(path), f"{self.model}: {' + '.join(self.processors)}, measured")
        return Path(path)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "processors": list(self.processors), "method": self.method,
                "plan": self.plan.to_dict(), "segments": [s.to_dict() for s in self.segments],
                "predicted_s": self.predicted_s, "measured_min_s": self.measured_min_s,
                "measured_median_s": self.measured_median_s, "relative_error": self.relative_error,
                "whole_model": self.whole_model.to_dict() if self.whole_model is not None else None,
                "note": self.note}


def _processors(processors: str | Sequence[str]) -> tuple[str, str]:
    procs = tuple(p.strip() for p in (processors.split(",") if isinstance(processors, str) else processors))
    if procs not in PROCESSOR_PAIRS:
        raise TensorplanError(f"processors {','.join(procs)!r}: use one of "
                              f"{', '.join(','.join(p) for p in PROCESSOR_PAIRS)}")
    return procs  # type: ignore[return-value]


def coexec(graph_or_spec: Graph | str | Path, processors: str | Sequence[str] = "cpu,cpu2", *,
           method: str = "greedy", repeats: int = 5, data: str | Path | None = None, whole_model: bool = True,
           check: bool = True, max_segments: int | None = None) -> CoexecResult:
    """Plan `graph_or_spec`'s partitionable ops for two real processors and co-execute the plan.

    `processors`: 'cpu,cpu2' (this process and a second one pinned to another core, the GPU's
    stand-in) or 'cpu,cuda'. `method`: the chain search (none | greedy | dp | exhaustive) or a
    single processor (cpu | gpu). Every segment is timed `repeats` times after a warm-up and, with
    `check`, compared with the unsplit result; with `whole_model`, the model runs end to end under
    the plan, CPU only and GPU only (other operators on the CPU), against ONNX Runtime.
    `data`: the CoDL training data directory (default: data/codl)."""
    from tensorplan.codl.coexecutor import ProcessPair, fit_local_cost, run_model, run_segments
    from tensorplan.codl.partition import chain_links, extract_ops, plan_ops

    procs = _processors(processors)
    if procs == ("cpu", "cuda"):
        import torch

        if not torch.cuda.is_available():
            raise TensorplanError("processors cpu,cuda: no CUDA device here; use cpu,cpu2 or simulate()")
        raise TensorplanError("processors cpu,cuda: no CUDA latency data collected yet to plan with; "
                              "the CUDA co-executor (codl.coexecutor.CudaCoexecutor) runs single segments "
                              "(see research/notes/codl.md)")
    graph = _graph(graph_or_spec)
    ops = extract_ops(graph)
    if not ops:
        raise TensorplanError(f"model '{graph.name}' has no partitionable Conv/Pool/FC operator at batch 1")
    with ProcessPair() as pair:
        cost = fit_local_cost(data, pair)
        shapes, links = [o.shape for o in ops], chain_links(graph, ops)
        plan = plan_ops(shapes, cost, links, method)
        segments = run_segments(graph, ops, plan, pair, repeats, max_segments, check)
        whole = None
        if whole_model:
            whole = run_model(graph, ops, {"codl": plan, "cpu_only": plan_ops(shapes, cost, links, "cpu"),
                                           "gpu_only": plan_ops(shapes, cost, links, "gpu")}, pair, repeats)
    return CoexecResult(graph.name, procs, method, plan, segments, whole)


@dataclass
class SimulationResult:
    """A model simulated on a SoC under every system compared; CoDL is the reference."""

    model: str
    soc: str
    seed: int
    systems: dict[str, SimResult]
    note: str = "simulated: planner quality given the SoC model, not a device measurement"

    def latency_s(self, system: str = "codl") -> float:
        return self.systems[system].latency_s

    def speedup(self, system: str) -> float:
        """How much faster CoDL is than `system` (its latency / CoDL's)."""
        return self.systems[system].latency_s / self.systems["codl"].latency_s

    def save_timeline(self, path: str | Path, system: str = "codl") -> Path:
        """A Gantt chart of both processors under `system`, as a PNG."""
        from tensorplan.codl.simulate import plot_timeline

        plot_timeline(self.systems[system].events, str(path), f"{self.model} on {self.soc} (simulated {system})")
        return Path(path)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "soc": self.soc, "seed": self.seed,
                "systems": {s: r.to_dict() for s, r in self.systems.items()}, "note": self.note}


def simulate(graph_or_spec: Graph | str | Path, soc: str = "sd855", *, systems: Sequence[str] = SYSTEMS,
             seed: int = 0, noise: bool = True) -> SimulationResult:
    """Simulated end-to-end latency of the model on a SoC (sd855 | sd865 | sd888 | kirin990, the
    profiles in codl/soc_profiles) under each of `systems` (default: all; 'codl' always included)."""
    from tensorplan.codl.simulate import calibrate
    from tensorplan.codl.simulate import simulate as run

    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise TensorplanError(f"unknown system(s) {', '.join(unknown)}; use {', '.join(SYSTEMS)}")
    graph = _graph(graph_or_spec)
    model = calibrate(soc)
    names = [s for s in SYSTEMS if s in systems or s == "codl"]
    return SimulationResult(graph.name, soc, seed, {s: run(graph, model, s, seed=seed, noise=noise) for s in names})
