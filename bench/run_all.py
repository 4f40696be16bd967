"""Run the benchmarks behind docs/results.md, then re-render it (`make bench`).

Each step is the exact command the docs quote; results land in bench/results/ and
`bench/summarize.py` turns them into docs/results.md. The full set takes hours on the 2-core
VM (korch_bench ~1-2 h, the CDMPP evaluation ~80 min), so `--only` / `--skip` pick steps and
`--list` shows them. Steps run one after another: timings taken side by side on a 2-core
machine would measure each other.

Usage: python bench/run_all.py [--list] [--only NAME,...] [--skip NAME,...] [--keep-going]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
TP = str(Path(PY).with_name("tensorplan"))

#: the Zen 3 VM's CPU as `cpu_info()` names it: steps that score its check kernels run on that CPU type
ZEN3_HOST = "AMD EPYC (family 25, model 1)"
# the domains the dataset had before the Zen 3 VM's were merged in (the device JSONs made before then)
PRE_ZEN3 = "gpuhost-16t,gpuhost-1t,local-1t,local-2t,zen4-1t,zen4-2t"

#: (name, command, rough minutes on the 2-core VM)
STEPS: list[tuple[str, list[str], float]] = [
    ("device", [PY, "bench/device_numbers.py", "--rounds", "5"], 3),
    ("store", [PY, "bench/store_throughput.py"], 2),
    ("import", [PY, "bench/import_check.py"], 8),
    ("kernels", [PY, "bench/korch_kernels.py"], 5),
    ("candidates", [PY, "bench/korch_candidates.py", "--check", "--fresh"], 55),
    ("korch", [PY, "bench/korch_bench.py", "--results-dir", "bench/results/korch_rewrite", "--force"], 120),
    # YOLOX-nano sits on the 1.5x roofline line and this VM has fast and slow phases: five more runs
    # of the same command give docs/results.md its run-to-run table
    *((f"korch-repeat-{i}", [PY, "bench/korch_bench.py", "--models", "yolox-nano", "--results-dir",
                             f"bench/results/korch_repeats/yolox-nano/run{i}", "--force"], 1.5) for i in range(1, 6)),
    ("standalone", [PY, "bench/korch_standalone.py", "--models",
                    "candy,segformer-b0,efficientvit-b1,yolox-nano,yolov4,resnet-50,bert-base"], 15),
    ("export", [PY, "bench/export_bench.py"], 3),
    ("beyond-zoo", [PY, "bench/beyond_zoo.py"], 12),
    ("ort-profile", [PY, "bench/ort_profile.py", "--models", "efficientvit-b1,yolox-nano,segformer-b0,candy"], 1),
    ("korch-gpu", [PY, "bench/korch_gpu.py", "--models", "candy", "efficientvit-b1", "yolox-nano"], 15),
    ("features", [PY, "bench/features_speed.py"], 2),
    ("cdmpp-speed", [PY, "bench/cdmpp_speed.py", "--epochs", "6"], 3),
    ("cdmpp-eval", [TP, "evaluate", "--devices", "local-1t,local-2t", "--holdout", "efficientvit-b1,tiny-mlp,mobilenet-v2",
                    "--time-scale", "0.625", "--out", "bench/results/cdmpp_eval.json", "--doc", "docs/cdmpp.md"], 80),
    # the wrapper models, added to the same document as they were (--resume keeps every model above)
    ("cdmpp-eval-wrappers", [TP, "evaluate", "--devices", "local-1t,local-2t", "--holdout",
                             "efficientvit-b1,tiny-mlp,mobilenet-v2", "--time-scale", "0.625", "--resume",
                             "--models", "xgboost-deep-mape,xgboost-deep-rel,xgboost-deep-rel-mape",
                             "--out", "bench/results/cdmpp_eval.json", "--doc", "docs/cdmpp.md"], 45),
    ("cdmpp-ensemble", [PY, "bench/cdmpp_ensemble.py"], 20),
    ("cdmpp-ensemble-hier", [PY, "bench/cdmpp_ensemble.py", "--models", "xgboost-hier", "--add"], 3),
    ("cdmpp-by-network", [PY, "bench/cdmpp_by_network.py", "--models",
                          "xgboost,cdmpp,cdmpp-nocmd,xgboost-hier,xgboost-parts,cdmpp-nocmd-parts,"
                          "cdmpp-nocmd-parts+xgboost-hier,xgboost-deep,xgboost-deep-mape,xgboost-deep-rel-mape"],
                          300),
    # the analytic estimate across CPUs (docs/cdmpp.md, "An analytic estimate for the trees")
    # (`xgboost-deep` on three of them: "More capacity for the trees"). `--devices`: the domains the
    # committed JSON was made on, before the Zen 3 domains were merged in
    *((f"cdmpp-xgb-hier-{tag}", [TP, "evaluate", "--splits", "device", "--models", models, *args,
                                 "--out", f"bench/results/cdmpp_xgb_hier_{tag}.json"], mins)
      for tag, mins, models, args in (
          ("device", 8, "xgboost,xgboost-parts,xgboost-hier,xgboost-deep", ["--devices", "local-1t,local-2t"]),
          ("zen4", 8, "xgboost,xgboost-hier,xgboost-deep",
           ["--devices", PRE_ZEN3, "--source", "local-1t", "--target", "zen4-1t"]),
          ("zen4_multi", 13, "xgboost,xgboost-hier,xgboost-deep",
           ["--devices", PRE_ZEN3, "--source", "local-1t,local-2t,gpuhost-1t,gpuhost-16t", "--target", "zen4-1t"]),
          ("gpuhost1t", 3, "xgboost,xgboost-hier", ["--devices", PRE_ZEN3, "--source", "local-1t", "--target", "gpuhost-1t"]),
          ("gpuhost16t", 3, "xgboost,xgboost-hier",
           ["--devices", PRE_ZEN3, "--source", "local-2t", "--target", "gpuhost-16t"]))),
    *((f"cdmpp-parts-{tag}", [TP, "evaluate", "--splits", "device", "--models", "cdmpp-nocmd,cdmpp-nocmd-parts",
                              "--time-scale", "0.625", *args, "--out", f"bench/results/cdmpp_parts_{tag}.json"], 9)
      for tag, args in (("device", ["--devices", "local-1t,local-2t"]),
                        ("zen4", ["--source", "local-1t", "--target", "zen4-1t"]))),
    # a third CPU as the held-out device: the Zen 3 VM's domains (docs/cdmpp.md, "A third CPU")
    *((f"cdmpp-eval-{tag}", [TP, "evaluate", "--splits", "device", "--models",
                             "xgboost,xgboost-hier,cdmpp,cdmpp-nocmd-parts,xgboost-deep", "--time-scale", "0.625", *args,
                             "--target", "zen3-1t", "--out", f"bench/results/cdmpp_eval_{tag}.json"], 16)
      for tag, args in (("zen3", ["--source", "local-1t"]),
                        ("zen3_multi", ["--source", "local-1t,local-2t,zen4-1t,zen4-2t,gpuhost-1t,gpuhost-16t"]))),
    ("cdmpp-by-network-summary", [PY, "bench/cdmpp_by_network.py", "--summary"], 0.1),
    # whole-network picks (docs/cdmpp.md, "Whole-network latency", "Ranking schedules within a task")
    ("cdmpp-by-network-picks", [PY, "bench/cdmpp_by_network.py", "--models",
                                "xgboost,xgboost-hier,cdmpp-nocmd-parts,cdmpp-nocmd-parts-rank",
                                "--out", "bench/results/cdmpp_by_network_picks.jsonl"], 135),
    ("cdmpp-by-network-picks-summary", [PY, "bench/cdmpp_by_network.py", "--summary",
                                        "--out", "bench/results/cdmpp_by_network_picks.jsonl"], 0.1),
    # `predict --tuned 32`: the shipped model's picks timed, and every candidate timed (the oracle)
    ("cdmpp-tuned-check", [PY, "bench/cdmpp_tuned_check.py", "--tuned", "32"], 15),
    ("cdmpp-tuned-oracle", [PY, "bench/cdmpp_tuned_check.py", "--oracle", "--models",
                            "tiny-style,tiny-linear-attention,tiny-cnn,mobilenet-v2,efficientvit-b1"], 13),
    ("cdmpp-tuned-summary", [PY, "bench/cdmpp_tuned_check.py", "--summary"], 0.1),
    # trains on the committed grid records (data/cdmpp-datamove-zen4, collected on a Zen 4 VM; the
    # collect command in the script's docstring must run on that machine type)
    ("cdmpp-datamove", [PY, "bench/cdmpp_datamove.py"], 25),
    ("cdmpp-datamove-summary", [PY, "bench/cdmpp_datamove.py", "--summary"], 0.1),
    ("cdmpp-datamove-multi", [PY, "bench/cdmpp_datamove.py", "--also-train", "local-1t,local-2t",
                              "--out", "bench/results/cdmpp_datamove_multi.jsonl"], 25),
    ("cdmpp-datamove-multi-summary", [PY, "bench/cdmpp_datamove.py", "--summary",
                                      "--out", "bench/results/cdmpp_datamove_multi.jsonl"], 0.1),
    ("cdmpp-predict-check", [PY, "bench/cdmpp_predict_check.py", "--calibrate"], 25),
    ("cdmpp-predict-check-summary", [PY, "bench/cdmpp_predict_check.py", "--summary"], 0.1),
    # the same on a Zen 3 host, into its own file (docs/cdmpp.md, "A third CPU")
    ("cdmpp-predict-check-zen3", [PY, "bench/cdmpp_predict_check.py", "--calibrate",
                                  "--out", "bench/results/cdmpp_predict_check_zen3.jsonl"], 12),
    ("cdmpp-predict-check-zen3-summary", [PY, "bench/cdmpp_predict_check.py", "--summary",
                                          "--out", "bench/results/cdmpp_predict_check_zen3.jsonl"], 0.1),
    # how much of a model's error a per-kernel scale would remove (oracle factors, k timed programs per task)
    ("cdmpp-error-parts", [PY, "bench/cdmpp_error_parts.py"], 15),
    ("cdmpp-error-parts-more", [PY, "bench/cdmpp_error_parts.py", "--models", "cdmpp-nocmd-parts-rank,xgboost-hier",
                                "--splits", "network"], 6),
    ("cdmpp-lono-floors-0", [PY, "bench/cdmpp_by_network.py", "--models", "xgboost-deep", "--shard", "0/2",
                             "--out", "bench/results/cdmpp_by_network_floors.jsonl"], 27),
    ("cdmpp-lono-floors-1", [PY, "bench/cdmpp_by_network.py", "--models", "xgboost-deep", "--shard", "1/2",
                             "--out", "bench/results/cdmpp_by_network_floors.jsonl"], 27),
    # ... and with the within-task spacing booster (docs/cdmpp.md, "Spacing an unseen kernel's schedules")
    *((f"cdmpp-lono-floors-rel-{i}", [PY, "bench/cdmpp_by_network.py", "--models", "xgboost-deep-rel", "--shard",
                                      f"{i}/2", "--out", "bench/results/cdmpp_by_network_floors.jsonl"], 60)
      for i in (0, 1)),
    ("cdmpp-lono-floors", [PY, "bench/cdmpp_by_network.py", "--summary",
                           "--out", "bench/results/cdmpp_by_network_floors.jsonl"], 0.1),
    *((f"cdmpp-error-parts-rel-{tag}", [PY, "bench/cdmpp_error_parts.py", "--models", models, "--splits", "network",
                                        "--threads", "1", *args], mins)
      for tag, mins, models, args in (
          ("table", 15, "xgboost-deep-rel,xgboost-deep-mape,xgboost-deep-rel-mape", []),
          ("draw2", 20, "xgboost-deep,xgboost-deep-rel,xgboost-deep-mape,xgboost-deep-rel-mape",
           ["--holdout", "segformer-b0,swin-tiny,candy,resnet-50"]))),
    ("cdmpp-error-parts-rel-sample", [PY, "bench/cdmpp_error_parts.py", "--models", "xgboost-deep-rel", "--splits",
                                      "sample", "--threads", "2"], 10),
    # cdmpp_rel_zen4.json's xgboost-deep-rel row predates the seen-program rule; the current one is _gated
    ("cdmpp-rel-zen4", [TP, "evaluate", "--splits", "device", "--models", "xgboost-deep",
                        "--devices", PRE_ZEN3, "--source", "local-1t", "--target", "zen4-1t",
                        "--out", "bench/results/cdmpp_rel_zen4.json"], 8),
    ("cdmpp-rel-zen4-gated", [TP, "evaluate", "--splits", "device", "--models", "xgboost-deep-rel",
                              "--devices", PRE_ZEN3, "--source", "local-1t", "--target", "zen4-1t",
                              "--out", "bench/results/cdmpp_rel_zen4_gated.json"], 10),
    # a booster of each kernel's scale over one row per task, against the trees' own (not shipped)
    ("cdmpp-task-scale", [PY, "bench/cdmpp_task_scale.py"], 10),
    # how much of each split's validation the trees have seen (why -rel's mix differs by split)
    ("cdmpp-val-overlap", [PY, "bench/cdmpp_val_overlap.py"], 1),
    # the trees with more capacity (xgboost-deep) against xgboost-hier, row by row, on the harness's splits
    ("cdmpp-xgb-capacity", [PY, "bench/cdmpp_xgb_capacity.py"], 85),
    # trains on the committed programs over the 0.1 s cap (data/cdmpp-big-zen4, Zen 4 VM) and scores
    # against the Zen 4 host's lines of the predict check's committed JSONL
    ("cdmpp-bigkernels", [PY, "bench/cdmpp_bigkernels.py"], 30),
    ("cdmpp-bigkernels-summary", [PY, "bench/cdmpp_bigkernels.py", "--summary"], 0.1),
    ("cdmpp-bigkernels-multi", [PY, "bench/cdmpp_bigkernels.py", "--also-train", "local-1t,local-2t",
                                "--out", "bench/results/cdmpp_bigkernels_multi.jsonl"], 30),
    ("cdmpp-bigkernels-multi-summary", [PY, "bench/cdmpp_bigkernels.py", "--summary",
                                        "--out", "bench/results/cdmpp_bigkernels_multi.jsonl"], 0.1),
    # the shipped model's training data: the collection CPU's alone, or with the Zen 4 VM's records
    # (its 'check' predicts with this host's device vector, so it runs on a Zen 4 host only)
    ("cdmpp-ship-data", [PY, "bench/cdmpp_ship_data.py"], 30),
    ("cdmpp-ship-data-shipped", [PY, "bench/cdmpp_ship_data.py", "--weights",
                                 "src/tensorplan/predict/weights/cdmpp-local.pt", "--label", "shipped-2026-11-25-4x900"], 3),
    # the shipped model on the Zen 3 VM's check kernels (runs on a Zen 3 host only)
    ("cdmpp-ship-data-shipped-zen3", [PY, "bench/cdmpp_ship_data.py", "--host", ZEN3_HOST,
                                      "--out", "bench/results/cdmpp_ship_data_zen3.jsonl", "--weights",
                                      "src/tensorplan/predict/weights/cdmpp-local.pt", "--label", "shipped-4x900s"], 3),
    ("cdmpp-ship-data-zen3-arms", [PY, "bench/cdmpp_ship_data.py", "--host", ZEN3_HOST,
                                   "--out", "bench/results/cdmpp_ship_data_zen3.jsonl",
                                   "--arms", "all-cpus,all-cpus+zen3"], 32),
    ("cdmpp-ship-data-zen3-summary", [PY, "bench/cdmpp_ship_data.py", "--summary",
                                      "--out", "bench/results/cdmpp_ship_data_zen3.jsonl"], 0.1),
    # whole-network totals as the kernels' sum or times the validation mean measured / predicted
    # (cdmpp/totals.py): leave each network out with the factor measured, then the summary
    ("cdmpp-network-totals-0", [PY, "bench/cdmpp_by_network.py", "--models", "xgboost-hier,cdmpp-nocmd-parts",
                                "--shard", "0/2", "--out", "bench/results/cdmpp_by_network_totals.jsonl"], 35),
    ("cdmpp-network-totals-1", [PY, "bench/cdmpp_by_network.py", "--models", "xgboost-hier,cdmpp-nocmd-parts",
                                "--shard", "1/2", "--out", "bench/results/cdmpp_by_network_totals.jsonl"], 35),
    ("cdmpp-network-totals", [PY, "bench/cdmpp_network_totals.py"], 3),
    ("cdmpp-gpu-predict-check", [PY, "bench/cdmpp_gpu_predict_check.py", "--holdout"], 25),
    # the H200 re-timed the H100's programs (docs/cdmpp.md, "A second GPU: the H200"): the gap
    # between the two, then the held-out-device split from one to the other
    ("cdmpp-gpu-ratio", [PY, "bench/cdmpp_domain_ratio.py", "h100", "h200", "--data", "data/cdmpp-h100", "--json",
                         "--out", "bench/results/cdmpp_domain_ratios_gpu.json"], 0.5),
    # how far a device transfer can go: each program's measured source latency times the best factor
    # (one, or one per task) against the target's (docs/cdmpp.md, "How far a device transfer can go")
    ("cdmpp-device-floors", [PY, "bench/cdmpp_domain_ratio.py", "local-2t", "local-1t", "local-1t", "zen4-1t",
                             "local-1t", "zen3-1t", "local-1t", "gpuhost-1t", "local-2t", "gpuhost-16t", "zen4-1t",
                             "zen3-1t", "gpuhost-1t", "gpuhost-16t", "--out", "bench/results/cdmpp_device_floors.json"],
     0.5),
    ("cdmpp-tree-fewshot-zen4", [PY, "bench/cdmpp_tree_fewshot.py", "--source", "local-1t", "--target", "zen4-1t",
                                 "--out", "bench/results/cdmpp_tree_fewshot_zen4.json"], 8),
    ("cdmpp-tree-fewshot-gpuhost", [PY, "bench/cdmpp_tree_fewshot.py", "--source", "local-1t", "--target",
                                    "gpuhost-1t", "--out", "bench/results/cdmpp_tree_fewshot_gpuhost.json"], 8),
    ("cdmpp-eval-h200", [TP, "evaluate", "--data", "data/cdmpp-h100", "--splits", "device", "--source", "h100",
                         "--target", "h200", "--models", "xgboost,xgboost-hier,xgboost-deep,roofline,mlp,cdmpp,tlp",
                         "--out", "bench/results/cdmpp_eval_h200.json"], 25),
    # would more programs per task help unseen networks? (docs/cdmpp.md, "More programs per task"):
    # the H100 domain capped at 1-3 programs per task, and the CPU domains at 2-16
    ("cdmpp-programs-per-task-h100", [PY, "bench/cdmpp_programs_per_task.py", "--data", "data/cdmpp-h100",
                                      "--devices", "h100", "--holdout", "tiny-mlp,efficientvit-b1,vit-b16,resnet-50,retinaface",
                                      "--caps", "1,2,3", "--models", "xgboost,xgboost-deep-mape,mlp,cdmpp", "--seeds", "0,1,2",
                                      "--out", "bench/results/cdmpp_programs_per_task_h100.json"], 40),
    ("cdmpp-programs-per-task-cpu", [PY, "bench/cdmpp_programs_per_task.py", "--devices", "local-1t,local-2t",
                                     "--caps", "2,4,8,16", "--models", "xgboost,xgboost-deep-mape,xgboost-deep-rel-mape",
                                     "--time-scale", "0.625", "--out", "bench/results/cdmpp_programs_per_task_cpu.json"], 35),
    ("codl-predictor", [PY, "bench/codl_predictor.py"], 5),
    ("codl-coexec", [PY, "bench/codl_coexec.py"], 10),
    ("codl-simulate", [PY, "bench/codl_simulate.py", "--seeds", "3"], 5),
    ("summarize", [PY, "bench/summarize.py"], 0.1),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="Show the steps and exit.")
    ap.add_argument("--only", default="", help="Comma-separated step names to run (summarize always runs last).")
    ap.add_argument("--skip", default="", help="Comma-separated step names to leave out.")
    ap.add_argument("--keep-going", action="store_true", help="Run the remaining steps after a failure.")
    a = ap.parse_args(argv)
    names = [s[0] for s in STEPS]
    only = [x for x in a.only.split(",") if x]
    skip = [x for x in a.skip.split(",") if x]
    bad = sorted(set(only + skip) - set(names))
    if bad:
        ap.error(f"unknown step(s) {bad}; steps: {', '.join(names)}")
    steps = [s for s in STEPS if (not only or s[0] in only or s[0] == "summarize") and s[0] not in skip]
    if a.list:
        for name, cmd, minutes in STEPS:
            print(f"{name:15s} ~{minutes:>5.1f} min  {' '.join(Path(c).name if c in (PY, TP) else c for c in cmd)}")
        return 0
    failed = []
    for name, cmd, minutes in steps:
        print(f"== {name} (~{minutes:.0f} min): {' '.join(cmd)}", flush=True)
        t0 = time.time()
        rc = subprocess.call(cmd, cwd=ROOT)
        print(f"== {name}: exit {rc} after {(time.time() - t0) / 60:.1f} min", flush=True)
        if rc != 0:
            failed.append(name)
            if not a.keep_going:
                break
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
