"""Show what the per-store features say about one task's programs, next to TVM's own extractor.

Why: when CDMPP mis-predicts a whole task (research/cdmpp/cdmpp_ood.py lists them), the first question is
whether the features can tell that task apart; this prints the named non-zero features of its first
programs, our rows vs TVM's PerStoreFeature rows, and the measured latency.

    .venv/bin/python research/cdmpp/cdmpp_task_features.py b36f104a9a501cd6 --programs 3
"""
from __future__ import annotations

import numpy as np
import typer


def main(task_key: str = typer.Argument(..., help="Task key (research/cdmpp/cdmpp_ood.py prints them)."),
         programs: int = typer.Option(3, "--programs", help="How many of the task's programs.")) -> None:
    from tensorplan.cdmpp import features as F
    from tensorplan.cdmpp.dataset import load_dataset, replay_trace
    from tensorplan.cdmpp.tasks import task_from_script

    ds = load_dataset(None)
    r = ds.records.reset_index(drop=True)
    tasks = ds.tasks.set_index("task_key")
    if task_key not in tasks.index:
        raise typer.BadParameter(f"unknown task {task_key!r}; see research/cdmpp/cdmpp_ood.py for task keys")
    t = tasks.loc[task_key]
    task = task_from_script(task_key, t.task_name, t.script, dict(t.networks))
    print(f"{t.task_name} ({task_key}), networks {list(t.networks)}, {t.flops:.0f} FLOPs")
    rows = np.flatnonzero((r.task_key == task_key).to_numpy() & (r.device == "local-1t").to_numpy())
    for i in rows[:programs]:
        sch = replay_trace(task.mod, r.trace[i])
        mine, ref = F.rows_like_tvm(F.compact_ast(sch)), F.tvm_per_store_feature(sch)
        same = mine.shape == ref.shape and np.allclose(mine, ref, atol=2e-3, rtol=1e-4)
        print(f"\nprogram {i}: {r.latency_s[i] * 1e6:.1f} µs on local-1t; rows equal to TVM's: {same}")
        for b, row in enumerate(mine):
            nz = {F.FEATURE_NAMES[k]: round(float(row[k]), 2) for k in np.flatnonzero(row)}
            print(f"  buffer row {b} (slog-scaled): {nz}")


if __name__ == "__main__":
    typer.run(main)
