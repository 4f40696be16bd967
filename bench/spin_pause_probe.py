"""Why interleaved timings pause between contenders: identical ONNX Runtime sessions, timed in turn.

Three sessions of the same small model (a 2-layer nn.TransformerEncoder, ~0.2 ms) in one process, 2
intra-op threads each, ORT's default spinning, timed two ways: as `tensorplan demo` did before session 27
(each round the sessions in a fixed rotation, each measured back to back for 0.2 s, no pause) and as
`measure.timer.interleaved` does (random order, a 50 ms pause, one untimed call, a ~30 ms burst).
Without the pause a session runs while the previous one's worker threads still spin on the 2 cores,
so identical sessions can differ by their position; with it they should agree.

    python bench/spin_pause_probe.py      # -> bench/results/spin_pause_probe.json
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import typer


def _transformer(path: Path) -> str:
    import torch

    from tensorplan.zoo.from_torch import from_torch
    torch.manual_seed(0)
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(128, 4, 256, batch_first=True), 2).eval()
    return str(from_torch(enc, (torch.randn(1, 64, 128),), name="encoder", path=path))


def _rotating(runners: dict, rounds: int, per_round_s: float = 0.2) -> dict:
    """The demo's former method: fixed rotation, each contender measured back to back, no pause."""
    from tensorplan.measure.timer import measure
    names = list(runners)
    out: dict = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            out[n].append(measure(runners[n], warmup=1, min_repeats=1, max_repeats=20, budget_s=per_round_s).median_s)
    return out


def main(rounds: int = typer.Option(15, help="Rounds per method."),
         out: Path = typer.Option(Path("bench/results/spin_pause_probe.json"), help="Results JSON.")) -> None:
    import onnx

    from tensorplan.devices import resolve
    from tensorplan.zoo.specs import load_model
    from tensorplan.ir.reference import random_feeds
    from tensorplan.ir.to_onnx import ort_session
    from tensorplan.measure.timer import interleaved, pinned_threads
    import tempfile
    model = _transformer(Path(tempfile.mkdtemp()) / "encoder.onnx")
    proto = onnx.load(model)
    feeds = random_feeds(load_model(model), seed=0)
    res = {}
    with pinned_threads(2):
        sessions = {f"session {k + 1}": ort_session(proto, threads=2, spinning=True) for k in range(3)}
        runners = {n: (lambda s=s: s.run(None, feeds)) for n, s in sessions.items()}
        for label in ("rotation, no pause", "random order, 50 ms pause"):
            times = (_rotating(runners, rounds) if label.startswith("rotation")
                     else interleaved(runners, rounds, pause_s=0.05, burst_s=0.03))
            res[label] = {n: statistics.median(v) * 1e3 for n, v in times.items()}
            print(f"{label:12s} " + "  ".join(f"{n} {v:.3f} ms" for n, v in res[label].items()), flush=True)
    spread = {k: max(v.values()) / min(v.values()) for k, v in res.items()}
    out.write_text(json.dumps({"bench": "spin_pause_probe", "model": "nn.TransformerEncoder(2 x (128, 4 heads))", "rounds": rounds, "median_ms": res,
                               "max_over_min": spread, "machine": resolve("local").to_dict(),
                               "created": time.time()}, indent=1, default=float))
    print(f"max/min across identical sessions: {spread}; wrote {out}")


if __name__ == "__main__":
    typer.run(main)
