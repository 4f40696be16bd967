"""Big kernels: do programs slower than the dataset's 0.1 s cap fix the networks they dominate?

Why: collection skips programs slower than 0.1 s per call (`max_kernel_s`), so no model has seen
one. A user's untuned big convolutions are exactly such programs: on the Zen 4 and Zen 3 hosts the
3 and 11 kernels over 0.1 s carry two thirds of segformer-b0's and YOLOv4's measured time, and
the shipped model puts them at a median 0.15-0.27x (`research/cdmpp/cdmpp_predict_check.py`, research/notes/cdmpp.md, *Checked on
the user's CPU*). The predictions saturate near the largest label they learnt.

A second collection pass times what the first skipped: the programs the export does not hold
(`--exclude-data`), with a 2 s cap, on tasks of at least 1e8 FLOPs. On a Zen 4 host:

    tensorplan predictor dataset collect --prefix zen4 --max-kernel-ms 2000 --min-task-flops 1e8 \\
        --exclude-data data/cdmpp --programs-per-task 24 --store ~/.cache/tensorplan/big-zen4.sqlite
    tensorplan predictor dataset export --store ~/.cache/tensorplan/big-zen4.sqlite --out data/cdmpp-big-zen4
    python research/cdmpp/cdmpp_bigkernels.py --extra data/cdmpp-big-zen4 --devices zen4-1t,zen4-2t

Each model and seed is trained twice on the domains `--devices` (+ `--also-train`), without and
with the big records, always without the tasks of the `--holdout` networks. Both then predict every
kernel's default schedule (sample 0, what `tensorplan predict` schedules) of the nine networks that
`cdmpp_predict_check.py` timed on a host of the same CPU type (`--host`), and are scored against
those measurements: per network the predicted / measured total, per kernel the MAPE, and the
kernels measured over 0.1 s. The networks whose tasks no training run saw (YOLOv4, tiny-style,
tiny-linear-attention and the held-out ones) are the test; the others show the fit. One JSON line
per (model, seed, with/without); `--summary` writes medians over seeds.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import typer

OUT = Path("research/cdmpp/results/cdmpp_bigkernels.jsonl")
CHECK = Path("research/cdmpp/results/cdmpp_predict_check.jsonl")
BIG_S = 0.1                       # the dataset's collection cap: kernels above it are "big"


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def checked_kernels(check: Path, host: str) -> dict[str, dict[str, dict]]:
    """{network: {task key: kernel}} of every kernel `cdmpp_predict_check.py` timed on `host`."""
    out = {r["model"]: {k["key"]: k for k in r["kernels"] if k.get("measured_us")}
           for r in _rows(check) if r["host"] == host}
    if not out:
        hosts = sorted({r["host"] for r in _rows(check)})
        raise SystemExit(f"{check}: no kernels timed on host '{host}' (hosts there: {hosts})")
    return out


def network_arrays(networks: list[str], dom: str, specs: dict) -> dict[str, tuple[list[str], np.ndarray, object]]:
    """{network: (task keys, calls, ProgramArrays)} of each kernel's default schedule, featurised once,
    on domain `dom` as the dataset's `specs` record it."""
    from tensorplan.zoo.specs import resolve_model
    from tensorplan.cdmpp.predict import network_programs, static_onnx

    out = {}
    for net in networks:
        path, name = resolve_model(net)
        tasks, _, _, _, _, arr = network_programs(static_onnx(path, name, None), name, dom, specs=specs)
        out[net] = ([t.key for t in tasks], np.array([t.networks.get(name, 1) for t in tasks], np.float64), arr)
    return out


def score(pred_s: np.ndarray, keys: list[str], calls: np.ndarray, measured: dict[str, dict],
          seen: set | None = None) -> dict:
    """One network: predicted / measured total over its timed kernels, kernel MAPE, big kernels
    (and those of them whose task is not in `seen`, the training tasks)."""
    sel = [i for i, k in enumerate(keys) if k in measured]
    p = pred_s[sel]
    m = np.array([measured[keys[i]]["measured_us"] for i in sel]) * 1e-6
    c = calls[sel]
    big = m > BIG_S
    new = big & np.array([keys[i] not in (seen or set()) for i in sel], bool)
    return {"big_unseen_kernels": int(new.sum()),
            "big_unseen_ratio_median": float(np.median(p[new] / m[new])) if new.any() else None,
            "kernels": len(sel), "measured_ms": float(c @ m * 1e3), "predicted_ms": float(c @ p * 1e3),
            "total_ratio": float((c @ p) / (c @ m)), "mape_pct": float(100 * np.mean(np.abs(p - m) / m)),
            "big_kernels": int(big.sum()), "big_share_pct": float(100 * (c[big] @ m[big]) / (c @ m)),
            "big_ratio_median": float(np.median(p[big] / m[big])) if big.any() else None,
            "small_ratio_total": float((c[~big] @ p[~big]) / (c[~big] @ m[~big])) if (~big).any() else None,
            "pred_over_meas": [float(x) for x in p / m]}


def train_model(tr_ds, name: str, seed: int, time_scale: float):
    """One harness model (`cdmpp_variants.harness.make_model`) trained on `tr_ds` -> (estimator, train info)."""
    from tensorplan.cdmpp.model import train

    import _path  # noqa: F401  (research/ on sys.path: cdmpp_variants)
    from cdmpp_variants.harness import make_model
    return train(tr_ds, seed=seed, make=lambda s: make_model(name, time_scale=time_scale, seed=s))


def run(extra: str, devices: list[str], also: list[str], holdout: list[str], models: list[str], seeds: list[int],
        time_scale: float, check: Path, host: str, dom: str, out: Path) -> None:
    from tensorplan.cdmpp.dataset import load_dataset

    measured = checked_kernels(check, host)
    arrays = None
    done = {(r["model"], r["seed"], r["with_big"]) for r in _rows(out)}
    for with_big in (False, True):
        raw = load_dataset(f"data/cdmpp,{extra}" if with_big else None).only_devices(devices + also)
        tr_ds, _ = raw.split(kind="network", holdout=holdout)
        seen = set(tr_ds.records["task_key"])
        for seed in seeds:
            for name in models:
                if (name, seed, with_big) in done:
                    continue
                est, info = train_model(tr_ds, name, seed, time_scale)
                if arrays is None:
                    arrays = network_arrays(list(measured), dom, raw.devices)
                nets = {}
                for net, (keys, calls, arr) in arrays.items():
                    nets[net] = score(np.asarray(est.predict(arr)), keys, calls, measured[net], seen)
                    nets[net]["tasks_in_training"] = int(sum(k in seen for k in keys))
                n_big = int((tr_ds.filter_stable(max_cov=0.01, metric="mad").records["latency_s"] > BIG_S).sum())
                row = {"model": name, "seed": seed, "with_big": with_big, "devices": devices, "also_train": also,
                       "holdout": holdout, "host": host, "predicted_as": dom, "train_records": info["records"],
                       "train_records_over_cap": n_big, "train_s": info["train_time_s"], "networks": nets}
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{name} seed {seed} big={with_big}: " + ", ".join(
                    f"{n} {v['total_ratio']:.2f}x" for n, v in nets.items()), flush=True)


def summarize(path: Path, check: Path) -> dict:
    """Per (model, with/without) and network: medians over seeds of the total ratio, kernel MAPE and
    the big kernels' median ratio; the shipped model's same figures (from the check) for reference."""
    rows = _rows(path)
    host = rows[0]["host"]
    shipped, measured = {}, {}
    for r in _rows(check):
        if r["host"] == host:
            ks = [k for k in r["kernels"] if k.get("measured_us")]
            measured[r["model"]] = np.array([k["measured_us"] for k in ks]) * 1e-6   # the rows' kernel order
            shipped[r["model"]] = score(np.array([k["predicted_us"] for k in ks]) * 1e-6, [k["key"] for k in ks],
                                        np.array([k["calls"] for k in ks], np.float64), {k["key"]: k for k in ks})
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], "with" if r["with_big"] else "without"), []).append(r)
    out = {"host": host, "shipped": {n: {k: v for k, v in s.items() if k != "pred_over_meas"} for n, s in shipped.items()},
           "models": {}}
    for (model, arm), rs in groups.items():
        nets = {}
        for net in rs[0]["networks"]:
            vs = [r["networks"][net] for r in rs]
            big = [v["big_ratio_median"] for v in vs if v["big_ratio_median"] is not None]
            new = [v["big_unseen_ratio_median"] for v in vs if v["big_unseen_ratio_median"] is not None]
            nets[net] = {"total_ratio": statistics.median(v["total_ratio"] for v in vs),
                         "mape_pct": statistics.median(v["mape_pct"] for v in vs),
                         "big_kernels": vs[0]["big_kernels"], "big_share_pct": vs[0]["big_share_pct"],
                         "big_ratio_median": statistics.median(big) if big else None,
                         "big_unseen_kernels": vs[0]["big_unseen_kernels"],
                         "big_unseen_ratio_median": statistics.median(new) if new else None,
                         "tasks_in_training": vs[0]["tasks_in_training"], "kernels": vs[0]["kernels"]}
        out["models"].setdefault(model, {})[arm] = {
            "seeds": sorted(r["seed"] for r in rs), "train_records": rs[0]["train_records"],
            "train_records_over_cap": rs[0]["train_records_over_cap"], "networks": nets,
            **{k: statistics.median(_pooled_ape(r["networks"], measured)[k] for r in rs)
               for k in ("kernel_mape_pct", "small_kernel_mape_pct", "big_kernel_mape_pct")}}
    out["shipped_pooled"] = _pooled_ape(shipped, measured)
    return out


def _pooled_ape(nets: dict, measured: dict) -> dict:
    """Kernel MAPE pooled over the networks: all kernels, those under the 0.1 s cap, those over it."""
    r = np.concatenate([nets[n]["pred_over_meas"] for n in nets])
    m = np.concatenate([measured[n] for n in nets])
    assert len(r) == len(m), "the check's kernels and the rows' are not the same"
    ape = 100 * np.abs(r - 1)
    return {"kernel_mape_pct": float(ape.mean()), "small_kernel_mape_pct": float(ape[m <= BIG_S].mean()),
            "big_kernel_mape_pct": float(ape[m > BIG_S].mean())}


def main(extra: str = typer.Option("data/cdmpp-big-zen4", help="Exported big-program records (dataset directory)."),
         devices: str = typer.Option("zen4-1t,zen4-2t", help="Domains to train on (the big records' and the check's CPU)."),
         also_train: str = typer.Option("", help="More domains to train on (e.g. local-1t,local-2t)."),
         holdout: str = typer.Option("segformer-b0", help="Networks whose tasks no run trains on."),
         models: str = typer.Option("xgboost-hier,cdmpp-nocmd-parts", help="Harness models."),
         seeds: str = typer.Option("0,1,2", help="Seeds."),
         time_scale: float = typer.Option(1.0, help="Multiply the models' training budgets."),
         check: Path = typer.Option(CHECK, help="cdmpp_predict_check.py's JSONL (the measured kernels)."),
         host: str = typer.Option("AMD EPYC (family 25, model 17)", help="The check's host to score against "
                                  "(its CPU type must be the --devices')."),
         predict_as: str = typer.Option("zen4-2t", help="Domain to predict the check's kernels on (2 threads)."),
         out: Path = typer.Option(OUT, help="JSONL, one line per (model, seed, with/without); resumable."),
         summary: bool = typer.Option(False, "--summary", help="Print and write the summary JSON.")) -> None:
    """Whole-network and big-kernel error with and without the programs over the 0.1 s cap in training."""
    if summary:
        s = summarize(out, check)
        out.with_suffix(".json").write_text(json.dumps(s, indent=1))
        nets = list(s["shipped"])
        print("| model | big records | " + " | ".join(nets) + " |")
        print("| shipped | – | " + " | ".join(f"{s['shipped'][n]['total_ratio']:.2f}×" for n in nets) + " |")
        for model, by in s["models"].items():
            for arm in ("without", "with"):
                if arm in by:
                    x = by[arm]
                    print(f"| {model} | {arm} ({x['train_records_over_cap']}) | " + " | ".join(
                        f"{x['networks'][n]['total_ratio']:.2f}×" for n in nets) + " |")
        print("\nkernels over 0.1 s whose task no run trained on: median predicted / measured (count)")
        for model, by in s["models"].items():
            for arm in ("without", "with"):
                if arm in by:
                    print(f"{model:>20} {arm:>7}: " + ", ".join(
                        f"{n} {v['big_unseen_ratio_median']:.2f}x ({v['big_unseen_kernels']})"
                        for n, v in by[arm]["networks"].items() if v["big_unseen_kernels"]))
        return
    run(extra, [d for d in devices.split(",") if d], [d for d in also_train.split(",") if d],
        [h for h in holdout.split(",") if h], [m for m in models.split(",") if m],
        [int(x) for x in seeds.split(",") if x], time_scale, check, host, predict_as, out)


if __name__ == "__main__":
    typer.run(main)
