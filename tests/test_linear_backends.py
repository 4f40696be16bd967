"""Linear/vendor backends (kernels/vendor.py) agree with numpy, bind zero-copy, pick the fastest."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

from tensorplan.errors import CompileError  # noqa: E402
from tensorplan.ir.graph import Graph, Node, Tensor  # noqa: E402
from tensorplan.kernels.vendor import best_kernel, call_overheads, make_kernel  # noqa: E402

RNG = np.random.default_rng(1)


def _g(nodes, inputs, consts, outs_shapes):
    g = Graph("lin", 17)
    for k, v in inputs.items():
        g.add_tensor(Tensor(k, v))
        g.inputs.append(k)
    for k, v in consts.items():
        g.add_tensor(Tensor(k, v.shape, str(v.dtype), v))
    for k, v in outs_shapes.items():
        g.add_tensor(Tensor(k, v))
    for j, (op, ins, outs, attrs) in enumerate(nodes):
        g.add_node(Node(f"n{j}", op, ins, outs, attrs))
    g.outputs = [nodes[-1][2][0]]
    return g


def matmul_graph(M=33, K=48, N=40, batch=()):
    w = RNG.standard_normal((K, N)).astype(np.float32)
    return _g([("MatMul", ["a", "w"], ["y"], {})], {"a": (*batch, M, K)}, {"w": w}, {"y": (*batch, M, N)}), w


def conv_graph(C=8, H=12, O=16, k=3, stride=1, group=1, pads=None, relu=True):
    w = RNG.standard_normal((O, C // group, k, k)).astype(np.float32)
    b = RNG.standard_normal(O).astype(np.float32)
    pads = pads if pads is not None else [k // 2] * 4
    Ho = (H + pads[0] + pads[2] - k) // stride + 1
    Wo = (H + pads[1] + pads[3] - k) // stride + 1
    nodes = [("Conv", ["x", "w", "b"], ["c"], {"kernel_shape": [k, k], "strides": [stride, stride], "pads": pads,
                                               "group": group})]
    outs = {"c": (1, O, Ho, Wo)}
    if relu:
        nodes.append(("Relu", ["c"], ["y"], {}))
        outs["y"] = (1, O, Ho, Wo)
    return _g(nodes, {"x": (1, C, H, H)}, {"w": w, "b": b}, outs), w, b


def _torch_conv_ref(x, w, b, stride, pads, group, relu):
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    y = torch.nn.functional.conv2d(torch.from_numpy(xp).double(), torch.from_numpy(w).double(),
                                   torch.from_numpy(b).double(), stride=stride, groups=group).numpy()
    return np.maximum(y, 0) if relu else y


@pytest.mark.parametrize("backend", ["ort", "torch", "tvm"])
def test_matmul_matches_numpy(backend):
    g, w = matmul_graph(batch=(2,))
    k = make_kernel(g, ["y"], backend)
    a = RNG.standard_normal((2, 33, 48)).astype(np.float32)
    y = k(torch.from_numpy(a)).numpy()
    np.testing.assert_allclose(y, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("backend", ["ort", "torch"])
@pytest.mark.parametrize("case", [dict(), dict(stride=2, pads=[0, 0, 1, 1]), dict(group=8, C=8, O=8),
                                  dict(k=1, pads=[0, 0, 0, 0], relu=False)])
def test_conv_epilogue_matches_numpy(backend, case):
    relu = case.get("relu", True)
    g, w, b = conv_graph(**case)
    k = make_kernel(g, g.outputs, backend)
    x = RNG.standard_normal(g.tensors["x"].shape).astype(np.float32)
    y = k(torch.from_numpy(x)).numpy()
    ref = _torch_conv_ref(x, w, b, case.get("stride", 1), case.get("pads", [1, 1, 1, 1]), case.get("group", 1), relu)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)


def test_gemm_and_convtranspose_torch_vs_ort():
    a = RNG.standard_normal((5, 7)).astype(np.float32)
    bw = RNG.standard_normal((9, 7)).astype(np.float32)
    c = RNG.standard_normal(9).astype(np.float32)
    g = _g([("Gemm", ["a", "bw", "c"], ["y"], {"transB": 1, "alpha": 0.5, "beta": 2.0})], {"a": (5, 7)},
           {"bw": bw, "c": c}, {"y": (5, 9)})
    for b in ("ort", "torch"):
        y = make_kernel(g, ["y"], b)(torch.from_numpy(a)).numpy()
        np.testing.assert_allclose(y, 0.5 * a @ bw.T + 2.0 * c, rtol=1e-4, atol=1e-4)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g2 = _g([("ConvTranspose", ["x", "w"], ["y"], {"kernel_shape": [3, 3], "strides": [2, 2],
                                                  "pads": [1, 1, 1, 1], "output_padding": [1, 1]})],
            {"x": (1, 4, 5, 5)}, {"w": w}, {"y": (1, 3, 10, 10)})
    x = RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)
    ref = torch.nn.functional.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), stride=2, padding=1,
                                               output_padding=1).numpy()
    for b in ("ort", "torch"):
        np.testing.assert_allclose(make_kernel(g2, ["y"], b)(torch.from_numpy(x)).numpy(), ref, rtol=1e-4,
                                   atol=1e-4)


def test_ort_binding_is_zero_copy():
    g, w = matmul_graph()
    k = make_kernel(g, ["y"], "ort")
    a, y = torch.randn(33, 48), torch.empty(33, 40)
    fn = k.bind([a], [y])
    fn()
    torch.testing.assert_close(y, a @ torch.from_numpy(w), rtol=1e-4, atol=1e-4)
    a.mul_(2)  # the binding reads the same memory: new values show up without rebinding
    fn()
    torch.testing.assert_close(y, a @ torch.from_numpy(w), rtol=1e-4, atol=1e-4)


def test_best_kernel_times_every_backend_and_picks_min():
    g, _ = matmul_graph(64, 64, 64)
    r = best_kernel(g, ["y"], backends=("ort", "torch", "tvm"), budget_s=0.02)
    assert set(r.times) == {"ort", "torch", "tvm"}, r.errors
    assert r.backend == min(r.times, key=r.times.get)
    assert all(t > 0 for t in r.times.values())


def test_unsupported_backend_reports_reason():
    g, _, _ = conv_graph()
    with pytest.raises(CompileError, match="Conv"):
        make_kernel(g, g.outputs, "tvm")
    r = best_kernel(g, g.outputs, backends=("tvm", "ort"), budget_s=0.01)
    assert r.backend == "ort" and "tvm" in r.errors


def test_call_overheads_are_small_and_positive():
    ov = call_overheads(2)
    assert set(ov) == {"tvm", "ort", "torch"}
    assert all(0 < v < 1e-3 for v in ov.values()), ov
