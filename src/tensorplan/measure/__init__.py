"""Measurement: the timing methodology (`timer`) and the SQLite store of programs and latencies (`store`)."""
from __future__ import annotations

from tensorplan.measure.store import SCHEMA_VERSION, Job, Store, canonical_json, content_key
from tensorplan.measure.timer import Timing, is_stable, measure, measure_stable, pinned_threads

__all__ = ["Timing", "measure", "measure_stable", "pinned_threads", "is_stable", "Store", "Job", "SCHEMA_VERSION",
           "canonical_json", "content_key"]
