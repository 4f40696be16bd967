"""The graph IR (`graph`), ONNX import (`onnx_import`) and export (`to_onnx`), the numpy
reference executor (`reference`, with `ort_node` for operators only ONNX Runtime has),
graph analysis (`analysis`) and the torch -> ONNX exporter (`torch_onnx`).
Imports nothing of ours above `errors` and `paths`."""
from tensorplan.ir.graph import Graph, Node, Tensor

__all__ = ["Graph", "Node", "Tensor"]
