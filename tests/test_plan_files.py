"""Plan files are data that a user may be handed: every command that reads one verifies it against
its model first (schema, field types and ranges, fingerprints, node names, kernel cover, no kernel
twice, buffers) and refuses with one clear error naming the field; a plan never names code to
run; a plan whose ONNX file changed is refused; `run` and `export` compare against ONNX Runtime on
the model file as given (issue 60)."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from typer.testing import CliRunner

from conftest import onnx_model
from tensorplan.cli import app
from tensorplan.errors import PlanError
from tensorplan.runtime.plan import BACKENDS, Plan, load_plan
from tensorplan.workflows.export import export_onnx
from tensorplan.workflows.orchestrate import orchestrate

runner = CliRunner()


def _write_model(path: Path, seed: int = 0, hidden: int = 16) -> Path:
    rng = np.random.default_rng(seed)
    inits = {"w": 0.1 * rng.standard_normal((8, hidden)).astype(np.float32),
             "b": 0.1 * rng.standard_normal((hidden,)).astype(np.float32)}
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["h"], name="mm"), n("Add", ["h", "b"], ["hb"], name="add"),
             n("Relu", ["hb"], ["r"], name="relu"), n("Exp", ["r"], ["e"], name="exp"),
             n("Softmax", ["e"], ["y"], name="sm", axis=-1)]
    onnx.save(onnx_model(nodes, {"x": [2, 8]}, ["y"], inits, name="small"), str(path))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(model file, plan file, plan dict) of a small model, orchestrated once (analytical costs)."""
    d = tmp_path_factory.mktemp("plans")
    model = _write_model(d / "small.onnx")
    plan = orchestrate(str(model), cost="analytical", race=False, time_limit=20)
    path = plan.save(d / "small.plan.json")
    return model, path, json.loads(path.read_text())


def _save(tmp_path, d, name="p.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fail loudly if any kernel is compiled or any plan executor is made."""
    import tensorplan.runtime.executor as ex

    def boom(*a, **k):
        raise AssertionError("a refused plan was run")
    monkeypatch.setattr(ex.PlanExecutor, "__init__", boom)
    monkeypatch.setattr(ex, "build_kernel", boom)


def _k0(d):
    return d["kernels"][0]


# mutation of a real plan -> a phrase the one error must contain (the field it names)
MUTATIONS = {
    "no schema": (lambda d: d.pop("schema"), "unsupported plan schema"),
    "schema": (lambda d: d.update(schema="tensorplan.korch/9"), "unsupported plan schema"),
    "kernels missing": (lambda d: d.pop("kernels"), "plan field kernels is missing"),
    "kernels not a list": (lambda d: d.update(kernels=5), "plan field kernels must be a list"),
    "kernels empty": (lambda d: d.update(kernels=[], order=[]), "kernels is empty"),
    "kernel not an object": (lambda d: d["kernels"].__setitem__(0, "k0"), "kernels[0] must be an object"),
    "kernel id missing": (lambda d: _k0(d).pop("id"), "kernels[0].id is missing"),
    "kernel id int": (lambda d: _k0(d).update(id=7), "kernels[0].id must be a string"),
    "nodes missing": (lambda d: _k0(d).pop("nodes"), "kernels[0] (kernel 'k0').nodes is missing"),
    "nodes a string": (lambda d: _k0(d).update(nodes="mm"), "(kernel 'k0').nodes must be a list of names"),
    "nodes empty": (lambda d: _k0(d).update(nodes=[]), "(kernel 'k0').nodes is empty"),
    "node twice": (lambda d: _k0(d)["nodes"].append(_k0(d)["nodes"][0]), "(kernel 'k0').nodes lists primitive"),
    "unknown node": (lambda d: _k0(d)["nodes"].append("no-such-node"),
                     "kernel 'k0' refers to unknown primitive node(s) ['no-such-node']"),
    "inputs wrong": (lambda d: _k0(d)["inputs"].append("ghost"), "kernel 'k0' declares inputs"),
    "outputs missing": (lambda d: _k0(d).pop("outputs"), "(kernel 'k0').outputs is missing"),
    "unknown kind": (lambda d: _k0(d).update(kind="fused"), "(kernel 'k0').kind is 'fused'"),
    "unknown backend": (lambda d: _k0(d).update(backend="cuda-magic"), "(kernel 'k0').backend is 'cuda-magic'"),
    "negative time": (lambda d: _k0(d).update(predicted_s=-1.0), "(kernel 'k0').predicted_s must be"),
    "time a string": (lambda d: _k0(d).update(predicted_s="fast"), "(kernel 'k0').predicted_s must be"),
    "schedule threads": (lambda d: _k0(d).update(schedule={"threads": "many"}), "(kernel 'k0').schedule.threads"),
    "order unknown kernel": (lambda d: d["order"].append("k99"), "order is not a permutation"),
    "order a string": (lambda d: d.update(order="k0"), "plan field order must be a list"),
    "slot 10^15 bytes": (lambda d: d["slots"].__setitem__(0, 10 ** 15), "plan field slots[0] must be a byte count"),
    "slot 100 GB": (lambda d: d["slots"].__setitem__(0, 10 ** 11), "plan field slots[0] is 100000000000 bytes"),
    "negative buffer": (lambda d: d["buffers"][0].update(bytes=-1), "buffers[0].bytes must be"),
    "buffer slot missing": (lambda d: d["buffers"][0].pop("slot"), "buffers[0].slot is missing"),
    "buffer slot out of range": (lambda d: d["buffers"][0].update(slot=99), "slot 99 is not one of"),
    "buffer bytes wrong": (lambda d: d["buffers"][0].update(bytes=d["buffers"][0]["bytes"] + 4),
                           "the tensor holds"),
    "buffers overlap": (lambda d: ([b.update(slot=0) for b in d["buffers"]],
                                   d["slots"].__setitem__(0, max(b["bytes"] for b in d["buffers"]))),
                        "while both are live"),
    "source missing": (lambda d: d.pop("source"), "plan field source is missing"),
    "source.model int": (lambda d: d["source"].update(model=3), "source.model must be a string"),
    "input shape huge": (lambda d: d["source"].update(input_shapes={"x": [10 ** 6, 10 ** 6, 10 ** 6]}),
                         "source.input_shapes.x"),
    "input shape negative": (lambda d: d["source"].update(input_shapes={"x": [-2, 8]}), "source.input_shapes.x"),
    "opset a string": (lambda d: d["source"].update(opset="17"), "source.opset must be"),
    "hash malformed": (lambda d: d["source"].update(onnx_sha256="abc"), "source.onnx_sha256 must be"),
    "hash missing": (lambda d: d["source"].pop("onnx_sha256"), "source.onnx_sha256"),
    "fingerprint": (lambda d: d["source"].update(fingerprint="0" * 16), "source.fingerprint"),
    "prim fingerprint": (lambda d: d["source"].update(prim_fingerprint="0" * 16), "primitive graph"),
    "options.threads": (lambda d: d["options"].update(threads=-3), "options.threads"),
}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_each_malformed_plan_gets_one_clear_error_naming_the_field(made, tmp_path, nothing_runs, name):
    _, _, good = made
    fn, phrase = MUTATIONS[name]
    d = copy.deepcopy(good)
    fn(d)
    p = _save(tmp_path, d)
    with pytest.raises(PlanError) as e:
        load_plan(p)
    msg = str(e.value)
    assert phrase in msg and str(p) in msg and "\n" not in msg, msg


def test_malformed_plans_through_the_cli_exit_2_with_one_line(made, tmp_path, nothing_runs):
    _, _, good = made
    for name in ("nodes missing", "unknown backend", "slot 10^15 bytes", "order a string"):
        fn, phrase = MUTATIONS[name]
        d = copy.deepcopy(good)
        fn(d)
        p = _save(tmp_path, d, f"{name.replace(' ', '_')}.json")
        for cmd in (["run", str(p)], ["export", str(p), "-o", str(tmp_path / "x.onnx")]):
            r = runner.invoke(app, cmd)
            assert r.exit_code == 2, (cmd, r.output)
            lines = [x for x in r.stderr.splitlines() if x.strip()]
            assert len(lines) == 1 and phrase in lines[0] and "Traceback" not in r.output, r.output
    assert not (tmp_path / "x.onnx").exists()
    for text in ("{not json", "[1, 2]"):
        p = tmp_path / "bad.json"
        p.write_text(text)
        r = runner.invoke(app, ["run", str(p)])
        assert r.exit_code == 2 and "Traceback" not in r.output and "plan file" in r.stderr, r.output
    r = runner.invoke(app, ["run", str(tmp_path)])
    assert r.exit_code == 2 and "is a directory" in r.stderr


def test_a_duplicated_kernel_is_refused_not_run_twice(made, tmp_path, nothing_runs):
    _, _, good = made
    d = copy.deepcopy(good)
    dup = copy.deepcopy(d["kernels"][-1])
    dup["id"] = "k_again"
    d["kernels"].append(dup)
    d["order"].append("k_again")
    p = _save(tmp_path, d)
    with pytest.raises(PlanError, match="compute the same primitives: a kernel listed twice would run twice"):
        load_plan(p)
    r = runner.invoke(app, ["run", str(p)])
    assert r.exit_code == 2 and "listed twice" in r.stderr, r.output
    # the same kernel under the same id is refused too
    d["kernels"][-1]["id"] = d["kernels"][-2]["id"]
    d["order"][-1] = d["kernels"][-2]["id"]
    with pytest.raises(PlanError, match="duplicate kernel ids"):
        load_plan(_save(tmp_path, d, "same-id.json"))


def _evil_factory(tmp_path) -> tuple[Path, Path]:
    marker = tmp_path / "ran.txt"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('imported')\n"
                    f"def make():\n    open({str(marker)!r}, 'w').write('called')\n")
    return evil, marker


def test_a_plan_naming_a_factory_spec_is_refused_without_running_it(made, tmp_path, monkeypatch, nothing_runs):
    _, _, good = made
    evil, marker = _evil_factory(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for model in (f"{evil}:make", "evil:make", str(evil)):
        for fields in ({"model": model}, {"model": model, "onnx": model}):
            d = copy.deepcopy(good)
            d["source"].update(fields)
            if "onnx" not in fields:
                d["source"].pop("onnx")
            p = _save(tmp_path, d)
            with pytest.raises(PlanError) as e:
                load_plan(p)
            msg = str(e.value)
            assert "Python code" in msg and "never imports or runs code" in msg and "ONNX file" in msg, msg
            for cmd in (["run", str(p)], ["export", str(p), "-o", str(tmp_path / "e.onnx")]):
                r = runner.invoke(app, cmd)
                assert r.exit_code == 2 and "Python code" in r.stderr, r.output
            assert not marker.exists(), f"{model}: the factory ran"


def test_a_plan_made_from_a_factory_names_its_exported_onnx_file(tmp_path, nothing_runs):
    pytest.importorskip("torch")
    marker = tmp_path / "called.txt"
    net = tmp_path / "net.py"
    net.write_text("import torch\n"
                   "def make():\n"
                   f"    open({str(marker)!r}, 'a').write('x')\n"
                   "    torch.manual_seed(0)\n"
                   "    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()\n"
                   "    return m, (torch.randn(2, 8),)\n")
    spec = f"{net}:make"
    plan = orchestrate(spec, cost="analytical", race=False, time_limit=20)
    assert marker.exists()                   # resolved when the plan was made, once
    src = plan.source
    assert src["made_from"] == spec and src["model"].endswith(".onnx") and src["model"] == src["onnx"]
    assert len(src["onnx_sha256"]) == 64
    marker.unlink()
    p = plan.save(tmp_path / "net.plan.json")
    back = load_plan(p)                      # reads the ONNX file; the factory is information only
    assert back.to_dict() == plan.to_dict() and not marker.exists()


def test_a_plan_whose_onnx_file_changed_or_went_is_refused(made, tmp_path, nothing_runs):
    model = _write_model(tmp_path / "m.onnx")
    plan = orchestrate(str(model), cost="analytical", race=False, time_limit=20)
    p = plan.save(tmp_path / "m.plan.json")
    load_plan(p)
    _write_model(model, seed=1)                          # same structure, other weights
    with pytest.raises(PlanError, match="changed since the plan was made"):
        load_plan(p)
    r = runner.invoke(app, ["export", str(p), "-o", str(tmp_path / "m2.onnx")])
    assert r.exit_code == 2 and "changed since the plan was made" in r.stderr, r.output
    model.unlink()
    with pytest.raises(PlanError, match="does not exist"):
        load_plan(p)


def test_export_checks_the_plan_against_the_model_first(made, tmp_path, nothing_runs):
    """Another model's plan: pointing a plan at a different file (its true hash) is refused by the
    graph fingerprint before anything is written."""
    from tensorplan.runtime.plan import file_sha256
    _, _, good = made
    other = _write_model(tmp_path / "other.onnx", hidden=12)
    d = copy.deepcopy(good)
    d["source"].update(model=str(other), onnx=str(other), onnx_sha256=file_sha256(other))
    p = _save(tmp_path, d)
    with pytest.raises(PlanError, match="source.fingerprint"):
        export_onnx(str(p), tmp_path / "o.onnx", rounds=0)
    assert not (tmp_path / "o.onnx").exists()


def test_run_and_export_compare_against_the_model_file_as_given(made, tmp_path, monkeypatch):
    """An import that gets a weight wrong: the plan, derived from that import, agrees with ONNX
    Runtime on tensorplan's re-export of the import (what `run` compared with before) but not with
    ONNX Runtime on the original file, which `run` now uses."""
    import tensorplan.ir.onnx_import as imp
    from tensorplan.ir.reference import rel_error
    from tensorplan.ir.to_onnx import run_onnxruntime
    model, path, _ = made
    real = imp.import_onnx

    def wrong_import(*a, **k):
        g = real(*a, **k)
        g.tensors["w"].data = g.tensors["w"].data * 2.0       # simulate an importer bug
        return g
    monkeypatch.setattr(imp, "import_onnx", wrong_import)
    plan = load_plan(path)
    res = plan.run(repeats=1)
    assert res.reference == str(model.resolve())
    assert res.ok is False and res.max_rel_err > 1e-2
    feeds_out = run_onnxruntime(plan.model_graph(), _feeds(plan))   # the old comparison
    assert rel_error(res.outputs["y"], feeds_out["y"]) <= 1e-4
    r = runner.invoke(app, ["run", str(path), "--json", "--repeats", "1"])
    assert r.exit_code == 1 and json.loads(r.stdout)["reference"] == str(model.resolve()), r.output
    monkeypatch.setattr(imp, "import_onnx", real)
    good = load_plan(path).run(repeats=1)
    assert good.ok and good.reference == str(model.resolve())
    ex = export_onnx(str(path), tmp_path / "s.onnx", rounds=0)
    assert ex.ok and ex.reference == str(model.resolve())


def _feeds(plan):
    from tensorplan.ir.reference import random_feeds
    return random_feeds(plan.primitive_graph(), seed=0)


def test_the_backends_a_plan_may_name_are_the_executors():
    from tensorplan.runtime.executor import FALLBACKS
    assert set(BACKENDS) == set(FALLBACKS)


def test_plan_from_dict_rejects_non_objects():
    with pytest.raises(PlanError, match="JSON object"):
        Plan.from_dict([1, 2])


def test_bad_counts_and_output_paths_are_one_line_errors(made, tmp_path, nothing_runs):
    _, path, _ = made
    cases = [(["orchestrate", "tiny-mlp", "--cost", "analytical", "-o", str(tmp_path)], "is a directory"),
             (["orchestrate", "tiny-mlp", "--cost", "analytical", "--race-rounds", "0"], "--race-rounds 0"),
             (["export", str(path), "-o", str(tmp_path)], "is a directory"),
             (["export", str(path), "-o", str(tmp_path / "x.onnx"), "--rounds", "-1"], "--rounds -1"),
             (["run", str(path), "--repeats", "-1"], "--repeats -1"),
             (["run", str(path), "--threads", "0"], "--threads 0")]
    for cmd, phrase in cases:
        r = runner.invoke(app, cmd)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        opt = phrase.split()[0]
        # a count under an option's `min=` is refused by the CLI parser itself (typer's usage error
        # naming the option); everything else is tensorplan's one-line error
        by_parser = opt.startswith("--") and "Invalid value" in r.stderr and opt in r.stderr
        assert r.exit_code == 2 and "Traceback" not in r.output, (cmd, r.output)
        assert by_parser or (len(lines) == 1 and phrase in lines[0]), (cmd, r.output)


def test_region_kernels_name_operators_that_compute_them(tmp_path, nothing_runs):
    from conftest import FixedDevice
    from test_regions import RegionFriendlyCost
    plan = orchestrate("tiny-cnn", device=FixedDevice(), cost=RegionFriendlyCost(), race=False)
    good = json.loads(plan.save(tmp_path / "r.json").read_text())
    j = next(i for i, k in enumerate(good["kernels"]) if k["kind"] == "region")
    kid = good["kernels"][j]["id"]
    for fn, phrase in ((lambda k: k["schedule"]["operators"].append("no-such-op"),
                        f"kernel '{kid}' refers to unknown operator node(s) ['no-such-op']"),
                       (lambda k: k["schedule"].pop("operators"), f"(kernel '{kid}').schedule.operators is missing"),
                       (lambda k: k["schedule"].update(operators=k["schedule"]["operators"][:1]),
                        f"region kernel '{kid}': its operators")):
        d = copy.deepcopy(good)
        fn(d["kernels"][j])
        with pytest.raises(PlanError, match=None) as e:
            load_plan(_save(tmp_path, d))
        assert phrase in str(e.value), str(e.value)
