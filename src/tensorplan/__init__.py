"""tensorplan: predict tensor-program latency, orchestrate fused kernels, co-execute.

`import tensorplan as tp`; every CLI command is one call in this API. Heavy modules
(TVM, torch) load lazily on first use, so `import tensorplan` stays cheap.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

from tensorplan.errors import TensorplanError  # noqa: E402,F401
from tensorplan.ir.graph import Graph, Node, Tensor  # noqa: E402,F401

# public name -> (module, attribute)
_LAZY = {
    "load_model": ("tensorplan.zoo.specs", "load_model"),
    "from_torch": ("tensorplan.zoo.from_torch", "from_torch"),
    "import_onnx": ("tensorplan.ir.onnx_import", "import_onnx"),
    "run_reference": ("tensorplan.ir.reference", "run_reference"),
    "zoo": ("tensorplan.zoo", None),
    "fission": ("tensorplan.korch.fission", "fission"),
    "resolve_device": ("tensorplan.devices", "resolve"),
    "measure": ("tensorplan.measure.timer", "measure"),
    "Store": ("tensorplan.measure.store", "Store"),
    "orchestrate": ("tensorplan.workflows.orchestrate", "orchestrate"),
    "Plan": ("tensorplan.runtime.plan", "Plan"),
    "run_plan": ("tensorplan.runtime.executor", "run_plan"),
    "run_demo": ("tensorplan.workflows.demo", "run_demo"),
    "export_onnx": ("tensorplan.workflows.export", "export_onnx"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tensorplan' has no attribute {name!r}")
    mod_name, attr = _LAZY[name]
    mod = importlib.import_module(mod_name)
    return mod if attr is None else getattr(mod, attr)


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
