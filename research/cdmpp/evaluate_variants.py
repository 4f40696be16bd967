"""`tensorplan predictor evaluate` with every research model name (`cdmpp_variants.harness`).

Same options and output as the product command; `--models` also takes the variant grammar
(`xgboost-deep-rel-mape`, `cdmpp-parts-leaf`, `NAME-ens3`, `A+B`, ...) and defaults to the published
evaluation's models; the summary line checks the CDMPP paper's goals.

    python research/cdmpp/evaluate_variants.py --devices local-1t,local-2t \\
        --holdout efficientvit-b1,tiny-mlp,mobilenet-v2 --time-scale 0.625 --out research/cdmpp/results/cdmpp_eval.json
"""
import functools
import inspect

import _path  # noqa: F401  (research/ on sys.path)
import typer

from tensorplan.cli.predictor import evaluate_cmd, run_evaluation

from cdmpp_variants.harness import DEFAULT_MODELS, VariantHarness


@functools.wraps(evaluate_cmd)
def main(**options) -> None:
    run_evaluation(VariantHarness(), **options)


# the product command's options, with --models describing this harness's names
_sig = inspect.signature(evaluate_cmd)
_models = typer.Option(None, "--models", help=f"Comma-separated models (default: {', '.join(DEFAULT_MODELS)}); "
                       "any name of cdmpp_variants.harness, e.g. xgboost-deep-rel-mape, cdmpp-nocmd-ens5, A+B.")
main.__signature__ = _sig.replace(parameters=[p.replace(default=_models) if p.name == "models" else p
                                              for p in _sig.parameters.values()])

if __name__ == "__main__":
    app = typer.Typer(add_completion=False)
    app.command(help=__doc__.splitlines()[0])(main)
    app()
