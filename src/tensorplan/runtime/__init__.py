"""Running plans: `PlanExecutor` (compiled kernels on reused buffers) and `run_plan`."""
from tensorplan.runtime.executor import PlanExecutor, RunResult, build_kernel, ort_reference, run_plan  # noqa: F401

__all__ = ["PlanExecutor", "RunResult", "build_kernel", "ort_reference", "run_plan"]
