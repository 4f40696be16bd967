"""The face every latency model shares (scikit-learn style): parameters in `__init__`, `fit`,
`predict` in seconds, `save` and `load`, and the registry that lets `load` rebuild any saved model.

Registration is by definition: every `Estimator` subclass is registered under its class name when
its module is imported (`__init_subclass__`). A saved file names its class and the module defining
it, so loading imports that module first (only modules inside `tensorplan`); files saved before
the module was recorded (the shipped weights) find it in `_DEFINED_IN`.
"""
from __future__ import annotations

import abc
import importlib
from pathlib import Path
from typing import Any

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.arrays import ProgramArrays, as_arrays

FORMAT = "tensorplan-estimator/1"

_REGISTRY: dict[str, type] = {}

#: Where the package's estimators are defined: what `load` imports for a file that names its class
#: but not its module (files written before the module was saved with them, the shipped weights).
_DEFINED_IN = {
    "CDMPP": "tensorplan.cdmpp.model",
    "Ensemble": "tensorplan.cdmpp.ensemble",
    "Calibrated": "tensorplan.cdmpp.calibrate",
    "TenSetXGB": "tensorplan.cdmpp.baselines",
    "TenSetMLP": "tensorplan.cdmpp.baselines",
    "TLPModel": "tensorplan.cdmpp.baselines",
    "RooflineLinear": "tensorplan.cdmpp.baselines",
}


class torch_threads:
    """Run torch with `n` intra-op threads inside the block, then restore the previous count.

    Default 1: on a machine whose cores are shared, the OpenMP workers of a multi-threaded step
    spin while they wait for a core and slow training many-fold; small models gain little from
    more threads.
    """

    def __init__(self, n: int | None):
        self.n = n or 1

    def __enter__(self):
        import torch

        self.prev = torch.get_num_threads()
        if self.prev != self.n:
            torch.set_num_threads(self.n)
        return self

    def __exit__(self, *exc):
        import torch

        if torch.get_num_threads() != self.prev:
            torch.set_num_threads(self.prev)
        return False


class Estimator(abc.ABC):
    """Every latency model: params in `__init__`, `fit`, `predict` (seconds), `save`, `load`.

    `fit(train, val=None, target=None)`: `target` is optional unlabelled target-domain data that a
    domain-adaptive model may use (CDMPP's CMD); other models ignore it.
    `finetune(data)`: adapt to a few labelled target samples; the default refits on nothing new
    and must be overridden by models that can adapt.
    """

    name = "estimator"
    #: True for models whose `finetune` adapts the trained model itself (CDMPP); the others refit.
    adapts_by_finetune = False

    def __init_subclass__(cls, **kw):
        """Register the class under its name, so `load` finds it (private helpers are skipped)."""
        super().__init_subclass__(**kw)
        if not cls.__name__.startswith("_"):
            _REGISTRY[cls.__name__] = cls

    def get_params(self) -> dict[str, Any]:
        import inspect

        sig = inspect.signature(type(self).__init__)
        return {k: getattr(self, k) for k in sig.parameters if k != "self"}

    @abc.abstractmethod
    def fit(self, train, val=None, target=None) -> "Estimator":
        """Fit on `train` (validation `val` for model selection, unlabelled `target` for CMD)."""

    @abc.abstractmethod
    def predict(self, records) -> np.ndarray:
        """Latency in seconds per program."""

    def finetune(self, data, base=None) -> "Estimator":
        """Adapt to labelled target-domain `data`; default: refit on `base` + `data`."""
        if base is None:
            raise TensorplanError(f"{self.name}: finetune needs the base training set")
        return self.fit(ProgramArrays.concat([as_arrays(base), as_arrays(data)]))

    # state <-> bytes; subclasses implement _state/_set_state
    @abc.abstractmethod
    def _state(self) -> dict[str, Any]:
        """Everything `save` must keep (arrays, weights, normalisers)."""

    @abc.abstractmethod
    def _set_state(self, state: dict[str, Any]) -> None:
        """Restore what `_state` returned."""

    def save(self, path: str | Path) -> Path:
        import torch

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = {"format": FORMAT, **estimator_blob(self),
                "domains": list(getattr(self, "domains_", None) or []),
                "domain_features": dict(getattr(self, "domain_features_", None) or {})}
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(blob, tmp)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Estimator":
        import torch

        path = Path(path)
        if not path.exists():
            raise TensorplanError(f"model file '{path}' does not exist")
        hint = "pass a file written by `tensorplan predictor train` (or leave out --weights for the shipped model)"
        try:
            blob = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - pickle, zip and torch errors for a truncated or foreign file
            raise TensorplanError(f"'{path}' is not a readable tensorplan model file "
                                  f"({type(e).__name__}: {str(e)[:120]}); {hint}") from None
        if not isinstance(blob, dict) or blob.get("format") != FORMAT:
            raise TensorplanError(f"'{path}' is not a tensorplan model file; {hint}")
        klass = estimator_class(blob["class"], blob.get("module"), f"'{path}'")
        if cls is not Estimator and not issubclass(klass, cls):
            raise TensorplanError(f"'{path}' holds a {blob['class']}, not a {cls.__name__}")
        obj = estimator_from_blob(blob, f"'{path}'")
        obj.domains_ = list(blob.get("domains") or [])  # [] = not recorded (a model saved before they were)
        obj.domain_features_ = dict(blob.get("domain_features") or {})  # the device vector each was learnt with
        return obj


def estimator_class(name: str, module: str | None, owner: str) -> type:
    """The registered class `name`, importing its defining `module` (or `_DEFINED_IN[name]`) when it
    is not registered yet; only modules inside `tensorplan` are imported. `owner` names the file or
    model being loaded in the error."""
    klass = _REGISTRY.get(name)
    where = module or _DEFINED_IN.get(name)
    if klass is None and where and where.startswith("tensorplan."):
        try:
            importlib.import_module(where)
        except ImportError as e:
            raise TensorplanError(f"{owner}: model class {name} is defined in {where}, which cannot be "
                                  f"imported ({e})") from None
        klass = _REGISTRY.get(name)
    if klass is None:
        outside = f" (defined in {where}: import that module before loading)" if where else ""
        raise TensorplanError(f"{owner}: unknown model class {name}{outside}")
    return klass


def estimator_blob(m: Estimator) -> dict:
    """A model's class, defining module, parameters and state: how it is saved, alone or nested
    inside another one's state (ensemble members, a calibrated base)."""
    return {"class": type(m).__name__, "module": type(m).__module__, "params": m.get_params(), "state": m._state()}


def estimator_from_blob(b: dict, owner: str) -> Estimator:
    """Rebuild what `estimator_blob` kept; `owner` names the enclosing model or file in the error."""
    m = estimator_class(b["class"], b.get("module"), owner)(**b["params"])
    m._set_state(b["state"])
    return m


def load_estimator(path: str | Path) -> Estimator:
    """Load any saved tensorplan estimator (CDMPP, a baseline, an ensemble or a calibrated model)."""
    return Estimator.load(path)
