"""One error type for everything a user can get wrong.

The CLI catches `TensorplanError` and prints its message (no traceback); every
message names the node, op, file or field at fault and says what to do.
"""
from __future__ import annotations


class TensorplanError(Exception):
    """Base class of every error tensorplan raises on bad input or state."""


class ModelImportError(TensorplanError):
    """The ONNX file cannot become a static `Graph` (corrupt, dynamic, unsupported)."""


class UnsupportedOperatorError(ModelImportError):
    """One or more operators have no implementation; lists them all at once."""

    def __init__(self, ops: list[tuple[str, str]], source: str = ""):
        self.ops = ops
        self.source = source
        lines = "\n".join(f"  - {op} (node '{name}')" for name, op in ops)
        where = f"{source}: " if source else ""
        super().__init__(
            f"{where}{len(ops)} node(s) use unsupported operators:\n{lines}\n"
            "Export the model without them or open an issue with the op types above."
        )


class StoreError(TensorplanError):
    """The measurement store is missing, corrupt or of an unknown schema."""


class StoreCorruptError(StoreError):
    """The store file is damaged (garbage pages, truncated, or not an SQLite file at all)."""


class StoreReadOnlyError(StoreError):
    """The store file or its directory cannot be written (permissions, read-only file system)."""


class StoreFullError(StoreError):
    """A write to the store failed because its disk is full (or failed with an I/O error)."""


class StoreLockedError(StoreError):
    """Another process held the store's write lock for longer than the busy timeout."""


class OutputPathError(TensorplanError):
    """An output file cannot be written (a directory, no permission, no space)."""


class PlanError(TensorplanError):
    """A plan failed verification or its solve failed."""


class CompileError(TensorplanError):
    """A kernel failed to lower or compile."""


class ClusterError(TensorplanError):
    """A Ray cluster that cannot take tensorplan's jobs: no head at the address, or no worker offering a device."""
