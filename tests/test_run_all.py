"""`make bench` runs bench/run_all.py: every step it names must exist and be spelled as the docs quote."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_run_all_lists_existing_scripts():
    out = subprocess.run([sys.executable, "bench/run_all.py", "--list"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) >= 10 and lines[-1].startswith("summarize")
    for ln in lines:
        for word in ln.split():
            if word.startswith("bench/") and word.endswith(".py"):
                assert (ROOT / word).exists(), ln
    docs = (ROOT / "docs" / "results.md").read_text()
    assert "python bench/korch_bench.py --results-dir bench/results/korch_rewrite" in out
    assert "bench/korch_bench.py --results-dir bench/results/korch_rewrite" in docs


def test_run_all_rejects_unknown_steps():
    r = subprocess.run([sys.executable, "bench/run_all.py", "--only", "nope"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode != 0 and "unknown step" in r.stderr


def test_run_all_runs_the_benchmarks_not_the_experiments():
    """The CDMPP experiments have their own runner (research/run_experiments.py); `make bench` runs
    only scripts in bench/."""
    out = subprocess.run([sys.executable, "bench/run_all.py", "--list"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    scripts = [w for ln in out.splitlines() for w in ln.split() if w.endswith(".py")]
    assert scripts and all(w.startswith("bench/") for w in scripts) and not any("cdmpp" in w for w in scripts)
