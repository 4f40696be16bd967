"""Imported first by every script here: puts `research/` on `sys.path` (its `cdmpp_variants` is not
installed with tensorplan) and names the folders the scripts read and write."""
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent          # research/cdmpp: the scripts
RESEARCH = HERE.parent
ROOT = RESEARCH.parent                           # the repository (data/, src/)
RESULTS = HERE / "results"                       # what the scripts write, committed

for p in (RESEARCH, HERE):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
