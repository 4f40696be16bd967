"""The research tests import `cdmpp_variants` (research/), the scripts of research/cdmpp/ and the
product tests' shared fixture `cdmpp_small` (tests/test_cdmpp_common.py); none is installed."""
import sys
from pathlib import Path

RESEARCH = Path(__file__).resolve().parents[1]
for p in (RESEARCH, RESEARCH / "cdmpp", RESEARCH.parent / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from test_cdmpp_common import cdmpp_small  # noqa: E402,F401  (the fixture, for every test here)
