"""The CDMPP study scripts of research/cdmpp/ on their committed results: each scores what its
check recorded, so a change to the product's predictor API that breaks a study shows here."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tensorplan.cdmpp.predict import predict

def test_gpu_predictions_are_checked_against_the_h100_timings_of_the_same_programs():
    """research/cdmpp/cdmpp_gpu_predict_check.py: each kernel's CUDA program is the draw the H100 dataset timed
    (same task key, same draw index), so a prediction made without a GPU has a measurement to meet."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "research" / "cdmpp" / "cdmpp_gpu_predict_check.py"
    spec = importlib.util.spec_from_file_location("cdmpp_gpu_predict_check", path)
    gpc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpc)
    timed = gpc.measured_programs()
    assert len(timed) > 3000 and all(v["us"] > 0 for v in timed.values())
    res = gpc.check(predict("tiny-cnn", device="h100", tuned=0), timed)
    s = res["summary"]
    assert s["whole_network"] and s["kernels_measured"] == s["kernels"] >= 4
    assert 0.2 < s["total_ratio"] < 5 and s["measured_ms"] > 0
    assert all(k["measured_us"] == timed[(k["key"], k["sample"])]["us"] for k in res["kernels"])
    # the H200 re-timed the same programs: its own timings, close to the H100's
    t200 = gpc.measured_programs(device="h200")
    assert len(t200) > 3000 and t200.keys() <= timed.keys()
    ratio = np.median([t200[k]["us"] / timed[k]["us"] for k in t200])
    assert 0.8 < ratio < 1.25 and any(t200[k]["us"] != timed[k]["us"] for k in t200)

def test_cpu_checks_from_several_hosts_are_pooled_per_host(tmp_path):
    """research/cdmpp/cdmpp_predict_check.py --summary on the committed runs (a Zen 3 and a Zen 4 VM): each
    host's kernels are pooled on their own, so one CPU's errors never dilute another's."""
    import importlib.util
    from pathlib import Path

    import numpy as np

    from tensorplan.cdmpp.metrics import regression_metrics
    path = Path(__file__).resolve().parents[2] / "research" / "cdmpp" / "cdmpp_predict_check.py"
    spec = importlib.util.spec_from_file_location("cdmpp_predict_check", path)
    pc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pc)
    jsonl = path.parent / "results" / "cdmpp_predict_check.jsonl"
    s = pc.summarize(jsonl)
    lines = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()]
    hosts = {r["host"] for r in lines}
    assert len(hosts) >= 2 and set(s["pooled_kernels"]) == hosts
    for host in hosts:
        ks = [k for r in lines if r["host"] == host for k in r["kernels"] if k.get("measured_us")]
        want = regression_metrics(np.array([k["predicted_us"] for k in ks]), np.array([k["measured_us"] for k in ks]))
        got = s["pooled_kernels"][host]["shipped"]
        assert got["n"] == len(ks) and got["mape_pct"] == pytest.approx(want["mape_pct"])
    pc.plot(jsonl, tmp_path / "check.png")
    assert (tmp_path / "check.png").stat().st_size > 10_000

def test_big_kernel_study_scores_the_checked_kernels_in_order():
    """research/cdmpp/cdmpp_bigkernels.py --summary on its committed runs: the rows' per-kernel ratios line up
    with the Zen 4 check's timed kernels (the shipped model's pooled MAPE comes out as the check's
    own), the big kernels are those over 0.1 s, and every arm names how many it trained on."""
    import importlib.util
    from pathlib import Path

    import numpy as np

    from tensorplan.cdmpp.metrics import regression_metrics
    path = Path(__file__).resolve().parents[2] / "research" / "cdmpp" / "cdmpp_bigkernels.py"
    spec = importlib.util.spec_from_file_location("cdmpp_bigkernels", path)
    bk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bk)
    jsonl = path.parent / "results" / "cdmpp_bigkernels.jsonl"
    s = bk.summarize(jsonl, bk.CHECK)
    lines = [json.loads(x) for x in bk.CHECK.read_text().splitlines() if x.strip()]
    ks = [k for r in lines if r["host"] == s["host"] for k in r["kernels"] if k.get("measured_us")]
    meas = np.array([k["measured_us"] for k in ks])
    want = regression_metrics(np.array([k["predicted_us"] for k in ks]), meas)
    assert s["shipped_pooled"]["kernel_mape_pct"] == pytest.approx(want["mape_pct"])
    assert sum(v["big_kernels"] for v in s["shipped"].values()) == int((meas > 1e5).sum()) > 0
    for model in ("xgboost-hier", "cdmpp-nocmd-parts"):
        without, with_ = s["models"][model]["without"], s["models"][model]["with"]
        assert with_["train_records_over_cap"] > 10 * max(1, without["train_records_over_cap"])
        assert with_["networks"]["segformer-b0"]["tasks_in_training"] == 0      # held out in both arms

def _ship_data_study(monkeypatch):
    """research/cdmpp/cdmpp_ship_data.py as a module (it imports cdmpp_bigkernels beside it)."""
    import importlib.util
    from pathlib import Path

    bench = Path(__file__).resolve().parents[2] / "research" / "cdmpp"
    monkeypatch.syspath_prepend(str(bench))
    spec = importlib.util.spec_from_file_location("cdmpp_ship_data", bench / "cdmpp_ship_data.py")
    sd = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sd)
    return sd

def test_ship_data_study_scores_the_old_weights_as_the_check_did(monkeypatch):
    """research/cdmpp/cdmpp_ship_data.py on its committed runs: the line of the weights shipped on 2026-11-24
    reproduces that model's own Zen 4 check (same kernels, same order), the line of the current
    weights names the domains the packaged model learnt, and both arms ran the same seeds."""
    from pathlib import Path

    import numpy as np

    from tensorplan.cdmpp.metrics import regression_metrics
    from tensorplan.cdmpp.model import load_shipped
    bench = Path(__file__).resolve().parents[2] / "research" / "cdmpp"
    sd = _ship_data_study(monkeypatch)
    s = sd.summarize(bench / "results" / "cdmpp_ship_data.jsonl")
    lines = [json.loads(x) for x in sd.CHECK.read_text().splitlines() if x.strip()]
    ks = [k for r in lines if r["host"] == s["host"] for k in r["kernels"] if k.get("measured_us")]
    want = regression_metrics(np.array([k["predicted_us"] for k in ks]), np.array([k["measured_us"] for k in ks]))
    old, new = s["models"]["weights"]["shipped-2026-11-24"], s["models"]["weights"]["shipped-2026-11-25"]
    assert old["check"]["kernels"] == len(ks) and old["check"]["kernel_mape_pct"] == pytest.approx(want["mape_pct"])
    assert 0 < new["check_unlabelled"]["kernels"] < new["check"]["kernels"]
    rows = [json.loads(x) for x in (bench / "results" / "cdmpp_ship_data.jsonl").read_text().splitlines()]
    current = [r for r in rows if r["arm"] == "shipped-2026-11-25-4x900"][0]
    assert sorted(current["devices"]) == sorted(load_shipped().domains_) and "zen4-2t" in current["devices"]
    for model in ("xgboost-hier", "cdmpp-nocmd-parts"):
        arms = s["models"][model]
        assert arms["collection"]["seeds"] == arms["all-cpus"]["seeds"] == [0, 1, 2]
        assert arms["all-cpus"]["train_records"] > arms["collection"]["train_records"]

def test_ship_data_study_on_the_zen3_host_scores_every_zen3_checked_kernel(monkeypatch):
    """The Zen 3 scoring (`--host "AMD EPYC (family 25, model 1)"`): every line covers exactly the
    kernels the predict check timed on a Zen 3 VM (and re-timed on 2026-11-27), and the programs
    labelled on that CPU type are the ones `measure-device --prefix zen3` timed
    (research/cdmpp/results/cdmpp_zen3_measure.json)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sd = _ship_data_study(monkeypatch)
    host = "AMD EPYC (family 25, model 1)"
    s = sd.summarize(root / "research" / "cdmpp" / "results" / "cdmpp_ship_data_zen3.jsonl")
    assert s["host"] == host and len(s["models"]["weights"]) >= 3
    checked = sd.checked_kernels(sd.CHECK, host)
    n_checked = sum(len(v) for v in checked.values())
    for arm in s["models"]["weights"].values():
        assert arm["check"]["kernels"] == n_checked > 200
        assert arm["check_unlabelled"]["kernels"] <= n_checked
    for model in ("xgboost-hier", "cdmpp-nocmd-parts"):                  # --arms all-cpus,all-cpus+zen3
        arms = s["models"][model]
        assert arms["all-cpus"]["seeds"] == arms["all-cpus+zen3"]["seeds"] == [0, 1, 2]
        assert arms["all-cpus+zen3"]["train_records"] > arms["all-cpus"]["train_records"]
        assert (arms["all-cpus"]["check_unlabelled"]["kernels"] == arms["all-cpus+zen3"]["check_unlabelled"]["kernels"]
                < n_checked)
    again = sd.checked_kernels(root / "research" / "cdmpp" / "results" / "cdmpp_predict_check_zen3.jsonl", host)
    assert {n: set(v) for n, v in again.items()} == {n: set(v) for n, v in checked.items()}
    measured = json.loads((root / "research" / "cdmpp" / "results" / "cdmpp_zen3_measure.json").read_text())
    labelled = sd._host_labelled(str(root / "data" / "cdmpp"), host)
    assert len(labelled) == measured["programs"]
    assert labelled != sd._host_labelled(str(root / "data" / "cdmpp"), "AMD EPYC (family 25, model 17)")
