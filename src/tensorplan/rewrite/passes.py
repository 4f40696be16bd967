"""The rewrite pass list: algebraic rewrites of the operator graph before fission, exact in real
arithmetic, each cutting FLOPs or replacing operators by cheaper ones.

Why: Korch (and ONNX Runtime) only regroup the operators a model is given; these passes change
which operators there are. Each is exact up to floating-point rounding (checked against ONNX
Runtime on the original model in tests/test_rewrite.py); the file of each family explains its
algebra. `rewrite` runs the passes in this order until none fires, so a pass may set up a later
one (``split_concat_conv`` exposes the 1x1 convolutions ``conv_before_resize`` moves, and both
expose the fuse convolution ``token_linear_conv`` folds). It returns a new graph and the list
of rules applied (name, node); the plan records that list, and `rewrite` is deterministic, so a
plan re-derives the same graph.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph
from tensorplan.rewrite import activation, attention, output_phases, stem, token_layout, upsample
from tensorplan.rewrite.common import Editor, Rule
from tensorplan.rewrite.output_phases import output_phase_factor
from tensorplan.rewrite.winograd import WINOGRAD, winograd_conv, winograd_convs

PASSES: tuple[tuple[str, Rule], ...] = (
    ("identity_resize", upsample.identity_resize),
    ("split_concat_conv", upsample.split_concat_conv),
    ("conv_before_resize", upsample.conv_before_resize),
    ("upsample_conv_phases", upsample.upsample_conv_phases),
    ("mish_sigmoid", activation.mish_sigmoid),
    ("focus_conv", stem.focus_conv),
    ("conv_output_phases", output_phases.conv_output_phases),
    ("token_linear_conv", token_layout.token_linear_conv),
    ("token_linear_as_conv", token_layout.token_linear_as_conv),
    ("linear_attention_channel_major", attention.linear_attention_channel_major),
)
RULES = tuple(name for name, _ in PASSES)  # the default: every pass but the opt-in Winograd


@dataclass
class RewriteResult:
    graph: Graph
    applied: list[tuple[str, str]] = field(default_factory=list)  # (rule, node name)

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for rule, _ in self.applied:
            out[rule] = out.get(rule, 0) + 1
        return out


def rewrite(graph: Graph, rules: tuple[str, ...] | list[str] = RULES, winograd=()) -> RewriteResult:
    """Apply `rules` (in PASSES order) until none fires, then `conv3x3_winograd` to the
    convolutions named in `winograd` (names not eligible are an error: a plan that names them
    was made for another model); returns a new, pruned graph."""
    unknown = set(rules) - set(RULES)
    if unknown:
        raise TensorplanError(f"unknown rewrite rule(s) {sorted(unknown)}; known: {', '.join(RULES)}")
    g = graph.copy()
    ed = Editor(g)
    applied: list[tuple[str, str]] = []
    chosen = [rule for name, rule in PASSES if name in rules]
    changed = True
    while changed:
        changed = False
        for rule in chosen:
            while rule(g, ed, applied):
                changed = True
    if winograd:
        want = set(winograd)
        eligible = {n.name: n for n in winograd_convs(g)}
        missing = sorted(want - set(eligible))
        if missing:
            raise TensorplanError(f"{WINOGRAD}: {', '.join(missing[:5])} not an eligible 3x3 convolution of "
                                  f"'{graph.name}' (see tensorplan.rewrite.winograd_convs); "
                                  "re-run `tensorplan orchestrate`")
        for name in [n.name for n in g.nodes if n.name in want]:
            winograd_conv(g, ed, eligible[name], applied)
    if applied:
        g.prune()
        g.toposort()
        g.validate()
    return RewriteResult(g, applied)


__all__ = ["PASSES", "RULES", "WINOGRAD", "RewriteResult", "output_phase_factor", "rewrite", "winograd_convs"]
