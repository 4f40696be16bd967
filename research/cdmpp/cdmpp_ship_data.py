"""Which data should the shipped model learn: the collection CPU's, or every CPU's the repo holds?

Why: the shipped model (`cdmpp/weights/cdmpp-local.pt`) learns the Zen 5 collection CPU's two
domains (`local-1t/2t`). The repo also holds a second CPU's records: the Zen 4 domains
(`zen4-1t/2t` in data/cdmpp), the programs over the 0.1 s cap (data/cdmpp-big-zen4) and the
data-movement grid (data/cdmpp-datamove-zen4). A user on a Zen 4 machine then predicts in a domain
the model learnt, and the big records teach it the untuned big convolutions that dominate YOLOv4 and
segformer-b0 (research/notes/cdmpp.md, *Programs over the 0.1 s cap*). The risks: the collection CPU's own
figures get worse, and so does a CPU neither arm learnt (more source CPUs made CDMPP's zero-shot
worse before, *One source domain or several*).

Each model and seed trains twice, on the same networks (the `--holdout` networks' tasks left out
of both arms):
  collection   local-1t, local-2t of data/cdmpp
  all-cpus     the same + zen4-1t, zen4-2t of data/cdmpp, data/cdmpp-big-zen4, data/cdmpp-datamove-zen4
  all-cpus+zen3  the same + the Zen 3 VM's zen3-1t, zen3-2t (`--arms`; measured later, run on a Zen 3 host)
and each is scored three ways:
  heldout      the held-out networks' unseen kernels on the collection CPU (stable records)
  gpuhost-*    a third CPU neither arm learnt: the GPU machine's Xeon at 1 and 16 threads
               (every stable record; a zero-shot device)
  check        every kernel's default schedule of the nine networks that `cdmpp_predict_check.py`
               timed on this host (`--host`), predicted with this host's own device vector, as
               `tensorplan predict --device local` does (the host must be of that CPU type)
One JSON line per (arm, model, seed), appended when done (resumable); `--summary` writes medians.

    python research/cdmpp/cdmpp_ship_data.py              # ~30 min on a 2-core VM (six 240 s CDMPPs)
    python research/cdmpp/cdmpp_ship_data.py --summary    # -> research/cdmpp/results/cdmpp_ship_data.json
    python research/cdmpp/cdmpp_ship_data.py --weights src/tensorplan/cdmpp/weights/cdmpp-local.pt --label shipped
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import typer

from cdmpp_bigkernels import BIG_S, CHECK, _rows, checked_kernels, network_arrays, score, train_model

OUT = Path("research/cdmpp/results/cdmpp_ship_data.jsonl")
ARMS = {"collection": ("data/cdmpp", ["local-1t", "local-2t"]),
        "all-cpus": ("data/cdmpp,data/cdmpp-big-zen4,data/cdmpp-datamove-zen4",
                     ["local-1t", "local-2t", "zen4-1t", "zen4-2t"])}
ARMS["all-cpus+zen3"] = (ARMS["all-cpus"][0], ARMS["all-cpus"][1] + ["zen3-1t", "zen3-2t"])
ZERO_SHOT = ["gpuhost-1t", "gpuhost-16t"]
STABLE = {"max_cov": 0.01, "metric": "mad"}


def _metrics(est, ds) -> dict:
    from tensorplan.cdmpp.arrays import as_arrays
    from tensorplan.cdmpp.metrics import regression_metrics
    arr = as_arrays(ds)
    m = regression_metrics(np.asarray(est.predict(arr)), arr.latency_s)
    return {k: m[k] for k in ("mape_pct", "median_ape_pct", "acc10_pct", "acc20_pct")} | {"records": len(ds)}


def _pooled(nets: dict, keep: str | None = None) -> dict:
    """Kernel MAPE over every checked kernel (or those whose flag `keep` is true), under and over
    the 0.1 s cap."""
    sel = np.concatenate([v[keep] if keep else np.ones(len(v["measured_s"]), bool) for v in nets.values()])
    r = np.concatenate([v["pred_over_meas"] for v in nets.values()])[sel]
    m = np.concatenate([v["measured_s"] for v in nets.values()])[sel]
    ape = 100 * np.abs(r - 1)
    return {"kernel_mape_pct": float(ape.mean()), "kernel_median_ape_pct": float(np.median(ape)),
            "small_kernel_mape_pct": float(ape[m <= BIG_S].mean()), "big_kernel_mape_pct": float(ape[m > BIG_S].mean()),
            "kernels": int(len(r))}


def _test_sets(holdout: list[str]) -> dict:
    """The held-out networks' unseen kernels on the collection CPU, and the zero-shot CPU's records."""
    from tensorplan.cdmpp.dataset import load_dataset
    everything = load_dataset(ARMS["all-cpus"][0]).filter_stable(**STABLE)
    _, test = everything.split(kind="network", holdout=holdout)
    return {"heldout": test.only_devices(ARMS["collection"][1])} | {d: everything.only_devices([d]) for d in ZERO_SHOT}


def _check(est, arrays: dict, measured: dict, seen: set | None = None, labelled: set | None = None) -> dict:
    """Each checked network scored (`score`), with its kernels' times and whether each one's program
    has a label of the check host's CPU type (`labelled`) in the order of `pred_over_meas`."""
    nets = {}
    for net, (keys, calls, arr) in arrays.items():
        nets[net] = score(np.asarray(est.predict(arr)), keys, calls, measured[net], seen)
        ks = [measured[net][k] for k in keys if k in measured[net]]
        nets[net]["measured_s"] = [k["measured_us"] * 1e-6 for k in ks]
        nets[net]["unlabelled"] = np.array([(k["key"], k["sample"]) not in (labelled or set()) for k in ks], bool)
    return nets


def _public(nets: dict) -> dict:
    return {n: {k: v for k, v in s.items() if k not in ("measured_s", "unlabelled")} for n, s in nets.items()}


def run(holdout: list[str], models: list[str], seeds: list[int], time_scale: float, host: str, out: Path,
        arms: list[str]) -> None:
    from tensorplan.devices.detect import cpu_info
    from tensorplan.cdmpp.dataset import load_dataset

    here = cpu_info()["model"]
    if here != host:
        raise SystemExit(f"this host is '{here}', the check's kernels were timed on '{host}': the 'check' score "
                         "predicts with this host's device vector, so run it on that CPU type (or pass --host)")
    measured = checked_kernels(CHECK, host)
    tests = _test_sets(holdout)
    arrays = network_arrays(list(measured), "local-2t", None)        # this host's own device vector
    labelled = _host_labelled(ARMS["all-cpus"][0], host)
    done = {(r["arm"], r["model"], r["seed"]) for r in _rows(out)}
    for arm in arms:
        data, devices = ARMS[arm]
        tr_ds, _ = load_dataset(data).only_devices(devices).split(kind="network", holdout=holdout)
        seen = set(tr_ds.records["task_key"])
        for seed in seeds:
            for name in models:
                if (arm, name, seed) in done:
                    continue
                est, info = train_model(tr_ds, name, seed, time_scale)
                nets = _check(est, arrays, measured, seen, labelled)
                row = {"arm": arm, "model": name, "seed": seed, "devices": devices, "data": data, "holdout": holdout,
                       "host": host, "train_records": info["records"], "train_s": info["train_time_s"],
                       "scores": {k: _metrics(est, t) for k, t in tests.items()},
                       "check": _pooled(nets), "check_unlabelled": _pooled(nets, "unlabelled"),
                       "networks": _public(nets)}
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{arm} {name} seed {seed}: " + ", ".join(f"{k} {v['mape_pct']:.1f}%" for k, v in row["scores"].items())
                      + f", check kernels {row['check']['kernel_mape_pct']:.1f}%; "
                      + ", ".join(f"{n} {v['total_ratio']:.2f}x" for n, v in nets.items()), flush=True)


# the dataset's domain prefix of each CPU type a predict check ran on
DOMAIN_PREFIX = {"AMD EPYC (family 25, model 17)": "zen4", "AMD EPYC (family 25, model 1)": "zen3",
                 "AMD EPYC (family 26, model 2)": "local"}   # the collection CPU's own type
# every export a shipped model may have learnt from (labels of the check host's type among them)
LABEL_DATA = ARMS["all-cpus"][0] + ",data/cdmpp-big-zen5"


def _host_labelled(data: str, host: str) -> set[tuple[str, int]]:
    """(task key, sample index) of every program that has a label of `host`'s CPU type in `data`: a
    checked kernel among them was timed on this CPU type for training, so the check is in-sample there."""
    import pandas as pd

    from tensorplan.cdmpp.dataset import load_dataset
    out = set()
    for d in data.split(","):
        ds = load_dataset(d)
        r = ds.records.merge(pd.read_parquet(Path(d) / "programs.parquet", columns=["prog_idx", "index"]), on="prog_idx")
        r = r[r["device"].str.startswith(f"{DOMAIN_PREFIX[host]}-")]
        out |= set(zip(r["task_key"], r["index"].astype(int)))
    return out


def score_weights(weights: Path, label: str, holdout: list[str], host: str, out: Path,
                  predict_as: str | None = None) -> None:
    """One line for a saved model (`--weights`), scored the same three ways. A shipped model trained
    on every network, so its `heldout` and `check` figures include networks it learnt: they show what
    users get, not generalisation; the `gpuhost-*` CPUs it never learnt stay zero-shot.

    `predict_as`: a dataset domain of the check host's CPU type (`zen4-2t`): its kernels are predicted
    with that domain's recorded device vector, so the check can be scored on any machine; without it
    this must run on the check's host and predicts as `local-2t`, measured here."""
    from tensorplan.devices.detect import cpu_info
    from tensorplan.cdmpp.base import load_estimator
    from tensorplan.cdmpp.dataset import load_dataset

    if predict_as is None and cpu_info()["model"] != host:
        raise SystemExit(f"the check's kernels were timed on '{host}'; run this on that CPU type "
                         "(or pass --predict-as with its dataset domain)")
    if any(r["arm"] == label and r["model"] == "weights" and r["host"] == host for r in _rows(out)):
        print(f"{out} already scores weights '{label}' on '{host}'; delete that line to score them again")
        return
    measured = checked_kernels(CHECK, host)
    tests = _test_sets(holdout)
    est = load_estimator(weights)
    specs = load_dataset(None).devices if predict_as else None
    nets = _check(est, network_arrays(list(measured), predict_as or "local-2t", specs), measured,
                  labelled=_host_labelled(LABEL_DATA, host))
    row = {"arm": label, "model": "weights", "seed": 0, "weights": str(weights), "host": host, "holdout": holdout,
           "devices": list(getattr(est, "domains_", []) or []), "train_records": None,
           "scores": {k: _metrics(est, t) for k, t in tests.items()}, "check": _pooled(nets),
           "check_unlabelled": _pooled(nets, "unlabelled"), "networks": _public(nets)}
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")


def summarize(path: Path) -> dict:
    """Per (model, arm): medians over seeds of every score, the check's pooled kernel figures and
    each network's predicted / measured total."""
    groups: dict = {}
    hosts = {r["host"] for r in _rows(path)}
    for r in _rows(path):     # a file scoring several hosts' checks keeps them apart
        arm = r["arm"] if len(hosts) == 1 else f"{r['arm']} on {r['host']}"
        groups.setdefault(r["model"], {}).setdefault(arm, []).append(r)
    med = statistics.median
    out = {"host": next(iter(_rows(path)), {}).get("host"), "models": {}}
    for model, arms in groups.items():
        for arm, rs in arms.items():
            out["models"].setdefault(model, {})[arm] = {
                "seeds": sorted(r["seed"] for r in rs), "train_records": rs[0]["train_records"],
                "scores": {k: {m: med(r["scores"][k][m] for r in rs) for m in rs[0]["scores"][k]}
                           for k in rs[0]["scores"]},
                "check": {m: med(r["check"][m] for r in rs) for m in rs[0]["check"]},
                **({"check_unlabelled": {m: med(r["check_unlabelled"][m] for r in rs) for m in rs[0]["check_unlabelled"]}}
                   if "check_unlabelled" in rs[0] else {}),
                "total_ratio": {n: med(r["networks"][n]["total_ratio"] for r in rs) for n in rs[0]["networks"]}}
    return out


def main(holdout: str = typer.Option("efficientvit-b1,tiny-mlp,mobilenet-v2,segformer-b0",
                                     help="Networks whose tasks neither arm trains on (the harness's three + segformer-b0)."),
         models: str = typer.Option("xgboost-hier,cdmpp-nocmd-parts", help="Harness models."),
         seeds: str = typer.Option("0,1,2", help="Seeds."),
         time_scale: float = typer.Option(1.0, help="Multiply the models' training budgets."),
         host: str = typer.Option("AMD EPYC (family 25, model 17)", help="The predict check's host (this CPU type)."),
         out: Path = typer.Option(OUT, help="JSONL, one line per (arm, model, seed); resumable."),
         weights: Path = typer.Option(None, help="Instead of training: score this saved model (e.g. the shipped "
                                      "one) and append it as arm --label, model 'weights'."),
         label: str = typer.Option("shipped", help="The arm name of a --weights line."),
         predict_as: str = typer.Option(None, help="With --weights: predict the check host's kernels as this "
                                        "dataset domain (e.g. zen4-2t), so the check runs on any machine."),
         arms: str = typer.Option("collection,all-cpus", help=f"Training arms to run, of {', '.join(ARMS)}."),
         summary: bool = typer.Option(False, "--summary", help="Print and write the summary JSON.")) -> None:
    """Train on the collection CPU's data or on every CPU's, and score both where users predict."""
    if weights is not None:
        score_weights(weights, label, [h for h in holdout.split(",") if h], host, out, predict_as)
    elif not summary:
        run([h for h in holdout.split(",") if h], [m for m in models.split(",") if m],
            [int(x) for x in seeds.split(",") if x], time_scale, host, out, [a for a in arms.split(",") if a])
    s = summarize(out)
    out.with_suffix(".json").write_text(json.dumps(s, indent=1))
    for model, arms in s["models"].items():
        for arm, x in arms.items():
            print(f"{model:>18} {arm:>10} ({x['train_records']} records): "
                  + ", ".join(f"{k} {v['mape_pct']:.1f}% ({v['median_ape_pct']:.1f})" for k, v in x["scores"].items())
                  + f"; check {x['check']['kernel_mape_pct']:.1f}% (small {x['check']['small_kernel_mape_pct']:.1f}, "
                  f"big {x['check']['big_kernel_mape_pct']:.1f}"
                  + (f"; {x['check_unlabelled']['kernels']} without a label of this CPU type: "
                     f"{x['check_unlabelled']['kernel_mape_pct']:.1f}%" if "check_unlabelled" in x else "") + "); "
                  + ", ".join(f"{n} {v:.2f}x" for n, v in x["total_ratio"].items()))


if __name__ == "__main__":
    typer.run(main)
