"""Models built around one base model (`MapePoint`, `TaskRelative`), and what each layer chose on
the validation split, so a result file records e.g. which `mix` a `-rel` model ran with."""
from __future__ import annotations

from typing import Any

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.base import Estimator


class WrappedEstimator(Estimator):
    """A model built around one base model (`self.base`), which its saved state nests with
    `estimator_blob`, so its own constructor takes no saved parameters."""

    base: Estimator | None = None
    # attributes `fit` sets from the validation split (task_relative's mix): results record them
    chosen_on_validation: tuple[str, ...] = ()

    def get_params(self) -> dict[str, Any]:
        return {}

    def _need_base(self, what: str) -> Estimator:
        if self.base is None:
            raise TensorplanError(f"{self.name}.{what}: no base model")
        return self.base


def wrapped_layers(model: Estimator) -> list[Estimator]:
    """The model and the bases it wraps, outermost first (`xgboost-deep-rel-mape`: MapePoint,
    TaskRelative, TenSetXGB)."""
    layers = [model]
    while isinstance(layers[-1], WrappedEstimator) and layers[-1].base is not None:
        layers.append(layers[-1].base)
    return layers


def validation_choices(model: Estimator) -> dict[str, Any]:
    """What each wrapper layer of `model` chose on the validation split, merged into one dict, so a
    result file says e.g. which `mix` a `-rel` model ran with."""
    return {k: getattr(layer, k) for layer in wrapped_layers(model)
            for k in getattr(layer, "chosen_on_validation", ())}
