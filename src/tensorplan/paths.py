"""Where tensorplan keeps caches and its default store (override with env vars)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """`$TENSORPLAN_CACHE` or `~/.cache/tensorplan`; created on first use."""
    p = Path(os.environ.get("TENSORPLAN_CACHE", Path.home() / ".cache" / "tensorplan"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def default_store_path() -> Path:
    """`$TENSORPLAN_STORE` or `<cache>/store.sqlite`."""
    env = os.environ.get("TENSORPLAN_STORE")
    return Path(env) if env else cache_dir() / "store.sqlite"


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file and a rename, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; the cache is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
