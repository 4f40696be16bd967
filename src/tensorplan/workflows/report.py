"""HTML report of the main job (`tensorplan demo --report`): one self-contained file.

Why: the terminal shows medians; a reader deciding whether to trust a plan wants the spread of
the interleaved rounds, where ONNX Runtime spends its time and what the plan's kernels are.
Charts are PNGs embedded as data URIs, so the file can be attached to an issue or mailed as is.
"""
from __future__ import annotations

import base64
import html
import io
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from tensorplan.workflows.demo import DemoKernel, DemoReport

BACKEND_COLOURS = {"tvm": "#1f77b4", "ort": "#ff7f0e", "onnxruntime": "#ff7f0e", "torch": "#2ca02c",
                   "reference": "#7f7f7f", "opaque": "#d62728"}


def _png(fig) -> str:
    """A matplotlib figure as a PNG data URI (and closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def latency_chart(rounds_ms: dict[str, list[float]]) -> str:
    """Per-round medians of each system (interleaved), as a strip + box plot."""
    plt = _plt()
    names = list(rounds_ms)
    fig, ax = plt.subplots(figsize=(6, 0.9 + 0.7 * len(names)))
    data = [rounds_ms[n] for n in names]
    ax.boxplot(data, orientation="horizontal", tick_labels=names, widths=0.5, showfliers=False)
    for i, v in enumerate(data, start=1):
        ax.scatter(v, [i] * len(v), s=12, alpha=0.6, zorder=3)
    ax.set_xlabel("ms per inference (one point per interleaved round)")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def per_op_chart(per_op: list, top: int = 12) -> str:
    """ONNX Runtime's time per operator type (its own profiler)."""
    plt = _plt()
    ops = sorted(per_op, key=lambda o: o.total_ms)[-top:]
    fig, ax = plt.subplots(figsize=(6, 0.6 + 0.3 * len(ops)))
    ax.barh([f"{o.op} ×{o.count}" for o in ops], [o.total_ms for o in ops], color="#ff7f0e")
    for i, o in enumerate(ops):
        ax.text(o.total_ms, i, f" {o.share:.0%}", va="center", fontsize=8)
    ax.set_xlabel("ms per inference")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def kernels_chart(kernels: list["DemoKernel"], top: int = 25) -> str:
    """The plan's most expensive kernels (predicted, from the measured cost model), by backend."""
    plt = _plt()
    ks = sorted(kernels, key=lambda k: k.predicted_us)[-top:]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.28 * len(ks)))
    ax.barh([f"{k.id} ({k.primitives} prim.)" for k in ks], [k.predicted_us / 1e3 for k in ks],
            color=[BACKEND_COLOURS.get(k.backend, "#9467bd") for k in ks])
    seen = {k.backend for k in ks}
    from matplotlib.patches import Patch
    ax.legend(handles=[Patch(color=BACKEND_COLOURS.get(b, "#9467bd"), label=b) for b in sorted(seen)],
              loc="lower right", fontsize=8)
    ax.set_xlabel("predicted ms (measured alone)")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def _table(header: list[str], rows: list[list]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


_CSS = """body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right}td:first-child,th:first-child{text-align:left}h2{margin-top:1.6em}
.ok{color:#080;font-weight:bold}.bad{color:#c00;font-weight:bold}img{max-width:100%}
.note{color:#555;font-size:90%}"""


def demo_report_html(rep: "DemoReport") -> str:
    """The report as one HTML string."""
    d, p = rep.device, rep.plan
    ok = '<span class="ok">agree</span>' if rep.agree else '<span class="bad">DISAGREE</span>'
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>tensorplan: {html.escape(rep.model)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>tensorplan report: {html.escape(rep.model)}</h1>",
             f"<p class='note'>Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {html.escape(platform.node())} "
             f"({html.escape(platform.processor() or platform.machine())}) by <code>tensorplan demo</code>. "
             "Latencies are medians of interleaved rounds: every system runs once per round, in rotating "
             "order, so load on a shared machine slows all of them alike.</p>",
             "<h2>Model and device</h2>",
             _table(["", ""], [
                 ["model", f"{rep.nodes} nodes, {rep.params / 1e6:.2f} M params, {rep.gflops:.2f} GFLOP"],
                 ["device", f"{d.name}: {d.cores} cores, {d.peak_fp32_gflops:.0f} GFLOP/s, "
                            f"{d.mem_bw_gbs:.1f} GB/s (measured)"],
                 ["ONNX Runtime", f"{rep.ort_median_ms:.3f} ms (CoV {rep.ort_cov:.1%})"],
                 ["reference executor vs ONNX Runtime", f"max rel. error {rep.max_rel_error:.2e}"]]),
             f"<p>Reference executor vs ONNX Runtime: {ok} (tolerance {rep.tolerance:.0e}).</p>"]
    if p:
        pok = '<span class="ok">agree</span>' if p.agree else '<span class="bad">DISAGREE</span>'
        tc = p.torch_compile
        has_tc = tc.median_ms is not None
        parts += ["<h2>Plan vs ONNX Runtime</h2>",
                  _table(["", "tensorplan", "ONNX Runtime"] + (["torch.compile"] if has_tc else []), [
                      ["median ms", f"{p.plan_median_ms:.3f}", f"{p.ort_median_ms:.3f}"]
                      + ([f"{tc.median_ms:.3f}"] if has_tc else []),
                      ["CoV of rounds", f"{p.plan_cov:.1%}", f"{p.ort_cov:.1%}"]
                      + ([f"{tc.cov:.1%}"] if has_tc else [])]),
                  (f"<p><b>{tc.speedup:.2f}×</b> vs torch.compile (compiled in {tc.compile_s:.1f} s, same "
                   "inputs, same rounds).</p>" if has_tc else
                   f"<p>torch.compile not raced: {html.escape(str(tc.skipped or 'n/a'))}.</p>"),
                  f"<p><b>{p.speedup_vs_ort:.2f}×</b> vs ONNX Runtime; outputs {pok} "
                  f"(max rel. error {p.max_rel_error:.2e}). {p.kernels} kernels from {p.primitives} "
                  f"primitives, backends {html.escape(str(p.backends))}; solver {html.escape(str(p.solver))}, "
                  f"optimised in {p.optimise_s or 0:.1f} s; predicted {p.predicted_ms:.2f} ms "
                  f"(sum of kernels timed alone).</p>"]
        if p.race:
            r = p.race
            parts.append("<p>Finalists raced end to end before the plan was kept (medians of "
                         f"{r['rounds']} interleaved rounds): " + html.escape(", ".join(
                             f"{k} {v:.3f} ms ({r['kernels'][k]} kernels)" for k, v in r["median_ms"].items()))
                         + f"; kept <b>{html.escape(r['chosen'])}</b>"
                         + (f" (fewest kernels within {r['margin']:.0%} of {html.escape(r['fastest'])})"
                            if r["chosen"] != r["fastest"] else "") + ".</p>")
        if p.rewrites:
            parts.append(f"<p>Exact rewrites applied before fission: {html.escape(str(p.rewrites))}.</p>")
        if p.rounds_ms:
            parts.append(f"<img alt='latency per round' src='{latency_chart(p.rounds_ms)}'>")
    parts += ["<h2>Where ONNX Runtime spends its time</h2>",
              f"<img alt='per operator' src='{per_op_chart(rep.per_op)}'>",
              _table(["operator", "nodes", "ms", "share"],
                     [[o.op, o.count, f"{o.total_ms:.3f}", f"{o.share:.1%}"] for o in rep.per_op])]
    if p and p.kernel_list:
        ks = p.kernel_list
        parts += ["<h2>The plan's kernels</h2>",
                  f"<img alt='kernels' src='{kernels_chart(ks)}'>",
                  _table(["kernel", "backend", "kind", "primitives", "operators", "predicted µs"],
                         [[k.id, k.backend, k.kind, k.primitives, k.ops, f"{k.predicted_us:.1f}"]
                          for k in sorted(ks, key=lambda k: -k.predicted_us)])]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_demo_report(rep: "DemoReport", path: str | Path) -> Path:
    """Write the HTML report (parent folders created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(demo_report_html(rep), encoding="utf-8")
    return out
