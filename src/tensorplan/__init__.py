"""tensorplan: predict tensor-program latency, orchestrate fused kernels, co-execute.

`import tensorplan as tp`; every CLI command is one call in this API.
"""
__version__ = "0.1.0"

from .errors import TensorplanError  # noqa: F401
from .graph import Graph, Node, Tensor  # noqa: F401
