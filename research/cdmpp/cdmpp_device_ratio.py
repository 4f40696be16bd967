"""How the 1-thread latency of a program relates to its 2-thread latency, on the committed records.

Why: few-shot device adaptation (`cdmpp/calibrate.py`) predicts the target device as the source
prediction times a learned factor. This shows what that factor looks like on this CPU: by the
program's parallel-loop extent and by kernel size (fixed per-call costs of the thread pool dominate
kernels of a few µs).

    .venv/bin/python research/cdmpp/cdmpp_device_ratio.py
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def main() -> None:
    from tensorplan.cdmpp.arrays import as_arrays
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.features import FEATURE_NAMES

    ds = load_dataset(None).filter_stable(max_cov=0.01, metric="mad")
    arr = as_arrays(ds)
    col = FEATURE_NAMES.index("parallel_prod")
    par = np.maximum.reduceat(arr.leaf_data[:, col].astype(np.float64), arr.offsets[:-1])
    r = ds.records.assign(par=par)
    p = r.pivot_table(index="prog_idx", columns="device", values="latency_s").dropna()
    par_of = r.groupby("prog_idx")["par"].first()
    df = pd.DataFrame({"ratio": p["local-1t"] / p["local-2t"], "lat2_us": p["local-2t"] * 1e6,
                       "par": par_of.reindex(p.index)})
    q = [0.05, 0.25, 0.5, 0.75, 0.95]

    def show(title, groups):
        print(f"\n{title}")
        print(groups["ratio"].describe(percentiles=q)[["count"] + [f"{int(x * 100)}%" for x in q]].round(3).to_string())

    print(f"{len(df)} programs measured on both local-1t and local-2t (stable records)")
    print("latency(1 thread) / latency(2 threads), quantiles:", df["ratio"].quantile(q).round(3).to_dict())
    show("by parallel-loop extent (slog2 of the product, max over stores)",
         df.groupby(pd.cut(df["par"], [-1, 0.5, 1.5, 99], labels=["no parallel loop", "extent 1-2", "extent > 2"]),
                    observed=True))
    show("by 2-thread latency (µs)", df.groupby(pd.cut(df["lat2_us"], [0, 10, 50, 1000, 1e9]), observed=True))


if __name__ == "__main__":
    main()
