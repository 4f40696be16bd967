"""Where tensorplan keeps caches and its default store (override with env vars)."""
from __future__ import annotations

import os
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
