"""Plans and running them: `plan` (the `Plan` data, `plan.run`, `plan.export`, `load_plan`),
`executor` (compiled kernels on reused buffers, this CPU), `torch_runner` (PyTorch kernels, one
CUDA graph on a GPU), `export` (a plan as one ONNX file) and `buffers` (arena slot assignment).
Import the submodules directly."""
