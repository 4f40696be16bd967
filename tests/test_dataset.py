"""CDMPP dataset: task extraction from a real ONNX network, schedule sampling, replayable traces,
a real (tiny) collection at 1 and 2 threads with resume, export/load, splits, and the committed data."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")

from tensorplan.cdmpp import dataset as D  # noqa: E402
from tensorplan.cdmpp import features as F  # noqa: E402
from tensorplan.cdmpp import tasks as T  # noqa: E402


@pytest.fixture(scope="module")
def mlp_tasks():
    return T.extract_tasks(["tiny-mlp"])


def test_extract_tasks_counts_call_sites(mlp_tasks):
    assert len(mlp_tasks) >= 2
    for t in mlp_tasks:
        assert list(t.mod.functions.keys())[0].name_hint == "main"
        assert t.networks.get("tiny-mlp", 0) >= 1
    assert any("matmul" in t.name for t in mlp_tasks)
    assert any(t.flops > 0 for t in mlp_tasks)
    # structural dedup: re-extracting gives the same keys
    assert sorted(t.key for t in T.extract_tasks(["tiny-mlp"])) == sorted(t.key for t in mlp_tasks)
    # round trip through the stored TVMScript keeps the structure (same key)
    t = mlp_tasks[0]
    t2 = T.task_from_script(t.key, t.name, t.script(), t.networks)
    assert T._struct_key(t2.mod["main"]) == t.key


def test_trace_replay_reproduces_tir(mlp_tasks):
    import tvm_ffi
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    task = max(mlp_tasks, key=lambda t: t.flops)
    state = D._TaskState(task, target)
    got = 0
    for i in range(6):
        r = D.sample_schedule(state, i)
        if r is None:
            continue
        sch, _ = r
        js = json.dumps(D.trace_json(sch))                  # what the store keeps
        again = D.replay_trace(task.mod, json.loads(js))
        assert tvm_ffi.structural_equal(sch.mod, again.mod)
        np.testing.assert_array_equal(F.compact_ast(sch).leaf_features, F.compact_ast(again).leaf_features)
        # the same sample index gives the same program (deterministic seeds -> resumable collection)
        sch2, _ = D.sample_schedule(state, i)
        assert tvm_ffi.structural_equal(sch.mod, sch2.mod)
        got += 1
    assert got >= 3


def _collect_in_fresh_process(store, **kw) -> dict:
    """`D.collect(['tiny-mlp'], store=store, **kw)` in a fresh process, its stats. Fresh: TVM's
    runtime pool size is fixed by the first kernel run in a process, and other tests in this worker
    may already have run kernels with a 1-thread pool."""
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    code = ("import json; from tensorplan.cdmpp import dataset as D; "
            f"st = D.collect(['tiny-mlp'], store={str(store)!r}, {args}, progress=False, log=lambda s: None); "
            "print(json.dumps(st.to_dict()))")
    return json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                                     timeout=600).stdout.strip().splitlines()[-1])


def test_collect_export_load_roundtrip(tmp_path):
    store = tmp_path / "s.sqlite"
    kw = dict(programs_per_task=2, threads=(1, 2), batch=2)
    st = _collect_in_fresh_process(store, **kw)
    assert st["programs"] >= 4 and st["records"] == 2 * st["programs"]
    again = _collect_in_fresh_process(store, **kw)
    assert again["programs"] == 0 and again["skipped_done"] >= st["programs"]   # resumed: nothing redone
    from tensorplan.measure.store import Store
    ms = list(Store(store).measurements(kind=D.PROGRAM_KIND))
    assert {m["device"] for m in ms} == {"local-1t", "local-2t"}
    assert {m["threads"] for m in ms} == {1, 2}                                # the pool really changed size
    assert all(len(m["repeats"]) >= 3 and m["median_s"] > 0 for m in ms)

    out = tmp_path / "data"
    info = D.export(store, out, progress=False, log=lambda s: None)
    assert info["records"] == len(ms)
    ds = D.load_dataset(out)
    r = ds.records
    for col in ("record_id", "task_key", "task_name", "networks", "device", "device_key", "latency_s", "cov",
                "repeats", "flops", "n_leaves", "trace", "sample_index"):
        assert col in r.columns
    assert len(ds.leaves) == len(r) == len(ds.positions)
    for i in range(len(r)):
        assert ds.leaves[i].shape == (r["n_leaves"][i], 164)
        assert len(ds.positions[i]) == r["n_leaves"][i]
        pre = ds.preorders[i]
        assert all(pre[p] >= 0 and pre[p + 1] == -1 for p in ds.positions[i])   # positions point at leaves
    assert all(dict(n).get("tiny-mlp", 0) >= 1 for n in r["networks"])
    # the stored trace replays to the program whose features were stored
    sch = D.record_schedule(ds, 0)
    np.testing.assert_allclose(F.compact_ast(sch).leaf_features, ds.leaves[0], rtol=2e-3, atol=2e-2)
    # splits
    tr, te_ = ds.split("device", holdout="local-2t")
    assert set(te_.records["device"]) == {"local-2t"} and set(tr.records["device"]) == {"local-1t"}
    tr, te_ = ds.split("sample")
    assert len(tr) + len(te_) == len(ds) and abs(len(te_) - len(ds) / 5) <= 1
    tr, te_ = ds.split("task", seed=0, test_fraction=0.5)
    assert not set(tr.records["task_key"]) & set(te_.records["task_key"])
    st_ = ds.filter_stable(max_cov=0.5)
    assert (st_.records["cov"] <= 0.5).all()
    nl = ds.network_latencies(max_cov=None)
    assert set(nl) == {("tiny-mlp", "local-1t"), ("tiny-mlp", "local-2t")}
    r1 = ds.records[ds.records["device"] == "local-1t"]
    calls = {t: dict(n)["tiny-mlp"] for t, n in zip(ds.tasks.task_key, ds.tasks.networks)}
    exp = sum(c * r1[r1.task_key == k].latency_s.min() for k, c in calls.items())
    assert nl[("tiny-mlp", "local-1t")] == pytest.approx(exp)
    # the untuned network: each kernel's lowest-numbered sample
    first = ds.network_latencies(max_cov=None, program="first")
    exp = sum(c * r1[r1.task_key == k].sort_values("sample_index").latency_s.iloc[0] for k, c in calls.items())
    assert first[("tiny-mlp", "local-1t")] == pytest.approx(exp) and exp >= nl[("tiny-mlp", "local-1t")]


def test_collect_on_another_cpu_names_its_own_domains(tmp_path):
    """`dataset collect --prefix zen4`: records of another CPU than the dataset's become domains
    zen4-<N>t with this machine's spec, under their own resumable job; 'local' is refused."""
    from tensorplan.errors import TensorplanError
    from tensorplan.measure.store import Store
    store = tmp_path / "s.sqlite"
    st = _collect_in_fresh_process(store, programs_per_task=1, threads=(1,), batch=1, prefix="testcpu")
    assert st["programs"] >= 2 and st["records"] == st["programs"]
    ms = list(Store(store).measurements(kind=D.PROGRAM_KIND))
    assert {m["device"] for m in ms} == {"testcpu-1t"} and len(ms) == st["records"]
    specs = D.local_specs([1, 2], "testcpu")
    assert [s.name for s in specs.values()] == ["testcpu-1t", "testcpu-2t"] and specs[2].threads == 2
    with pytest.raises(TensorplanError, match="collect: prefix 'local'"):
        D.local_specs([1], "local")


def test_second_pass_times_only_what_an_export_lacks(tmp_path):
    """`collect --exclude-data DIR --min-task-flops F`: the pass over what a first collection skipped
    (its programs over the time cap). Programs the export timed are not sampled again, tasks under F
    FLOPs are left out, and the new programs load together with the export's."""
    from tensorplan.errors import TensorplanError
    first, second = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    _collect_in_fresh_process(first, programs_per_task=2, threads=(1,), batch=2)
    D.export(first, tmp_path / "a", progress=False, log=lambda s: None)
    have = D.timed_programs(tmp_path / "a")
    assert have and {i for _, i in have} <= {0, 1}
    tasks = D.load_dataset(tmp_path / "a").tasks
    flops = sorted(tasks["flops"])
    cut = flops[len(flops) // 2]                       # the larger half of tiny-mlp's tasks
    st = _collect_in_fresh_process(second, programs_per_task=3, threads=(1,), batch=3, exclude=have,
                                   min_task_flops=cut)
    assert st["programs"] >= 1
    D.export(second, tmp_path / "b", progress=False, log=lambda s: None)
    got = D.timed_programs(tmp_path / "b")
    assert got and not got & have                      # nothing timed twice
    big = set(tasks.loc[tasks["flops"] >= cut, "task_key"])
    assert {k for k, _ in got} <= big
    both = D.load_dataset(f"{tmp_path / 'a'},{tmp_path / 'b'}")
    assert len(both.records) == len(D.load_dataset(tmp_path / "a").records) + len(D.load_dataset(tmp_path / "b").records)
    with pytest.raises(TensorplanError, match="no programs.parquet"):
        D.timed_programs(tmp_path)


@pytest.mark.parametrize("name,domains", [("cdmpp-big-zen4", {"zen4-1t", "zen4-2t"}),
                                          ("cdmpp-big-zen5", {"local-1t", "local-2t"})])
def test_programs_over_the_time_cap_join_the_dataset(name, domains):
    """data/cdmpp-big-zen4 and -zen5 (`collect --exclude-data data/cdmpp --max-kernel-ms 2000` on the
    Zen 4 VM, and on a VM of the collection CPU's type): programs the dataset skipped as slower than
    0.1 s, none of them a program it timed, loading as more records of its zen4 / local domains."""
    big_dir = D.default_data_dir().parent / name
    ds = _committed_or_skip()
    if not (big_dir / "records.parquet").exists():
        pytest.skip(f"data/{name} not available")
    big = D.load_dataset(big_dir)
    assert set(big.records["device"]) == domains
    assert (big.records["latency_s"] > 0.1).mean() > 0.5 and big.records["flops"].min() >= 1e8
    assert not D.timed_programs(big_dir) & D.timed_programs(D.default_data_dir())
    both = D.load_dataset(f"{D.default_data_dir()},{big_dir}")
    assert len(both.records) == len(ds.records) + len(big.records)


def test_new_tasks_of_a_known_domain_load_with_the_dataset():
    """data/cdmpp-datamove-zen4 (datamove-grid collected on the Zen 4 VM, `collect --prefix zen4`)
    joins the dataset's zen4 domains: different programs, so both parts' records stay, under the
    first part's device spec; the same programs twice are refused."""
    from tensorplan.errors import TensorplanError
    grid_dir = D.default_data_dir().parent / "cdmpp-datamove-zen4"
    ds = _committed_or_skip()
    if not (grid_dir / "records.parquet").exists():
        pytest.skip("data/cdmpp-datamove-zen4 not available")
    grid = D.load_dataset(grid_dir)
    assert set(grid.records["device"]) == {"zen4-1t", "zen4-2t"}
    assert {n for v in grid.records["networks"] for n, _ in v} == {"datamove-grid"}
    both = D.load_dataset(f"{D.default_data_dir()},{grid_dir}")
    for dev in ("zen4-1t", "zen4-2t"):
        assert (both.records["device"] == dev).sum() == (ds.records["device"] == dev).sum() + (grid.records["device"] == dev).sum()
    assert both.devices["zen4-1t"] == ds.devices["zen4-1t"]
    assert not set(grid.records["task_key"]) & set(ds.records["task_key"])
    with pytest.raises(TensorplanError, match="'zen4-1t' times [0-9]+ of the same programs"):
        D.load_dataset([grid_dir, grid_dir])


def test_two_thread_domain_really_uses_two_threads(tmp_path):
    """local-2t must run parallel loops on 2 workers (regression: a pool configured down to 1 thread
    before first use ran '2-thread' kernels on one worker). Fresh process; each iteration of a
    parallel loop calls back into Python and records its OS thread, so the check does not depend on
    timing (a busy neighbour core cannot make it flaky)."""
    code = r"""
import threading, numpy as np, tvm, tvm_ffi
from tvm.script import tirx as T
from tensorplan.cdmpp import dataset as D
D.init_pool(2)
ids = set()
def record(i):
    ids.add(threading.get_ident())
    return 0
tvm_ffi.register_global_func("tp_test.record_thread", record)
@T.prim_func
def f(A: T.Buffer((64,), "int32")):
    for i in T.parallel(64):
        A[i] = T.call_packed("tp_test.record_thread", i)
lib = tvm.compile(tvm.IRModule({"main": f}), target=tvm.target.Target({"kind": "llvm", "num-cores": 2})).jit()
a = tvm.runtime.tensor(np.zeros(64, "int32"))
seen = []
for n in (1, 2):
    ids.clear()
    D._time_lib(lib, [a], [n], min_repeat_s=1e-6, max_kernel_s=0.5, repeats=3)
    seen.append(len(ids))
print(*seen)
"""
    probe = tmp_path / "probe.py"          # a file, not -c: TVMScript reads the function's source
    probe.write_text(code)
    out = subprocess.run([sys.executable, str(probe)], check=True, capture_output=True, text=True, timeout=300)
    one, two = map(int, out.stdout.strip().splitlines()[-1].split())
    assert one == 1, f"the 1-thread domain ran its parallel loop on {one} threads"
    assert two == 2, f"the 2-thread domain ran its parallel loop on {two} thread(s): the second worker is not used"


def test_split_by_network_holds_out_unseen_tasks(tmp_path):
    ds = _committed_or_skip()
    nets = sorted({k for v in ds.tasks["networks"] for k, _ in v})
    tr, te_ = ds.split("network", holdout=nets[0])
    assert len(te_) > 0
    assert not set(tr.records["task_key"]) & set(te_.records["task_key"])
    assert all(any(k == nets[0] for k, _ in v) for v in te_.records["networks"])


def _committed_or_skip():
    try:
        return D.load_dataset()
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"committed dataset not available: {e}")


def test_stats_reports_tuned_and_untuned_network_latency():
    """`dataset stats --json`: per network, the sum over kernels of the fastest program and of the
    first design-space sample; the first can never beat the fastest, and sampling 64 schedules of
    each kernel must pay off on the median network."""
    from typer.testing import CliRunner

    from tensorplan.cli import app
    from tensorplan.errors import TensorplanError
    ds = _committed_or_skip()
    r = CliRunner().invoke(app, ["predictor", "dataset", "stats", "--metric", "mad", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)
    fast, first = s["network_latency_s"], s["network_latency_first_sample_s"]
    assert set(fast) == set(first) and len(fast) >= 16
    assert all(first[k] >= fast[k] * (1 - 1e-12) for k in fast)
    assert s["first_sample_slowdown_median"] > 1.2
    with pytest.raises(TensorplanError, match="fastest' or 'first"):
        ds.network_latencies(program="best")


def test_committed_dataset_is_consistent():
    ds = _committed_or_skip()
    s = ds.stats()
    assert s["n_networks"] >= 8 and s["tasks_total"] >= 200
    assert {"local-1t", "local-2t"} <= set(s["devices"])
    # every domain carries the spec of the machine that measured it, and different CPUs have different keys
    specs = {n: d["spec"] for n, d in ds.devices.items()}
    assert set(specs) == set(s["devices"]) and all(specs.values())
    keys = {n: d["key"] for n, d in ds.devices.items()}
    assert len(set(keys.values())) == len(keys)
    r = ds.records
    assert (r["latency_s"] > 0).all() and np.isfinite(r["cov"]).all()
    assert all(ds.leaves[i].shape[1] == 164 for i in range(0, len(r), max(1, len(r) // 50)))
    # replaying a committed trace reproduces the committed features
    rng = np.random.default_rng(0)
    for i in rng.choice(len(r), size=3, replace=False):
        sch = D.record_schedule(ds, int(i))
        np.testing.assert_allclose(F.compact_ast(sch).leaf_features, ds.leaves[int(i)], rtol=2e-3, atol=2e-2)


def test_measure_device_merges_a_new_domain(tmp_path):
    """Dataset programs re-timed on this machine become new domains <prefix>-Nt with their own
    recorded spec; the run resumes; merging twice does not duplicate; features come from the record."""
    import shutil
    from tensorplan.devices.spec import DeviceSpec
    from tensorplan.cdmpp.arrays import as_arrays, device_features
    src = D.default_data_dir()
    if not (src / "records.parquet").exists():
        pytest.skip("committed dataset not available")
    data = tmp_path / "data"
    shutil.copytree(src, data)
    store = tmp_path / "dev.sqlite"
    code = ("import json, sys; from tensorplan.cdmpp import dataset as D; "
            f"st = D.measure_device('testcpu', data={str(data)!r}, store=sys.argv[3], programs_per_task=1, "
            "budget_minutes=float(sys.argv[2]), progress=False, workers=int(sys.argv[1]), log=lambda s: None); "
            "print(json.dumps(st.to_dict()))")
    def run(workers: int, minutes: float = 0.1, store=store) -> dict:
        out = subprocess.run([sys.executable, "-c", code, str(workers), str(minutes), str(store)], check=True,
                             capture_output=True, text=True, timeout=600).stdout
        return json.loads(out.strip().splitlines()[-1])
    first = run(1)
    assert first["programs"] >= 3 and first["records"] == 2 * first["programs"]
    # compiled ahead by 2 forked workers (prebuild); a longer budget, as their first builds start cold
    second = run(2, 0.3)
    assert second["skipped_done"] >= first["programs"] + first["too_slow"]          # resumed
    assert second["programs"] >= 1 and second["records"] == 2 * second["programs"]
    info = D.merge_device("testcpu", data=data, store=store, log=lambda s: None)
    again = D.merge_device("testcpu", data=data, store=store, log=lambda s: None)
    assert info["records"] == again["records"]                                      # replaced, not appended twice
    ds = D.load_dataset(data)
    new = ds.records[ds.records["device"].str.startswith("testcpu-")]
    assert set(new["device"]) == {"testcpu-1t", "testcpu-2t"}
    assert len(new) == 2 * (first["programs"] + second["programs"])
    # the same programs as the committed records: their features are shared, only latencies are new
    old = ds.records[ds.records["device"] == "local-1t"].set_index("prog_idx")
    assert set(new["prog_idx"]) <= set(old.index)
    assert (new["latency_s"] > 0).all()
    spec = DeviceSpec.from_dict(ds.devices["testcpu-1t"]["spec"])
    assert spec.name == "testcpu-1t" and spec.threads == 1 and spec.measured
    # a recorded domain is described by its recorded spec, whatever machine runs this
    rec = ds.devices["local-1t"]["spec"]
    np.testing.assert_allclose(device_features("local-1t", ds.devices),
                               DeviceSpec.from_dict(rec).feature_vector(), rtol=1e-6)
    sub = ds.subset(np.flatnonzero(ds.records["device"].to_numpy() == "testcpu-2t"))
    arr = as_arrays(sub)
    np.testing.assert_allclose(arr.device[0], device_features("testcpu-2t", ds.devices), rtol=1e-6)
    with pytest.raises(Exception, match="measure-device"):
        D.merge_device("nothere", data=data, store=store, log=lambda s: None)
    # a later session (another machine of the same kind, a fresh store) times only programs the
    # dataset does not hold yet, and merging it keeps the earlier records
    first_spec = D.load_dataset(data).devices["testcpu-1t"]["spec"]
    third = run(1, 0.1, tmp_path / "dev2.sqlite")
    assert third["skipped_done"] == first["programs"] + second["programs"] and third["programs"] >= 1
    more = D.merge_device("testcpu", data=data, store=tmp_path / "dev2.sqlite", log=lambda s: None)
    assert more["records"] == info["records"] + 2 * third["programs"]
    ds2 = D.load_dataset(data)
    both = ds2.records[ds2.records["device"] == "testcpu-1t"]
    assert len(both) == first["programs"] + second["programs"] + third["programs"]
    assert both["prog_idx"].is_unique
    assert ds2.devices["testcpu-1t"]["spec"] == first_spec       # the domain keeps its first spec
    # records of another CPU model cannot join a domain
    meta = json.loads((data / "meta.json").read_text())
    meta["devices"]["testcpu-1t"]["spec"]["model"] = "Some Other CPU"
    (data / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(Exception, match="Some Other CPU"):
        D.merge_device("testcpu", data=data, store=tmp_path / "dev2.sqlite", log=lambda s: None)
    assert len(D.load_dataset(data).records) == more["records"]               # nothing written


def test_merge_gpu_adds_a_second_gpu_of_the_same_programs(tmp_path):
    """Programs of the GPU dataset re-timed on another GPU (`measure-gpu` over its programs.parquet)
    join that dataset as a new domain: the store's program keys are the dataset's prog_keys, the
    other domains' records stay, re-merging replaces, and programs of another dataset are refused."""
    import dataclasses
    import shutil
    from tensorplan.devices.catalog import lookup
    from tensorplan.measure.store import Store
    from tensorplan.measure.timer import Timing
    from tensorplan.cdmpp.gpu_dataset import read_programs
    src = D.default_data_dir().parent / "cdmpp-h100"
    if not (src / "records.parquet").exists():
        pytest.skip("committed GPU dataset not available")
    data = tmp_path / "gpu"
    shutil.copytree(src, data)
    progs = read_programs(data / "programs.parquet")[:5]
    st = Store(tmp_path / "gpu.sqlite")
    dev = st.put_device(dataclasses.replace(lookup("h200-sxm"), name="testgpu"))
    rows = []
    for i, p in enumerate(progs):
        payload = {k: p[k] for k in ("task_key", "index", "space", "seed", "target")}
        payload["trace"] = json.loads(p["trace"])
        t = Timing.from_repeats([1e-5 * (i + 1)] * 5, warmup=1, number=100, method="test")
        rows.append((st.put_program(D.PROGRAM_KIND, payload), dev, t, D.TAG, {"timer": D.TIMER_VERSION}))
    st.put_measurements(rows)
    before = D.load_dataset(data)
    info = D.merge_gpu("testgpu", data=data, store=st, log=lambda s: None)
    again = D.merge_gpu("testgpu", data=data, store=st, log=lambda s: None)
    assert info["records_added"] == 5 and again["records"] == info["records"] == len(before.records) + 5
    ds = D.load_dataset(data)
    new = ds.records[ds.records["device"] == "testgpu"]
    assert (ds.records["device"] != "testgpu").sum() == len(before.records)         # others kept
    got = dict(zip(new["prog_key"], new["latency_s"]))
    want = {k: 1e-5 * (i + 1) for i, (k, *_) in enumerate(rows)}
    assert got.keys() == want.keys() and all(abs(got[k] - want[k]) < 1e-12 for k in want)
    assert ds.devices["testgpu"]["spec"]["mem_bw_gbs"] == 4800
    with pytest.raises(Exception, match="measure-gpu --name h300"):
        D.merge_gpu("h300", data=data, store=st, log=lambda s: None)
    # the CLI: the same merge by name, a missing store named with the command that writes one
    from typer.testing import CliRunner
    from tensorplan.cli import app
    res = CliRunner().invoke(app, ["predictor", "dataset", "merge-gpu", "--name", "testgpu", "--data", str(data),
                                   "--store", str(tmp_path / "gpu.sqlite"), "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["records"] == again["records"]
    res = CliRunner().invoke(app, ["predictor", "dataset", "merge-gpu", "--name", "testgpu", "--data", str(data),
                                   "--store", str(tmp_path / "nope.sqlite")])
    assert res.exit_code != 0 and "measure-gpu" in str(res.exception or res.output)
    other = dict(payload, seed=-1)
    st.put_measurements([(st.put_program(D.PROGRAM_KIND, other), dev, t, D.TAG, {"timer": D.TIMER_VERSION})])
    with pytest.raises(Exception, match="not in"):
        D.merge_gpu("testgpu", data=data, store=st, log=lambda s: None)
