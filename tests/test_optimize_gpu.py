"""`optimize` on a GPU (workflows.optimize_gpu): the H100 predictor prices the candidates' CUDA
programs, PyTorch times the kernels that decide, a machine without TVM plans from stored predictions.

Here (no GPU) the loop runs with PyTorch's CPU kernels (`torch_device="cpu"`, eager): the dry run
of the GPU path; the `gpu` test runs the real one where a CUDA GPU exists."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("optimize_gpu")

SRC = Path(__file__).resolve().parent.parent / "src"
# tiny-cnn's candidates priced as h100 by `tensorplan optimize tiny-cnn --device h100 --price-only
# --store tests/data/tiny_cnn_h100_predictions.sqlite` (rerun it when the shipped GPU model changes:
# test_plan_on_a_machine_without_tvm_from_stored_predictions fails until then)
PRICED = Path(__file__).resolve().parent / "data" / "tiny_cnn_h100_predictions.sqlite"

# a machine without TVM: importing tvm or tvm_ffi fails (torch's probes for the module still see one)
NO_TVM = """
import importlib.abc, importlib.machinery, sys
class _NoTVM(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tvm", "tvm_ffi"):
            return importlib.machinery.ModuleSpec(name, self)
    def create_module(self, spec):
        raise ImportError(f"No module named '{spec.name}'")
    def exec_module(self, module):
        pass
sys.meta_path.insert(0, _NoTVM())
"""

PLAN_WITHOUT_TVM = NO_TVM + """
import json, time
from tensorplan import devices
from tensorplan.errors import TensorplanError
from tensorplan.zoo.specs import as_graph
from tensorplan.workflows.optimize_gpu import optimize_gpu
try:
    p = optimize_gpu(as_graph("tiny-cnn", None, 17), devices.device("h100"), budget_s=300, t_start=time.perf_counter(),
                     phases={}, store=sys.argv[1], torch_device="cpu", compile=False, peers=False)
except TensorplanError as e:
    print(json.dumps({"error": str(e)}))
else:
    print(json.dumps({"opt": p.stats["optimize"], "gpu": p.stats["gpu"], "backends": [k.backend for k in p.kernels],
                      "cost_model": p.stats["cost_model"],
                      "tvm_loaded": "tvm" in sys.modules and sys.modules["tvm"] is not None}))
"""


def _price(store: Path):
    from tensorplan import devices
    from tensorplan.workflows.optimize_gpu import optimize_gpu
    from tensorplan.zoo.specs import as_graph
    return optimize_gpu(as_graph("tiny-cnn", None, 17), devices.device("h100"), budget_s=300,
                        t_start=time.perf_counter(), phases={}, store=store, price_only=True)


def _without_tvm(store: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", PLAN_WITHOUT_TVM, str(store)], capture_output=True, text=True,
                       timeout=300, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin",
                                         "HOME": str(Path.home())})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_price_only_prices_cuda_programs_with_the_gpu_model(tmp_path):
    plan = _price(tmp_path / "s.sqlite")
    opt, cm = plan.stats["optimize"], plan.stats["cost_model"]
    assert opt["stop"] == "price-only" and opt["measured"] == 0
    assert cm["tuned"]["model"].startswith("cdmpp-h100.pt:")         # the shipped GPU predictor
    assert cm["tuned"]["device"] == "h100-sxm" and cm["tuned"]["tuned"] >= 10
    # every kernel of the plan runs on PyTorch on the GPU, priced by CDMPP (memory) or the work model
    assert {k.backend for k in plan.kernels} == {"torch-inductor"}
    assert all(k.schedule.get("device") == "cuda" for k in plan.kernels)
    by = {r["by"] for r in plan.stats["gpu"]["kernels"]}
    assert by == {"cdmpp", "work model"}
    # GPU kernels: sub-100 us, above zero, and the same kernel costs the same (no hidden CPU domain)
    preds = [r["predicted_ms"] for r in plan.stats["gpu"]["kernels"]]
    assert all(0 < p < 0.1 for p in preds)


def test_tuned_gpu_predictions_have_no_cpu_default_schedule(tmp_path):
    from tensorplan.cost.tuned import TunedCost
    from tensorplan.korch.candidates import enumerate_candidates
    from tensorplan.korch.fission import fission
    from tensorplan.zoo.specs import as_graph

    prim = fission(as_graph("tiny-cnn", None, 17)).graph
    mem = [c for c in enumerate_candidates(prim, max_nodes=4) if c.kind == "memory"][:4]
    tc = TunedCost(device="h100", store=tmp_path / "s.sqlite", samples=8)
    costs = tc.cost_many(prim, mem)
    for c, v in zip(mem, costs):
        p = tc.prediction(c)
        assert p is not None and v == p.best_s
        # sampled CUDA programs only, kept without their traces (PyTorch builds what runs on a GPU)
        assert all(r.index >= 0 and r.schedule == {"name": "sampled"} for r in p.ranked)
        # the default (TVM's first valid draw, what runs untuned) is priced and never beats the pick
        assert math.isfinite(p.default_s) and p.default_s >= p.best_s
        assert tc.top_schedules(prim, c, 2) == [r.schedule for r in p.ranked[:2]]
    # the store key does not hold this machine's thread count: another host reads the same predictions
    again = TunedCost(device="h100", store=tmp_path / "s.sqlite", samples=8, threads=16)
    assert again.cost_many(prim, mem) == costs and again.stats["cache_hits"] == len(mem)


def test_plan_on_a_machine_without_tvm_from_stored_predictions(tmp_path):
    store = tmp_path / "s.sqlite"
    shutil.copy(PRICED, store)          # the committed predictions: every one is found, none drawn
    out = _without_tvm(store)
    assert "error" not in out, out
    opt = out["opt"]
    assert not out["tvm_loaded"]
    tuned = out["cost_model"]["predicted_by"]["tuned"]
    assert tuned["searched"] == 0 and tuned["cache_hits"] >= 10      # every CUDA price read, none drawn
    assert opt["stop"] == "stable" and 0 < opt["measured"] <= opt["unique_kernels"]
    assert opt["max_rel_err"] is not None and opt["max_rel_err"] <= opt["tolerance"]
    assert set(out["backends"]) == {"torch"}       # eager PyTorch kernels here (compile=False)
    # every kernel of the final plan was timed; predictions are kept beside the timings
    rows = out["gpu"]["kernels"]
    assert rows and all(r["measured_ms"] is not None and r["predicted_ms"] is not None for r in rows)
    # a second run times nothing: the timings are in the store
    again = _without_tvm(store)["opt"]
    assert again["measured"] == 0 and again["from_store"] >= opt["measured"]


def test_without_tvm_and_without_predictions_one_clear_error(tmp_path):
    out = _without_tvm(tmp_path / "empty.sqlite")
    assert "TVM" in out["error"] and "same store" in out["error"]


def test_torch_device_cost_keeps_timings_and_failures_in_the_store(tmp_path):
    from tensorplan.cost.torch_device import TorchDeviceCost
    from tensorplan.korch.candidates import enumerate_candidates
    from tensorplan.korch.fission import fission
    from tensorplan.zoo.specs import as_graph

    prim = fission(as_graph("tiny-cnn", None, 17)).graph
    cands = enumerate_candidates(prim, max_nodes=3)[:6]
    first = TorchDeviceCost("cpu", compile=False, store=tmp_path / "s.sqlite", budget_s=0.01)
    costs = first.cost_many(prim, cands)
    assert all(c > 0 for c in costs)
    second = TorchDeviceCost("cpu", compile=False, store=tmp_path / "s.sqlite")
    assert [second.cached(prim, c) for c in cands] == costs
    assert second.cost_many(prim, cands) == costs and second.describe()["kernels_timed"] == 0
    # another backend (Inductor) is another program: nothing of eager's is reused for it
    assert TorchDeviceCost("cpu", compile=True, store=tmp_path / "s.sqlite").cached(prim, cands[0]) is None


def test_cli_optimize_gpu_refusals_are_one_line(tmp_path):
    from typer.testing import CliRunner

    from tensorplan.cli import app

    r = CliRunner().invoke(app, ["optimize", "tiny-mlp", "--device", "cuda", "--store", str(tmp_path / "s.sqlite")])
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert "no CUDA GPU" in r.output
    r = CliRunner().invoke(app, ["optimize", "tiny-mlp", "--device", "h100", "--price-as", "local",
                                 "--price-only", "--store", str(tmp_path / "s.sqlite")])
    assert r.exit_code != 0 and "not a GPU" in r.output


@pytest.mark.gpu
def test_optimize_on_the_gpu(tmp_path):
    import tensorplan as tp

    shutil.copy(PRICED, tmp_path / "s.sqlite")      # the GPU machine has no TVM: predictions made here
    plan = tp.optimize("tiny-cnn", device="cuda", budget_s=300, store=tmp_path / "s.sqlite", out_dir=tmp_path / "o",
                       price_as="h100")
    opt = plan.stats["optimize"]
    assert opt["stop"] == "stable" and opt["max_rel_err"] <= opt["tolerance"]
    assert opt["measured_plan_ms"] > 0 and "torch.compile" in opt["peers_ms"]
    assert (tmp_path / "o" / "plan.json").exists()


def test_cli_price_only_prints_the_predicted_plan_and_the_gpu_command(tmp_path):
    from typer.testing import CliRunner

    from tensorplan.cli import app

    store = tmp_path / "s.sqlite"
    r = CliRunner().invoke(app, ["optimize", "tiny-cnn", "--device", "h100", "--price-only", "--store", str(store),
                                 "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output[r.output.index("{"):])
    assert d["stop"] == "price-only" and d["device"] == "h100-sxm" and d["measured"] == 0
    assert d["backends"] == {"torch-inductor": d["kernels"]} and d["solo_sum_ms"] > 0
    r = CliRunner().invoke(app, ["optimize", "tiny-cnn", "--device", "h100", "--price-only", "--store", str(store)])
    assert r.exit_code == 0 and "--price-as" in r.output and "│ predicted" in r.output   # the command for the GPU


def test_lazy_cost_rescales_cdmpp_prices_to_the_kernels_another_backend_times(tmp_path):
    from tensorplan.cost.lazy import SCALE_PRIOR_POINTS, LazyCost, PredictedCost
    from tensorplan.cost.torch_device import TorchDeviceCost
    from tensorplan.korch.candidates import enumerate_candidates
    from tensorplan.korch.fission import fission
    from tensorplan.zoo.specs import as_graph

    prim = fission(as_graph("tiny-cnn", None, 17)).graph
    cands = enumerate_candidates(prim, max_nodes=4)
    pc = PredictedCost(device="h100", store=tmp_path / "s.sqlite", samples=4)
    lazy = LazyCost(pc, measured=TorchDeviceCost("cpu", compile=False, budget_s=0.01))
    lazy.predict_all(prim, cands)
    mem = [c for c in {c.canonical_hash: c for c in cands}.values() if pc.by_tuned(c)]
    assert len(mem) >= 4 and lazy.tuned_scale == 1.0
    timed, rest = mem[:3], mem[3:]
    lazy.measure(prim, timed)
    lazy.repredict(prim, cands)
    logs = sorted(math.log(lazy.measured_s(c) / lazy.predicted_s(c)) for c in timed)
    want = math.exp(logs[1] * 3 / (3 + SCALE_PRIOR_POINTS))      # the median of three, shrunk toward 1
    assert lazy.tuned_scale == pytest.approx(want) and lazy.tuned_scale != 1.0
    c = rest[0]
    assert lazy.cost(prim, c) == pytest.approx(lazy.predicted_s(c) * want)     # unmeasured: the scaled price
    assert lazy.cost(prim, timed[0]) == lazy.measured_s(timed[0])             # measured: its timing
    assert lazy.describe()["tuned_scale_points"] == 3
