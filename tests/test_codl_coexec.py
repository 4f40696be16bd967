"""Co-executor exactness on two real processes (and CUDA where present)."""
import numpy as np
import pytest

from tensorplan.codl.predictor import OpShape
from tensorplan.codl.coexecutor import CoexecJob, ProcessPair, memory_overhead, reference_output


@pytest.fixture(scope="module")
def pair():
    with ProcessPair() as p:
        yield p


def _check(pair, job, seed=0):
    op = job.ops[0]
    shape = (1, op.ic) if op.kind == "fc" else (1, op.ic, op.ih, op.iw)
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    pj = pair.prepare(job)
    try:
        rt = pair.run(pj, x)
        out = pair.output(pj)
    finally:
        pair.free(pj)
    ref = reference_output(job, x).reshape(out.shape)
    err = float(np.abs(out - ref).max())
    assert err <= 1e-4, f"{[o.short() for o in job.ops]} {job.dim} {job.ratio}: max err {err}"
    return rt


CASES = [(k, s, same, h) for k in (1, 3, 5, 7) for s in (1, 2) for same in (True, False) for h in (9, 16)
         if h + (k // 2) * 2 * same >= k]


@pytest.mark.parametrize("k,s,same,h", CASES)
def test_h_split_exact(pair, k, s, same, h):
    p = k // 2 if same else 0
    op = OpShape("conv", h, 11, 5, 12, k, s, p, p, p, p)
    _check(pair, CoexecJob.random([op], "H", 0.4, seed=k * 10 + s, relu=True))


@pytest.mark.parametrize("ratio", [0.0, 0.3, 0.7, 1.0])
def test_oc_split_exact(pair, ratio):
    op = OpShape("conv", 13, 10, 6, 40, 3, 2, 1, 1, 1, 1)
    _check(pair, CoexecJob.random([op], "OC", ratio))


def test_pool_depthwise_fc_exact(pair):
    _check(pair, CoexecJob.random([OpShape("pool", 15, 15, 8, 8, 3, 2, 1, 1, 1, 1)], "H", 0.5))
    _check(pair, CoexecJob.random([OpShape("pool", 15, 15, 32, 32, 2, 2)], "OC", 0.5))
    _check(pair, CoexecJob.random([OpShape("conv", 15, 15, 32, 32, 3, 1, 1, 1, 1, 1, g=32)], "H", 0.6))
    _check(pair, CoexecJob.random([OpShape("conv", 15, 15, 32, 32, 3, 2, 1, 1, 1, 1, g=32)], "OC", 0.5))
    _check(pair, CoexecJob.random([OpShape("fc", 1, 1, 96, 50)], "OC", 0.3))


@pytest.mark.parametrize("ratio", [0.2, 0.5, 0.7])
def test_chain_exact(pair, ratio):
    ops = [OpShape("conv", 23, 17, 3, 8, 3, 1, 1, 1, 1, 1), OpShape("conv", 23, 17, 8, 8, 5, 2, 2, 2, 2, 2),
           OpShape("pool", 12, 9, 8, 8, 2, 2), OpShape("conv", 6, 4, 8, 16, 1, 1),
           OpShape("conv", 6, 4, 16, 16, 3, 1, 0, 0, 1, 1)]
    rt = _check(pair, CoexecJob.random(ops, "H", ratio, relu=True))
    assert rt.cpu > 0 and rt.gpu > 0 and rt.total >= max(rt.gpu, rt.cpu)


def test_components_and_memory_overhead(pair):
    op = OpShape("conv", 56, 56, 32, 32, 3, 1, 1, 1, 1, 1)
    job = CoexecJob.random([op], "H", 0.5)
    rt = _check(pair, job)
    assert rt.map_in > 0 and rt.trans_in > 0 and rt.trans_out > 0 and rt.map_out > 0
    assert {e[0] for e in rt.events["cpu"]} >= {"compute", "transform in"}
    mem = memory_overhead(job)
    assert mem["replicated_weights"] == 4 * (32 * 32 * 9 + 32) and mem["halo_input"] == 4 * 2 * 56 * 32
    assert np.median(pair.measure_sync(20)) < 0.05


def test_whole_model_runs_and_matches_ort(pair):
    """RetinaFace end to end: planned segments co-executed, Concat/Reshape/… on the CPU alone."""
    from tensorplan.zoo.specs import load_model
    from tensorplan.codl.partition import chain_links, extract_ops, plan_ops
    from tensorplan.codl.coexecutor import fit_local_cost, model_steps, run_model

    graph = load_model("retinaface")
    ops = extract_ops(graph)
    plan = plan_ops([o.shape for o in ops], fit_local_cost(None, pair), chain_links(graph, ops), "greedy")
    steps = model_steps(graph, ops, plan)
    assert sorted(i for kind, i in steps if kind == "segment") == list(range(len(plan.segments)))
    assert any(kind == "cpu" for kind, _ in steps)
    run = run_model(graph, ops, plan, pair, repeats=1)
    res = run.plans["plan"]
    assert res.max_rel_err_vs_ort <= 1e-4 and res.steps["zero_copy_inputs"] > 0
    m = res.median
    assert m.segments > 0 and m.cpu_ops > 0 and m.total >= m.segments + m.cpu_ops
    assert set(run.ort_median_s) == {1, len(pair.cores)} and set(res.speedup_vs_ort) == set(run.ort_median_s)
    assert run.to_dict()["plans"]["plan"]["median_s"]["total"] == m.total


@pytest.mark.gpu
def test_cuda_coexec_exact():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from tensorplan.codl.coexecutor import CudaCoexecutor

    ex = CudaCoexecutor()
    for ops, dim, r in [([OpShape("conv", 33, 20, 8, 16, 3, 1, 1, 1, 1, 1)], "H", 0.5),
                        ([OpShape("conv", 33, 20, 8, 16, 3, 2, 1, 1, 1, 1)], "OC", 0.5),
                        ([OpShape("conv", 33, 20, 8, 8, 3, 1, 1, 1, 1, 1), OpShape("pool", 33, 20, 8, 8, 2, 2)], "H", 0.3)]:
        job = CoexecJob.random(ops, dim, r, relu=True)
        x = np.random.default_rng(0).standard_normal((1, ops[0].ic, ops[0].ih, ops[0].iw)).astype(np.float32)
        st = ex.prepare(job)
        out, rt = ex.run(st, ex.home_input(x))
        ref = reference_output(job, x)
        assert float(np.abs(out.float().cpu().numpy() - ref).max()) <= 1e-3  # TF32 may be on for cuDNN
        assert rt.total > 0
