"""The measurement store: one SQLite file (WAL mode) holding devices, programs, measurements and job
progress, keyed by content hashes so every write is idempotent.

Why SQLite/WAL: standard library, one file to copy, readers never block the writer, several processes
can write (each transaction takes the write lock; `busy_timeout` makes the others wait instead of
failing). Why content hashes: the same program measured twice on the same device lands on the same
row (re-put replaces), so a crashed and resumed job never duplicates records. Why jobs: a measuring
loop marks each finished item in the same transaction as its measurement, so a SIGKILL loses at most
the item in flight and a rerun skips everything already done.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from tensorplan.devices.spec import DeviceSpec
from tensorplan.errors import (StoreCorruptError, StoreError, StoreFullError, StoreLockedError,
                               StoreReadOnlyError, TensorplanError)
from tensorplan.paths import default_store_path
from tensorplan.measure.timer import Timing

BUSY_TIMEOUT_MS = 60_000


# -------------------------------------------------------------------------------------------------
# content hashing
# -------------------------------------------------------------------------------------------------
def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "to_dict"):
        return o.to_dict()
    raise TypeError(f"{type(o).__name__} is not JSON-serialisable")


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces, numpy values as python, NaN/inf refused."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                          default=_json_default)
    except (TypeError, ValueError) as e:
        raise StoreError(f"store: payload cannot be stored as canonical JSON ({e}); "
                         "use dicts/lists/str/int/finite floats/numpy values") from None


def content_key(kind: str, payload: Any) -> str:
    """sha256 hex of `kind` + canonical JSON of `payload`: the program key."""
    return hashlib.sha256(f"{kind}\n{canonical_json(payload)}".encode()).hexdigest()


# -------------------------------------------------------------------------------------------------
# schema and migrations (applied in order; schema_version = number applied)
# -------------------------------------------------------------------------------------------------
def _script(c: sqlite3.Connection, sql: str) -> None:
    """Run ;-separated DDL inside the caller's transaction (executescript would COMMIT first)."""
    for stmt in sql.split(";"):
        if stmt.strip():
            c.execute(stmt)


def _m1_initial(c: sqlite3.Connection) -> None:
    _script(c, """
        CREATE TABLE IF NOT EXISTS devices (
            dev_key TEXT PRIMARY KEY, name TEXT NOT NULL, kind TEXT NOT NULL, spec TEXT NOT NULL,
            created REAL NOT NULL);
        CREATE TABLE IF NOT EXISTS programs (
            prog_key TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT NOT NULL, created REAL NOT NULL);
        CREATE TABLE IF NOT EXISTS measurements (
            prog_key TEXT NOT NULL REFERENCES programs(prog_key),
            dev_key TEXT NOT NULL REFERENCES devices(dev_key),
            tag TEXT NOT NULL DEFAULT '',
            median_s REAL NOT NULL, mean_s REAL, min_s REAL, cov REAL, n_repeats INTEGER,
            repeats BLOB, warmup INTEGER, number INTEGER, threads INTEGER, method TEXT, extra TEXT,
            created REAL NOT NULL,
            PRIMARY KEY (prog_key, dev_key, tag));
    """)


def _m2_jobs_and_indexes(c: sqlite3.Connection) -> None:
    _script(c, """
        CREATE TABLE IF NOT EXISTS jobs (
            job TEXT NOT NULL, item_key TEXT NOT NULL, done_at REAL NOT NULL, PRIMARY KEY (job, item_key));
        CREATE INDEX IF NOT EXISTS programs_kind ON programs(kind);
        CREATE INDEX IF NOT EXISTS measurements_dev ON measurements(dev_key, tag);
        CREATE INDEX IF NOT EXISTS devices_name ON devices(name);
    """)


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_m1_initial, _m2_jobs_and_indexes]
SCHEMA_VERSION = len(MIGRATIONS)

_MEAS_COLS = ("prog_key", "dev_key", "tag", "median_s", "mean_s", "min_s", "cov", "n_repeats", "repeats",
              "warmup", "number", "threads", "method", "extra", "created")


def encode_repeats(repeats: Iterable[float]) -> bytes:
    """Repeats as little-endian float32 (4 bytes each; 7 significant digits is plenty for latencies)."""
    return np.asarray(list(repeats), dtype="<f4").tobytes()


def decode_repeats(blob: bytes | None) -> list[float]:
    return [] if not blob else np.frombuffer(blob, dtype="<f4").astype(float).tolist()


# -------------------------------------------------------------------------------------------------
# faults: each SQLite / OS failure becomes one StoreError subclass naming the file and what to do
# -------------------------------------------------------------------------------------------------
_CORRUPT_CODES = {"SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_CORRUPT_INDEX", "SQLITE_CORRUPT_SEQUENCE",
                  "SQLITE_CORRUPT_VTAB", "SQLITE_IOERR_SHORT_READ"}
_CORRUPT_TEXT = ("malformed", "not a database", "file is encrypted", "could not decode", "corrupt")
_FULL_TEXT = ("disk is full", "database or disk is full", "no space left")
_READONLY_TEXT = ("readonly database", "read-only", "unable to open database file", "permission denied",
                  "access permission denied", "attempt to write a readonly")
_LOCKED_TEXT = ("database is locked", "database table is locked", "locked")


def store_fault(path: Path, e: BaseException, doing: str = "") -> StoreError:
    """The StoreError subclass (corrupt, read-only, full, locked, or plain) for an sqlite3/OS error
    `e` on the store at `path`; the advice never destroys data a fault left intact."""
    name = str(getattr(e, "sqlite_errorname", "") or "")
    text = str(e).lower()
    errno_ = getattr(e, "errno", None)
    where = f" while {doing}" if doing else ""
    folder = path.parent
    side = f"(SQLite also writes '{path.name}-wal' and '{path.name}-shm' next to it)"
    if (name in _CORRUPT_CODES or name.startswith("SQLITE_CORRUPT")
            or any(t in text for t in _CORRUPT_TEXT)
            or isinstance(e, (UnicodeDecodeError, json.JSONDecodeError))):
        what = ("is not an SQLite database, or its header is damaged"
                if name == "SQLITE_NOTADB" or "not a database" in text else "is damaged")
        return StoreCorruptError(
            f"store '{path}' {what}{where} ({e}); nothing more was written to it. "
            f"To keep what is readable: `sqlite3 '{path}' .recover | sqlite3 '{path}.recovered'` and use "
            f"--store '{path}.recovered' (or set $TENSORPLAN_STORE to it); or move the file aside "
            f"(`mv '{path}' '{path}.damaged'`) and tensorplan starts a new, empty store at that path.")
    if (name.startswith("SQLITE_FULL") or errno_ == errno.ENOSPC or errno_ == errno.EDQUOT
            or any(t in text for t in _FULL_TEXT)):
        return StoreFullError(
            f"store '{path}': the disk is full{where} ({e}); the unfinished write was rolled back and the "
            f"data already in the store is intact. Free space on the file system holding '{folder}', or point "
            f"$TENSORPLAN_STORE (or --store) at a file on another disk; rerun and finished work is kept.")
    if (name.startswith("SQLITE_READONLY") or name.startswith("SQLITE_CANTOPEN") or name.startswith("SQLITE_PERM")
            or name.startswith("SQLITE_AUTH") or errno_ in (errno.EACCES, errno.EPERM, errno.EROFS)
            or isinstance(e, PermissionError) or any(t in text for t in _READONLY_TEXT)):
        return StoreReadOnlyError(
            f"store '{path}' cannot be written{where} ({e}): the file or its directory '{folder}' "
            f"is read-only or not yours {side}. The data in it is intact. Make both writable "
            f"(chmod/chown, or remount read-write), or point $TENSORPLAN_STORE (or --store) at a writable path.")
    if name.startswith("SQLITE_BUSY") or name.startswith("SQLITE_LOCKED") or any(t in text for t in _LOCKED_TEXT):
        return StoreLockedError(
            f"store '{path}' is locked{where} ({e}): another process held its write lock for more than "
            f"{BUSY_TIMEOUT_MS / 1000:g} s; nothing was written. Wait for the other tensorplan job to finish "
            f"(`fuser '{path}'` names it), or give this run its own store with --store or $TENSORPLAN_STORE.")
    if name.startswith("SQLITE_IOERR") or "disk i/o error" in text or isinstance(e, OSError):
        return StoreFullError(
            f"store '{path}': input/output error{where} ({e}); the unfinished write was rolled back. "
            f"The disk holding '{folder}' may be full, failing or unmounted: free space or check it, or point "
            f"$TENSORPLAN_STORE (or --store) at a file on another disk.")
    return StoreError(f"store '{path}': SQLite failed{where} ({type(e).__name__}: {e}); "
                      f"nothing was written by the failed step. Pass another --store path to work around it.")


def _loads(path: Path, text: str) -> Any:
    """A stored JSON value; a damaged one is a corrupt store, not a traceback."""
    try:
        return json.loads(text)
    except (TypeError, ValueError) as e:
        raise store_fault(path, json.JSONDecodeError(f"stored JSON is damaged: {e}", str(text)[:40], 0)) from None


# -------------------------------------------------------------------------------------------------
# the store
# -------------------------------------------------------------------------------------------------
class Store:
    """SQLite measurement store; one connection per (process, thread), safe for several writer processes."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_store_path()
        self._local = threading.local()
        if self.path.exists() and self.path.is_dir():
            raise StoreError(f"store '{self.path}' is a directory; pass a file path such as {self.path / 'store.sqlite'}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise store_fault(self.path, e, f"creating its directory '{self.path.parent}'") from None
        self._init_schema()

    # ---- connection ---------------------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        loc = self._local
        if getattr(loc, "pid", None) != os.getpid() or getattr(loc, "conn", None) is None:
            loc.conn = self._connect()
            loc.pid = os.getpid()
            loc.depth = 0
        return loc.conn

    def _connect(self) -> sqlite3.Connection:
        try:
            c = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        except (sqlite3.Error, OSError) as e:
            raise store_fault(self.path, e, "opening it") from None
        try:
            c.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            mode = c.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":  # pragma: no cover - e.g. a network file system
                raise StoreError(f"store '{self.path}': SQLite refused WAL mode (got {mode}); put the store on a local disk")
            c.execute("PRAGMA synchronous=NORMAL")
            c.execute("PRAGMA cache_size=-65536")  # 64 MiB page cache: batched inserts touch many index pages
            c.execute("PRAGMA foreign_keys=ON")
        except (sqlite3.Error, OSError) as e:
            c.close()
            raise store_fault(self.path, e, "opening it") from None
        except BaseException:
            c.close()
            raise
        return c

    def _corrupt(self, e: BaseException, doing: str = "") -> StoreError:
        """The StoreError for `e` (named for history: it classifies every fault, not only corruption)."""
        return store_fault(self.path, e, doing)

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None and getattr(self._local, "pid", None) == os.getpid():
            c.close()
        self._local.conn = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: takes the write lock up front, so no deadlock on upgrade).
        Nested calls join the outer transaction."""
        c = self.conn
        loc = self._local
        if loc.depth:
            loc.depth += 1
            try:
                yield c
            finally:
                loc.depth -= 1
            return
        try:
            c.execute("BEGIN IMMEDIATE")
        except (sqlite3.Error, OSError) as e:
            raise self._corrupt(e, "starting a write") from None
        loc.depth = 1
        try:
            yield c
        except sqlite3.Error as e:   # (an OSError from the caller's own work is the caller's to report)
            loc.depth = 0
            self._rollback(c)
            if isinstance(e, sqlite3.IntegrityError):   # a caller's bad reference, not a store fault
                raise
            raise self._corrupt(e, "writing") from None
        except BaseException:
            loc.depth = 0
            self._rollback(c)
            raise
        else:
            loc.depth = 0
            try:
                c.execute("COMMIT")
            except (sqlite3.Error, OSError) as e:
                self._rollback(c)   # e.g. a full disk at COMMIT: nothing of this transaction stays
                raise self._corrupt(e, "committing a write") from None

    @staticmethod
    def _rollback(c: sqlite3.Connection) -> None:
        """Roll back if a transaction is still open (SQLite may already have, e.g. after SQLITE_FULL)."""
        try:
            if c.in_transaction:
                c.execute("ROLLBACK")
        except sqlite3.Error:   # the connection is unusable; the file keeps its last committed state
            pass

    def _read(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self.conn.execute(sql, args).fetchall()
        except (sqlite3.Error, OSError) as e:
            raise self._corrupt(e) from None

    # ---- schema ---------------------------------------------------------------------------------
    def _init_schema(self, upto: int | None = None) -> None:
        target = SCHEMA_VERSION if upto is None else upto
        with self.transaction() as c:
            try:
                c.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                row = c.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            except (sqlite3.Error, OSError) as e:
                raise self._corrupt(e) from None
            try:
                version = int(row[0]) if row else 0
            except ValueError:
                raise StoreCorruptError(f"store '{self.path}': meta.schema_version is {row[0]!r}, not a number; "
                                        f"the file is damaged: move it aside (`mv '{self.path}' "
                                        f"'{self.path}.damaged'`) and tensorplan starts a new store, or pass "
                                        "another --store path") from None
            if version > SCHEMA_VERSION:
                raise StoreError(f"store '{self.path}' has schema version {version}, newer than this tensorplan "
                                 f"understands ({SCHEMA_VERSION}); upgrade tensorplan or pass another --store path")
            for i in range(version, target):
                MIGRATIONS[i](c)
            if target > version:
                c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)", (str(target),))
                c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('migrated_at', ?)", (str(time.time()),))

    @property
    def schema_version(self) -> int:
        return int(self._read("SELECT value FROM meta WHERE key='schema_version'")[0][0])

    # ---- devices and programs -------------------------------------------------------------------
    def put_device(self, spec: DeviceSpec) -> str:
        """Store a device spec (latest figures win); returns its key."""
        key = spec.key()
        with self.transaction() as c:
            c.execute("INSERT INTO devices(dev_key, name, kind, spec, created) VALUES (?,?,?,?,?) "
                      "ON CONFLICT(dev_key) DO UPDATE SET name=excluded.name, kind=excluded.kind, spec=excluded.spec",
                      (key, spec.name, spec.kind, canonical_json(spec.to_dict()), time.time()))
        return key

    def get_device(self, dev_key_or_name: str) -> DeviceSpec | None:
        rows = self._read("SELECT spec FROM devices WHERE dev_key=? OR name=? ORDER BY created DESC LIMIT 1",
                          (dev_key_or_name, dev_key_or_name))
        return DeviceSpec.from_dict(_loads(self.path, rows[0][0])) if rows else None

    def put_program(self, kind: str, payload: dict) -> str:
        """Store a program (idempotent: same kind+payload -> same key, one row); returns its key."""
        if not kind:
            raise StoreError("store: put_program needs a non-empty kind (e.g. 'tir', 'kernel', 'subgraph')")
        blob = canonical_json(payload)
        key = hashlib.sha256(f"{kind}\n{blob}".encode()).hexdigest()
        with self.transaction() as c:
            c.execute("INSERT OR IGNORE INTO programs(prog_key, kind, payload, created) VALUES (?,?,?,?)",
                      (key, kind, blob, time.time()))
        return key

    def put_programs(self, items: Iterable[tuple[str, dict]]) -> list[str]:
        """Batched `put_program` in one transaction."""
        rows, keys = [], []
        now = time.time()
        for kind, payload in items:
            blob = canonical_json(payload)
            key = hashlib.sha256(f"{kind}\n{blob}".encode()).hexdigest()
            rows.append((key, kind, blob, now))
            keys.append(key)
        with self.transaction() as c:
            c.executemany("INSERT OR IGNORE INTO programs(prog_key, kind, payload, created) VALUES (?,?,?,?)", rows)
        return keys

    def get_program(self, prog_key: str) -> tuple[str, dict]:
        rows = self._read("SELECT kind, payload FROM programs WHERE prog_key=?", (prog_key,))
        if not rows:
            raise StoreError(f"store '{self.path}': no program with key {prog_key}")
        return rows[0][0], _loads(self.path, rows[0][1])

    def has_program(self, prog_key: str) -> bool:
        return bool(self._read("SELECT 1 FROM programs WHERE prog_key=?", (prog_key,)))

    # ---- measurements ---------------------------------------------------------------------------
    @staticmethod
    def _meas_row(prog_key: str, dev_key: str, timing: Timing | dict, tag: str, extra: dict | None,
                  now: float) -> tuple:
        t = timing if isinstance(timing, Timing) else Timing.from_dict(timing)
        ex = dict(t.extra or {})
        ex.update(extra or {})
        return (prog_key, dev_key, tag or "", float(t.median_s), float(t.mean_s), float(t.min_s), float(t.cov),
                len(t.repeats), encode_repeats(t.repeats), int(t.warmup), int(t.number),
                None if t.threads is None else int(t.threads), t.method, canonical_json(ex) if ex else None, now)

    _INSERT_MEAS = (f"INSERT OR REPLACE INTO measurements({', '.join(_MEAS_COLS)}) "
                    f"VALUES ({', '.join('?' * len(_MEAS_COLS))})")

    def put_measurement(self, prog_key: str, dev_key: str, timing: Timing, tag: str = "",
                        extra: dict | None = None) -> None:
        """Store one measurement; re-putting the same (program, device, tag) replaces it."""
        self.put_measurements([(prog_key, dev_key, timing, tag, extra)])

    def put_measurements(self, rows: Iterable[tuple]) -> int:
        """Batched measurements in ONE transaction: rows of (prog_key, dev_key, timing[, tag[, extra]])."""
        now = time.time()
        data = []
        for r in rows:
            if not 3 <= len(r) <= 5:
                raise StoreError("store: each measurement row is (prog_key, dev_key, timing, tag, extra)")
            pk, dk, t = r[0], r[1], r[2]
            data.append(self._meas_row(pk, dk, t, r[3] if len(r) > 3 else "", r[4] if len(r) > 4 else None, now))
        try:
            with self.transaction() as c:
                c.executemany(self._INSERT_MEAS, data)
        except sqlite3.IntegrityError as e:
            bad = self._missing_refs(data)
            raise StoreError(f"store '{self.path}': {bad or e}; call put_program/put_device first") from None
        return len(data)

    def _missing_refs(self, data: list[tuple]) -> str:
        for row in data:
            if not self._read("SELECT 1 FROM programs WHERE prog_key=?", (row[0],)):
                return f"measurement refers to unknown program {row[0]}"
            if not self._read("SELECT 1 FROM devices WHERE dev_key=?", (row[1],)):
                return f"measurement refers to unknown device {row[1]}"
        return ""

    def get_measurement(self, prog_key: str, dev_key: str, tag: str = "") -> dict | None:
        it = self._query_measurements("m.prog_key=? AND m.dev_key=? AND m.tag=?", (prog_key, dev_key, tag or ""))
        return next(it, None)

    def measurements(self, kind: str | None = None, device: str | None = None,
                     tag: str | None = None) -> Iterator[dict]:
        """All measurements (joined with program kind/payload and device name), optionally filtered by
        program kind, device (key or name) and tag."""
        where, args = [], []
        if kind is not None:
            where.append("p.kind=?")
            args.append(kind)
        if device is not None:
            where.append("(m.dev_key=? OR d.name=?)")
            args += [device, device]
        if tag is not None:
            where.append("m.tag=?")
            args.append(tag)
        return self._query_measurements(" AND ".join(where) or "1", tuple(args))

    def _query_measurements(self, where: str, args: tuple) -> Iterator[dict]:
        sql = (f"SELECT {', '.join('m.' + c for c in _MEAS_COLS)}, p.kind, p.payload, d.name "
               f"FROM measurements m JOIN programs p ON p.prog_key=m.prog_key "
               f"LEFT JOIN devices d ON d.dev_key=m.dev_key WHERE {where} ORDER BY m.rowid")
        try:
            cur = self.conn.execute(sql, args)
        except (sqlite3.Error, OSError) as e:
            raise self._corrupt(e) from None
        while True:
            try:
                chunk = cur.fetchmany(512)
            except (sqlite3.Error, OSError) as e:
                raise self._corrupt(e) from None
            if not chunk:
                return
            for row in chunk:
                d = dict(zip(_MEAS_COLS, row[:len(_MEAS_COLS)]))
                d["repeats"] = decode_repeats(d["repeats"])
                d["extra"] = _loads(self.path, d["extra"]) if d["extra"] else {}
                d["kind"], d["payload"], d["device"] = row[-3], _loads(self.path, row[-2]), row[-1]
                yield d

    def count(self, table: str = "measurements") -> int:
        if table not in ("devices", "programs", "measurements", "jobs"):
            raise TensorplanError(f"store: unknown table {table!r}")
        return int(self._read(f"SELECT COUNT(*) FROM {table}")[0][0])

    # ---- jobs -------------------------------------------------------------------------------------
    def job(self, name: str) -> "Job":
        return Job(self, name)

    # ---- summaries and export ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counts per table, per program kind and per device, file size (with WAL) and schema version."""
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        by_kind = dict(self._read("SELECT kind, COUNT(*) FROM programs GROUP BY kind ORDER BY kind"))
        meas_kind = dict(self._read("SELECT p.kind, COUNT(*) FROM measurements m JOIN programs p "
                                    "ON p.prog_key=m.prog_key GROUP BY p.kind ORDER BY p.kind"))
        meas_dev = {}
        for name, key, n in self._read("SELECT d.name, m.dev_key, COUNT(*) FROM measurements m LEFT JOIN devices d "
                                       "ON d.dev_key=m.dev_key GROUP BY m.dev_key ORDER BY d.name"):
            label = f"{name} [{key[:8]}]" if name else key
            meas_dev[label] = n
        jobs = dict(self._read("SELECT job, COUNT(*) FROM jobs GROUP BY job ORDER BY job"))
        return {
            "path": str(self.path), "file_bytes": size, "schema_version": self.schema_version,
            "devices": self.count("devices"), "programs": self.count("programs"),
            "measurements": self.count("measurements"), "programs_by_kind": by_kind,
            "measurements_by_kind": meas_kind, "measurements_by_device": meas_dev, "jobs_done": jobs,
        }

    def export_parquet(self, out_dir: str | Path) -> dict[str, Path]:
        """One parquet file per table (devices, programs, measurements, jobs, meta); returns table -> file."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from tensorplan.errors import OutputPathError

        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise OutputPathError(f"--parquet '{out}' is a file; pass a directory for the parquet files")
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputPathError(f"cannot create the output directory '{out}' ({e.strerror or e})") from None
        files: dict[str, Path] = {}
        # read everything in one snapshot so the files agree with each other
        c = self.conn
        try:
            c.execute("BEGIN")
        except (sqlite3.Error, OSError) as e:
            raise self._corrupt(e) from None
        try:
            for table in ("meta", "devices", "programs", "measurements", "jobs"):
                cur = c.execute(f"SELECT * FROM {table}")
                cols = [d[0] for d in cur.description]
                rows = cur.fetchall()
                data = {col: [r[i] for r in rows] for i, col in enumerate(cols)}
                fields = []
                for col in cols:
                    if table == "measurements" and col == "repeats":
                        data[col] = [decode_repeats(b) for b in data[col]]
                        fields.append(pa.field(col, pa.list_(pa.float32())))
                    elif col in ("median_s", "mean_s", "min_s", "cov", "created", "done_at"):
                        fields.append(pa.field(col, pa.float64()))
                    elif col in ("n_repeats", "warmup", "number", "threads"):
                        fields.append(pa.field(col, pa.int64()))
                    else:
                        fields.append(pa.field(col, pa.string()))
                tbl = pa.table(data, schema=pa.schema(fields))
                files[table] = out / f"{table}.parquet"
                try:
                    pq.write_table(tbl, files[table])
                except OSError as e:
                    raise OutputPathError(f"cannot write '{files[table]}' ({e.strerror or e}); the store is "
                                          "unchanged: free space or pass another --parquet directory") from None
        except (sqlite3.Error, OSError) as e:
            raise self._corrupt(e, "reading it") from None
        finally:
            self._rollback(c)   # a read-only snapshot: nothing to commit
        return files


@dataclass
class Job:
    """Progress of one resumable loop: which item keys are done. Mark an item done in the same
    transaction as its result (`store.transaction()` or `record`) so a kill loses at most that item."""

    store: Store
    name: str

    def is_done(self, item_key: str) -> bool:
        return bool(self.store._read("SELECT 1 FROM jobs WHERE job=? AND item_key=?", (self.name, item_key)))

    def mark_done(self, item_key: str) -> None:
        with self.store.transaction() as c:
            c.execute("INSERT OR REPLACE INTO jobs(job, item_key, done_at) VALUES (?,?,?)",
                      (self.name, item_key, time.time()))

    def done_keys(self) -> set[str]:
        return {r[0] for r in self.store._read("SELECT item_key FROM jobs WHERE job=?", (self.name,))}

    def record(self, item_key: str, prog_key: str, dev_key: str, timing: Timing, tag: str = "",
               extra: dict | None = None) -> None:
        """Store a measurement and mark the item done, atomically."""
        with self.store.transaction():
            self.store.put_measurement(prog_key, dev_key, timing, tag, extra)
            self.mark_done(item_key)

    def reset(self) -> None:
        with self.store.transaction() as c:
            c.execute("DELETE FROM jobs WHERE job=?", (self.name,))
