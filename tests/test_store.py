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
from tensorplan.errors import StoreCorruptError, StoreError, StoreFullError, StoreLockedError, StoreReadOnlyError
from tensorplan.measure import store as store_mod
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
    junk = b"this is not a database at all " * 200
    p.write_bytes(junk)
    with pytest.raises(StoreCorruptError) as e:
        Store(p)
    msg = str(e.value)
    assert str(p) in msg and ".recover" in msg and "mv " in msg and "delete" not in msg
    assert p.read_bytes() == junk   # refused, never overwritten


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


# ---- faults told apart: corrupt, read-only, full, locked ----------------------------------------
def _filled(p, n: int = 400) -> tuple[Store, str]:
    s = Store(p)
    dk = s.put_device(device("t4"))
    s.put_measurements([(k, dk, _timing(1)) for k in s.put_programs([("tir", {"i": i, "pad": "x" * 200})
                                                                      for i in range(n)])])
    s.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    s.close()
    return s, dk


def _no_destroy_advice(msg: str) -> None:
    low = msg.lower()
    assert "delete" not in low and "rm " not in low and "remove" not in low, msg


def test_truncated_file_is_corrupt_with_recovery_advice(tmp_path):
    p = tmp_path / "trunc.sqlite"
    _filled(p)
    data = p.read_bytes()[: len(p.read_bytes()) // 2]
    p.write_bytes(data)
    with pytest.raises(StoreCorruptError) as e:
        s = Store(p)
        s.stats()
        list(s.measurements())
    msg = str(e.value)
    assert str(p) in msg and "damaged" in msg and ".recover" in msg and "--store" in msg
    _no_destroy_advice(msg)
    assert p.read_bytes() == data          # nothing written to a damaged file


def test_garbage_mid_file_is_corrupt(tmp_path):
    p = tmp_path / "mid.sqlite"
    _filled(p)
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 8192] = b"\xff" * 8192
    p.write_bytes(bytes(data))
    with pytest.raises(StoreCorruptError) as e:
        s = Store(p)
        s.stats()
        list(s.measurements())
    assert str(p) in str(e.value) and "malformed" in str(e.value)
    _no_destroy_advice(str(e.value))


class _FaultyConn:
    """A real connection whose statements starting with `when` raise `error` (a mocked disk fault)."""

    def __init__(self, conn, when: str, error: Exception):
        self._c, self._when, self._error = conn, when.upper(), error

    def _check(self, sql: str) -> None:
        if sql.lstrip().upper().startswith(self._when):
            raise self._error

    def execute(self, sql, *a):
        self._check(sql)
        return self._c.execute(sql, *a)

    def executemany(self, sql, *a):
        self._check(sql)
        return self._c.executemany(sql, *a)

    def __getattr__(self, name):
        return getattr(self._c, name)


def _inject(s: Store, when: str, error: Exception) -> None:
    s._local.conn = _FaultyConn(s.conn, when, error)


@pytest.mark.parametrize("when", ["INSERT", "COMMIT"])
def test_full_disk_rolls_back_and_keeps_data(tmp_path, when):
    p = tmp_path / "full.sqlite"
    _, dk = _filled(p, 50)
    s = Store(p)
    before = (s.count("programs"), s.count("measurements"))
    _inject(s, when, sqlite3.OperationalError("database or disk is full"))
    with pytest.raises(StoreFullError) as e:
        s.put_measurements([(k, dk, _timing(2), "new") for k in s.put_programs([("tir", {"new": i})
                                                                                 for i in range(20)])])
    msg = str(e.value)
    assert str(p) in msg and "full" in msg and "$TENSORPLAN_STORE" in msg and "intact" in msg
    _no_destroy_advice(msg)
    s.close()
    s = Store(p)   # nothing half-written: the failed transaction left no row
    assert (s.count("programs"), s.count("measurements")) == before
    assert list(s.measurements(tag="new")) == []
    s.close()


def test_full_disk_on_a_small_file_system(tmp_path):
    """A real 512 KiB tmpfs (needs root and CAP_SYS_ADMIN; skipped elsewhere: the mocked tests above
    cover the same path)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root or no CAP_SYS_ADMIN)")
    try:
        p = mnt / "s.sqlite"
        s = Store(p)
        committed = 0
        with pytest.raises(StoreFullError) as e:
            for b in range(1000):
                s.put_programs([("tir", {"b": b, "i": i, "pad": "y" * 300}) for i in range(50)])
                committed += 50
        assert str(p) in str(e.value) and "full" in str(e.value)
        _no_destroy_advice(str(e.value))
        s.close()
        s = Store(p)
        assert s.count("programs") == committed > 0     # every committed batch kept, the failed one absent
        s.close()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_in_nested_job_record_is_atomic(tmp_path):
    p = tmp_path / "fulljob.sqlite"
    _, dk = _filled(p, 5)
    s = Store(p)
    pk = s.put_program("tir", {"job": 1})
    _inject(s, "COMMIT", sqlite3.OperationalError("database or disk is full"))
    with pytest.raises(StoreFullError):
        s.job("j").record("item", pk, dk, _timing(3))
    s.close()
    s = Store(p)
    assert not s.job("j").is_done("item") and s.get_measurement(pk, dk) is None
    s.close()


def test_read_only_directory(tmp_path, monkeypatch):
    d = tmp_path / "ro"
    d.mkdir()
    p = d / "s.sqlite"
    _filled(p, 5)
    if os.geteuid() != 0:   # a real read-only directory (root ignores the mode bits: mock it instead)
        os.chmod(d, 0o555)
        try:
            with pytest.raises(StoreReadOnlyError) as e:
                s = Store(p)
                s.put_program("tir", {"ro": 1})
            new = d / "sub" / "new.sqlite"
            with pytest.raises(StoreReadOnlyError) as e2:
                Store(new)
        finally:
            os.chmod(d, 0o755)
    else:
        s = Store(p)
        _inject(s, "INSERT", sqlite3.OperationalError("attempt to write a readonly database"))
        with pytest.raises(StoreReadOnlyError) as e:
            s.put_program("tir", {"ro": 1})
        s.close()

        def no_mkdir(self, *a, **k):
            raise PermissionError(13, "Permission denied", str(self))

        monkeypatch.setattr(store_mod.Path, "mkdir", no_mkdir)
        with pytest.raises(StoreReadOnlyError) as e2:
            Store(d / "sub" / "new.sqlite")
        monkeypatch.undo()

        def cannot_open(*a, **k):
            raise sqlite3.OperationalError("unable to open database file")

        monkeypatch.setattr(store_mod.sqlite3, "connect", cannot_open)
        with pytest.raises(StoreReadOnlyError) as e3:
            Store(p)
        monkeypatch.undo()
        assert str(p) in str(e3.value)
    for err in (e.value, e2.value):
        msg = str(err)
        assert "ro" in msg and "$TENSORPLAN_STORE" in msg and "writable" in msg
        _no_destroy_advice(msg)
    assert str(p) in str(e.value)
    s = Store(p)
    assert s.count("programs") == 5 and not s.has_program(content_key("tir", {"ro": 1}))
    s.close()


def test_locked_store_names_the_lock_and_writes_nothing(tmp_path, monkeypatch):
    p = tmp_path / "locked.sqlite"
    _filled(p, 5)
    monkeypatch.setattr(store_mod, "BUSY_TIMEOUT_MS", 200)
    other = sqlite3.connect(p, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")            # another writer holds the write lock
    try:
        s = Store.__new__(Store)                # opened before the lock would also work; reads still do
        s.path, s._local = p, store_mod.threading.local()
        assert s.count("programs") == 5         # WAL: readers are not blocked
        with pytest.raises(StoreLockedError) as e:
            s.put_program("tir", {"locked": 1})
        msg = str(e.value)
        assert str(p) in msg and "locked" in msg and "0.2 s" in msg and "--store" in msg
        _no_destroy_advice(msg)
    finally:
        other.execute("ROLLBACK")
        other.close()
    s.put_program("tir", {"locked": 1})         # lock released: the write goes through
    assert s.count("programs") == 6
    s.close()


def test_corrupt_write_and_unknown_faults(tmp_path):
    p = tmp_path / "w.sqlite"
    _filled(p, 3)
    s = Store(p)
    _inject(s, "INSERT", sqlite3.DatabaseError("database disk image is malformed"))
    with pytest.raises(StoreCorruptError):
        s.put_program("tir", {"x": 1})
    s._local.conn = s._local.conn._c
    _inject(s, "INSERT", sqlite3.OperationalError("disk I/O error"))
    with pytest.raises(StoreError, match="input/output error") as e:
        s.put_program("tir", {"x": 2})
    _no_destroy_advice(str(e.value))
    s.close()
    assert Store(p).count("programs") == 3


def test_cli_store_fault_is_one_line(tmp_path, monkeypatch, capsys):
    from tensorplan.cli import main

    p = tmp_path / "mid.sqlite"
    _filled(p)
    data = bytearray(p.read_bytes())
    data[len(data) // 2: len(data) // 2 + 8192] = b"\x00\xff" * 4096
    p.write_bytes(bytes(data))
    monkeypatch.setattr(sys, "argv", ["tensorplan", "store", "stats", "--store", str(p)])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and str(p) in err and ".recover" in err


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
