"""The HTML report of `tensorplan optimize`: the plan against the peers, where the time to plan went,
what was predicted and what was measured.

One self-contained file (charts as PNG data URIs) written next to the plan; the peers' chart and
table are the demo report's (workflows/report.py), so both read alike."""
from __future__ import annotations

import html
import platform
import time
from pathlib import Path

from typing import TYPE_CHECKING

from tensorplan.runtime.plan import Plan
from tensorplan.workflows.peers import PeerTimings, RunnerTiming
from tensorplan.workflows.precision_search import FP32_RUNNER
from tensorplan.workflows.report import REPORT_CSS, pyplot, png_data_uri, html_table, noise_note, peers_chart, peers_table

if TYPE_CHECKING:  # optimize calls this module, not the other way round
    from tensorplan.workflows.optimize import OptimizeSummary


def _timings(summary: "OptimizeSummary") -> PeerTimings | None:
    d = dict(summary.timings or {})
    if not d:
        return None
    d["runners"] = {k: RunnerTiming(**v) for k, v in d["runners"].items()}
    return PeerTimings(**d)


def phases_chart(phases: dict[str, float], budget_s: float) -> str:
    """Where the time to plan went, one bar per phase, against the budget."""
    plt = pyplot()
    items = [(k[:-2], v) for k, v in phases.items() if v >= 0.01]
    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.3 * len(items)))
    ax.barh([k for k, _ in items], [v for _, v in items], color="#1f77b4", alpha=0.7)
    for i, (_, v) in enumerate(items):
        ax.text(v, i, f" {v:.1f} s", va="center", fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"seconds (budget {budget_s:.0f} s, total {sum(v for _, v in items):.0f} s)")
    ax.grid(axis="x", alpha=0.3)
    return png_data_uri(fig)


def precision_section(s: "OptimizeSummary") -> list[str]:
    """The precision search as HTML parts: what was kept, the calibration (and its warning), and every
    (backend, precision) tried per kernel with its accuracy beside its speed."""
    p = s.precision
    fp32_ms = ((s.timings or {}).get("runners") or {}).get(FP32_RUNNER, {}).get("median_ms")
    kept = ", ".join(f"{k}: {v}" for k, v in p.chosen.items()) or "no kernel searched"
    out = ["<h2>Precisions tried</h2>",
           f"<p>Requested <b>{html.escape(p.requested)}</b>: tried {html.escape(', '.join(p.precisions))} at a "
           f"tolerance of <b>{p.tolerance:g}</b> (largest |output − fp32 output| over the output's largest "
           f"magnitude, ONNX Runtime fp32 on the model as given being the reference). Kept: {html.escape(kept)}."
           + (f" The plan at fp32 ran {fp32_ms:.3f} ms in the same timing run, the kept plan "
              f"{s.measured_plan_ms:.3f} ms." if fp32_ms is not None and s.measured_plan_ms is not None else "")
           + (f" Backed off (the combination broke the tolerance): {html.escape(', '.join(p.backed_off))}."
              if p.backed_off else "") + "</p>"]
    if p.final is not None:
        out.append(f"<p>The kept plan, rebuilt from its plan data, on the calibration set: "
                   f"{html.escape(p.final.short())}.</p>")
    out.append(f"<p class='note'>Calibration: {html.escape(p.calibration)}. This CPU: "
               + html.escape("; ".join(f"{k} {v}" for k, v in p.native.items())) + ".</p>")
    for w in ([p.calibration_warning] if p.calibration_warning else []) + list(p.warnings):
        out.append(f"<p><span class='bad'>Warning:</span> {html.escape(w)}</p>")
    rows = []
    for v in p.variants:
        a = v.accuracy
        rows.append([v.label, v.backend, v.precision, v.status + (f" ({v.note})" if v.note else ""),
                     f"{v.median_ms:.3f}" if v.median_ms is not None else "",
                     f"{a.error:.2g}" if a else "", f"{a.max_abs:.2g}" if a else "", f"{a.max_rel:.2g}" if a else "",
                     f"{a.cosine:.5f}" if a else "",
                     f"{a.top1_agreement:.1%}" if a and a.top1_agreement is not None else ""])
    out += ["<p class='note'>Each variant is the whole plan with that kernel (and, for \"k3 +11\", the 11 kernels "
            "that compute the same) at that backend and precision, the kernels searched before it as kept: its time is the median of interleaved rounds against the "
            "kernel's other variants, its accuracy the plan's outputs on every calibration sample.</p>",
            html_table(["kernel", "backend", "precision", "status", "plan ms", "error", "max abs", "max rel",
                        "cosine", "top-1 agreement"], rows)]
    return out


def optimize_report_html(plan: Plan, s: "OptimizeSummary") -> str:
    """The report as one HTML string (`s`: the plan's `OptimizeSummary`)."""
    t = _timings(s)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>tensorplan optimize: "
             f"{html.escape(s.model)}</title><style>{REPORT_CSS}</style></head><body>",
             f"<h1>tensorplan optimize: {html.escape(s.model)}</h1>",
             f"<p class='note'>Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} on {html.escape(platform.node())} "
             f"({html.escape(platform.processor() or platform.machine())}), device {html.escape(s.device)}. "
             "Latencies are medians of interleaved rounds: every runtime runs once per round in a fresh random "
             "order, so load on a shared machine slows all of them alike.</p>"]
    ok = (s.max_rel_err is not None and s.tolerance is not None and s.max_rel_err <= s.tolerance)
    parts.append(f"<p>Checked against ONNX Runtime on {html.escape(s.reference)}: "
                 + (f"<span class='ok'>agree</span> (max relative error {s.max_rel_err:.2e}, tolerance "
                    f"{s.tolerance:.0e}" + (", the accuracy budget of the reduced-precision kernels" if s.reduced
                                            else "") + ")" if ok else "<span class='bad'>not checked</span>")
                 + ".</p>")
    if t is not None:
        best = s.best_peer
        parts += ["<h2>The plan vs the runtimes you could deploy instead</h2>",
                  (f"<p><b>{s.speedup_over_best:.2f}×</b> over the best fp32 peer, {html.escape(best)}. "
                   if best else "<p>No fp32 peer was timed. ")
                  + f"The plan runs in <b>{s.measured_plan_ms:.3f} ms</b>; its kernels timed alone sum to "
                  f"{s.solo_sum_ms:.3f} ms" + (f", the plan-time model predicted {s.predicted_plan_ms:.3f} ms"
                                               if s.predicted_plan_ms is not None else "") + ".</p>",
                  noise_note(t), peers_table(t), f"<img alt='latency per round' src='{peers_chart(t)}'>"]
    if s.precision is not None:
        parts += precision_section(s)
    race = plan.stats.get("race")
    if race:
        parts.append("<p>Finalists raced end to end before the plan was kept: " + html.escape(", ".join(
            f"{k} {v:.3f} ms ({race['kernels'][k]} kernels)" for k, v in race["median_ms"].items()))
            + f"; kept <b>{html.escape(race['chosen'])}</b>.</p>")
    parts += ["<h2>What was predicted, what was measured</h2>",
              f"<p>{s.candidates} candidate kernels, {s.unique_kernels} unique (what a fully measured "
              f"<code>orchestrate</code> compiles and times). {s.draws} schedules sampled for {s.searched} TIR kernels "
              f"(at most {s.samples} each, fewer once the predicted best stopped improving) and their defaults were "
              f"ranked by the predictor; the solver's kernels were then compiled and timed (the top "
              f"{s.top_k} schedules of each TIR kernel): <b>{s.measured}</b> kernels timed in this run "
              f"({100 * s.measured_share:.1f}%), {s.from_store} found in the store. Stopped: "
              f"{html.escape(s.stop)}.</p>",
              html_table(["solve", "kernels", "priced by prediction only", "timed after it", "objective ms",
                      "solve s", "measure s"],
                     [[it.index + 1, it.kernels, it.unmeasured, it.measured_now, f"{it.objective_ms:.3f}",
                       f"{it.solve_s:.2f}", f"{it.measure_s:.1f}"] for it in s.iterations]),
              "<h2>Time to plan</h2>", f"<img alt='phases' src='{phases_chart(s.phases, s.budget_s)}'>"]
    rows = []
    for k in sorted(plan.kernels, key=lambda k: -k.predicted_s):
        sched = k.schedule or {}
        rows.append([k.id, k.backend, k.precision, k.kind, len(k.nodes), f"{k.predicted_s * 1e6:.1f}",
                     str(sched.get("name", "")) + (f" (threads {sched['threads']})" if "threads" in sched else "")])
    parts += ["<h2>The plan's kernels</h2>",
              "<p class='note'>Solo µs: the kernel timed alone at fp32 (or, where the budget ended first, "
              "predicted).</p>",
              html_table(["kernel", "backend", "precision", "kind", "primitives", "solo µs", "schedule"], rows)]
    if plan.source.get("rewrites"):
        from collections import Counter
        rw = Counter(r for r, _ in plan.source["rewrites"])
        parts.append("<p>Exact rewrites applied before fission: "
                     f"{html.escape(', '.join(f'{k} ×{v}' for k, v in rw.items()))}.</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_optimize_report(plan: Plan, summary: "OptimizeSummary", path: str | Path) -> Path:
    """Write the report (parent folders created); returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(optimize_report_html(plan, summary), encoding="utf-8")
    return out


__all__ = ["optimize_report_html", "phases_chart", "precision_section", "write_optimize_report"]
