"""Store: a real SQLite file; idempotent content-keyed writes, schema migration and refusal of
unknown/corrupt files, 4 concurrent writer processes, and a SIGKILLed measuring job that resumes."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

from tensorplan.devices import device
from tensorplan.errors import StoreError
from tensorplan.measure.store import MIGRATIONS, SCHEMA_VERSION, Store, content_key
from tensorplan.measure.timer import Timing, measure


def _timing(x: float) -> Timing:
    return Timing.from_repeats([x, x * 1.01, x * 0.99], warmup=1, method="synthetic for a store test")


def test_wal_mode_and_schema(store):
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.conn.execute("PRAGMA busy_timeout").fetchone()[0] > 0
    assert store.schema_version == SCHEMA_VERSION
    tables = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables >= {"devices", "programs", "measurements", "jobs", "meta"}


def test_program_keys_are_content_hashes(store):
    k1 = store.put_program("tir", {"shape": [1, 2], "op": "add", "n": np.int64(3)})
    k2 = store.put_program("tir", {"op": "add", "n": 3, "shape": (1, 2)})  # same content, other order/types
    k3 = store.put_program("kernel", {"op": "add", "n": 3, "shape": [1, 2]})  # other kind
    assert k1 == k2 != k3 and len(k1) == 64
    assert k1 == content_key("tir", {"n": 3, "op": "add", "shape": [1, 2]})
    assert store.count("programs") == 2
    assert store.get_program(k1) == ("tir", {"n": 3, "op": "add", "shape": [1, 2]})
    with pytest.raises(StoreError, match="no program"):
        store.get_program("0" * 64)
    with pytest.raises(StoreError, match="JSON"):
        store.put_program("tir", {"x": float("nan")})


def test_measurement_roundtrip_and_replace(store):
    dk = store.put_device(device("t4"))
    assert store.put_device(device("t4")) == dk and store.count("devices") == 1
    pk = store.put_program("tir", {"op": "matmul", "m": 64})
    t = measure(lambda: sum(range(2000)), warmup=1, min_repeats=5, max_repeats=5, budget_s=0)
    store.put_measurement(pk, dk, t, extra={"note": "first"})
    got = store.get_measurement(pk, dk)
    assert got["median_s"] == t.median_s and got["cov"] == t.cov and got["method"] == t.method
    assert np.allclose(got["repeats"], t.repeats, rtol=1e-6)  # float32 storage
    assert got["extra"] == {"note": "first"} and got["kind"] == "tir" and got["device"] == "t4"
    store.put_measurement(pk, dk, _timing(1.0), extra={"note": "second"})
    assert store.count("measurements") == 1
    assert store.get_measurement(pk, dk)["median_s"] == 1.0
    store.put_measurement(pk, dk, _timing(2.0), tag="fused")
    assert store.count("measurements") == 2
    assert store.get_measurement(pk, dk, "fused")["median_s"] == 2.0
    assert store.get_measurement(pk, dk, "other") is None
    assert store.get_device("t4").key() == dk


def test_batched_put_is_one_transaction(store):
    dk = store.put_device(device("h100"))
    keys = store.put_programs([("tir", {"i": i}) for i in range(500)])
    store.put_measurements([(k, dk, _timing(1e-3 * (i + 1)), "", {"i": i}) for i, k in enumerate(keys)])
    assert store.count("measurements") == 500
    # one bad row (unknown program) rolls back the whole batch
    bad = [(k, dk, _timing(5.0), "b") for k in keys[:10]] + [("f" * 64, dk, _timing(1.0), "b")]
    with pytest.raises(StoreError, match="unknown program"):
        store.put_measurements(bad)
    assert store.count("measurements") == 500
    assert list(store.measurements(tag="b")) == []


def test_measurements_filters(store):
    d1, d2 = store.put_device(device("t4")), store.put_device(device("sd855-gpu"))
    a = store.put_program("tir", {"a": 1})
    b = store.put_program("subgraph", {"b": 2})
    store.put_measurements([(a, d1, _timing(1)), (b, d1, _timing(2)), (a, d2, _timing(3), "x")])
    assert len(list(store.measurements())) == 3
    assert [m["median_s"] for m in store.measurements(kind="tir")] == [1, 3]
    assert [m["median_s"] for m in store.measurements(device="t4")] == [1, 2]
    assert [m["median_s"] for m in store.measurements(device=d2)] == [3]
    assert [m["payload"] for m in store.measurements(kind="subgraph")] == [{"b": 2}]
    assert [m["median_s"] for m in store.measurements(tag="x")] == [3]


def test_stats_and_parquet_export(store, tmp_path):
    import pyarrow.parquet as pq

    dk = store.put_device(device("a100"))
    keys = store.put_programs([("tir", {"i": i}) for i in range(7)] + [("kernel", {"j": 0})])
    store.put_measurements([(k, dk, _timing(0.5)) for k in keys])
    store.job("j").mark_done("x")
    s = store.stats()
    assert s["programs"] == 8 and s["measurements"] == 8 and s["devices"] == 1
    assert s["programs_by_kind"] == {"kernel": 1, "tir": 7}
    assert list(s["measurements_by_device"].values()) == [8]
    assert s["jobs_done"] == {"j": 1} and s["file_bytes"] > 0 and s["schema_version"] == SCHEMA_VERSION
    files = store.export_parquet(tmp_path / "pq")
    assert set(files) == {"meta", "devices", "programs", "measurements", "jobs"}
    m = pq.read_table(files["measurements"])
    assert m.num_rows == 8 and str(m.schema.field("repeats").type) == "list<element: float>"
    assert m.column("repeats").to_pylist()[0] == pytest.approx([0.5, 0.505, 0.495], rel=1e-6)
    assert pq.read_table(files["programs"]).num_rows == 8


def test_migration_from_v1(tmp_path):
    p = tmp_path / "old.sqlite"
    c = sqlite3.connect(p, isolation_level=None)
    c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    MIGRATIONS[0](c)
    c.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    c.execute("INSERT INTO programs VALUES ('k1', 'tir', '{\"a\":1}', 0)")
    c.close()
    s = Store(p)
    assert s.schema_version == SCHEMA_VERSION
    assert s.get_program("k1") == ("tir", {"a": 1})  # old data kept
    s.job("resumed").mark_done("item")  # table added by migration 2
    assert s.job("resumed").done_keys() == {"item"}


def test_newer_schema_refused(tmp_path):
    p = tmp_path / "new.sqlite"
    Store(p).close()
    c = sqlite3.connect(p)
    c.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    c.commit()
    c.close()
    with pytest.raises(StoreError) as e:
        Store(p)
    assert str(p) in str(e.value) and "99" in str(e.value) and "upgrade" in str(e.value)


def test_corrupt_file_refused(tmp_path):
    p = tmp_path / "junk.sqlite"
    p.write_bytes(b"this is not a database at all " * 200)
    with pytest.raises(StoreError) as e:
        Store(p)
    assert str(p) in str(e.value) and "delete" in str(e.value)


def test_corrupt_pages_refused(tmp_path):
    p = tmp_path / "bad.sqlite"
    s = Store(p)
    dk = s.put_device(device("t4"))
    s.put_measurements([(k, dk, _timing(1)) for k in s.put_programs([("tir", {"i": i}) for i in range(300)])])
    s.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.close()
    data = bytearray(p.read_bytes())
    data[4096:len(data) - 4096] = b"\x5a" * (len(data) - 8192)  # smash every page but the header page
    p.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="bad.sqlite"):
        s2 = Store(p)
        s2.stats()
        list(s2.measurements())


# ---- several writer processes ------------------------------------------------------------------
def _writer(path: str, wid: int, n: int) -> None:
    s = Store(path)
    dk = s.put_device(device("h100"))
    for i in range(n):
        shared = s.put_program("tir", {"shared": i})          # every writer writes these
        own = s.put_program("tir", {"writer": wid, "i": i})   # only this writer
        if i % 2:
            s.put_measurement(own, dk, _timing(wid + i / 1000), tag="own")
        else:
            s.put_measurements([(own, dk, _timing(wid + i / 1000), "own"), (shared, dk, _timing(1.0), f"w{wid}")])
        s.job("writers").mark_done(f"{wid}:{i}")
    s.close()


def test_four_writer_processes(tmp_path):
    path = str(tmp_path / "mp.sqlite")
    Store(path).close()
    n = 60
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, n)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    s = Store(path)
    assert s.count("programs") == n + 4 * n  # shared programs stored once
    own = list(s.measurements(tag="own"))
    assert len(own) == 4 * n
    assert {(m["payload"]["writer"], m["payload"]["i"]) for m in own} == {(w, i) for w in range(4) for i in range(n)}
    for m in own:
        assert m["median_s"] == pytest.approx(m["payload"]["writer"] + m["payload"]["i"] / 1000)
    assert sum(1 for m in s.measurements() if m["tag"].startswith("w")) == 4 * (n // 2)
    assert len(s.job("writers").done_keys()) == 4 * n


# ---- a measuring job killed mid-way, then resumed ------------------------------------------------
_JOB_CHILD = r"""
import sys, time
from tensorplan.measure.store import Store
from tensorplan.measure.timer import measure
from tensorplan.devices import device
path, n, slow = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = Store(path)
dk = s.put_device(device("sd855-cpu"))
job = s.job("measure-loop")
skipped = 0
for i in range(n):
    item = f"item-{i}"
    if job.is_done(item):
        skipped += 1
        continue
    pk = s.put_program("tir", {"loop": i})
    t = measure(lambda: sum(range(200 * (i + 1))), warmup=1, min_repeats=3, max_repeats=3, budget_s=0)
    time.sleep(slow)
    job.record(item, pk, dk, t, extra={"i": i})
    print("done", i, flush=True)
print("skipped", skipped, flush=True)
"""


def test_killed_job_resumes_without_loss_or_duplicates(tmp_path):
    path = str(tmp_path / "job.sqlite")
    n = 40
    p = subprocess.Popen([sys.executable, "-c", _JOB_CHILD, path, str(n), "0.01"], stdout=subprocess.PIPE, text=True)
    reported = []
    for line in p.stdout:
        reported.append(int(line.split()[1]))
        if len(reported) == 15:
            os.kill(p.pid, signal.SIGKILL)
            break
    p.wait(30)
    assert p.returncode == -signal.SIGKILL
    s = Store(path)
    done = s.job("measure-loop").done_keys()
    stored = {m["extra"]["i"]: m for m in s.measurements(kind="tir")}
    # everything reported before the kill is there; at most the one in flight got further
    assert set(reported) <= set(stored) and len(stored) - len(reported) <= 1
    assert done == {f"item-{i}" for i in stored}  # result and done-mark are atomic
    before = {i: (m["created"], m["median_s"]) for i, m in stored.items()}
    s.close()
    r = subprocess.run([sys.executable, "-c", _JOB_CHILD, path, str(n), "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"skipped {len(before)}" in r.stdout
    s = Store(path)
    final = {m["extra"]["i"]: m for m in s.measurements(kind="tir")}
    assert sorted(final) == list(range(n)) and s.count("measurements") == n
    assert all((final[i]["created"], final[i]["median_s"]) == before[i] for i in before)  # not re-measured
    assert len(s.job("measure-loop").done_keys()) == n


# ---- CLI ---------------------------------------------------------------------------------------------
def test_cli_store_stats_and_export(store, tmp_path):
    from typer.testing import CliRunner

    from tensorplan.cli import app

    dk = store.put_device(device("t4"))
    store.put_measurement(store.put_program("tir", {"z": 1}), dk, _timing(0.1))
    r = CliRunner().invoke(app, ["store", "stats", "--store", str(store.path), "--json"])
    assert r.exit_code == 0, r.output
    st = json.loads(r.stdout)
    assert st["measurements"] == 1 and st["schema_version"] == SCHEMA_VERSION
    r = CliRunner().invoke(app, ["store", "export", "--parquet", str(tmp_path / "out"), "--store", str(store.path)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "out" / "measurements.parquet").exists()
    r = CliRunner().invoke(app, ["store", "stats", "--store", str(tmp_path / "missing.sqlite")])
    assert r.exit_code != 0 and isinstance(r.exception, StoreError)


def _forked_put(store: Store, i: int) -> None:
    dk = store.put_device(device("t4"))
    store.put_measurement(store.put_program("tir", {"forked": i}), dk, _timing(i + 1.0))


def test_store_object_survives_fork(store):
    """A Store opened before a fork reconnects in the child instead of sharing the parent's handle."""
    store.put_device(device("t4"))
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_forked_put, args=(store, i)) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    _forked_put(store, 2)  # the parent's own connection still works
    assert sorted(m["payload"]["forked"] for m in store.measurements()) == [0, 1, 2]
