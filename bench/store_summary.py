"""Summarise a measurement store written on another machine (e.g. by bench/gpu_machine_cdmpp.sh):
per device, the programs measured, the span of measurement time and the device spec.

    python bench/store_summary.py STORE.sqlite [--out bench/results/NAME.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict

from tensorplan.measure.store import Store


def summarise(path: str) -> dict:
    st = Store(path)
    by_dev: dict[str, list] = defaultdict(list)
    keys: dict[str, str] = {}
    for m in st.measurements(kind="cdmpp_program", tag="cdmpp"):
        by_dev[m["device"]].append(m)
        keys[m["device"]] = m["dev_key"]
    out = {"store": path, "devices": {}}
    for dev, ms in sorted(by_dev.items()):
        created = sorted(m["created"] for m in ms)
        spec = st.get_device(keys[dev])
        out["devices"][dev] = {
            "records": len(ms),
            "median_latency_s": statistics.median(m["median_s"] for m in ms),
            "median_cov": statistics.median(m["cov"] for m in ms),
            "first_measured": created[0], "last_measured": created[-1],
            "spec": spec.to_dict() if spec else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stores", nargs="+")
    ap.add_argument("--out")
    a = ap.parse_args()
    res = [summarise(s) for s in a.stores]
    text = json.dumps(res, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
