"""tensorplan: predict tensor-program latency, orchestrate fused kernels, co-execute.

`import tensorplan as tp`; every CLI command is one call in this API:

    graph = tp.load("resnet-50")                  # ONNX path, zoo name, pkg.mod:factory, file.py:factory
    plan = tp.optimize(graph, budget_s=600)       # `tensorplan optimize`: predicted costs, lazy measurement
    plan = tp.orchestrate(graph, device="local")  # what `tensorplan orchestrate` does, race included
    plan.save("r50.plan.json"); plan = tp.load_plan("r50.plan.json")
    result = plan.run()                           # `tensorplan run`
    plan.export("r50.onnx")                       # `tensorplan export`

Heavy modules (TVM, torch) load lazily on first use, so `import tensorplan` stays cheap.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

from tensorplan.errors import TensorplanError  # noqa: E402,F401
from tensorplan.ir.graph import Graph, Node, Tensor  # noqa: E402,F401

# public name -> (module, attribute); None = the module itself
_LAZY = {
    # models
    "load": ("tensorplan.zoo.specs", "load"),
    "from_torch": ("tensorplan.zoo.from_torch", "from_torch"),
    "import_onnx": ("tensorplan.ir.onnx_import", "import_onnx"),
    "run_reference": ("tensorplan.ir.reference", "run_reference"),
    "inspect": ("tensorplan.workflows.inspect", "inspect_model"),
    "ModelReport": ("tensorplan.workflows.inspect", "ModelReport"),
    "zoo": ("tensorplan.zoo", None),
    # devices and measurement
    "device": ("tensorplan.devices", "device"),
    "DeviceSpec": ("tensorplan.devices.spec", "DeviceSpec"),
    "devices": ("tensorplan.devices", None),
    "measure": ("tensorplan.measure", None),
    "Store": ("tensorplan.measure.store", "Store"),
    "precision": ("tensorplan.precision", None),
    # kernel orchestration (Korch) and plans
    "fission": ("tensorplan.korch.fission", "fission"),
    "orchestrate": ("tensorplan.workflows.orchestrate", "orchestrate"),
    "optimize": ("tensorplan.workflows.optimize", "optimize"),
    "OptimizeSummary": ("tensorplan.workflows.optimize", "OptimizeSummary"),
    "PrecisionSearch": ("tensorplan.workflows.precision_search", "PrecisionSearch"),
    "Plan": ("tensorplan.runtime.plan", "Plan"),
    "load_plan": ("tensorplan.runtime.plan", "load_plan"),
    "RunResult": ("tensorplan.runtime.executor", "RunResult"),
    "ExportResult": ("tensorplan.runtime.export", "ExportResult"),
    "export_onnx": ("tensorplan.workflows.export", "export_onnx"),
    "run_demo": ("tensorplan.workflows.demo", "run_demo"),
    # latency prediction (CDMPP)
    "predict": ("tensorplan.cdmpp.predict", "predict"),
    "NetworkPrediction": ("tensorplan.cdmpp.predict", "NetworkPrediction"),
    # co-execution (CoDL)
    "coexec": ("tensorplan.workflows.coexec", "coexec"),
    "simulate": ("tensorplan.workflows.coexec", "simulate"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tensorplan' has no attribute {name!r}")
    mod_name, attr = _LAZY[name]
    mod = importlib.import_module(mod_name)
    return mod if attr is None else getattr(mod, attr)


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
