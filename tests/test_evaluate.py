"""Evaluation harness and KMeans task selection on a small real subset."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")

from tensorplan.predict.cdmpp import as_arrays, regression_metrics, within_task_spearman  # noqa: E402
from tensorplan.predict.evaluate import evaluate, render_markdown, write_doc  # noqa: E402
from tensorplan.predict.finetune import (few_shot_split, select_tasks_kmeans, select_tasks_random,  # noqa: E402
                                         selection_cmd)
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
    # covering the clusters: the selected programs are at least as close (CMD) to the pool as the
    # median random selection of the same size (CDMPP's own check, §3.1 step 5)
    cmd_k = selection_cmd(pool, ft)
    rnd = []
    for s in range(7):
        t = select_tasks_random(pool, k, seed=s)
        ii = np.flatnonzero(np.isin(pool.task_key, t))
        rnd.append(selection_cmd(pool, ii))
    assert cmd_k <= np.median(rnd) * 1.05, (cmd_k, rnd)


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
        for k in ("zero_shot", "fewshot_kmeans", "fewshot_random"):
            assert keys <= set(m[k]), (name, k)
    assert dev["fewshot"]["kmeans"]["n_target_samples"] == dev["models"]["cdmpp"]["fewshot_kmeans"]["n_target_samples"]
    assert "network_mape_pct" in res["summary"] and "device_fewshot_kmeans_mape_pct" in res["summary"]
    json.dumps(res)  # JSON-able
    md = render_markdown(res)
    assert "Held-out networks" in md and "| cdmpp |" in md and "few-shot KMeans" in md
    doc = tmp_path / "cdmpp.md"
    doc.write_text("# title\n\nhand-written text\n")
    write_doc(res, doc)
    write_doc(res, doc)  # idempotent: one generated block
    text = doc.read_text()
    assert text.count("BEGIN cdmpp-eval") == 1 and "hand-written text" in text
