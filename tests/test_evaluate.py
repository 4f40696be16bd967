"""Evaluation harness and KMeans task selection on a small real subset."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from tensorplan.cdmpp.arrays import as_arrays  # noqa: E402
from tensorplan.cdmpp.evaluate import evaluate, render_markdown, write_doc  # noqa: E402
from tensorplan.cdmpp.finetune import few_shot_split, select_tasks_kmeans, select_tasks_random, selection_cmd  # noqa: E402
from tensorplan.cdmpp.metrics import regression_metrics, within_task_spearman  # noqa: E402
from test_cdmpp_common import cdmpp_small  # noqa: E402,F401


def test_metrics_definitions():
    t = np.array([1.0, 2.0, 4.0, 8.0])
    p = np.array([1.05, 2.5, 4.0, 6.0])
    m = regression_metrics(p, t)
    assert m["mape_pct"] == pytest.approx(100 * np.mean([0.05, 0.25, 0.0, 0.25]))
    assert m["acc10_pct"] == 50.0 and m["acc20_pct"] == 50.0
    assert m["rmse_ms"] == pytest.approx(1e3 * np.sqrt(np.mean((p - t) ** 2)))
    tk = np.array(["a"] * 5 + ["b"] * 5)
    y = np.arange(10, dtype=float) + 1
    assert within_task_spearman(y, y, tk) == pytest.approx(1.0)
    assert within_task_spearman(-y, y, tk) == pytest.approx(-1.0)


def test_kmeans_selection(cdmpp_small):
    pool = as_arrays(cdmpp_small["target"])
    n_tasks = len(np.unique(pool.task_key))
    k = max(2, n_tasks // 3)
    sel = select_tasks_kmeans(pool, k, seed=0)
    assert len(sel) == k and len(set(sel)) == k and set(sel) <= set(pool.task_key)
    assert sel == select_tasks_kmeans(pool, k, seed=0)  # deterministic
    ft, rest, tasks = few_shot_split(pool, k, 4, "kmeans", seed=0)
    assert set(pool.task_key[ft]) == set(tasks) and len(np.intersect1d(ft, rest)) == 0
    assert len(ft) <= 4 * k
    cmd_k = selection_cmd(pool, ft)
    assert np.isfinite(cmd_k) and cmd_k >= 0


def test_kmeans_selection_covers_clusters(cdmpp_small):
    """Pool = 3 groups of tasks, each group the programs of one real task split across 3 task keys.
    KMeans selection of 3 tasks must take one task from each group (random selection often does not)."""
    pool = as_arrays(cdmpp_small["target"])
    tks, counts = np.unique(pool.task_key, return_counts=True)
    vec = {t: pool.leaf_data[np.concatenate([np.arange(pool.offsets[i], pool.offsets[i + 1])
                                             for i in np.flatnonzero(pool.task_key == t)])].mean(0) for t in tks}
    cand = [t for t, c in zip(tks, counts) if c >= 3]
    # three tasks far apart in feature space
    chosen = [cand[0]]
    while len(chosen) < 3:
        chosen.append(max((t for t in cand if t not in chosen),
                          key=lambda t: min(np.linalg.norm(vec[t] - vec[c]) for c in chosen)))
    idx, keys, group = [], [], {}
    for g, t in enumerate(chosen):
        ii = np.flatnonzero(pool.task_key == t)
        for j, i in enumerate(ii):
            idx.append(i)
            keys.append(f"{t}#{j % 3}")
            group[f"{t}#{j % 3}"] = g
    sub = pool.subset(np.array(idx))
    sub.task_key = np.array(keys, dtype=object)
    sel = select_tasks_kmeans(sub, 3, seed=0)
    assert sorted(group[t] for t in sel) == [0, 1, 2], sel
    misses = sum(len({group[t] for t in select_tasks_random(sub, 3, seed=s)}) < 3 for s in range(10))
    assert misses > 0  # the control is not trivially perfect on this pool


def test_evaluate_quick_all_metrics(cdmpp_small, tmp_path):
    ds = cdmpp_small["ds"]
    res = evaluate(ds, models=("cdmpp", "xgboost", "roofline"), quick=True, fewshot_tasks=2,
                   fewshot_per_task=4, max_cov=None)
    assert set(res["splits"]) == {"network", "device", "sample"}
    keys = {"mape_pct", "rmse_ms", "acc10_pct", "acc20_pct", "spearman_within_task"}
    for split in ("network", "sample"):
        for name, m in res["splits"][split]["models"].items():
            assert keys <= set(m), (split, name)
            assert np.isfinite(m["mape_pct"]) and m["predict_per_s"] > 0 and m["train_time_s"] > 0
            assert "network_latency" in m
    net = res["splits"]["network"]
    assert net["n_test"] > 0 and net["holdout_networks"]
    dev = res["splits"]["device"]
    for name, m in dev["models"].items():
        for k in ("zero_shot", "fewshot_kmeans", "fewshot_random", "calibrated_kmeans", "calibrated_random"):
            assert keys <= set(m[k]), (name, k)
    assert dev["fewshot"]["kmeans"]["n_target_samples"] == dev["models"]["cdmpp"]["fewshot_kmeans"]["n_target_samples"]
    assert set(dev["models"]) == {"cdmpp", "xgboost", "roofline"}
    assert "network_mape_pct" in res["summary"] and "device_fewshot_kmeans_mape_pct" in res["summary"]
    assert "device_calibrated_kmeans_mape_pct" in res["summary"]
    assert res["summary"]["network_model"] == "cdmpp" and res["summary"]["network_best_model"] in dev["models"]
    json.dumps(res)  # JSON-able
    md = render_markdown(res)
    assert "Held-out networks" in md and "| cdmpp |" in md and "few-shot KMeans" in md
    assert "**Summary**" in md and "held-out-network MAPE" in md and "Best of all models" in md
    doc = tmp_path / "cdmpp.md"
    doc.write_text("# title\n\nhand-written text\n")
    write_doc(res, doc)
    write_doc(res, doc)  # idempotent: one generated block
    text = doc.read_text()
    assert text.count("BEGIN cdmpp-eval") == 1 and "hand-written text" in text


def test_the_product_harness_builds_a_small_flat_set_of_models():
    """`predictor evaluate` and `predictor train --model` know CDMPP with and without CMD, the shipped
    configuration and the baselines, by plain names; anything else is an unknown model."""
    from tensorplan.errors import TensorplanError
    from tensorplan.cdmpp.evaluate import DEFAULT_MODELS, Harness, make_model

    table = Harness().models(quick=True)
    assert set(DEFAULT_MODELS) == set(table) == set(Harness().models())
    shipped = make_model("cdmpp-nocmd-parts", quick=True)
    assert shipped.cmd_alpha == 0.0 and shipped.parts_input
    for research_name in ("xgboost-deep", "cdmpp-ens2", "xgboost-deep-rel-mape", "cdmpp-parts-leaf", "cdmpp+xgboost"):
        with pytest.raises(TensorplanError, match="unknown model"):
            make_model(research_name, quick=True)


@pytest.mark.slow
def test_cli_predict_with_shipped_model():
    """`tensorplan predict MODEL --device local` works with the packaged weights."""
    from typer.testing import CliRunner

    from tensorplan.cli import app
    from tensorplan.cdmpp.model import SHIPPED_MODEL

    assert SHIPPED_MODEL.exists() and SHIPPED_MODEL.stat().st_size < 20e6
    assert SHIPPED_MODEL.with_suffix(".norm.json").exists()
    r = CliRunner().invoke(app, ["predict", "tiny-mlp", "--device", "local", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert out["n_kernels"] >= 3 and out["total_ms"] > 0
    assert all(k["predicted_us"] > 0 for k in out["kernels"])
    # the headline is the tuned picks' total (the default), the untuned one the default schedules'
    assert out["total_is"] == "tuned"
    assert out["total_ms"] == pytest.approx(sum(k["tuned_total_us"] for k in out["kernels"]) / 1e3)
    assert out["untuned_total_ms"] == pytest.approx(sum(k["total_us"] for k in out["kernels"]) / 1e3)
    assert out["total_ms"] <= out["untuned_total_ms"] * (1 + 1e-9)
    bad = CliRunner().invoke(app, ["predict", "/nonexistent/model.onnx"])
    assert bad.exit_code != 0


def test_device_split_takes_several_source_domains():
    """CDMPP's cross-device recipe: pre-train on every other device, then few-shot on the target.
    Real records of three domains (two Zen 5 thread counts as sources, the Zen 4 CPU as target)."""
    from tensorplan.errors import TensorplanError
    from tensorplan.cdmpp.dataset import load_dataset
    from tensorplan.cdmpp.evaluate import device_split

    ds = load_dataset().filter_stable(0.01)
    r = ds.records
    tasks = sorted(r.loc[r["device"] == "zen4-1t", "task_key"].unique())[:30]
    sub = ds.subset((r["task_key"].isin(tasks) & r["device"].isin(["local-1t", "local-2t", "zen4-1t"])).to_numpy())
    one = device_split(sub, "local-1t", "zen4-1t", per_task=2, n_tasks=4)
    two = device_split(sub, "local-1t, local-2t", "zen4-1t", per_task=2, n_tasks=4)
    assert set(one["train"].device_name) == {"local-1t"}
    assert set(two["train"].device_name) == {"local-1t", "local-2t"}
    assert len(two["train"]) > len(one["train"])
    # the target side does not depend on the sources: same pool, same selections, same test set
    assert set(two["test"].device_name) == {"zen4-1t"}
    assert np.array_equal(one["test"].latency_s, two["test"].latency_s)
    assert one["selections"]["kmeans"][2] == two["selections"]["kmeans"][2]
    with pytest.raises(TensorplanError, match="also a source"):
        device_split(sub, "local-1t,zen4-1t", "zen4-1t", per_task=2)
    with pytest.raises(TensorplanError, match="no-such-cpu"):
        device_split(sub, "local-1t,no-such-cpu", "zen4-1t", per_task=2)


def test_evaluate_keeps_only_the_named_domains(cdmpp_small):
    from tensorplan.errors import TensorplanError
    ds = cdmpp_small["ds"]
    res = evaluate(ds, models=("roofline",), splits=("sample",), quick=True, max_cov=None, domains=["local-1t"])
    assert set(res["dataset"]["devices"]) == {"local-1t"} and res["dataset"]["domains"] == ["local-1t"]
    assert res["dataset"]["records_total"] == int((ds.records["device"] == "local-1t").sum())
    with pytest.raises(TensorplanError, match="zen9"):
        evaluate(ds, models=("roofline",), splits=("sample",), quick=True, max_cov=None, domains=["zen9-1t"])


def test_evaluate_keeps_only_the_named_leaf_counts(cdmpp_small):
    """--leaves 5 is the CDMPP scripts' default setting: only programs with that many buffer stores."""
    from tensorplan.errors import TensorplanError
    ds = cdmpp_small["ds"]
    counts = ds.records["n_leaves"].value_counts()
    k = int(counts.index[0])          # the commonest leaf count of the fixture's programs
    res = evaluate(ds, models=("roofline",), splits=("sample",), quick=True, max_cov=None, leaves=[k])
    assert res["dataset"]["leaves"] == [k] and res["dataset"]["records_total"] == int(counts[k])
    sp = res["splits"]["sample"]
    md = render_markdown(res)
    assert sp["n_train"] + sp["n_test"] <= int(counts[k]) and f"[{k}] leaves" in md
    assert f"Machine: {res['machine']['cpu']}, {res['machine']['cpus']} CPUs" in md
    with pytest.raises(TensorplanError, match=r"\[999\] leaves"):
        evaluate(ds, models=("roofline",), splits=("sample",), quick=True, max_cov=None, leaves=[999])


def test_errors_by_leaf_count_split_the_test_set():
    """`by_leaves`: per leaf count, the error of that count's programs only (here 10% off on one
    count, exact on the others)."""
    from tensorplan.cdmpp.evaluate import _by_leaf_count

    class Arr:   # the two fields _by_leaf_count reads
        n_leaves = np.array([5] * 60 + [3] * 70 + [9] * 10)
        latency_s = np.linspace(1e-4, 1e-2, 140)
    pred = Arr.latency_s * np.where(Arr.n_leaves == 5, 1.1, 1.0)
    out = _by_leaf_count(pred, Arr)
    assert set(out) == {"3", "5"}                 # 9 has fewer than 50 test records
    assert out["5"]["n"] == 60 and out["5"]["mape_pct"] == pytest.approx(10.0)
    assert out["3"]["mape_pct"] == pytest.approx(0.0)


def test_evaluate_resume_keeps_scored_models_and_checks_settings(cdmpp_small):
    """--resume: models already in the earlier document are kept (not retrained), new ones are added,
    a checkpoint follows every model, and a document of other settings is refused."""
    from tensorplan.errors import TensorplanError
    ds = cdmpp_small["ds"]
    kw = dict(splits=("sample", "network"), quick=True, max_cov=None)
    first = evaluate(ds, models=("roofline",), **kw)
    saved = []
    both = evaluate(ds, models=("xgboost", "roofline"), resume=json.loads(json.dumps(first)),
                    checkpoint=lambda doc: saved.append(json.loads(json.dumps(doc))), **kw)
    for split in ("sample", "network"):
        assert list(both["splits"][split]["models"]) == ["roofline", "xgboost"]
        # kept as scored the first time, to the last digit (a retrained model re-times its training)
        assert both["splits"][split]["models"]["roofline"] == json.loads(json.dumps(
            first["splits"][split]["models"]["roofline"]))
    assert len(saved) == 2 and "xgboost" in saved[0]["splits"]["network"]["models"]
    assert saved[0]["splits"]["sample"]["models"].keys() == {"roofline"}  # the earlier split survives a checkpoint
    assert both["models"] == ["roofline", "xgboost"] and len(both["runs"]) == 2
    assert both["summary"]["network_best_model"] in ("roofline", "xgboost")
    with pytest.raises(TensorplanError, match="seed"):
        evaluate(ds, models=("roofline",), resume=first, seed=1, **kw)
    with pytest.raises(TensorplanError, match="time scale"):
        evaluate(ds, models=("roofline",), resume=first, time_scale=0.5, **kw)
    with pytest.raises(TensorplanError, match="holdout_networks"):
        other = [n for n in sorted({k for v in ds.records["networks"] for k, _ in v})
                 if n not in first["splits"]["network"]["holdout_networks"]]
        evaluate(ds, models=("roofline",), resume=first, holdout_networks=other[:1], **kw)


class _FromLabels:
    """A stand-in model that predicts from the labels it is handed (`transform(latency, task_key)`)."""

    def __init__(self, transform):
        self.transform = transform

    def predict(self, arr):
        return self.transform(np.asarray(arr.latency_s, float), np.asarray(arr.task_key))


def _two_networks(ds):
    """The fixture's tasks regrouped into two networks (and a third whose kernel has no records)."""
    import dataclasses

    import pandas as pd

    tasks = ds.tasks[ds.tasks["task_key"].isin(set(ds.records["task_key"]))].reset_index(drop=True)
    keys = sorted(tasks["task_key"])
    half = set(keys[: len(keys) // 2])
    tasks["networks"] = [[("net-a", 2)] if k in half else [("net-b", 1)] for k in tasks["task_key"]]
    ghost = tasks.iloc[:1].copy()
    ghost["task_key"], ghost["networks"] = "no-such-task", [[("net-c", 1)]]
    return dataclasses.replace(ds, tasks=pd.concat([tasks, ghost], ignore_index=True))


def test_network_latency_three_picks_and_regret(cdmpp_small):
    """Whole-network sums over the fastest / first / model-picked program of each task: exact for an
    oracle; a model that shrinks the within-task spread over-predicts the label-chosen fastest
    programs (the selection bias the label-free picks avoid); a rank-reversing model picks the
    slowest programs and its regret is exactly their measured excess."""
    from tensorplan.cdmpp.evaluate import EvalData, network_error, _network_errors

    ds = _two_networks(cdmpp_small["ds"])
    data = EvalData(ds)
    r = ds.records
    nets = {"net-a@local-1t", "net-a@local-2t", "net-b@local-1t", "net-b@local-2t"}

    oracle = _network_errors(_FromLabels(lambda y, t: y), data, None, None)
    assert set(oracle) == {"fastest", "first", "picked"}
    for pick in oracle:
        assert set(k for k in oracle[pick] if not k.startswith("_")) == nets   # net-c lacks a kernel: left out
        assert oracle[pick]["_mean_ape_pct"] == pytest.approx(0, abs=1e-9)
    assert oracle["picked"]["_mean_regret_pct"] == pytest.approx(0, abs=1e-9)
    # the fastest programs' measured sum is the dataset's own network latency
    meas = ds.network_latencies(max_cov=None)
    assert oracle["fastest"]["net-a@local-1t"]["measured_ms"] == pytest.approx(1e3 * meas[("net-a", "local-1t")])
    # "first" sums the lowest-numbered sample of each task
    first = r.loc[r.groupby(["task_key", "device"])["sample_index"].idxmin()]
    want = sum(2 * y for y, d, k in zip(first["latency_s"], first["device"], first["task_key"])
               if d == "local-2t" and k in {t for t, nn in zip(ds.tasks["task_key"], ds.tasks["networks"])
                                             if nn == [("net-a", 2)]})
    assert oracle["first"]["net-a@local-2t"]["measured_ms"] == pytest.approx(1e3 * want)
    untuned = ds.network_latencies(max_cov=None, program="first")
    assert oracle["first"]["net-a@local-2t"]["regret_pct"] == pytest.approx(
        100 * (untuned[("net-a", "local-2t")] / meas[("net-a", "local-2t")] - 1))
    assert oracle["first"]["_mean_regret_pct"] > 0     # 16 random schedules: the first is rarely the fastest

    def shrink(y, t):
        out = np.empty_like(y)
        for k in np.unique(t):
            m = t == k
            mu = np.log(y[m]).mean()
            out[m] = np.exp(mu + 0.3 * (np.log(y[m]) - mu))
        return out

    s = _network_errors(_FromLabels(shrink), data, None, None)
    for k in nets:
        assert s["fastest"][k]["predicted_ms"] > s["fastest"][k]["measured_ms"]
        assert s["picked"][k]["regret_pct"] == pytest.approx(0, abs=1e-9)   # ranking kept: picks the fastest

    rev = _network_errors(_FromLabels(lambda y, t: 1.0 / y), data, None, ["local-1t"])
    slow = r[r["device"] == "local-1t"].groupby("task_key")["latency_s"]
    a = {t for t, nn in zip(ds.tasks["task_key"], ds.tasks["networks"]) if nn == [("net-a", 2)]}
    worst, best = sum(slow.max()[k] for k in a), sum(slow.min()[k] for k in a)
    assert set(k for k in rev["picked"] if not k.startswith("_")) == {"net-a@local-1t", "net-b@local-1t"}
    assert rev["picked"]["net-a@local-1t"]["regret_pct"] == pytest.approx(100 * (worst / best - 1))
    # scored entries read the same way whatever the document's age
    assert network_error({"network_latency": s}, "picked", "_mean_regret_pct") == s["picked"]["_mean_regret_pct"]
    old = {"network_latency": {"x@local-1t": {"ape_pct": 5.0}, "_mean_ape_pct": 5.0}}
    assert network_error(old) == 5.0 and network_error(old, "first") is None


def test_machines_text_names_each_machine_with_the_models_it_scored():
    """A document resumed on another CPU says which models (and timings) came from which machine."""
    from tensorplan.cdmpp.evaluate import _machines_text
    a = {"cpu": "AMD EPYC", "cpus": 2, "torch": "2.13.0+cpu"}
    b = {"cpu": "Intel Xeon", "cpus": 2, "torch": "2.13.0+cpu"}
    one = {"machine": a, "runs": [{"machine": a, "models": ["xgboost"]}, {"machine": a, "models": ["mlp"]}]}
    assert _machines_text(one) == "Machine: AMD EPYC, 2 CPUs, torch 2.13.0+cpu"
    two = {"machine": b, "runs": [{"machine": a, "models": ["xgboost", "mlp"]},
                                  {"machine": b, "models": ["xgboost", "mlp", "tlp"]}]}
    text = _machines_text(two)
    assert "AMD EPYC, 2 CPUs, torch 2.13.0+cpu (xgboost, mlp)" in text
    assert "Intel Xeon, 2 CPUs, torch 2.13.0+cpu (tlp)" in text
