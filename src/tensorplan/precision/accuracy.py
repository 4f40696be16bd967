"""How far reduced-precision outputs drift from the fp32 reference, in the figures users compare:
a normalised max error (the one a tolerance bounds), max absolute and relative error, cosine
similarity and, for classifiers, top-1 agreement.

Why normalised: a tolerance has to mean the same on logits around 10 and on features around 1e-3, so
`error` is the largest absolute difference over the largest reference magnitude of the same output
and sample: "the outputs stay within 2 % of their range". NaN or inf where the reference is finite
makes `error` infinite, so no tolerance accepts it.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tensorplan.errors import TensorplanError

#: Floor of the reference magnitude in `error` (an all-zero output would divide by zero).
MAGNITUDE_FLOOR = 1e-6
#: `max_rel` divides by |ref| + this share of the output's largest magnitude, so values near zero do
#: not turn a tiny absolute difference into a huge relative one.
REL_FLOOR = 1e-3


@dataclass
class Accuracy:
    """Outputs of a reduced-precision run against the fp32 reference over `samples` samples.

    `error`: max over samples and outputs of max|out - ref| / max(max|ref|, 1e-6), the figure a
    tolerance bounds; `max_abs`: max |out - ref|; `max_rel`: max |out - ref| / (|ref| + 1e-3 max|ref|);
    `cosine`: the lowest, over outputs, cosine similarity of all samples flattened; `top1_agreement`:
    share of rows whose argmax agrees, over outputs shaped like classifier logits ([batch, classes],
    classes >= 2), None when there are none."""

    error: float
    max_abs: float
    max_rel: float
    cosine: float
    top1_agreement: float | None
    samples: int

    def within(self, tolerance: float) -> bool:
        """Whether `error` is finite and at most `tolerance` (a share of the outputs' range)."""
        return math.isfinite(self.error) and self.error <= tolerance

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: a non-finite figure is written as None, `finite` says whether all were finite."""
        d = asdict(self)
        finite = all(math.isfinite(v) for k, v in d.items() if isinstance(v, float))
        out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
        out["finite"] = finite
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Accuracy":
        """An Accuracy read back from `to_dict()`: a figure written as None (not finite) comes back as
        inf (errors) or NaN (cosine), so `within` still refuses it."""
        if not isinstance(d, dict):
            raise TensorplanError(f"accuracy record must be an object (Accuracy.to_dict()), got {type(d).__name__}")
        missing = [k for k in ("error", "max_abs", "max_rel", "cosine", "samples") if k not in d]
        if missing:
            raise TensorplanError(f"accuracy record lacks field(s) {missing} (write it with Accuracy.to_dict())")

        def num(k: str, fill: float) -> float:
            return fill if d[k] is None else float(d[k])
        top1 = d.get("top1_agreement")
        return cls(error=num("error", math.inf), max_abs=num("max_abs", math.inf), max_rel=num("max_rel", math.inf),
                   cosine=num("cosine", math.nan), top1_agreement=None if top1 is None else float(top1),
                   samples=int(d["samples"]))

    def short(self) -> str:
        """One line for tables and logs."""
        top1 = f", top-1 {self.top1_agreement:.1%}" if self.top1_agreement is not None else ""
        return (f"error {self.error:.2g} (max abs {self.max_abs:.2g}, max rel {self.max_rel:.2g}, "
                f"cosine {self.cosine:.5f}{top1}; {self.samples} samples)")


def compare(reference: list[dict[str, np.ndarray]], outputs: list[dict[str, np.ndarray]]) -> Accuracy:
    """`outputs[i]` (a reduced-precision run on sample i) against `reference[i]` (fp32 on the same
    sample), output by output. Raises TensorplanError when the two do not pair up (sample counts,
    output names or shapes differ)."""
    if not reference:
        raise TensorplanError("accuracy: no reference samples to compare against")
    if len(reference) != len(outputs):
        raise TensorplanError(f"accuracy: {len(outputs)} output samples vs {len(reference)} reference samples; "
                              "run both on the same calibration set")
    names = list(reference[0])
    if not names:
        raise TensorplanError("accuracy: the reference has no outputs")
    error = max_abs = max_rel = 0.0
    dots = {n: 0.0 for n in names}
    norms = {n: [0.0, 0.0] for n in names}
    agree = rows = 0
    classifier = False
    for i, (ref, out) in enumerate(zip(reference, outputs)):
        if set(ref) != set(names) or set(out) != set(names):
            raise TensorplanError(f"accuracy: sample {i} has outputs {sorted(out)}, the reference {sorted(ref)}; "
                                  "both runs must produce the same named outputs")
        for n in names:
            r = np.asarray(ref[n], dtype=np.float64)
            o = np.asarray(out[n], dtype=np.float64)
            if r.shape != o.shape:
                raise TensorplanError(f"accuracy: output '{n}' of sample {i} has shape {o.shape}, the reference "
                                      f"{r.shape}")
            if r.size == 0:
                continue
            if not np.isfinite(r).all():
                raise TensorplanError(f"accuracy: the fp32 reference output '{n}' of sample {i} holds NaN/inf; "
                                      "it cannot judge other precisions (check the model and its inputs)")
            diff = np.abs(o - r)
            top = float(np.abs(r).max())
            if not np.isfinite(o).all():
                d_max = math.inf
            else:
                d_max = float(diff.max())
            error = max(error, d_max / max(top, MAGNITUDE_FLOOR))
            max_abs = max(max_abs, d_max)
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = diff / (np.abs(r) + REL_FLOOR * max(top, MAGNITUDE_FLOOR))
            max_rel = max(max_rel, math.inf if not np.isfinite(rel).all() else float(rel.max()))
            if np.isfinite(o).all():
                dots[n] += float(np.dot(o.ravel(), r.ravel()))
                norms[n][0] += float(np.dot(o.ravel(), o.ravel()))
                norms[n][1] += float(np.dot(r.ravel(), r.ravel()))
            else:
                dots[n] = math.nan
            if r.ndim == 2 and r.shape[1] >= 2:
                classifier = True
                agree += int((o.argmax(axis=1) == r.argmax(axis=1)).sum())
                rows += r.shape[0]
    cosine = min(_cosine(dots[n], *norms[n]) for n in names)
    return Accuracy(error=error, max_abs=max_abs, max_rel=max_rel, cosine=cosine,
                    top1_agreement=(agree / rows) if classifier and rows else None, samples=len(reference))


def _cosine(dot: float, norm_o: float, norm_r: float) -> float:
    """Cosine similarity from the accumulated dot product and squared norms: 1 when both are zero,
    0 when only one is, NaN (never accepted) when the outputs were not finite."""
    if math.isnan(dot):
        return math.nan
    if norm_o == 0.0 and norm_r == 0.0:
        return 1.0
    if norm_o == 0.0 or norm_r == 0.0:
        return 0.0
    return dot / math.sqrt(norm_o * norm_r)


__all__ = ["Accuracy", "MAGNITUDE_FLOOR", "REL_FLOOR", "compare"]
