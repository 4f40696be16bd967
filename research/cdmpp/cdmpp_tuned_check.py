"""`tensorplan predict --tuned N --measure` over several networks: the model as a tuner's cost model.

Why: `predict` sums each kernel's default schedule (its first design-space sample), which runs
~2-3x slower than the kernel's best sampled schedule (`tensorplan predictor dataset stats`). With `--tuned N`
the model ranks each kernel's first N samples without timing any and keeps the predicted-fastest.
This script times, on this CPU, the default schedules and the model's picks for each network,
so the speed-up the picks buy, the kernels they make slower, and how well the tuned total is
predicted are measured, not claimed. Networks absent from the dataset (yolov4, tiny-style,
tiny-linear-attention) are the fair test: for the others, the shipped model has seen these very
programs' labels in training.

`--weights` checks another predictor's picks on the same kernels, e.g. one trained with the
within-task ranking term (`CDMPP(w_rank=0.3)`, trained through `model.train`) against one trained without it.

One JSON line per (network, host, N, label), appended when done, so a killed run resumes;
`--summary` writes the summary JSON and prints the markdown table of research/notes/cdmpp.md.

    python research/cdmpp/cdmpp_tuned_check.py --tuned 32          # about 15 min on a 2-core VM
    tensorplan predictor train --max-time 300 --out base300.pt
    python -c "from tensorplan.cdmpp.model import train; train(epochs=400, max_time_s=300, parts_input=True, w_rank=0.3, out='rank300.pt')"
    python research/cdmpp/cdmpp_tuned_check.py --weights base300.pt --label base300 --models tiny-style,tiny-linear-attention,yolov4
    python research/cdmpp/cdmpp_tuned_check.py --weights rank300.pt --label rank300 --models tiny-style,tiny-linear-attention,yolov4
    python research/cdmpp/cdmpp_tuned_check.py --oracle --models tiny-style,tiny-linear-attention   # every candidate timed
    python research/cdmpp/cdmpp_tuned_check.py --summary
"""
from __future__ import annotations

import json
from pathlib import Path

import typer

OUT = Path("research/cdmpp/results/cdmpp_tuned_check.jsonl")
NETWORKS = ["tiny-style", "tiny-linear-attention", "yolov4", "tiny-cnn", "mobilenet-v2", "efficientvit-b1"]


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _done(path: Path) -> set:
    return {(r["model"], r["host"], r["tuned"], r.get("label", "shipped")) for r in _rows(path)}


def run(networks: list[str], tuned: int, device: str, out: Path, weights: Path | None = None,
        label: str = "shipped") -> None:
    """Per network not yet in the JSONL for (host, N, label): predict with `weights` (default: the
    shipped model), time the default schedules and the picks."""
    from tensorplan.devices.detect import cpu_info, machine_info
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.predict import predict

    host = cpu_info()["model"]
    done = _done(out)
    seen = {k for v in load_dataset(None).tasks["networks"] for k, _ in v}
    for net in networks:
        if (net, host, tuned, label) in done:
            print(f"{net}: done on {host}")
            continue
        r = predict(net, device=device, weights=weights, measure=True, progress=True, calibrated=False,
                    tuned=tuned).to_dict()
        r.update(host=host, seen_in_dataset=net in seen, machine=machine_info(), label=label)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a") as f:
            f.write(json.dumps(r) + "\n")
        t = r["measured"].get("tuned", {})
        print(f"{net}: default {t.get('default_measured_ms', float('nan')):.2f} ms, picks "
              f"{t.get('measured_ms', float('nan')):.2f} ms measured", flush=True)


ORACLE = OUT.with_name("cdmpp_tuned_oracle.jsonl")


def oracle(networks: list[str], tuned: int, threads: int, out: Path) -> None:
    """Time every one of each kernel's first N schedules (the candidates `--tuned N` ranks), once per
    (network, host, N), whatever the predictor: the measured-fastest candidate is the yardstick for
    every predictor's picks (`summarize`: regret measured on this CPU, not on the dataset's labels)."""
    import tvm

    from tensorplan.devices.detect import cpu_info
    from tensorplan.zoo.specs import resolve_model
    from tensorplan.cdmpp.dataset import init_pool, time_module
    from tensorplan.cdmpp.predict import MEASURE_TIMER, static_onnx, task_schedules
    from tensorplan.cdmpp.tasks import network_tasks_and_gaps
    from tensorplan.progress import progress_bar

    host = cpu_info()["model"]
    done = {(r["model"], r["host"], r["tuned"]) for r in _rows(out)}
    init_pool(threads)
    target = tvm.target.Target({"kind": "llvm", "num-cores": threads})
    for net in networks:
        if (net, host, tuned) in done:
            print(f"{net}: oracle done on {host}")
            continue
        path, name = resolve_model(net)
        tasks, _ = network_tasks_and_gaps(static_onnx(path, name), name)
        kernels = []
        with progress_bar(f"{net}: time every candidate", len(tasks), True) as advance:
            for t in tasks:
                times = {}
                for mod, i in task_schedules(t, None, tuned, 8 + 4 * tuned):   # as `predict` draws them
                    r = time_module(mod, t, target, [threads], **MEASURE_TIMER)
                    if not isinstance(r, str):
                        times[str(i)] = 1e6 * r[threads].median_s
                kernels.append({"key": t.key, "task": t.name, "calls": int(t.networks.get(name, 1)),
                                "measured_us": times})
                advance()
        with out.open("a") as f:
            f.write(json.dumps({"model": net, "host": host, "tuned": tuned, "threads": threads,
                                "kernels": kernels}) + "\n")


def _oracle_regret(r: dict, orc: dict) -> dict | None:
    """The picks' and the default schedules' network time over the measured-fastest candidates',
    all from the oracle's timings (one timing pass, so the three are comparable)."""
    times = {k["key"]: k for k in orc["kernels"]}
    tot = {"best": 0.0, "picks": 0.0, "default": 0.0}
    hits = 0
    for k in r["kernels"]:
        o = times.get(k["key"])
        ts = (o or {}).get("measured_us") or {}
        pick, dflt = ts.get(str(k["tuned_sample"])), ts.get(str(k["sample"]))
        if pick is None or dflt is None:
            return None                      # a candidate failed to time: no fair network total
        tot["best"] += k["calls"] * min(ts.values())
        tot["picks"] += k["calls"] * pick
        tot["default"] += k["calls"] * dflt
        hits += pick == min(ts.values())
    return {"picks_regret_pct": 100 * (tot["picks"] / tot["best"] - 1),
            "default_regret_pct": 100 * (tot["default"] / tot["best"] - 1),
            "picks_are_fastest": hits, "best_ms": tot["best"] / 1e3}


def summarize(path: Path) -> dict:
    """Per (network, host, N): default and tuned totals, measured and predicted, over the kernels timed
    both ways; the picks' measured speed-up and how many kernels they made slower."""
    rows = []
    oracles = {(o["model"], o["host"], o["tuned"]): o for o in _rows(path.with_name(ORACLE.name))}
    for r in _rows(path):
        m, t = r["measured"], r["measured"].get("tuned")
        if not t:
            continue
        orc = oracles.get((r["model"], r["host"], r["tuned"]))
        extra = (_oracle_regret(r, orc) or {}) if orc else {}
        rows.append({"network": r["model"], "host": r["host"], "tuned": r["tuned"], "label": r.get("label", "shipped"),
                     "seen_in_dataset": r["seen_in_dataset"], "kernels": r["n_kernels"],
                     "kernels_timed_both": t["kernels"], "kernels_changed": t["changed"],
                     "kernels_slower": t["kernels_slower"],
                     "default_measured_ms": t["default_measured_ms"], "default_predicted_ms": m["predicted_ms"],
                     "tuned_measured_ms": t["measured_ms"], "tuned_predicted_ms": t["predicted_ms"],
                     "measured_speedup": t["measured_speedup"], "tuned_total_ratio": t["total_ratio"],
                     "default_total_ratio": m["total_ratio"], **extra})
    return {"rows": rows}


def _print_table(rows: list[dict], ms) -> None:
    """The docs table of one host's rows."""
    print("| network | in dataset | predictor | kernels (changed / slower) | default, measured ms | "
          "picks, measured ms | speed-up | tuned total, predicted / measured | picks' regret % (default's) | "
          "picks measured-fastest |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for x in rows:
        orc = ((f"{x['picks_regret_pct']:.0f} ({x['default_regret_pct']:.0f})", f"{x['picks_are_fastest']}")
               if "picks_regret_pct" in x else ("—", "—"))
        print(f"| {x['network']} | {'yes' if x['seen_in_dataset'] else 'no'} | {x['label']} | {x['kernels']} "
              f"({x['kernels_changed']} / {x['kernels_slower']}) | {ms(x['default_measured_ms'])} | "
              f"{ms(x['tuned_measured_ms'])} | {x['measured_speedup']:.2f}× | {x['tuned_total_ratio']:.2f}× | "
              f"{orc[0]} | {orc[1]} |")


def main(models: str = typer.Option(",".join(NETWORKS), help="Comma-separated zoo names or ONNX paths."),
         tuned: int = typer.Option(32, "--tuned", help="Schedules compared per kernel."),
         device: str = typer.Option("local-1t", help="'local' or 'local-<N>t'."),
         out: Path = typer.Option(OUT, help="JSONL, one line per (network, host, N, label); resumable."),
         weights: Path = typer.Option(None, "--weights", help="Predictor file (default: the shipped model)."),
         label: str = typer.Option("shipped", "--label", help="Name of the predictor in the JSONL (with --weights)."),
         summary: bool = typer.Option(False, "--summary", help="Write the summary JSON from the JSONL."),
         with_oracle: bool = typer.Option(False, "--oracle", help="Instead: time every candidate of every kernel "
                                          "(cdmpp_tuned_oracle.jsonl next to --out), the yardstick for the "
                                          "picks' regret in --summary.")) -> None:
    """The model's picks among each kernel's first N schedules, timed against the default schedules."""
    if with_oracle:
        from tensorplan.cdmpp.predict import local_threads
        oracle([m for m in models.split(",") if m], tuned, local_threads(device),
               out.with_name(ORACLE.name))
        return
    if summary:
        s = summarize(out)
        out.with_suffix(".json").write_text(json.dumps(s, indent=1))
        ms = (lambda x: f"{x:,.2f}" if x < 1000 else f"{x:,.0f}")
        for host in dict.fromkeys(x["host"] for x in s["rows"]):     # one table per host CPU
            print(f"\n{host}:\n")
            _print_table([x for x in s["rows"] if x["host"] == host], ms)
        return
    run([m for m in models.split(",") if m], tuned, device, out, weights, label)


if __name__ == "__main__":
    typer.run(main)
