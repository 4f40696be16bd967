"""The package's shape, read from the source with `ast` (nothing is imported): no import cycle,
layers import downwards only, and no product module imports the research or bench folders.

Why: the layout (docs/architecture.md) keeps each idea in its own package with data flowing
one way; a cycle or an upward import is how that erodes, one convenient import at a time. Every
import statement counts, at module level or inside a function; only those under
``if TYPE_CHECKING:`` are exempt (they never run). An import of a module's own package, an
ancestor or a descendant is not an edge (the semantics of shared/tools/import_cycles.py).
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "src" / "tensorplan"
ROOT = "tensorplan"

# Layer of each top-level module or subpackage of tensorplan; a module may import its own layer
# and those below it. The package's own __init__ and __main__ sit above everything.
LAYERS = {
    "errors": 0, "paths": 0, "progress": 0, "forkmap": 0,
    "ir": 1, "devices": 1,
    "zoo": 2, "measure": 2, "precision": 2,
    "rewrite": 3, "kernels": 3,
    "korch": 4,
    "cdmpp": 5,
    "cost": 6,
    "codl": 7,
    "runtime": 8,
    "workflows": 9,
    "api": 10, "cli": 10,
}
TOP = max(LAYERS.values()) + 1
NOT_SHIPPED = ("research", "bench")   # top-level folders of the repository, not installed


@dataclass(frozen=True)
class Edge:
    src: str      # importing module
    dst: str      # imported module of the package
    path: str     # file of the importing module, relative to src/
    line: int
    stmt: str     # the import statement as written

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: `{self.stmt}` -> {self.dst}"


def _modules(pkg: Path) -> dict[str, Path]:
    mods = {}
    for p in sorted(pkg.rglob("*.py")):
        parts = list(p.relative_to(pkg.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _imports(tree: ast.Module):
    """Import statements that run (not under `if TYPE_CHECKING:`)."""
    skip = {id(x) for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.dump(n.test)
            for x in ast.walk(n)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip]


def _names(mod: str, is_init: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Absolute dotted names an import statement refers to (the package and each imported name)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = mod.split(".") if is_init else mod.split(".")[:-1]
        if node.level > 1:
            base = base[:len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{a.name}" for a in node.names]


def _scan(pkg: Path = PKG) -> tuple[dict[str, Path], list[Edge], list[Edge]]:
    """(modules, edges between package modules, imports of folders that are not shipped)."""
    mods = _modules(pkg)
    edges: list[Edge] = []
    outside: list[Edge] = []
    for m, p in mods.items():
        src = p.read_text()
        rel = str(p.relative_to(pkg.parent))
        tree = ast.parse(src, filename=rel)
        for node in _imports(tree):
            stmt = ast.unparse(node)
            seen = set()
            for name in _names(m, p.name == "__init__.py", node):
                if name.split(".")[0] in NOT_SHIPPED:
                    outside.append(Edge(m, name, rel, node.lineno, stmt))
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if not name or name in seen or name == m or m.startswith(name + ".") or name.startswith(m + "."):
                    continue
                seen.add(name)
                edges.append(Edge(m, name, rel, node.lineno, stmt))
    return mods, edges, outside


def _cycles(mods, edges: list[Edge]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {m: [] for m in mods}
    for e in edges:
        graph[e.src].append(e.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def layer_of(mod: str) -> int | None:
    """The layer of a module of the package (None: its top-level name is not in LAYERS)."""
    parts = mod.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return TOP
    return LAYERS.get(parts[1])


@functools.cache
def scan() -> tuple[dict[str, Path], list[Edge], list[Edge]]:
    """The scan of the real package, once per session."""
    return _scan()


def test_every_module_has_a_layer():
    mods, _, _ = scan()
    missing = sorted({m.split(".")[1] for m in mods if layer_of(m) is None})
    assert not missing, (f"top-level module(s) {missing} of src/tensorplan are not in LAYERS of "
                         f"tests/test_layout.py: give each new package its layer there")


def test_no_import_cycles():
    mods, edges, _ = scan()
    found = _cycles(mods, edges)
    report = []
    for comp in found:
        members = set(comp)
        report.append(f"import cycle: {' <-> '.join(comp)}")
        report += [f"    {e}" for e in edges if e.src in members and e.dst in members]
    assert not found, f"{len(found)} import cycle(s) in src/tensorplan:\n" + "\n".join(report)


def test_layers_import_downwards_only():
    _, edges, _ = scan()
    up = [e for e in edges
          if layer_of(e.src) is not None and layer_of(e.dst) is not None and layer_of(e.dst) > layer_of(e.src)]
    report = [f"{e.src} (layer {layer_of(e.src)}) imports {e.dst} (layer {layer_of(e.dst)}): {e}" for e in up]
    assert not up, f"{len(up)} upward import(s) (layers in tests/test_layout.py):\n" + "\n".join(report)


def test_product_does_not_import_research():
    _, _, outside = scan()
    report = [f"{e.src} imports {e.dst}, which is not installed with the package: {e}" for e in outside]
    assert not outside, "\n".join(report)


def test_the_scan_sees_cycles_and_layers(tmp_path):
    """The checks themselves: a planted cycle (one import inside a function), an upward import
    and a research import are found; a TYPE_CHECKING import is not."""
    pkg = tmp_path / ROOT
    for d in ("ir", "cli"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "ir" / "a.py").write_text("from tensorplan.ir import b\n")
    (pkg / "ir" / "b.py").write_text("def f():\n    from tensorplan.ir.a import x\n")
    (pkg / "ir" / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from tensorplan.cli import main\nimport research.tools\n")
    (pkg / "ir" / "d.py").write_text("from ..cli import main\n")
    mods, edges, outside = _scan(pkg)
    assert _cycles(mods, edges) == [["tensorplan.ir.a", "tensorplan.ir.b"]]
    assert {(e.src, e.dst) for e in edges if layer_of(e.dst) > layer_of(e.src)} == {("tensorplan.ir.d", "tensorplan.cli")}
    assert [(e.src, e.dst, e.line) for e in outside] == [("tensorplan.ir.c", "research.tools", 4)]
