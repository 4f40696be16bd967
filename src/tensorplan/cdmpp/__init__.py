"""Latency prediction: CDMPP's compact-AST features and dataset (`features`, `dataset`, `tasks`),
the CDMPP model and baselines (`cdmpp`, `baselines`, `evaluate`).

Submodules import TVM / torch lazily; import what you need, e.g.
`from tensorplan.cdmpp.features import compact_ast` or
`from tensorplan.cdmpp.dataset import load_dataset`.
"""
