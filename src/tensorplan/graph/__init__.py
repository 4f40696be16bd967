"""Graph IR, ONNX import/export, fission and the model zoo (imports nothing else of ours)."""
from .ir import Graph, Node, Tensor
from .load import load_model

__all__ = ["Graph", "Node", "Tensor", "load_model"]
