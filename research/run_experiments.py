"""The CDMPP experiments: every command behind the research notes' tables (research/notes/cdmpp.md).

Not part of `make bench` (bench/run_all.py runs the benchmarks behind docs/results.md); each step
is the command the notes quote and writes to research/cdmpp/results/. The whole list takes a day
on a 2-core machine; `--only` / `--skip` pick steps and `--list` shows them. Same options as
bench/run_all.py, whose runner this uses.

Usage: python research/run_experiments.py [--list] [--only NAME,...] [--skip NAME,...] [--keep-going]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run_all import PY, main  # noqa: E402  (bench/run_all.py: the step runner)

#: `tensorplan predictor evaluate` with the research variants' model names
EVAL = [PY, "research/cdmpp/evaluate_variants.py"]
#: where the published evaluation's tables are regenerated
NOTES = "research/notes/cdmpp.md"
#: the packaged weights, scored by the shipping studies
SHIPPED = Path("src/tensorplan/cdmpp/weights/cdmpp-local.pt")
#: the Zen 3 VM's CPU as `cpu_info()` names it: steps that score its check kernels run on that CPU type
ZEN3_HOST = "AMD EPYC (family 25, model 1)"
# the domains the dataset had before the Zen 3 VM's were merged in (the device JSONs made before then)
PRE_ZEN3 = "gpuhost-16t,gpuhost-1t,local-1t,local-2t,zen4-1t,zen4-2t"

#: (name, command, rough minutes on the 2-core development VM)
STEPS: list[tuple[str, list[str], float]] = [
    ("features", [PY, "bench/features_speed.py"], 2),
    ("cdmpp-speed", [PY, "research/cdmpp/cdmpp_speed.py", "--epochs", "6"], 3),
    ("cdmpp-eval", [*EVAL, "--devices", "local-1t,local-2t", "--holdout", "efficientvit-b1,tiny-mlp,mobilenet-v2",
                    "--time-scale", "0.625", "--out", "research/cdmpp/results/cdmpp_eval.json", "--doc", NOTES], 80),
    # the wrapper models, added to the same document as they were (--resume keeps every model above)
    ("cdmpp-eval-wrappers", [*EVAL, "--devices", "local-1t,local-2t", "--holdout",
                             "efficientvit-b1,tiny-mlp,mobilenet-v2", "--time-scale", "0.625", "--resume",
                             "--models", "xgboost-deep-mape,xgboost-deep-rel,xgboost-deep-rel-mape",
                             "--out", "research/cdmpp/results/cdmpp_eval.json", "--doc", NOTES], 45),
    ("cdmpp-ensemble", [PY, "research/cdmpp/cdmpp_ensemble.py"], 20),
    ("cdmpp-ensemble-hier", [PY, "research/cdmpp/cdmpp_ensemble.py", "--models", "xgboost-hier", "--add"], 3),
    ("cdmpp-by-network", [PY, "research/cdmpp/cdmpp_by_network.py", "--models",
                          "xgboost,cdmpp,cdmpp-nocmd,xgboost-hier,xgboost-parts,cdmpp-nocmd-parts,"
                          "cdmpp-nocmd-parts+xgboost-hier,xgboost-deep,xgboost-deep-mape,xgboost-deep-rel-mape"],
                          300),
    # the analytic estimate across CPUs (research/notes/cdmpp.md, "An analytic estimate for the trees")
    # (`xgboost-deep` on three of them: "More capacity for the trees"). `--devices`: the domains the
    # committed JSON was made on, before the Zen 3 domains were merged in
    *((f"cdmpp-xgb-hier-{tag}", [*EVAL, "--splits", "device", "--models", models, *args,
                                 "--out", f"research/cdmpp/results/cdmpp_xgb_hier_{tag}.json"], mins)
      for tag, mins, models, args in (
          ("device", 8, "xgboost,xgboost-parts,xgboost-hier,xgboost-deep", ["--devices", "local-1t,local-2t"]),
          ("zen4", 8, "xgboost,xgboost-hier,xgboost-deep",
           ["--devices", PRE_ZEN3, "--source", "local-1t", "--target", "zen4-1t"]),
          ("zen4_multi", 13, "xgboost,xgboost-hier,xgboost-deep",
           ["--devices", PRE_ZEN3, "--source", "local-1t,local-2t,gpuhost-1t,gpuhost-16t", "--target", "zen4-1t"]),
          ("gpuhost1t", 3, "xgboost,xgboost-hier", ["--devices", PRE_ZEN3, "--source", "local-1t", "--target", "gpuhost-1t"]),
          ("gpuhost16t", 3, "xgboost,xgboost-hier",
           ["--devices", PRE_ZEN3, "--source", "local-2t", "--target", "gpuhost-16t"]))),
    *((f"cdmpp-parts-{tag}", [*EVAL, "--splits", "device", "--models", "cdmpp-nocmd,cdmpp-nocmd-parts",
                              "--time-scale", "0.625", *args, "--out", f"research/cdmpp/results/cdmpp_parts_{tag}.json"], 9)
      for tag, args in (("device", ["--devices", "local-1t,local-2t"]),
                        ("zen4", ["--source", "local-1t", "--target", "zen4-1t"]))),
    # a third CPU as the held-out device: the Zen 3 VM's domains (research/notes/cdmpp.md, "A third CPU")
    *((f"cdmpp-eval-{tag}", [*EVAL, "--splits", "device", "--models",
                             "xgboost,xgboost-hier,cdmpp,cdmpp-nocmd-parts,xgboost-deep", "--time-scale", "0.625", *args,
                             "--target", "zen3-1t", "--out", f"research/cdmpp/results/cdmpp_eval_{tag}.json"], 16)
      for tag, args in (("zen3", ["--source", "local-1t"]),
                        ("zen3_multi", ["--source", "local-1t,local-2t,zen4-1t,zen4-2t,gpuhost-1t,gpuhost-16t"]))),
    ("cdmpp-by-network-summary", [PY, "research/cdmpp/cdmpp_by_network.py", "--summary"], 0.1),
    # whole-network picks (research/notes/cdmpp.md, "Whole-network latency", "Ranking schedules within a task")
    ("cdmpp-by-network-picks", [PY, "research/cdmpp/cdmpp_by_network.py", "--models",
                                "xgboost,xgboost-hier,cdmpp-nocmd-parts,cdmpp-nocmd-parts-rank",
                                "--out", "research/cdmpp/results/cdmpp_by_network_picks.jsonl"], 135),
    ("cdmpp-by-network-picks-summary", [PY, "research/cdmpp/cdmpp_by_network.py", "--summary",
                                        "--out", "research/cdmpp/results/cdmpp_by_network_picks.jsonl"], 0.1),
    # `predict --tuned 32`: the shipped model's picks timed, and every candidate timed (the oracle)
    ("cdmpp-tuned-check", [PY, "research/cdmpp/cdmpp_tuned_check.py", "--tuned", "32"], 15),
    ("cdmpp-tuned-oracle", [PY, "research/cdmpp/cdmpp_tuned_check.py", "--oracle", "--models",
                            "tiny-style,tiny-linear-attention,tiny-cnn,mobilenet-v2,efficientvit-b1"], 13),
    ("cdmpp-tuned-summary", [PY, "research/cdmpp/cdmpp_tuned_check.py", "--summary"], 0.1),
    # trains on the committed grid records (data/cdmpp-datamove-zen4, collected on a Zen 4 VM; the
    # collect command in the script's docstring must run on that machine type)
    ("cdmpp-datamove", [PY, "research/cdmpp/cdmpp_datamove.py"], 25),
    ("cdmpp-datamove-summary", [PY, "research/cdmpp/cdmpp_datamove.py", "--summary"], 0.1),
    ("cdmpp-datamove-multi", [PY, "research/cdmpp/cdmpp_datamove.py", "--also-train", "local-1t,local-2t",
                              "--out", "research/cdmpp/results/cdmpp_datamove_multi.jsonl"], 25),
    ("cdmpp-datamove-multi-summary", [PY, "research/cdmpp/cdmpp_datamove.py", "--summary",
                                      "--out", "research/cdmpp/results/cdmpp_datamove_multi.jsonl"], 0.1),
    ("cdmpp-predict-check", [PY, "research/cdmpp/cdmpp_predict_check.py", "--calibrate"], 25),
    ("cdmpp-predict-check-summary", [PY, "research/cdmpp/cdmpp_predict_check.py", "--summary"], 0.1),
    # the same on a Zen 3 host, into its own file (research/notes/cdmpp.md, "A third CPU")
    ("cdmpp-predict-check-zen3", [PY, "research/cdmpp/cdmpp_predict_check.py", "--calibrate",
                                  "--out", "research/cdmpp/results/cdmpp_predict_check_zen3.jsonl"], 12),
    ("cdmpp-predict-check-zen3-summary", [PY, "research/cdmpp/cdmpp_predict_check.py", "--summary",
                                          "--out", "research/cdmpp/results/cdmpp_predict_check_zen3.jsonl"], 0.1),
    # how much of a model's error a per-kernel scale would remove (oracle factors, k timed programs per task)
    ("cdmpp-error-parts", [PY, "research/cdmpp/cdmpp_error_parts.py"], 15),
    ("cdmpp-error-parts-more", [PY, "research/cdmpp/cdmpp_error_parts.py", "--models", "cdmpp-nocmd-parts-rank,xgboost-hier",
                                "--splits", "network"], 6),
    ("cdmpp-lono-floors-0", [PY, "research/cdmpp/cdmpp_by_network.py", "--models", "xgboost-deep", "--shard", "0/2",
                             "--out", "research/cdmpp/results/cdmpp_by_network_floors.jsonl"], 27),
    ("cdmpp-lono-floors-1", [PY, "research/cdmpp/cdmpp_by_network.py", "--models", "xgboost-deep", "--shard", "1/2",
                             "--out", "research/cdmpp/results/cdmpp_by_network_floors.jsonl"], 27),
    # ... and with the within-task spacing booster (research/notes/cdmpp.md, "Spacing an unseen kernel's schedules")
    *((f"cdmpp-lono-floors-rel-{i}", [PY, "research/cdmpp/cdmpp_by_network.py", "--models", "xgboost-deep-rel", "--shard",
                                      f"{i}/2", "--out", "research/cdmpp/results/cdmpp_by_network_floors.jsonl"], 60)
      for i in (0, 1)),
    ("cdmpp-lono-floors", [PY, "research/cdmpp/cdmpp_by_network.py", "--summary",
                           "--out", "research/cdmpp/results/cdmpp_by_network_floors.jsonl"], 0.1),
    *((f"cdmpp-error-parts-rel-{tag}", [PY, "research/cdmpp/cdmpp_error_parts.py", "--models", models, "--splits", "network",
                                        "--threads", "1", *args], mins)
      for tag, mins, models, args in (
          ("table", 15, "xgboost-deep-rel,xgboost-deep-mape,xgboost-deep-rel-mape", []),
          ("draw2", 20, "xgboost-deep,xgboost-deep-rel,xgboost-deep-mape,xgboost-deep-rel-mape",
           ["--holdout", "segformer-b0,swin-tiny,candy,resnet-50"]))),
    ("cdmpp-error-parts-rel-sample", [PY, "research/cdmpp/cdmpp_error_parts.py", "--models", "xgboost-deep-rel", "--splits",
                                      "sample", "--threads", "2"], 10),
    # cdmpp_rel_zen4.json's xgboost-deep-rel row predates the seen-program rule; the current one is _gated
    ("cdmpp-rel-zen4", [*EVAL, "--splits", "device", "--models", "xgboost-deep",
                        "--devices", PRE_ZEN3, "--source", "local-1t", "--target", "zen4-1t",
                        "--out", "research/cdmpp/results/cdmpp_rel_zen4.json"], 8),
    ("cdmpp-rel-zen4-gated", [*EVAL, "--splits", "device", "--models", "xgboost-deep-rel",
                              "--devices", PRE_ZEN3, "--source", "local-1t", "--target", "zen4-1t",
                              "--out", "research/cdmpp/results/cdmpp_rel_zen4_gated.json"], 10),
    # a booster of each kernel's scale over one row per task, against the trees' own (not shipped)
    ("cdmpp-task-scale", [PY, "research/cdmpp/cdmpp_task_scale.py"], 10),
    # how much of each split's validation the trees have seen (why -rel's mix differs by split)
    ("cdmpp-val-overlap", [PY, "research/cdmpp/cdmpp_val_overlap.py"], 1),
    # the trees with more capacity (xgboost-deep) against xgboost-hier, row by row, on the harness's splits
    ("cdmpp-xgb-capacity", [PY, "research/cdmpp/cdmpp_xgb_capacity.py"], 85),
    # trains on the committed programs over the 0.1 s cap (data/cdmpp-big-zen4, Zen 4 VM) and scores
    # against the Zen 4 host's lines of the predict check's committed JSONL
    ("cdmpp-bigkernels", [PY, "research/cdmpp/cdmpp_bigkernels.py"], 30),
    ("cdmpp-bigkernels-summary", [PY, "research/cdmpp/cdmpp_bigkernels.py", "--summary"], 0.1),
    ("cdmpp-bigkernels-multi", [PY, "research/cdmpp/cdmpp_bigkernels.py", "--also-train", "local-1t,local-2t",
                                "--out", "research/cdmpp/results/cdmpp_bigkernels_multi.jsonl"], 30),
    ("cdmpp-bigkernels-multi-summary", [PY, "research/cdmpp/cdmpp_bigkernels.py", "--summary",
                                        "--out", "research/cdmpp/results/cdmpp_bigkernels_multi.jsonl"], 0.1),
    # the shipped model's training data: the collection CPU's alone, or with the Zen 4 VM's records
    # (its 'check' predicts with this host's device vector, so it runs on a Zen 4 host only)
    ("cdmpp-ship-data", [PY, "research/cdmpp/cdmpp_ship_data.py"], 30),
    ("cdmpp-ship-data-shipped", [PY, "research/cdmpp/cdmpp_ship_data.py", "--weights",
                                 str(SHIPPED), "--label", "shipped-2026-11-25-4x900"], 3),
    # the shipped model on the Zen 3 VM's check kernels (runs on a Zen 3 host only)
    ("cdmpp-ship-data-shipped-zen3", [PY, "research/cdmpp/cdmpp_ship_data.py", "--host", ZEN3_HOST,
                                      "--out", "research/cdmpp/results/cdmpp_ship_data_zen3.jsonl", "--weights",
                                      str(SHIPPED), "--label", "shipped-4x900s"], 3),
    ("cdmpp-ship-data-zen3-arms", [PY, "research/cdmpp/cdmpp_ship_data.py", "--host", ZEN3_HOST,
                                   "--out", "research/cdmpp/results/cdmpp_ship_data_zen3.jsonl",
                                   "--arms", "all-cpus,all-cpus+zen3"], 32),
    ("cdmpp-ship-data-zen3-summary", [PY, "research/cdmpp/cdmpp_ship_data.py", "--summary",
                                      "--out", "research/cdmpp/results/cdmpp_ship_data_zen3.jsonl"], 0.1),
    # whole-network totals as the kernels' sum or times the validation mean measured / predicted
    # (cdmpp_variants/totals.py): leave each network out with the factor measured, then the summary
    ("cdmpp-network-totals-0", [PY, "research/cdmpp/cdmpp_by_network.py", "--models", "xgboost-hier,cdmpp-nocmd-parts",
                                "--shard", "0/2", "--out", "research/cdmpp/results/cdmpp_by_network_totals.jsonl"], 35),
    ("cdmpp-network-totals-1", [PY, "research/cdmpp/cdmpp_by_network.py", "--models", "xgboost-hier,cdmpp-nocmd-parts",
                                "--shard", "1/2", "--out", "research/cdmpp/results/cdmpp_by_network_totals.jsonl"], 35),
    ("cdmpp-network-totals", [PY, "research/cdmpp/cdmpp_network_totals.py"], 3),
    ("cdmpp-gpu-predict-check", [PY, "research/cdmpp/cdmpp_gpu_predict_check.py", "--holdout"], 25),
    # the H100 model's prices of Korch candidates vs Inductor's kernels timed on the H100 (#62 step 3)
    ("cdmpp-gpu-prices-inductor", [PY, "research/cdmpp/cdmpp_gpu_prices_inductor.py"], 6),
    # the H200 re-timed the H100's programs (research/notes/cdmpp.md, "A second GPU: the H200"): the gap
    # between the two, then the held-out-device split from one to the other
    ("cdmpp-gpu-ratio", [PY, "research/cdmpp/cdmpp_domain_ratio.py", "h100", "h200", "--data", "data/cdmpp-h100", "--json",
                         "--out", "research/cdmpp/results/cdmpp_domain_ratios_gpu.json"], 0.5),
    # how far a device transfer can go: each program's measured source latency times the best factor
    # (one, or one per task) against the target's (research/notes/cdmpp.md, "How far a device transfer can go")
    ("cdmpp-device-floors", [PY, "research/cdmpp/cdmpp_domain_ratio.py", "local-2t", "local-1t", "local-1t", "zen4-1t",
                             "local-1t", "zen3-1t", "local-1t", "gpuhost-1t", "local-2t", "gpuhost-16t", "zen4-1t",
                             "zen3-1t", "gpuhost-1t", "gpuhost-16t", "--out", "research/cdmpp/results/cdmpp_device_floors.json"],
     0.5),
    ("cdmpp-tree-fewshot-zen4", [PY, "research/cdmpp/cdmpp_tree_fewshot.py", "--source", "local-1t", "--target", "zen4-1t",
                                 "--out", "research/cdmpp/results/cdmpp_tree_fewshot_zen4.json"], 8),
    ("cdmpp-tree-fewshot-gpuhost", [PY, "research/cdmpp/cdmpp_tree_fewshot.py", "--source", "local-1t", "--target",
                                    "gpuhost-1t", "--out", "research/cdmpp/results/cdmpp_tree_fewshot_gpuhost.json"], 8),
    ("cdmpp-eval-h200", [*EVAL, "--data", "data/cdmpp-h100", "--splits", "device", "--source", "h100",
                         "--target", "h200", "--models", "xgboost,xgboost-hier,xgboost-deep,roofline,mlp,cdmpp,tlp",
                         "--out", "research/cdmpp/results/cdmpp_eval_h200.json"], 25),
    # would more programs per task help unseen networks? (research/notes/cdmpp.md, "More programs per task"):
    # the H100 domain capped at 1-3 programs per task, and the CPU domains at 2-16
    ("cdmpp-programs-per-task-h100", [PY, "research/cdmpp/cdmpp_programs_per_task.py", "--data", "data/cdmpp-h100",
                                      "--devices", "h100", "--holdout", "tiny-mlp,efficientvit-b1,vit-b16,resnet-50,retinaface",
                                      "--caps", "1,2,3", "--models", "xgboost,xgboost-deep-mape,mlp,cdmpp", "--seeds", "0,1,2",
                                      "--out", "research/cdmpp/results/cdmpp_programs_per_task_h100.json"], 40),
    ("cdmpp-programs-per-task-cpu", [PY, "research/cdmpp/cdmpp_programs_per_task.py", "--devices", "local-1t,local-2t",
                                     "--caps", "2,4,8,16", "--models", "xgboost,xgboost-deep-mape,xgboost-deep-rel-mape",
                                     "--time-scale", "0.625", "--out", "research/cdmpp/results/cdmpp_programs_per_task_cpu.json"], 35),
]


if __name__ == "__main__":
    sys.exit(main(steps=STEPS, description=__doc__.splitlines()[0]))
