"""Import time of every zoo model (opset 17 and 11) and reference-executor vs ONNX
Runtime max relative error per model (max|ref-ort| / max(max|ort|, eps), fp32).

    .venv/bin/python bench/import_check.py [--models a,b] [--opsets 17,11] [--repeats 3]

Writes bench/results/import_check.json (with the machine description).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from tensorplan.devices.detect import machine_info


def main() -> None:
    from rich.progress import Progress

    from tensorplan import zoo
    from tensorplan.ir.onnx_import import import_onnx
    from tensorplan.ir.reference import random_feeds, rel_error, run_reference
    from tensorplan.ir.to_onnx import ort_session

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    ap.add_argument("--opsets", default="17,11")
    ap.add_argument("--repeats", type=int, default=3, help="imports timed per model (median)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "import_check.json"))
    args = ap.parse_args()
    names = [m for m in args.models.split(",") if m] or [e.name for e in zoo.list_models()]
    opsets = [int(o) for o in args.opsets.split(",")]
    rows = []
    with Progress() as prog:
        task = prog.add_task("import + check", total=len(names) * len(opsets))
        for name in names:
            for opset in opsets:
                prog.update(task, description=f"{name} opset {opset}")
                row: dict = {"model": name, "opset": opset}
                try:
                    t0 = time.perf_counter()
                    path = zoo.export(name, opset)
                    row["export_s"] = time.perf_counter() - t0
                    times = []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        graph = import_onnx(path, name=name)
                        times.append(time.perf_counter() - t0)
                    row["import_s_median"] = statistics.median(times)
                    row["import_s"] = times
                    row["nodes"] = len(graph.nodes)
                    row["onnx_nodes"] = None
                    feeds = random_feeds(graph, seed=0)
                    t0 = time.perf_counter()
                    ref = run_reference(graph, feeds)
                    row["reference_s"] = time.perf_counter() - t0
                    import onnx
                    proto = onnx.load(str(path))
                    row["onnx_nodes"] = len(proto.graph.node)
                    sess = ort_session(proto, threads=2)
                    t0 = time.perf_counter()
                    out = sess.run(None, {k: v for k, v in feeds.items()})
                    row["ort_s"] = time.perf_counter() - t0
                    ort = dict(zip([o.name for o in sess.get_outputs()], out))
                    errs = {o: rel_error(ref[o], ort[o]) for o in graph.outputs}
                    row["rel_errors"] = errs
                    row["max_rel_error"] = max(errs.values())
                    row["passed"] = row["max_rel_error"] <= 1e-4
                except Exception as e:  # record and go on: one bad model must not hide the rest
                    row["error"] = f"{type(e).__name__}: {e}"
                    row["passed"] = False
                rows.append(row)
                prog.console.print(
                    f"{name:22s} opset {opset}: import {row.get('import_s_median', float('nan')):.3f} s, "
                    f"nodes {row.get('nodes')}, max rel err {row.get('max_rel_error', float('nan')):.2e}"
                    + (f"  ERROR {row['error']}" if "error" in row else ""))
                prog.advance(task)
    result = {"machine": machine_info(), "tolerance": 1e-4,
              "rel_error": "max|ref-ort| / max(max|ort|, 1e-6), fp32, random inputs (seed 0)",
              "rows": rows, "all_passed": all(r["passed"] for r in rows)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}; all passed: {result['all_passed']}")


if __name__ == "__main__":
    main()
