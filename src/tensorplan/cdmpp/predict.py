"""Whole-network latency prediction (`tensorplan predict`), and its measured check.

A network becomes its fused kernels (`tasks.network_tasks`); each kernel gets one deterministic
schedule (its first valid meta-schedule design-space sample, drawn exactly as the dataset draws its
programs: `task_schedules`), its compact AST, and a predicted latency. The network's latency is
the call-count-weighted sum, the quantity CDMPP's end-to-end replay predicts. With `tuned=N` the
model also acts as a tuner's cost model: it ranks each kernel's first N samples and sums the
predicted-fastest ones.

Why `measure`: a prediction alone is a claim. With `measure=True` every kernel is also compiled
with that same schedule and timed on this machine with the dataset's timer (`dataset.time_module`,
TVM's runtime pool at the domain's thread count), so the user sees per kernel and for the whole
network how far the prediction is from this CPU's reality. That is only possible for this
machine's own domains (`local`, `local-Nt`). On a CPU other than the one the training data came
from, this is a zero-shot test of a new device: the device vector describes this machine
(`devices.resolve`), while every label the model learnt from came from the collection CPU.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.progress import progress_bar
from tensorplan.cdmpp.model import SHIPPED_MODEL, ProgramArrays, device_features, load_estimator, load_shipped, regression_metrics, resolve_domain

# the dataset's timer settings (`dataset.collect`), with a longer cap: a network's big kernels
# (a VGG convolution with an untuned schedule) run for seconds and must still be timed
MEASURE_TIMER = {"min_repeat_s": 2e-5, "repeats": 15, "max_kernel_s": 5.0}


def task_schedules(task, target=None, n: int = 1, tries: int = 8) -> list[tuple]:
    """The first `n` valid meta-schedule design-space samples of a task among draws 0..tries-1 ->
    [(module, sample index)]: the same sampler and seeds as the dataset, so the programs look like
    the training data, and draw i is the dataset's program `index` i of that task where it was
    measured. Empty when no draw is valid (or the task has no design space)."""
    import tvm

    from tensorplan.cdmpp.dataset import _TaskState, sample_schedule

    target = target or tvm.target.Target({"kind": "llvm", "num-cores": 2})
    out = []
    try:
        st = _TaskState(task, target)
        for i in range(tries if st.spaces else 0):
            r = sample_schedule(st, i)
            if r is not None:
                out.append((r[0].mod, i))
                if len(out) == n:
                    break
    except Exception:  # noqa: BLE001 - a task meta-schedule cannot schedule: the caller falls back
        pass
    return out


SHIPPED_GPU_MODEL = SHIPPED_MODEL.with_name("cdmpp-h100.pt")
GPU_SAMPLE_TRIES = 8 * 24   # gpu_dataset.sample_programs: programs_per_task x tries_per_program


def domain_kind(domain: str) -> str:
    """'gpu' or 'cpu' (what `devices.resolve` says; a domain it does not know counts as a CPU)."""
    from tensorplan.devices import resolve
    try:
        return "gpu" if resolve(domain).kind == "gpu" else "cpu"
    except Exception:  # noqa: BLE001 - a dataset-only domain name such as 'zen4-1t'
        return "cpu"


def gpu_target(domain: str):
    """The TVM target a GPU domain's programs are scheduled for: its `nvidia/...` tag (the tag the
    GPU dataset was sampled with for the H100), or the catalog's `tvm_tag` of a GPU of the same die
    (the H200 -> the H100's); a clear error for a GPU TVM has no tag for."""
    import tvm

    from tensorplan.devices import resolve
    spec = resolve(domain)
    extra = spec.extra or {}
    if extra.get("tvm_tag"):                   # a GPU TVM has no tag of its own for (the H200)
        return tvm.target.Target(extra["tvm_tag"])
    names = [domain, spec.name, str(extra.get("catalog", ""))]
    for n in names:
        base = re.split(r"-(?:sxm|pcie|nvl)", n.lower())[0]              # 'a100-sxm4-40gb' -> 'a100'
        for b in dict.fromkeys((base, re.sub(r"([a-z])(\d)", r"\1-\2", base))):  # 'rtx4090' -> 'rtx-4090'
            for tag in (f"nvidia/nvidia-{b}", f"nvidia/geforce-{b}", f"nvidia/tesla-{b}"):
                try:
                    return tvm.target.Target(tag)
                except Exception:  # noqa: BLE001 - not a known tag; try the next spelling
                    continue
    raise TensorplanError(f"device '{domain}': TVM has no CUDA target tag for it (tried nvidia/nvidia-{names[0]}), "
                          "so its kernels cannot be scheduled as GPU programs; predict a GPU TVM knows "
                          "(e.g. --device h100, a100)")


def local_threads(domain: str) -> int:
    """Thread count of one of this machine's domains ('local-2t' -> 2); a clear error otherwise."""
    m = re.fullmatch(r"local-(\d+)t", domain)
    if not m:
        raise TensorplanError(f"--measure times the kernels on this machine, so the device must be 'local' or "
                              f"'local-<N>t', not '{domain}'; predict '{domain}' without --measure")
    n = int(m.group(1))
    if not 1 <= n <= (os.cpu_count() or 1):
        raise TensorplanError(f"device '{domain}': this machine has {os.cpu_count()} CPU(s), "
                              f"cannot time kernels at {n} threads")
    return n


def measured_summary(kernels: list[dict]) -> dict:
    """Prediction vs measurement over the kernels that were timed: per-kernel metrics (each kernel
    once), rank correlation across kernels, and the call-weighted totals over the same kernels."""
    from scipy.stats import spearmanr

    ok = [k for k in kernels if k.get("measured_us")]
    out: dict = {"kernels_measured": len(ok), "kernels_failed": [k["task"] for k in kernels
                                                                 if not k.get("measured_us")]}
    if not ok:
        return out
    pred = np.array([k["predicted_us"] for k in ok]) * 1e-6
    meas = np.array([k["measured_us"] for k in ok]) * 1e-6
    calls = np.array([k["calls"] for k in ok], np.float64)
    out["per_kernel"] = regression_metrics(pred, meas)
    out["spearman_across_kernels"] = float(spearmanr(pred, meas).statistic) if len(ok) > 2 else float("nan")
    out["predicted_ms"] = float(calls @ pred * 1e3)
    out["measured_ms"] = float(calls @ meas * 1e3)
    out["total_ratio"] = out["predicted_ms"] / out["measured_ms"]
    out["total_ape_pct"] = 100 * abs(out["total_ratio"] - 1)
    both = [k for k in ok if k.get("tuned_measured_us")]
    if both:   # `predict_network(tuned=N)`: the model's picks, timed, over the kernels timed both ways
        c = np.array([k["calls"] for k in both], np.float64)
        tp, tm, dm = (c @ np.array([k[f] for k in both]) / 1e3
                      for f in ("tuned_us", "tuned_measured_us", "measured_us"))
        out["tuned"] = {"kernels": len(both), "changed": sum(k["tuned_sample"] != k["sample"] for k in both),
                        "predicted_ms": tp, "measured_ms": tm, "default_measured_ms": dm, "total_ratio": tp / tm,
                        "measured_speedup": dm / tm,
                        "kernels_slower": sum(k["tuned_measured_us"] > 1.05 * k["measured_us"] for k in both)}
    return out


def _save_schedules(out: Path, network: str, kernels: list[dict], mods: list) -> None:
    """Write each kernel's scheduled program as TVMScript (DIR/<kernel>.py) and an index
    (DIR/schedules.json: kernel, task key, calls, sample index, predicted µs, file)."""
    out.mkdir(parents=True, exist_ok=True)
    index = []
    for k, mod in zip(kernels, mods):
        f = out / f"{k['task']}.py"
        f.write_text(mod.script())
        pick = "tuned_sample" in k
        index.append({"kernel": k["task"], "key": k["key"], "calls": k["calls"], "file": f.name,
                      "sample": k["tuned_sample"] if pick else k["sample"],
                      "predicted_us": k["tuned_us"] if pick else k["predicted_us"]})
    (out / "schedules.json").write_text(json.dumps({"network": network, "kernels": index}, indent=1))


def static_onnx(path: Path, name: str, input_shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    """`path` itself when its inputs have static shapes and none are given; otherwise the model
    imported with `input_shapes` (a symbolic dimension left open is one clear error naming it) and
    written back as a static ONNX file in the cache, which TVM's frontend then sees (a dynamic model
    would give kernels with symbolic loop bounds, which no latency model can time)."""
    import hashlib

    from tensorplan.ir.onnx_import import import_onnx, load_proto
    from tensorplan.ir.to_onnx import graph_to_onnx
    from tensorplan.paths import atomic_write, cache_dir
    proto = load_proto(path)[0]
    inits = {t.name for t in proto.graph.initializer}
    dynamic = any(d.dim_value <= 0 for i in proto.graph.input if i.name not in inits
                  for d in i.type.tensor_type.shape.dim)
    if not dynamic and not input_shapes:
        return path
    data = graph_to_onnx(import_onnx(path, input_shapes, name=name)).SerializeToString()
    out = cache_dir() / "static" / f"{name}-{hashlib.sha256(data).hexdigest()[:12]}.onnx"
    if not out.exists():
        atomic_write(out, data)
    return out


def network_programs(path: str | Path, name: str, dom: str, tuned: int = 0, progress: bool = False,
                     log: Callable[[str], None] | None = None, specs: dict | None = None) -> tuple:
    """A network's fused kernels, each with its default schedule (then up to `tuned` - 1 more
    samples), featurised for domain `dom` -> (tasks, gaps, programs, how each was scheduled, compact
    ASTs, ProgramArrays). Programs are (task index, module, sample index), each task's default first.
    What `predict_network` predicts; a study that compares several predictors on the same kernels
    computes it once. `specs`: a dataset's recorded devices (`Dataset.devices`), for a `dom` such as
    zen4-2t that only a dataset describes."""
    from tensorplan.cdmpp.features import featurize_many
    from tensorplan.cdmpp.tasks import network_tasks_and_gaps, task_io_of

    is_gpu = domain_kind(dom) == "gpu"
    tasks, gaps = network_tasks_and_gaps(path, name)
    if gaps and log:
        log("not predicted (no TIR kernel after TVM's fusion; their time is not in the total): "
            + ", ".join(f"{op.removeprefix('relax.')} x{n}" for op, n in sorted(gaps.items())))
    if not tasks:
        raise TensorplanError(f"model '{name}': no fused kernels found")
    progs: list[tuple[int, object, int | None]] = []
    how = []
    with progress_bar("sample schedules", len(tasks), progress) as advance:
        target = gpu_target(dom) if is_gpu else None
        # a big convolution's CUDA design space yields a valid draw (postprocessors pass) once in up to
        # ~100 draws (resnet-50), so a GPU gets the dataset sampler's whole budget per task
        tries = (GPU_SAMPLE_TRIES if is_gpu else 8) + 4 * tuned
        for j, t in enumerate(tasks):
            got = task_schedules(t, target, max(1, tuned), tries)
            how.append(f"meta-schedule sample {got[0][1]}" if got else "unscheduled")
            progs.append((j, got[0][0], got[0][1]) if got else (j, t.mod, None))
            progs.extend((j, m, i) for m, i in got[1:])
            advance()
            if log:
                log(f"{t.name}: {how[-1]}" + (f", {len(got)} schedules to compare" if tuned else ""))
    asts = featurize_many([m for _, m, _ in progs], is_gpu=is_gpu)
    arr = ProgramArrays.from_programs([a.leaf_features for a in asts], [a.positions for a in asts], device=dom,
                                      task_key=[tasks[j].key for j, _, _ in progs], flops=[a.flops for a in asts],
                                      task_io=[task_io_of(m) for _, m, _ in progs], specs=specs)
    return tasks, gaps, progs, how, asts, arr


def predict_network(model: str, device: str = "local", weights: str | Path | None = None,
                    log: Callable[[str], None] | None = None, measure: bool = False,
                    progress: bool = False, calibrated: bool = True,
                    input_shapes: dict[str, tuple[int, ...]] | None = None, tuned: int = 0,
                    save_schedules: str | Path | None = None) -> dict:
    """MODEL (ONNX path or zoo name) -> fused tasks -> default schedule -> features -> latency.

    `measure`: also compile and time each kernel's program here (`local` domains only) and report
    prediction vs measurement (`measured_summary`, key "measured"). `calibrated`: for this machine's
    domains, use the model `tensorplan calibrate` fitted here when there is one (and no `weights`).
    `input_shapes` fixes the symbolic dimensions of a dynamic model (as `--input-shape` elsewhere).

    `tuned` = N > 0: the predictor as a tuner's cost model, with no measurement. Each kernel also
    gets its first N valid design-space samples (the default schedule among them), all predicted;
    the one predicted fastest is its "tuned" schedule, and "tuned_total_ms" the network with those.
    With `measure`, the tuned picks are timed too, so the measured speed-up over the default
    schedules shows what the model's picks are worth (`measured_summary`, key "tuned").

    `save_schedules` = DIR: each kernel's scheduled program (the pick under `tuned`, else the
    default) as TVMScript, DIR/<kernel>.py, plus DIR/schedules.json listing them; a user compiles
    one with `tvm.compile(tvm.script.from_source(text))`."""
    import tvm

    from tensorplan.devices.spec import feature_differences, features_outside
    from tensorplan.zoo.specs import resolve_model
    from tensorplan.cdmpp.dataset import init_pool, time_module

    if tuned < 0:
        raise TensorplanError(f"tuned: the number of schedules to compare per kernel must be >= 0, got {tuned}")
    path, name = resolve_model(model)
    path = static_onnx(path, name, input_shapes)   # a bad model fails here, before any model loading
    dom = resolve_domain(device)
    threads = local_threads(dom) if measure else None
    if threads is not None:
        init_pool(threads)     # before anything configures TVM's runtime pool (dataset.init_pool)
    if weights is None and calibrated and re.fullmatch(r"local-\d+t", dom):
        from tensorplan.cdmpp.local_calibration import local_model_path
        here = local_model_path(int(dom[6:-1]))
        weights = here if here.exists() else None    # `tensorplan calibrate` made one for this CPU
    is_gpu = domain_kind(dom) == "gpu"
    if weights is None and is_gpu:
        weights = SHIPPED_GPU_MODEL                  # trained on the H100's own CUDA programs
    est = load_shipped() if weights is None else load_estimator(weights)
    known = list(getattr(est, "domains_", None) or [])
    if is_gpu and known and not any(domain_kind(d) == "gpu" for d in known):
        raise TensorplanError(f"device '{dom}' is a GPU, but '{weights or SHIPPED_MODEL}' was trained on CPU "
                              f"domains only ({', '.join(known)}): CPU-trained models miss GPU programs 20-90x "
                              "(docs/cdmpp.md). Leave out --weights to use the shipped H100 model, or train one on "
                              "GPU data: tensorplan predictor train --data data/cdmpp-h100")
    warning = None
    learnt_all = getattr(est, "domain_features_", None) or {}
    learnt = learnt_all.get(dom)
    here = device_features(dom)
    diff = feature_differences(learnt, here) if learnt is not None else []
    # hardware the model learnt under another name: a catalog name (h100-sxm is the 'h100' measured),
    # or this CPU when the model learnt it as another domain than the `local-*` one it resolves to
    same_as = (next((d for d, v in learnt_all.items() if d != dom and np.allclose(v, here, rtol=0.05)), None)
               if learnt is None or diff else None)
    outside = features_outside(list(learnt_all.values()), here) if same_as is None else []
    beyond = (f"; this device lies outside every device the model learnt ({', '.join(outside)}), so the model "
              "extrapolates: on a 2-core Xeon VM whose bandwidth lay below the learnt range it over-predicted "
              "1.65x (kernel MAPE 90 %, docs/cdmpp.md)" if outside else "")
    if diff and same_as is None:
        warning = (f"zero-shot: the model learnt '{dom}' on another machine (its device vector differs from what "
                   f"'{dom}' resolves to here: {', '.join(diff)}); on a new CPU such predictions were off by "
                   f"40-70 % (MAPE) in docs/cdmpp.md{beyond}. Run `tensorplan calibrate` here (minutes) and "
                   "predict again.")
    elif known and dom not in known and same_as is None:
        warning = (f"zero-shot: the model was trained on {', '.join(known)}, never on '{dom}'{beyond}; "
                   + ("on a new CPU such predictions were off by 40-70 % (MAPE, held-out CPUs) in docs/cdmpp.md. "
                      "Run `tensorplan calibrate` on that machine." if not is_gpu else
                      "with one GPU learnt, the device vector barely moves its predictions, so expect the learnt "
                      "GPU's latencies, not this one's. Measure a few thousand programs there (tensorplan predictor dataset "
                      "measure-gpu) and train on them."))
    if same_as and log:
        log(f"'{dom}' has the device vector of '{same_as}', which the model learnt: predicting it as '{same_as}'")
    if warning and log:
        log(f"warning: {warning}")
    t0 = time.perf_counter()
    tasks, gaps, progs, how, asts, arr = network_programs(path, name, dom, tuned=tuned, progress=progress, log=log)
    t1 = time.perf_counter()
    # an ensemble also says how much its members disagree (std of log latency) per kernel
    logs = est.member_log_predictions(arr) if hasattr(est, "member_log_predictions") else None
    pred, spread = est.from_logs(logs) if logs is not None else (est.predict(arr), None)
    t2 = time.perf_counter()
    owner = np.array([j for j, _, _ in progs])
    first = np.searchsorted(owner, np.arange(len(tasks)))       # each task's default-schedule row
    kernels, mods, tuned_mods = [], [], []
    for j, t in enumerate(tasks):
        r, c = first[j], int(t.networks.get(name, 1))
        s = float(pred[r])
        kernels.append({"task": t.name, "key": t.key, "calls": c, "flops": float(t.flops), "leaves": asts[r].n_leaves,
                        "schedule": how[j], "sample": progs[r][2], "predicted_us": 1e6 * s, "total_us": 1e6 * s * c})
        mods.append(progs[r][1])
        if spread is not None:
            kernels[-1]["log_spread"] = float(spread[r])
        if tuned:
            rows = np.flatnonzero(owner == j)
            b = int(rows[np.argmin(pred[rows])])
            kernels[-1].update({"candidates": len(rows), "tuned_sample": progs[b][2],
                                "tuned_us": 1e6 * float(pred[b]), "tuned_total_us": 1e6 * float(pred[b]) * c})
            tuned_mods.append(progs[b][1] if b != r else None)
    total = sum(k["total_us"] for k in kernels)
    if save_schedules is not None:
        _save_schedules(Path(save_schedules), name, kernels,
                        [tm if tm is not None else m for tm, m in zip(tuned_mods or [None] * len(mods), mods)])
    unscheduled = [k["task"] for k in kernels if k["schedule"] == "unscheduled"]
    if unscheduled and is_gpu and log:   # a loop nest without thread binding is no CUDA program at all
        log(f"warning: no valid CUDA schedule in {GPU_SAMPLE_TRIES} draws for {', '.join(unscheduled[:5])}"
            f"{' ...' if len(unscheduled) > 5 else ''}: predicted from the plain loop nest, not a GPU program")
    out = {"model": name, "device": device, "domain": dom, "kind": "gpu" if is_gpu else "cpu",
           "trained_on": known, "warning": warning, "same_device_as": same_as, "predictor": type(est).__name__,
           "weights": str(weights or SHIPPED_MODEL), "kernels": kernels, "total_ms": total / 1e3,
           "n_kernels": len(kernels), "unscheduled": unscheduled, "featurize_s": t1 - t0, "predict_s": t2 - t1,
           "not_predicted": gaps}
    if tuned:
        out["tuned"] = tuned
        out["tuned_total_ms"] = sum(k["tuned_total_us"] for k in kernels) / 1e3
    if logs is not None:   # the whole model as each member alone predicts it: a range for the total
        calls = np.array([k["calls"] for k in kernels], np.float64)
        out["member_total_ms"] = (np.exp(logs[:, first]) @ calls * 1e3).tolist()
    if threads is not None:
        target = tvm.target.Target({"kind": "llvm", "num-cores": threads})
        t3 = time.perf_counter()
        with progress_bar("compile + time", len(tasks), progress) as advance:
            for j, (k, t, mod) in enumerate(zip(kernels, tasks, mods)):
                r = time_module(mod, t, target, [threads], **MEASURE_TIMER)
                if isinstance(r, str):
                    k["measure_error"] = r
                    if log:
                        log(f"{t.name}: not measured ({r})")
                else:
                    k["measured_us"] = 1e6 * r[threads].median_s
                    k["measured_cov"] = r[threads].cov
                if tuned and tuned_mods[j] is None:          # the default schedule is the pick
                    k["tuned_measured_us"] = k.get("measured_us")
                elif tuned:
                    r = time_module(tuned_mods[j], t, target, [threads], **MEASURE_TIMER)
                    if isinstance(r, str):
                        k["tuned_measure_error"] = r
                    else:
                        k["tuned_measured_us"] = 1e6 * r[threads].median_s
                advance()
        out["measured"] = measured_summary(kernels)
        out["measured"]["threads"] = threads
        out["measure_s"] = time.perf_counter() - t3
    return out
