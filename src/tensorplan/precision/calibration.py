"""Calibration inputs: the samples on which a reduced-precision kernel is quantized and its accuracy
measured against fp32.

Why its own module: int8 scales and every accuracy figure are only as good as these inputs, so they
are read once, checked against the model's declared inputs (name, shape, dtype, finite values) and
handed on as plain feeds. Two layouts are read from a directory: one `.npz` per sample holding every
input, or one `NAME.npy` per input with a leading sample axis. Without a directory the samples are
drawn from the declared shapes, and the set says so in `warning`: random inputs measure numerical
drift, not task accuracy.
"""
from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorplan.errors import TensorplanError
from tensorplan.ir.graph import Graph

RANDOM_WARNING = ("random inputs measure numerical drift, not task accuracy; pass --calibration DIR with real "
                  "inputs (one .npz per sample holding every input, or NAME.npy per input with a leading sample "
                  "axis) to measure accuracy on your data")

_LAYOUT = ("one .npz per sample holding every input, or NAME.npy per input with a leading sample axis "
           "(characters other than letters, digits, '.', '-' and '_' in NAME written as '_')")


@dataclass
class CalibrationSet:
    """Calibration samples: `feeds[i]` maps every graph input to its value for sample i (declared
    shape and dtype). `source` says where they came from; `warning` is set when they cannot measure
    task accuracy (random inputs)."""

    feeds: list[dict[str, np.ndarray]]
    source: str
    warning: str | None = None

    def __len__(self) -> int:
        return len(self.feeds)


def file_stem(input_name: str) -> str:
    """The `.npy` file stem of a graph input: its name with characters that do not belong in a file
    name (anything but letters, digits, '.', '-', '_') written as '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", input_name)


def load_calibration(graph: Graph, directory: Path | str | None, count: int = 8, seed: int = 0) -> CalibrationSet:
    """The calibration samples of `graph`: read from `directory` (every sample it holds), or, when it
    is None, `count` random feeds from the declared shapes (seeds `seed` .. `seed+count-1`, as
    `ir.reference.random_feeds` draws them) with `warning` set. Raises TensorplanError naming the file
    and the input when a file does not fit the graph's inputs."""
    if directory is None:
        if count < 1:
            raise TensorplanError(f"calibration: count must be >= 1 random samples, got {count}")
        from tensorplan.ir.reference import random_feeds
        feeds = [random_feeds(graph, seed=seed + i) for i in range(count)]
        return CalibrationSet(feeds, f"random: {count} samples drawn from the declared input shapes "
                                     f"(seeds {seed}..{seed + count - 1})", RANDOM_WARNING)
    root = Path(directory)
    if not root.exists():
        raise TensorplanError(f"calibration directory '{root}' does not exist; pass a directory holding {_LAYOUT}")
    if not root.is_dir():
        raise TensorplanError(f"calibration path '{root}' is not a directory; pass a directory holding {_LAYOUT}")
    npz = sorted(root.glob("*.npz"))
    npy = sorted(root.glob("*.npy"))
    if npz and npy:
        raise TensorplanError(f"calibration directory '{root}' holds both .npz ({len(npz)}) and .npy ({len(npy)}) "
                              f"files; keep one layout: {_LAYOUT}")
    if npz:
        feeds = [_read_npz(graph, f) for f in npz]
        return CalibrationSet(feeds, f"{root}: {len(feeds)} samples, one .npz per sample")
    if npy:
        feeds = _read_npy_dir(graph, root, npy)
        return CalibrationSet(feeds, f"{root}: {len(feeds)} samples, one .npy per input")
    raise TensorplanError(f"calibration directory '{root}' holds no .npz or .npy files; expected {_LAYOUT} "
                          f"for the inputs {_declared(graph)}")


# ------------------------------------------------------------------------------------------------
# reading and checking
# ------------------------------------------------------------------------------------------------
def _declared(graph: Graph) -> str:
    return ", ".join(f"'{n}' {graph.tensors[n].dtype}[{'x'.join(map(str, graph.tensors[n].shape))}]"
                     for n in graph.inputs)


def _mismatch(missing: list[str], extra: list[str]) -> str:
    """The "lacks A and holds B, which name(s) no input of the model" part of an error message."""
    what = [f"lacks {', '.join(missing)}"] if missing else []
    if extra:
        what.append(f"holds {', '.join(extra)}, which name(s) no input of the model")
    return " and ".join(what)


def _read_npz(graph: Graph, path: Path) -> dict[str, np.ndarray]:
    """One sample: every graph input from one .npz file, checked."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise TensorplanError(f"calibration file '{path}' is not a readable .npz archive: {e}") from None
    missing = [f"input '{n}'" for n in graph.inputs if n not in arrays]
    extra = [f"array '{k}'" for k in sorted(set(arrays) - set(graph.inputs))]
    if missing or extra:
        raise TensorplanError(f"calibration file '{path}' {_mismatch(missing, extra)}; each .npz must hold exactly "
                              f"the model's inputs: {_declared(graph)}")
    return {n: _checked(graph, n, arrays[n], path) for n in graph.inputs}


def _read_npy_dir(graph: Graph, root: Path, files: list[Path]) -> list[dict[str, np.ndarray]]:
    """Every sample from one NAME.npy per input (leading sample axis), checked."""
    by_stem = {f.stem: f for f in files}
    wanted = {file_stem(n): n for n in graph.inputs}
    if len(wanted) != len(graph.inputs):
        raise TensorplanError(f"calibration directory '{root}': the model's inputs {list(graph.inputs)} share a "
                              "file name once written as NAME.npy; use one .npz per sample instead")
    missing = [f"{s}.npy (input '{n}')" for s, n in wanted.items() if s not in by_stem]
    extra = sorted(f"{s}.npy" for s in by_stem if s not in wanted)
    if missing or extra:
        raise TensorplanError(f"calibration directory '{root}' {_mismatch(missing, extra)}; expected one NAME.npy "
                              f"per input with a leading sample axis: {_declared(graph)}")
    stacks: dict[str, np.ndarray] = {}
    for stem, name in wanted.items():
        path = by_stem[stem]
        try:
            arr = np.load(path, allow_pickle=False, mmap_mode="r")
        except (OSError, ValueError, EOFError) as e:
            raise TensorplanError(f"calibration file '{path}' is not a readable .npy array: {e}") from None
        shape = tuple(graph.tensors[name].shape)
        if arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != shape:
            raise TensorplanError(f"calibration file '{path}' has shape {tuple(arr.shape)} but input '{name}' is "
                                  f"{list(shape)}; a NAME.npy holds the samples along a leading axis: "
                                  f"(samples, {', '.join(map(str, shape))})")
        if arr.shape[0] == 0:
            raise TensorplanError(f"calibration file '{path}' holds no samples (leading axis 0)")
        stacks[name] = arr
    counts = {n: int(a.shape[0]) for n, a in stacks.items()}
    if len(set(counts.values())) > 1:
        raise TensorplanError(f"calibration directory '{root}': the inputs' files hold different sample counts "
                              f"{counts}; every NAME.npy needs the same leading axis")
    n_samples = next(iter(counts.values()))
    return [{n: _checked(graph, n, np.array(stacks[n][i]), by_stem[file_stem(n)], sample=i) for n in graph.inputs}
            for i in range(n_samples)]


def _checked(graph: Graph, name: str, arr: np.ndarray, path: Path, sample: int | None = None) -> np.ndarray:
    """`arr` as input `name` of `graph` (declared shape; declared dtype when the cast keeps the
    values: float to float, integers in range, bool to bool), or a TensorplanError saying which."""
    t = graph.tensors[name]
    where = f"calibration file '{path}'" + (f" sample {sample}" if sample is not None else "")
    if tuple(arr.shape) != tuple(t.shape):
        raise TensorplanError(f"{where}: input '{name}' has shape {tuple(arr.shape)}, the model declares "
                              f"{list(t.shape)}")
    want = np.dtype(np.float32) if t.dtype == "bfloat16" else np.dtype(t.dtype)
    have = arr.dtype
    if np.issubdtype(want, np.floating):
        ok = np.issubdtype(have, np.floating)
    elif want == np.bool_:
        ok = have == np.bool_
    elif np.issubdtype(want, np.integer):
        ok = np.issubdtype(have, np.integer)
        if ok and arr.size:
            lo, hi = np.iinfo(want).min, np.iinfo(want).max
            if int(arr.min()) < lo or int(arr.max()) > hi:
                raise TensorplanError(f"{where}: input '{name}' holds values {int(arr.min())}..{int(arr.max())}, "
                                      f"outside {want.name}'s range, the model's dtype for it")
    else:
        ok = have == want
    if not ok:
        raise TensorplanError(f"{where}: input '{name}' is {have.name}, the model takes {t.dtype}; convert (and, "
                              "for images, normalise) the data as the model expects before saving it")
    if np.issubdtype(have, np.floating) and not np.isfinite(arr).all():
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise TensorplanError(f"{where}: input '{name}' holds {bad} NaN/inf value(s); calibration needs finite data")
    return np.ascontiguousarray(arr, dtype=want)


__all__ = ["CalibrationSet", "RANDOM_WARNING", "file_stem", "load_calibration"]
