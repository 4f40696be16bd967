"""GPU device domain: CUDA schedules sampled without a GPU, compiled by forked workers, measured
on a GPU (skipped here without one), exported as a dataset with GPU features."""
from __future__ import annotations

import importlib.util
import json
import time

import numpy as np
import pytest

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp import dataset as D
from tensorplan.cdmpp import gpu_dataset as G

pytestmark = pytest.mark.xdist_group("gpu_dataset")


def _small_data(tmp_path, names=("softmax", "layer_norm", "fused_conv2d4_add1_tir_sigmoid1_multiply")):
    """A dataset directory holding only a few tasks of the committed one (sampling all 447 takes minutes)."""
    import pyarrow.parquet as pq
    src = D.default_data_dir()
    if not (src / "tasks.parquet").exists():
        pytest.skip("committed dataset not available")
    t = pq.read_table(src / "tasks.parquet").to_pandas()
    keep = t[t["task_name"].isin(names)].drop_duplicates("task_name")
    d = tmp_path / "data"
    d.mkdir()
    import pyarrow as pa
    pq.write_table(pa.Table.from_pandas(keep, preserve_index=False), d / "tasks.parquet")
    return d, keep


@pytest.fixture(scope="module")
def cuda_programs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu")
    d, keep = _small_data(tmp)
    progs = G.sample_programs("nvidia/nvidia-h100", data=d, programs_per_task=2, workers=2, progress=False,
                              log=lambda s: None)
    return d, keep, progs


def test_sampled_cuda_schedules_are_valid_and_reproducible(cuda_programs, tmp_path):
    d, keep, progs = cuda_programs
    assert {p["task_key"] for p in progs} == set(keep["task_key"])        # every task got programs
    assert all(p["target"] == "nvidia/nvidia-h100" for p in progs)
    # the same call draws the same schedules (seeded per task and index)
    again = G.sample_programs("nvidia/nvidia-h100", data=d, programs_per_task=2, workers=1, progress=False,
                              log=lambda s: None)
    assert [(p["task_key"], p["index"], p["trace"]) for p in again] == [(p["task_key"], p["index"], p["trace"]) for p in progs]
    # round trip through the programs file
    f = G.write_programs(progs, tmp_path / "p.parquet")
    assert G.read_programs(f) == progs


def test_untimed_leaves_out_the_programs_a_dataset_holds(cuda_programs, tmp_path):
    """A later session times only new draws: programs of the dataset (same task, index, target) drop out."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    d, keep, progs = cuda_programs
    timed = progs[::2]
    pq.write_table(pa.table({c: [p[c] for p in timed] for c in ("task_key", "index", "target")}),
                   tmp_path / "programs.parquet")
    left = G.untimed(progs, tmp_path)
    assert left == progs[1::2]
    other = [dict(p, target="nvidia/nvidia-a100") for p in timed]      # another GPU's draws are not timed
    assert G.untimed(other, tmp_path) == other
    with pytest.raises(TensorplanError, match="programs.parquet"):
        G.untimed(progs, tmp_path / "nowhere")
    # the CLI checks the directory before it spends minutes sampling
    from typer.testing import CliRunner
    from tensorplan.cli import app
    t0 = time.perf_counter()
    res = CliRunner().invoke(app, ["predictor", "dataset", "sample", "--skip-timed", str(tmp_path / "nowhere"),
                                   "-o", str(tmp_path / "p.parquet")])
    assert res.exit_code != 0 and "programs.parquet" in str(res.exception) + res.output
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "p.parquet").exists()


def test_cuda_programs_featurise_as_gpu_programs(cuda_programs):
    """Replayed on the task, a CUDA program binds blockIdx/threadIdx: the GPU feature block is set."""
    from tensorplan.cdmpp.features import FEATURE_GROUPS, compact_ast
    from tensorplan.cdmpp.tasks import task_from_script
    d, keep, progs = cuda_programs
    rows = keep.set_index("task_key")
    lo, hi = FEATURE_GROUPS["gpu_threads"]
    for p in progs:
        r = rows.loc[p["task_key"]]
        task = task_from_script(p["task_key"], r["task_name"], r["script"], {}, float(r["flops"]))
        ast = compact_ast(D.replay_trace(task.mod, p["trace"]), is_gpu=D.is_gpu_target(p["target"]))
        f = ast.leaf_features[:, lo:hi]
        assert (f[:, 0] == 1.0).all()                             # is_gpu
        assert f[:, 1:7].max() > 1.0                              # some block/thread extent > 1 (log-scaled)
    assert not D.is_gpu_target(None) and not D.is_gpu_target("llvm") and D.is_gpu_target("cuda")


def test_compile_workers_build_cuda_libraries(cuda_programs, tmp_path):
    """The spawned workers replay and compile CUDA programs into libraries, in order."""
    from tensorplan.cdmpp.prebuild import Prebuilder
    d, keep, progs = cuda_programs
    tasks = G._tasks_table(d)
    with Prebuilder(progs[:2], tasks, progs[0]["target"], tmp_path / "libs", 2) as pre:
        res = list(pre.imap(range(2)))
    assert [k for k, _, _ in res] == [0, 1]
    for _, path, err in res:
        assert (path is not None and (tmp_path / "libs" / path.split("/")[-1]).exists() and not err) \
            or (path is None and err)                             # built, or one named error (never a crash)


def test_measure_gpu_needs_a_gpu_and_a_good_programs_file(cuda_programs, tmp_path):
    d, keep, progs = cuda_programs
    with pytest.raises(TensorplanError, match="does not exist"):
        G.read_programs(tmp_path / "nope.parquet")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(TensorplanError, match="not a readable parquet"):
        G.read_programs(tmp_path / "bad.parquet")
    with pytest.raises(TensorplanError, match="name"):
        G.measure_gpu("local", progs, data=d, store=tmp_path / "s.sqlite", progress=False)
    mixed = progs[:1] + [dict(progs[1], target="nvidia/nvidia-a100")]
    with pytest.raises(TensorplanError, match="mix targets"):
        G.measure_gpu("h100", mixed, data=d, store=tmp_path / "s.sqlite", progress=False)


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("tvm") is None,
                    reason="needs TVM to build the CUDA programs; the lent GPU machine has none "
                           "(bench/gpu_machine_cdmpp.sh carries it)")
def test_measure_gpu_times_programs_on_the_gpu(cuda_programs, tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    d, keep, progs = cuda_programs
    store = tmp_path / "gpu.sqlite"
    st = G.measure_gpu("testgpu", progs, data=d, store=store, workers=2, progress=False, log=lambda s: None)
    assert st.programs >= 1 and st.records == st.programs
    again = G.measure_gpu("testgpu", progs, data=d, store=store, workers=2, progress=False, log=lambda s: None)
    assert again.programs == 0 and again.skipped_done == len(progs)          # resumed: nothing re-measured
    out = D.export(store, tmp_path / "ds", progress=False, workers=1, log=lambda s: None)
    ds = D.load_dataset(out["dir"])
    assert set(ds.records["device"]) == {"testgpu"}
    spec = ds.devices["testgpu"]["spec"]
    assert spec["kind"] == "gpu"
    assert json.loads(json.dumps(spec))["name"] == "testgpu"
    assert np.all(ds.records["latency_s"] > 0)


def test_committed_h100_dataset_holds_gpu_programs():
    """data/cdmpp-h100 (measured on a lent H100, re-timed on a lent H200): two GPU domains with
    their recorded specs over the same programs, every program featurised as a GPU program,
    loadable like the CPU dataset."""
    import pyarrow.parquet as pq
    from tensorplan.cdmpp.features import FEATURE_GROUPS
    d = D.default_data_dir().parent / "cdmpp-h100"
    if not (d / "records.parquet").exists():
        pytest.skip("GPU dataset not available")
    ds = D.load_dataset(d)
    assert len(ds) >= 6000 and set(ds.records["device"]) == {"h100", "h200"}
    spec = ds.devices["h100"]["spec"]
    assert spec["kind"] == "gpu" and "H100" in spec["model"]
    h200 = ds.devices["h200"]["spec"]
    assert h200["kind"] == "gpu" and "H200" in h200["model"] and h200["mem_bw_gbs"] > spec["mem_bw_gbs"]
    on = {d: set(ds.records.prog_idx[ds.records.device == d]) for d in ("h100", "h200")}
    assert len(on["h200"]) >= 3000 and on["h200"] <= on["h100"]                   # the H100's programs
    lo, _ = FEATURE_GROUPS["gpu_threads"]
    assert all(float(leaf[:, lo].min()) == 1.0 for leaf in ds.leaves[:500])      # is_gpu on every leaf
    targets = set(pq.read_table(d / "programs.parquet", columns=["target"]).column("target").to_pylist())
    assert targets == {"nvidia/nvidia-h100"}
    assert (ds.records["latency_s"] > 0).all() and ds.records["latency_s"].median() < 1e-3


def test_cpu_and_gpu_exports_load_as_one_dataset():
    """`--data data/cdmpp,data/cdmpp-h100`: the CPU domains and the H100 in one dataset, programs
    kept apart, tasks shared, each domain's spec kept; one domain in two exports is refused."""
    cpu_dir = D.default_data_dir()
    gpu_dir = cpu_dir.parent / "cdmpp-h100"
    if not (gpu_dir / "records.parquet").exists():
        pytest.skip("GPU dataset not available")
    cpu, gpu = D.load_dataset(cpu_dir), D.load_dataset(gpu_dir)
    both = D.load_dataset(f"{cpu_dir},{gpu_dir}")
    assert len(both) == len(cpu) + len(gpu) == len(both.leaves) == len(both.positions)
    assert set(both.records["device"]) == set(cpu.records["device"]) | {"h100", "h200"}
    assert set(both.devices) == set(cpu.devices) | {"h100", "h200"}
    assert both.devices["h100"]["spec"]["kind"] == "gpu"
    n_cpu_prog = cpu.records["prog_idx"].nunique()
    assert both.records["prog_idx"].nunique() == n_cpu_prog + gpu.records["prog_idx"].nunique()
    assert both.tasks["task_key"].is_unique and set(both.tasks["task_key"]) >= set(gpu.records["task_key"])
    i = len(cpu) + 5                                   # a GPU record keeps its own leaves and label
    assert np.array_equal(both.leaves[i], gpu.leaves[5])
    assert both.records["latency_s"].iloc[i] == gpu.records["latency_s"].iloc[5]
    with pytest.raises(TensorplanError, match="'h100' times [0-9]+ of the same programs"):
        D.load_dataset([gpu_dir, gpu_dir])
