"""`tensorplan predictor ...`: for people who build latency predictors: the CDMPP dataset
(`predictor dataset ...`), training, few-shot fine-tuning and the evaluation harness."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from tensorplan.errors import TensorplanError

_err = Console(stderr=True)


def _log(msg: str) -> None:
    _err.print(f"[dim]{msg}[/]")


def _leaf_counts(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint="--leaves") from None


def _dump(obj) -> str:
    return json.dumps(obj, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o))


predictor_app = typer.Typer(help="Build latency predictors: the CDMPP dataset, training, fine-tuning, evaluation.",
                             no_args_is_help=True)


@predictor_app.command("train")
def train_cmd(
    data: Optional[Path] = typer.Option(None, "--data", help="Dataset directory (default: data/cdmpp/)."),
    devices: Optional[str] = typer.Option(None, "--devices", help="Comma-separated device domains (default: all)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to save the model (.pt; default: cache)."),
    ship: bool = typer.Option(False, "--ship", help="Save to the packaged weights (cdmpp/weights/cdmpp-local.pt)."),
    model: str = typer.Option("cdmpp", "--model", help="cdmpp, or one baseline of `predictor evaluate` "
                              "(xgboost, xgboost-hier, mlp, tlp, roofline); use the file with predict --weights."),
    parts: bool = typer.Option(True, "--parts/--no-parts", help="cdmpp also reads each program's analytic "
                               "compute / DRAM-footprint / cache-traffic seconds on its device (parts_input)."),
    epochs: int = typer.Option(400, "--epochs", min=1, help="Maximum epochs (cdmpp)."),
    max_time: float = typer.Option(600.0, "--max-time", help="Training time budget in seconds (per member)."),
    members: int = typer.Option(1, "--members", min=1, help="Train an ensemble of this many seeds (>= 2): "
                                "averaged predictions and a per-kernel spread."),
    workers: int = typer.Option(0, "--workers", min=0, help="Ensemble members trained at once, one CPU each "
                                "(0: every CPU this process may use); each keeps its --max-time."),
    max_spread: float = typer.Option(0.01, "--max-spread", min=0.0, help="Keep records whose repeat spread is <= this."),
    stability: str = typer.Option("mad", "--stability", help="Spread measure: mad (MAD/median) or cov (CDMPP)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Train CDMPP (or --model) on the measured dataset (stable records) and save it."""
    from tensorplan.cli.common import output_file, positive
    from tensorplan.forkmap import default_workers
    from tensorplan.paths import cache_dir
    from tensorplan.cdmpp.evaluate import make_model
    from tensorplan.cdmpp.model import SHIPPED_MODEL, train

    output_file(out, "--out")
    positive(max_time, "--max-time")
    if ship and model != "cdmpp":
        raise typer.BadParameter("--ship packages CDMPP only; save other models with --out", param_hint="--model")
    make = None
    if model != "cdmpp":
        if model.startswith("cdmpp"):
            raise typer.BadParameter(f"'{model}': pass cdmpp (with --epochs/--max-time/--parts) or a single "
                                     "baseline such as xgboost-hier; --members makes an ensemble", param_hint="--model")
        try:
            make_model(model)                           # unknown names fail here, before any data loads
        except TensorplanError as e:
            raise typer.BadParameter(str(e), param_hint="--model") from e
        make = lambda s: make_model(model, seed=s)      # noqa: E731
    dest = SHIPPED_MODEL if ship else (out or cache_dir() / "models" / f"{model}.pt")
    _, info = train(data, devices=devices.split(",") if devices else None, out=dest, epochs=epochs,
                    max_time_s=max_time, max_cov=max_spread, stability=stability, members=members,
                    make=make, parts_input=parts, workers=workers or default_workers())
    if json_out:
        print(_dump(info))
        return
    v = info["val"]
    Console().print(f"trained on {info['records']} records ({', '.join(info['devices'])}) in "
                    f"{info['train_time_s']:.0f} s; validation MAPE {v['mape_pct']:.2f}%, "
                    f"±10% {v['acc10_pct']:.1f}%; saved {info['path']} ({info['size_mb']:.1f} MB)")

@predictor_app.command("finetune")
def finetune_cmd(
    device: str = typer.Option(..., "--device", help="Target device domain, e.g. local-1t."),
    model: Optional[Path] = typer.Option(None, "--model", help="Pre-trained model (default: shipped)."),
    data: Optional[Path] = typer.Option(None, "--data", help="Dataset directory with the target's records."),
    tasks: int = typer.Option(10, "--tasks", min=1, help="Number of tasks to measure on the target."),
    per_task: int = typer.Option(8, "--per-task", min=1, help="Programs per selected task."),
    method: str = typer.Option("kmeans", "--method", help="Task selection: kmeans or random."),
    steps: int = typer.Option(300, "--steps", min=1, help="Fine-tuning steps."),
    adapt: str = typer.Option("finetune", "--adapt",
                              help="finetune: train CDMPP's head; calibrate: keep the model, fit a "
                                   "correction from --source predictions to this device."),
    source: Optional[str] = typer.Option(None, "--source", help="Source domain for --adapt calibrate "
                                                                "(default: another device in the data)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where to save the fine-tuned model."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Few-shot fine-tune CDMPP for a device domain from KMeans-selected (or random) tasks."""
    from tensorplan.paths import cache_dir
    from tensorplan.cdmpp.finetune import finetune_device
    from tensorplan.cli.common import output_file
    output_file(out, "--out")

    dest = out or cache_dir() / "models" / f"cdmpp-{device}.pt"
    info = finetune_device(device, model=model, data=data, n_tasks=tasks, per_task=per_task, method=method,
                           steps=steps, out=dest, adapt=adapt, source=source)
    if json_out:
        print(_dump(info))
        return
    Console().print(f"{adapt}, {method}: {info['n_target_samples']} samples from {len(info['tasks'])} tasks; "
                    f"MAPE on the rest of {device}: {info['before']['mape_pct']:.2f}% -> "
                    f"{info['after']['mape_pct']:.2f}%; saved {info['path']}")

@predictor_app.command("evaluate")
def evaluate_cmd(
    data: Optional[str] = typer.Option(None, "--data", help="Dataset directory (default: data/cdmpp/); "
                                       "several, comma-separated, load as one (data/cdmpp,data/cdmpp-h100)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here (e.g. cdmpp_eval.json)."),
    doc: Optional[Path] = typer.Option(None, "--doc", help="Regenerate the results block of this markdown "
                                       "file (between its cdmpp-eval markers; appended when absent)."),
    models: Optional[str] = typer.Option(None, "--models", help="Comma-separated models (default: all of cdmpp, "
                                         "cdmpp-nocmd, cdmpp-nocmd-parts (what train ships), xgboost, xgboost-hier, "
                                         "mlp, tlp, roofline)."),
    resume: bool = typer.Option(False, "--resume", help="Keep every model already scored in --out (same data "
                                "and settings) and score only the others: continues a killed run, or adds "
                                "models to a finished one. --out is saved after each model."),
    splits: str = typer.Option("network,device,sample", "--splits", help="Comma-separated splits."),
    quick: bool = typer.Option(False, "--quick", help="Tiny epochs (smoke test, numbers meaningless)."),
    holdout: Optional[str] = typer.Option(None, "--holdout", help="Comma-separated held-out networks."),
    source: str = typer.Option("local-2t", "--source", help="Device split: domain(s) the models train on, "
                                "comma-separated (e.g. local-1t,local-2t,gpuhost-1t,gpuhost-16t)."),
    target: str = typer.Option("local-1t", "--target", help="Device split: held-out domain (few-shot target), "
                               "e.g. zen4-1t from `tensorplan predictor dataset measure-device`."),
    fewshot_tasks: Optional[int] = typer.Option(None, "--fewshot-tasks", min=1, help="Tasks selected for few-shot."),
    per_task: int = typer.Option(8, "--per-task", min=1, help="Programs per selected task."),
    time_scale: float = typer.Option(1.0, "--time-scale", help="Multiply every model's training budget."),
    max_spread: float = typer.Option(0.01, "--max-spread", min=0.0, help="Keep records whose repeat spread is <= this."),
    stability: str = typer.Option("mad", "--stability", help="Spread measure: mad (MAD/median) or cov (CDMPP)."),
    devices: Optional[str] = typer.Option(None, "--devices", help="Keep only these device domains' records, "
                                          "comma-separated (default: all; e.g. local-1t,local-2t)."),
    leaves: Optional[str] = typer.Option(None, "--leaves", help="Keep only programs with these leaf counts, "
                                         "comma-separated (5: the CDMPP scripts' default setting)."),
    json_out: bool = typer.Option(False, "--json", help="Print the result JSON."),
) -> None:
    """Train and score CDMPP and the baselines on the same splits; write JSON and a markdown table."""
    run_evaluation(None, data=data, out=out, doc=doc, models=models, resume=resume, splits=splits, quick=quick,
                   holdout=holdout, source=source, target=target, fewshot_tasks=fewshot_tasks, per_task=per_task,
                   time_scale=time_scale, max_spread=max_spread, stability=stability, devices=devices,
                   leaves=leaves, json_out=json_out)


def run_evaluation(harness, *, data: Optional[str], out: Optional[Path], doc: Optional[Path], models: Optional[str],
                   resume: bool, splits: str, quick: bool, holdout: Optional[str], source: str, target: str,
                   fewshot_tasks: Optional[int], per_task: int, time_scale: float, max_spread: float, stability: str,
                   devices: Optional[str], leaves: Optional[str], json_out: bool) -> None:
    """What `predictor evaluate` does with its options, with `harness` (default: the product's
    `evaluate.Harness`) naming the models: a harness that knows more models reuses the command."""
    from tensorplan.cdmpp.evaluate import evaluate, render_markdown, save_results, write_doc
    from tensorplan.cli.common import output_file, positive

    output_file(out, "--out")
    output_file(doc, "--doc")
    positive(time_scale, "--time-scale")
    if resume and out is None:
        raise typer.BadParameter("--resume needs --out (the result file to continue)", param_hint="--resume")
    earlier = None
    if resume and out.exists():
        try:
            earlier = json.loads(out.read_text())
        except (OSError, ValueError) as e:
            raise typer.BadParameter(f"cannot read {out} ({e}); drop --resume to start afresh",
                                     param_hint="--resume") from e
    res = evaluate(data, models=models.split(",") if models else None, splits=splits.split(","),
                   quick=quick, resume=earlier, checkpoint=(lambda doc: save_results(doc, out)) if out else None,
                   holdout_networks=holdout.split(",") if holdout else None, fewshot_tasks=fewshot_tasks,
                   source_device=source, target_device=target,
                   fewshot_per_task=per_task, time_scale=time_scale, max_cov=max_spread,
                   stability=stability, domains=devices.split(",") if devices else None,
                   leaves=_leaf_counts(leaves) if leaves else None, log=_log, harness=harness)
    if out:
        save_results(res, out)
        _log(f"wrote {out}")
    if doc:
        write_doc(res, doc, harness)
        _log(f"updated {doc}")
    if json_out:
        print(_dump(res))
    else:
        Console().print(render_markdown(res, harness))


def register(app: typer.Typer) -> None:
    from tensorplan.cli.dataset import dataset_app
    predictor_app.add_typer(dataset_app, name="dataset")
    app.add_typer(predictor_app, name="predictor")
