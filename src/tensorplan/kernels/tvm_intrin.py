"""Import TVM's tensor intrinsics in seconds instead of ~25 s.

Why: every meta_schedule `TuneContext` imports `tvm.s_tir.tensor_intrin`, which parses ~500
TVMScript functions; each parse calls `inspect.stack()`, and for every frame whose file is a
pseudo-file (`<frozen importlib._bootstrap>`, `<string>`, `<ast>`: the import machinery and
TVMScript's own evaluator) `inspect.getmodule` scans all of `sys.modules` before it returns None.
That scan is ~70 % of the import (24 s measured on the 2-core dev VM), paid by `tensorplan
predict`, `dataset sample|collect`, `calibrate` and the meta_schedule tuner alike.

`load_tensor_intrinsics()` records those pseudo-files in `inspect.modulesbyfile` under a module
name that does not exist, so `getmodule` takes its cached path and returns the same None at
once; nothing else changes.
"""
from __future__ import annotations

import inspect
import sys

# pseudo-file -> a module name that is never in sys.modules (getmodule then returns None, as before)
_PSEUDO_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<frozen runpy>", "<string>",
                 "<ast>")
_NO_MODULE = "tensorplan._no_module_for_pseudo_file"


def load_tensor_intrinsics() -> None:
    """Import `tvm.s_tir.tensor_intrin` (what a TuneContext does first), the fast way."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    for f in _PSEUDO_FILES:
        inspect.modulesbyfile.setdefault(f, _NO_MODULE)
    import tvm.s_tir.tensor_intrin  # noqa: F401


__all__ = ["load_tensor_intrinsics"]
