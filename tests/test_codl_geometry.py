"""Partition geometry: halo rows, odd heights, legality, OC rounding, chain halo propagation."""
import pytest

from tensorplan.errors import PlanError
from tensorplan.codl.partition import chain_rows, codl_input_height_ok, gpu_rows, h_split, halo_rows, input_rows, oc_split, split
from tensorplan.codl.predictor import OpShape


@pytest.mark.parametrize("k,s", [(1, 1), (3, 1), (3, 2), (5, 1), (5, 2), (7, 1), (7, 2)])
@pytest.mark.parametrize("h", [7, 13, 16, 31])
@pytest.mark.parametrize("same", [True, False])
def test_h_split_covers_output_and_halo(k, s, h, same):
    p = k // 2 if same else 0
    if h + 2 * p < k:
        pytest.skip("input smaller than kernel")
    op = OpShape("conv", h, h, 4, 8, k, s, p, p, p, p)
    for r10 in range(1, 10):
        sp = h_split(op, r10 / 10)
        if sp.gpu is None or sp.cpu is None:
            continue
        g, c = sp.gpu_rows, sp.cpu_rows
        assert g.o0 == 0 and g.o1 == c.o0 and c.o1 == op.oh          # outputs partition OH exactly
        assert sp.gpu.oh == g.out_rows and sp.cpu.oh == c.out_rows    # each part computes its rows
        assert g.r0 == 0 and c.r1 == min(op.ih, (op.oh - 1) * s + k - p)   # unused last rows trimmed
        # in padded coordinates the overlap is exactly K - S rows (the halo) when it is interior
        lo_c = c.o0 * s
        hi_g = (g.o1 - 1) * s + k
        assert hi_g - lo_c == k - s


def test_gpu_rows_ceil_and_bounds():
    assert gpu_rows(13, 0.5) == 7 and gpu_rows(13, 0.0) == 0 and gpu_rows(13, 1.0) == 13
    assert gpu_rows(10, 0.3) == 3
    with pytest.raises(Exception):
        gpu_rows(10, 1.5)


def test_odd_height_stride2_codl_legality():
    # padded height 15+2=17, K3 S2: (17-3)%2 == 0 -> CoDL accepts g where both parts satisfy it
    op = OpShape("conv", 15, 15, 4, 4, 3, 2, 1, 1, 1, 1)
    assert codl_input_height_ok(17, 3, 2)
    assert not codl_input_height_ok(16, 3, 2) and not codl_input_height_ok(2, 3, 1)
    legal = [h_split(op, r / 10).codl_legal() for r in range(11)]
    assert all(legal)
    # even padded height with K3 S2 leaves an unused last row: CoDL's strict check refuses the CPU part
    op2 = OpShape("conv", 16, 16, 4, 4, 3, 2, 1, 0, 1, 0)   # padded 17? no: 16+1 = 17 -> fine
    op3 = OpShape("conv", 16, 16, 4, 4, 3, 2, 1, 1, 1, 1)   # padded 18: (18-3) odd
    assert all(h_split(op2, r / 10).codl_legal() for r in range(11))
    assert not h_split(op3, 0.5).codl_legal()
    # ...while our geometry trims the unused row and stays exact (see co-executor tests)
    sp = h_split(op3, 0.5)
    assert sp.cpu.oh + sp.gpu.oh == op3.oh


def test_input_rows_rejects_bad_range():
    op = OpShape("conv", 8, 8, 4, 4, 3, 1, 1, 1, 1, 1)
    with pytest.raises(PlanError):
        input_rows(op, 3, 3)
    with pytest.raises(PlanError):
        input_rows(op, 0, 9)


def test_oc_split_rounds_to_channel_block():
    op = OpShape("conv", 8, 8, 4, 100, 3, 1, 1, 1, 1, 1)
    sp = oc_split(op, 0.3, 16)
    assert sp.oc_gpu == 32 and sp.cpu.oc == 68 and sp.cpu.ic == 4     # both read the whole input
    sp = oc_split(op, 0.95, 16)
    assert sp.cpu is None and sp.gpu.oc == 100                          # rounding reaches OC -> GPU only
    dw = OpShape("conv", 8, 8, 32, 32, 3, 1, 1, 1, 1, 1, g=32)
    sp = oc_split(dw, 0.5, 4)
    assert sp.gpu.ic == sp.gpu.oc == sp.gpu.g == 16                     # depthwise slices its input too
    with pytest.raises(PlanError):
        split(OpShape("fc", 1, 1, 64, 10), "H", 0.5)


def test_chain_halo_propagates_backwards():
    a = OpShape("conv", 32, 32, 4, 8, 3, 1, 1, 1, 1, 1)
    b = OpShape("conv", 32, 32, 8, 8, 3, 1, 1, 1, 1, 1)
    c = OpShape("pool", 32, 32, 8, 8, 2, 2)
    g, cp = chain_rows([a, b, c], 0.5)
    assert g[-1].o1 == 8 and cp[-1].o0 == 8                        # tail split at ceil(16*0.5)
    assert g[1].o1 == g[2].r1 and g[0].o1 == g[1].r1                # each op's output = next op's input
    # head overlap: pool has no halo (K=S), two 3x3 S1 convs add 2 rows each side -> 4 rows
    assert halo_rows([a, b, c], 0.5) == 4
    assert halo_rows([a], 0.5) == 2
    with pytest.raises(PlanError):
        chain_rows([a, OpShape("conv", 16, 16, 8, 8, 3, 1)], 0.5)
