"""Latency prediction (CDMPP): compact-AST features and the dataset (`features`, `tasks`,
`dataset`, `gpu_dataset`), the program arrays models read (`arrays`, `analytic`), the estimator
base and registry (`base`), the CDMPP model (`model`) and baselines (`baselines`, `ensemble`,
`calibrate`), few-shot adaptation (`finetune`, `local_calibration`), the evaluation harness
(`evaluate`, `metrics`) and network prediction (`predict`).

Submodules import TVM / torch lazily; import what you need, e.g.
`from tensorplan.cdmpp.features import compact_ast` or
`from tensorplan.cdmpp.dataset import load_dataset`.
"""
