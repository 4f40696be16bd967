"""CDMPP research variants that did not become the product: wrapper models (leaf-count experts,
a MAPE-optimal point, a within-task spacing booster), network-total factors, and the evaluation
harness that names them (`harness.VariantHarness`). Not installed with tensorplan; import with
`research/` on `sys.path` (`research/_path.py`)."""
