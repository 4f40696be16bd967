"""How much of each split's validation set the trees have already seen: why `-rel` picks a mix.

Why: `TaskRelative` (`xgboost*-rel`) chooses its mix on the validation split. On the sample split it
picks 0 (the trees alone), on the one-domain device split 0.25, on held-out networks 0.5. A
validation record whose *program* is also a training record on another domain (the same schedule
timed at the other thread count) is nearly memorised by the trees, which leaves the spacing booster
nothing to add. This counts, for the evaluation table's three splits (the harness's own split
functions, seed 0), the share of validation and test records whose program is in training, by
the dataset's program index and by `ProgramArrays.program_ids` (task and leaves: what
`TaskRelative` checks, which also counts a task's schedules the features cannot tell apart), and
reads the mix and validation MAPEs each `-rel` model recorded in the evaluation table's JSON.

    .venv/bin/python research/cdmpp/cdmpp_val_overlap.py
"""
from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import typer


def main(out: Path = typer.Option(Path("research/cdmpp/results/cdmpp_val_overlap.json"), "--out"),
         table: Path = typer.Option(Path("research/cdmpp/results/cdmpp_eval.json"), "--table",
                                    help="The evaluation table's result JSON (for the recorded mixes).")) -> None:
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import EvalData, device_split, machine_info, network_split, sample_split
    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.harness import PUBLISHED_HOLDOUT

    ds = load_dataset(None).only_devices(["local-1t", "local-2t"]).filter_stable(max_cov=0.01, metric="mad")
    D = EvalData(ds)
    prog = dict(zip(ds.records["record_id"].astype(int), ds.records["prog_idx"].astype(int)))

    def programs(arr) -> np.ndarray:
        return np.array([prog[int(r)] for r in arr.record_id])

    def share_seen(ids: np.ndarray, seen: np.ndarray) -> float:
        return float(100 * np.isin(ids, seen).mean())

    splits = {"sample": sample_split(ds, 0, D), "network": network_split(ds, PUBLISHED_HOLDOUT, 0, D)}
    dv = device_split(ds, "local-2t", "local-1t", 8, 0, None, D)
    splits["device"] = (dv["train"], dv["val"], dv["test"])
    doc = json.loads(table.read_text()) if table.exists() else {"splits": {}}
    res = {}
    for name, (tr, va, te) in splits.items():
        seen, seen_ids = np.unique(programs(tr)), np.unique(tr.program_ids())
        entry = {"n_train": len(tr), "n_val": len(va), "n_test": len(te),
                 "val_program_in_train_pct": share_seen(programs(va), seen),
                 "test_program_in_train_pct": share_seen(programs(te), seen),
                 "val_program_id_in_train_pct": share_seen(va.program_ids(), seen_ids),
                 "test_program_id_in_train_pct": share_seen(te.program_ids(), seen_ids)}
        models = doc["splits"].get(name, {}).get("models", {})
        for m in ("xgboost-deep-rel", "xgboost-deep-rel-mape"):
            e = models.get(m, {})
            ch = (e.get("zero_shot") or e).get("chosen_on_validation")
            if ch:
                entry[m] = {"mix": ch["mix"], "val_mape_by_mix": ch["val_mape_by_mix"]}
        res[name] = entry
        print(f"{name:8s} val {entry['val_program_in_train_pct']:5.1f} % / test "
              f"{entry['test_program_in_train_pct']:5.1f} % of records have their program in training "
              f"(by program id {entry['val_program_id_in_train_pct']:5.1f} / "
              f"{entry['test_program_id_in_train_pct']:5.1f} %); "
              f"mix {entry.get('xgboost-deep-rel', {}).get('mix')}")
    out.write_text(json.dumps({"splits": res, "machine": machine_info(), "host": platform.node(),
                               "created": time.time()}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
