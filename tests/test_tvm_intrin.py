"""tensorplan.kernels.tvm_intrin: TVM's tensor intrinsics imported the fast way, with the same result."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_fast_import_registers_the_intrinsics_and_keeps_getmodule_answers():
    code = textwrap.dedent("""
        import inspect, sys
        frames = {}
        for fn in ("<string>", "<ast>", "<frozen importlib._bootstrap>"):
            ns = {}
            exec(compile("import sys; fr = sys._getframe()", fn, "exec"), ns)
            frames[fn] = ns["fr"]
        before = {fn: inspect.getmodule(f, fn) for fn, f in frames.items()}
        from tensorplan.kernels.tvm_intrin import load_tensor_intrinsics
        load_tensor_intrinsics()
        after = {fn: inspect.getmodule(f, fn) for fn, f in frames.items()}
        assert before == after == {fn: None for fn in frames}, (before, after)
        assert "tvm.s_tir.tensor_intrin" in sys.modules
        from tvm.s_tir import TensorIntrin
        TensorIntrin.get("dot_16x4_avx512")   # raises if the x86 intrinsics were not registered
        assert inspect.getmodule(inspect) is inspect and inspect.getmodule(load_tensor_intrinsics).__name__ == "tensorplan.kernels.tvm_intrin"
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]
