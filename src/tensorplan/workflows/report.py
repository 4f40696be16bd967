"""HTML report of the main job (`tensorplan demo --report`): one self-contained file.

Why: the terminal shows medians; a reader deciding whether to trust a plan wants the spread of
the interleaved rounds against every peer runtime (and whether the run was noisy), where ONNX
Runtime spends its time and what the plan's kernels are. `peers_chart`, `peers_table` and
`noise_note` take a `workflows.peers.PeerTimings`, so any workflow's report can show its peers.
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
    from tensorplan.workflows.peers import PeerTimings

BACKEND_COLOURS = {"tvm": "#1f77b4", "ort": "#ff7f0e", "onnxruntime": "#ff7f0e", "torch": "#2ca02c",
                   "reference": "#7f7f7f", "opaque": "#d62728"}


def png_data_uri(fig) -> str:
    """A matplotlib figure as a PNG data URI (and closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _clip_ms(rounds: list[list[float]]) -> float:
    """Where the x axis ends: past every box's upper whisker (Q3 + 1.5 IQR), so one runner's
    outlying rounds cannot squash everyone else's medians into a corner."""
    import numpy as np
    top = 0.0
    for r in rounds:
        q1, q3 = np.percentile(r, [25, 75])
        top = max(top, min(max(r), q3 + 1.5 * (q3 - q1)))
    return top * 1.15


def peers_chart(timings: "PeerTimings", plan_name: str | None = "tensorplan") -> str:
    """Every runner's interleaved rounds as box + points, its median written beside it. Readable when
    one runner has outliers: whiskers only (no fliers), the axis clipped past the longest whisker with
    the clipped rounds drawn as arrows at the edge, and a log axis when medians span more than 4x.
    The bf16 figure is labelled as such (hatched); a noisy run says so in the title."""
    plt = pyplot()
    ts = sorted(timings.runners.values(), key=lambda t: -t.median_ms)
    names = [t.label + (f" [{t.precision}]" if t.precision not in (None, "fp32") and t.precision not in t.label
                        else "") for t in ts]
    data = [t.rounds_ms for t in ts]
    clip = _clip_ms(data)
    meds = [t.median_ms for t in ts]
    log = max(meds) / max(min(meds), 1e-9) > 4.0
    fig, ax = plt.subplots(figsize=(7, 1.0 + 0.6 * len(ts)))
    box = ax.boxplot(data, orientation="horizontal", tick_labels=names, widths=0.5, showfliers=False,
                     patch_artist=True, medianprops={"color": "black", "linewidth": 2})
    for patch, t in zip(box["boxes"], ts):
        colour = "#1f77b4" if t.name == plan_name else ("#bbbbbb" if t.precision not in (None, "fp32") else "#ff7f0e")
        patch.set_facecolor(colour)
        patch.set_alpha(0.45)
        if t.precision not in (None, "fp32"):
            patch.set_hatch("//")
    for i, (t, v) in enumerate(zip(ts, data), start=1):
        inside = [x for x in v if x <= clip]
        ax.scatter(inside, [i] * len(inside), s=12, alpha=0.6, zorder=3, color="#333333")
        out = len(v) - len(inside)
        if out:
            ax.scatter([clip], [i], marker=">", s=40, color="#c00", zorder=4)
            ax.text(clip, i + 0.3, f"{out} round{'s' * (out > 1)} > {clip:.3g} ms", ha="right", fontsize=7,
                    color="#c00")
        ax.text(t.median_ms, i - 0.38, f"{t.median_ms:.4g} ms", ha="center", fontsize=7)
    if log:
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
        ax.set_xscale("log")
        ax.set_xlim(min(min(v) for v in data) * 0.8, clip)
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_xlim(0, clip)
    ax.set_xlabel("ms per inference (one point per interleaved round" + ("; log scale" if log else "") + ")")
    ax.grid(axis="x", alpha=0.3, which="both")
    if timings.noisy:
        ax.set_title(f"NOISY RUN: {timings.noise_reason}", color="#c00", fontsize=8, wrap=True)
    return png_data_uri(fig)


def peers_table(timings: "PeerTimings", plan_name: str | None = "tensorplan") -> str:
    """Every runner of the run (median, CoV, what it computes in, build time, error vs ONNX Runtime,
    the plan's speed-up over it), the best fp32 peer marked, then the peers that were not timed."""
    best = timings.best_peer()
    plan = timings.runners.get(plan_name) if plan_name else None
    rows = []
    for t in sorted(timings.runners.values(), key=lambda t: t.median_ms):
        mark = " (best fp32 peer)" if t.name == best else (" (beside, not a baseline)"
                                                            if t.peer and t.precision != "fp32" else "")
        rows.append([t.label + mark, t.precision or "", f"{t.median_ms:.3f}", f"{t.cov:.1%}",
                     "" if t.build_s is None else f"{t.build_s:.2f}",
                     "" if t.max_rel_error is None else f"{t.max_rel_error:.1e}",
                     f"{t.median_ms / plan.median_ms:.2f}×" if plan and t.name != plan_name else ""])
    for name, why in timings.skipped.items():
        rows.append([name, "", "not timed", "", "", "", why])
    return html_table(["runtime", "precision", "median ms", "CoV of rounds", "build s", "max rel. error vs ORT",
                   f"{plan_name} speed-up" if plan else ""], rows)


def noise_note(timings: "PeerTimings") -> str:
    """One paragraph: the run's noise flag and the load it ran under."""
    load = (f"1-minute load {timings.load_before:.2f} before, {timings.load_after:.2f} after, on "
            f"{timings.cores} usable cores; {timings.rounds} rounds ({html.escape(timings.method)})")
    if timings.noisy:
        return (f"<p><span class='bad'>Noisy run</span>: {html.escape(str(timings.noise_reason))}. Re-run on a "
                f"quiet machine before quoting these figures. <span class='note'>{load}.</span></p>")
    return f"<p><span class='ok'>Quiet run</span>: every CoV ≤ {timings.max_cov:.0%}. <span class='note'>{load}.</span></p>"


def per_op_chart(per_op: list, top: int = 12) -> str:
    """ONNX Runtime's time per operator type (its own profiler)."""
    plt = pyplot()
    ops = sorted(per_op, key=lambda o: o.total_ms)[-top:]
    fig, ax = plt.subplots(figsize=(6, 0.6 + 0.3 * len(ops)))
    ax.barh([f"{o.op} ×{o.count}" for o in ops], [o.total_ms for o in ops], color="#ff7f0e")
    for i, o in enumerate(ops):
        ax.text(o.total_ms, i, f" {o.share:.0%}", va="center", fontsize=8)
    ax.set_xlabel("ms per inference")
    ax.grid(axis="x", alpha=0.3)
    return png_data_uri(fig)


def kernels_chart(kernels: list["DemoKernel"], top: int = 25) -> str:
    """The plan's most expensive kernels (predicted, from the measured cost model), by backend."""
    plt = pyplot()
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
    return png_data_uri(fig)


def html_table(header: list[str], rows: list[list]) -> str:
    th = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


REPORT_CSS = """body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right}td:first-child,th:first-child{text-align:left}h2{margin-top:1.6em}
.ok{color:#080;font-weight:bold}.bad{color:#c00;font-weight:bold}img{max-width:100%}
.note{color:#555;font-size:90%}"""


def demo_report_html(rep: "DemoReport") -> str:
    """The report as one HTML string."""
    d, p = rep.device, rep.plan
    ok = '<span class="ok">agree</span>' if rep.agree else '<span class="bad">DISAGREE</span>'
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>tensorplan: {html.escape(rep.model)}</title>"
             f"<style>{REPORT_CSS}</style></head><body>",
             f"<h1>tensorplan report: {html.escape(rep.model)}</h1>",
             f"<p class='note'>Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {html.escape(platform.node())} "
             f"({html.escape(platform.processor() or platform.machine())}) by <code>tensorplan demo</code>. "
             "Latencies are medians of interleaved rounds: every system runs once per round, in rotating "
             "order, so load on a shared machine slows all of them alike.</p>",
             "<h2>Model and device</h2>",
             html_table(["", ""], [
                 ["model", f"{rep.nodes} nodes, {rep.params / 1e6:.2f} M params, {rep.gflops:.2f} GFLOP"],
                 ["device", f"{d.name}: {d.cores} cores, {d.peak_fp32_gflops:.0f} GFLOP/s, "
                            f"{d.mem_bw_gbs:.1f} GB/s (measured)"],
                 # one ONNX Runtime figure per page: with a plan, the interleaved one below
                 *([] if p else [["ONNX Runtime", f"{rep.ort_median_ms:.3f} ms (CoV {rep.ort_cov:.1%})"]]),
                 ["reference executor vs ONNX Runtime", f"max rel. error {rep.max_rel_error:.2e}"]]),
             f"<p>Reference executor vs ONNX Runtime: {ok} (tolerance {rep.tolerance:.0e}).</p>"]
    if p:
        pok = '<span class="ok">agree</span>' if p.agree else '<span class="bad">DISAGREE</span>'
        t = p.peers
        best = t.runners.get(p.best_peer) if p.best_peer else None
        bf16 = [r for r in t.runners.values() if r.peer and r.precision not in (None, "fp32")]
        parts += ["<h2>Plan vs the runtimes you could deploy instead</h2>",
                  "<p>Every runtime runs the original model with the same inputs and thread count, "
                  "interleaved in one run; the headline is the speed-up over the fastest fp32 one.</p>",
                  noise_note(t),
                  peers_table(t),
                  (f"<p><b>{p.speedup_vs_best:.2f}×</b> vs the best fp32 peer, {html.escape(best.label)} "
                   f"({best.median_ms:.3f} ms)" if best else "<p>No fp32 peer was timed")
                  + "".join(f"; {html.escape(r.label)}, computing in {html.escape(str(r.precision))}, beside it: "
                            f"{r.median_ms:.3f} ms ({r.median_ms / p.plan_median_ms:.2f}×, max rel. error "
                            f"{r.max_rel_error if r.max_rel_error is not None else float('nan'):.1e})" for r in bf16)
                  + f". <b>{p.speedup_vs_ort:.2f}×</b> vs ONNX Runtime; outputs {pok} "
                  f"(max rel. error {p.max_rel_error:.2e}). {p.kernels} kernels from {p.primitives} "
                  f"primitives, backends {html.escape(str(p.backends))}; solver {html.escape(str(p.solver))}, "
                  f"optimised in {p.optimise_s or 0:.1f} s; predicted {p.predicted_ms:.2f} ms "
                  f"(sum of kernels timed alone).</p>",
                  f"<img alt='latency per round' src='{peers_chart(t)}'>"]
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
    parts += ["<h2>Where ONNX Runtime spends its time</h2>",
              f"<img alt='per operator' src='{per_op_chart(rep.per_op)}'>",
              html_table(["operator", "nodes", "ms", "share"],
                     [[o.op, o.count, f"{o.total_ms:.3f}", f"{o.share:.1%}"] for o in rep.per_op])]
    if p and p.kernel_list:
        ks = p.kernel_list
        parts += ["<h2>The plan's kernels</h2>",
                  f"<img alt='kernels' src='{kernels_chart(ks)}'>",
                  html_table(["kernel", "backend", "kind", "primitives", "operators", "predicted µs"],
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
