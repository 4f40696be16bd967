"""The face every latency model shares (scikit-learn style): parameters in `__init__`, `fit`,
`predict` in seconds, `save` and `load`, and the registry that lets `load` rebuild any saved model.

Registration is by definition: every `Estimator` subclass is registered under its class name when
its module is imported (`__init_subclass__`). A saved file names its class (and the module that
defined it, for the reader); loading looks the class up in the registry, importing only the
package's own module for it from `_DEFINED_IN`, never a module the file names.

The file format (`FORMAT`, "tensorplan-estimator/2") holds no code: a `torch.save` zip of a dict
whose leaves are tensors and plain values (dict, list, tuple, str, bytes, int, float, bool, None).
A numpy array is kept as `{"__ndarray__": tensor}` and restored as an array (`plain_state`,
`restore_state`), numpy scalars as Python numbers; XGBoost models as their own UBJSON bytes. It is
read with `torch.load(weights_only=True)`, whose unpickler builds only those types and refuses any
other global, so a file crafted to run code when unpickled is one clear error and runs nothing.
Files of format /1 (written before) load the same way when they hold only such values (the shipped
weights did); one holding numpy arrays or scalars is read with only numpy's array and scalar
constructors allowed besides (`_LEGACY_NUMPY`); anything else is refused with the advice to retrain.
"""
from __future__ import annotations

import abc
import importlib
import re
from pathlib import Path
from typing import Any

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.cdmpp.arrays import ProgramArrays, as_arrays

FORMAT = "tensorplan-estimator/2"
#: formats `load` reads: /1 (the same layout, written before numpy values were converted)
READABLE_FORMATS = ("tensorplan-estimator/1", FORMAT)
_NDARRAY = "__ndarray__"

_REGISTRY: dict[str, type] = {}

#: Where the package's estimators are defined: what `load` imports for a file that names its class
#: but not its module (files written before the module was saved with them, the shipped weights).
#: The only modules `load` ever imports to find a class.
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
        blob = plain_state({"format": FORMAT, **estimator_blob(self),
                            "domains": list(getattr(self, "domains_", None) or []),
                            "domain_features": dict(getattr(self, "domain_features_", None) or {})},
                           type(self).__name__)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(blob, tmp)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Estimator":
        """Rebuild a saved model; the file is read as data only (`read_blob`), never as code."""
        path = Path(path)
        if not path.exists():
            raise TensorplanError(f"model file '{path}' does not exist")
        blob = read_blob(path)
        if not isinstance(blob.get("class"), str) or not isinstance(blob.get("params"), dict) \
                or not isinstance(blob.get("state"), dict):
            raise TensorplanError(f"'{path}' is not a complete tensorplan model file (no class, params or state); "
                                  f"{_HINT}")
        klass = estimator_class(blob["class"], blob.get("module"), f"'{path}'")
        if cls is not Estimator and not issubclass(klass, cls):
            raise TensorplanError(f"'{path}' holds a {blob['class']}, not a {cls.__name__}")
        obj = estimator_from_blob(blob, f"'{path}'")
        obj.domains_ = list(blob.get("domains") or [])  # [] = not recorded (a model saved before they were)
        obj.domain_features_ = dict(blob.get("domain_features") or {})  # the device vector each was learnt with
        return obj


def estimator_class(name: str, module: str | None, owner: str) -> type:
    """The registered `Estimator` subclass `name`. When it is not registered yet, the package's own
    module for it (`_DEFINED_IN[name]`) is imported; a module the file names is never imported (it
    is only quoted in the error), so a file cannot make `load` import anything. `owner` names the
    file or model being loaded in the error."""
    if not isinstance(name, str):
        raise TensorplanError(f"{owner}: the model class is not a name ({type(name).__name__})")
    klass = _REGISTRY.get(name)
    where = _DEFINED_IN.get(name)
    if klass is None and where:
        try:
            importlib.import_module(where)
        except ImportError as e:
            raise TensorplanError(f"{owner}: model class {name} is defined in {where}, which cannot be "
                                  f"imported ({e})") from None
        klass = _REGISTRY.get(name)
    if klass is None:
        named = f" (the file says it is defined in {module})" if isinstance(module, str) and module else ""
        raise TensorplanError(f"{owner}: unknown model class {name}{named}: not one of tensorplan's estimators "
                              f"({', '.join(sorted(_DEFINED_IN))}); a file never makes tensorplan import code. "
                              "If you defined that class yourself, import its module before loading")
    return klass


def estimator_blob(m: Estimator) -> dict:
    """A model's class, defining module, parameters and state: how it is saved, alone or nested
    inside another one's state (ensemble members, a calibrated base)."""
    return {"class": type(m).__name__, "module": type(m).__module__, "params": m.get_params(), "state": m._state()}


def estimator_from_blob(b: dict, owner: str) -> Estimator:
    """Rebuild what `estimator_blob` kept; `owner` names the enclosing model or file in the error."""
    klass = estimator_class(b.get("class"), b.get("module"), owner)
    try:
        m = klass(**b["params"])
        m._set_state(b["state"])
    except TensorplanError:
        raise
    except (TypeError, KeyError, ValueError, IndexError, AttributeError) as e:
        raise TensorplanError(f"{owner}: the saved {b.get('class')} does not fit this version of it "
                              f"({type(e).__name__}: {str(e)[:160]}); retrain it with `tensorplan predictor train`") from None
    return m


def load_estimator(path: str | Path) -> Estimator:
    """Load any saved tensorplan estimator (CDMPP, a baseline, an ensemble or a calibrated model)."""
    return Estimator.load(path)


_HINT = "pass a file written by `tensorplan predictor train` (or leave out --weights for the shipped model)"


def _legacy_numpy_globals() -> list:
    """numpy's array and scalar constructors (and dtype classes): what a format-/1 file written with
    numpy values in its state needs, and nothing that runs code (an object array's elements go
    through the same restricted unpickler)."""
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    out = [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype]
    out += [v for v in vars(np.dtypes).values() if isinstance(v, type) and issubclass(v, np.dtype)]
    return out


def read_blob(path: str | Path) -> dict:
    """The dict a model file holds, read with `torch.load(weights_only=True)`: no code runs. A file
    that needs any other global (pickled classes, a crafted `__reduce__`) is one clear error."""
    import pickle

    import torch

    path = Path(path)
    if not path.exists():
        raise TensorplanError(f"model file '{path}' does not exist")

    def load(extra: list):
        with torch.serialization.safe_globals(extra):
            return torch.load(path, map_location="cpu", weights_only=True)

    try:
        try:
            blob = load([])
        except pickle.UnpicklingError as e:
            if "numpy" not in str(e):
                raise
            blob = load(_legacy_numpy_globals())       # a format-/1 file with numpy values in its state
    except pickle.UnpicklingError as e:
        what = re.search(r"Unsupported global: GLOBAL [\w.]+|Unsupported operand \d+|Trying to [^.\n]{0,100}", str(e))
        raise TensorplanError(
            f"'{path}' was not loaded: it holds pickled Python objects, not only weights and plain values "
            f"({what.group(0) if what else str(e).splitlines()[0][:120]}). A model file is data and is never "
            "unpickled as code: it may come from another program or an older tensorplan, or be crafted to run "
            "code. Retrain it with `tensorplan predictor train` (the files it writes load safely), or leave out "
            "--weights for the shipped model") from None
    except Exception as e:  # noqa: BLE001 - zip and torch errors for a truncated or foreign file
        raise TensorplanError(f"'{path}' is not a readable tensorplan model file "
                              f"({type(e).__name__}: {str(e)[:120]}); {_HINT}") from None
    if not isinstance(blob, dict) or blob.get("format") not in READABLE_FORMATS:
        raise TensorplanError(f"'{path}' is not a tensorplan model file; {_HINT}")
    return restore_state(blob)


def plain_state(x: Any, owner: str = "model", where: str = "") -> Any:
    """`x` with every value `torch.load(weights_only=True)` reads: numpy arrays as
    `{"__ndarray__": tensor}`, numpy scalars as Python numbers, tensors detached on the CPU; any
    other object is an error naming where it is (it could only be saved by pickling code)."""
    import torch

    if x is None or type(x) in (bool, int, float, str, bytes):
        return x
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TensorplanError(f"{owner}.save: {where or 'state'} is an object array, which cannot be saved as data")
        return {_NDARRAY: torch.from_numpy(np.ascontiguousarray(x).copy())}
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (bool, int, float, str, bytes)):     # subclasses (IntEnum, np.float64 is caught above)
        return next(t for t in (bool, int, float, str, bytes) if isinstance(x, t))(x)
    if isinstance(x, bytearray):
        return bytes(x)
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if type(k) not in (str, int):
                raise TensorplanError(f"{owner}.save: key {k!r} of {where or 'state'} is a "
                                      f"{type(k).__name__}, not a str or int")
            out[k] = plain_state(v, owner, f"{where}/{k}")
        return out
    if isinstance(x, (list, tuple)):
        items = [plain_state(v, owner, f"{where}/{i}") for i, v in enumerate(x)]
        return tuple(items) if isinstance(x, tuple) else items
    raise TensorplanError(f"{owner}.save: {where or 'state'} is a {type(x).__module__}.{type(x).__name__}; "
                          "a model file holds only tensors and plain values (convert it in `_state`)")


def restore_state(x: Any) -> Any:
    """Undo `plain_state`: `{"__ndarray__": tensor}` back to a numpy array."""
    if isinstance(x, dict):
        if len(x) == 1 and _NDARRAY in x:
            return x[_NDARRAY].numpy()
        return {k: restore_state(v) for k, v in x.items()}
    if isinstance(x, list):
        return [restore_state(v) for v in x]
    if isinstance(x, tuple):
        return tuple(restore_state(v) for v in x)
    return x
