"""asrtrain's imports: no module imports itself back through others, and none imports a module of a
higher layer. The layers are the list under "Layers" in docs/architecture.md, read from there.

Every import counts, at the top of a module or inside a function (a lazy import still ties the
two modules), except those under ``if TYPE_CHECKING:``: annotations only, never executed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "asrtrain"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(path: Path, modules: set[str]) -> dict[str, int]:
    """The package's modules that ``path`` imports, each with the line of its first import."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    out: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target and target not in modules:   # asrtrain.x.y.Name -> asrtrain.x.y
            target = target.rpartition(".")[0]
        if target and target != name:
            out.setdefault(target, line)

    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                add(f"{base}.{alias.name}", node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("__import__", "import_module") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            add(node.args[0].value, node.lineno)
    return {m: line for m, line in out.items() if m.startswith("asrtrain")}


def import_graph() -> tuple[dict[str, Path], dict[str, dict[str, int]]]:
    files = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    return files, {m: imports_of(p, set(files)) for m, p in files.items()}


def read_layers() -> list[tuple[str, list[str]]]:
    """The ``layers`` block of docs/architecture.md: ``name: module-or-package ...`` per line,
    lowest first."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = re.search(r"^```layers\n(.*?)^```", text, re.S | re.M)
    assert block, "docs/architecture.md has no ```layers block"
    layers = []
    for line in block.group(1).splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, members = line.partition(":")
            layers.append((name.strip(), members.split()))
    return layers


def layer_of(module: str, layers: list[tuple[str, list[str]]]) -> int | None:
    """The layer that lists ``module`` (``asrtrain.fileio``) or a package above it
    (``asrtrain.align.*``: the package and everything in it); the longest entry wins."""
    best, found = -1, None
    for i, (_, members) in enumerate(layers):
        for m in members:
            package = m[:-2] if m.endswith(".*") else None
            hit = module == m if package is None else (
                module == package or module.startswith(package + "."))
            if hit and len(m) > best:
                best, found = len(m), i
    return found


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_back() -> None:
    files, graph = import_graph()
    found = cycles(graph)
    lines = []
    for comp in found:
        for m in comp:
            lines += [f"{files[m].relative_to(REPO)}:{line} imports {t}"
                      for t, line in graph[m].items() if t in comp]
    assert not found, "import cycles:\n" + "\n".join(lines)


def test_every_module_has_a_layer_and_imports_none_above_it() -> None:
    layers = read_layers()
    files, graph = import_graph()
    unplaced = [m for m in files if layer_of(m, layers) is None]
    assert not unplaced, f"modules in no layer of docs/architecture.md: {unplaced}"
    upward = []
    for m, targets in sorted(graph.items()):
        mine = layer_of(m, layers)
        for t, line in targets.items():
            theirs = layer_of(t, layers)
            if theirs > mine:
                upward.append(f"{files[m].relative_to(REPO)}:{line}: {m} ({layers[mine][0]}) "
                              f"imports {t} ({layers[theirs][0]})")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_the_walk_sees_lazy_imports_and_skips_annotations(tmp_path: Path) -> None:
    """The checks above can fail: an import inside a function counts, ``TYPE_CHECKING`` ones do
    not, and a cycle and an upward import are found."""
    pkg = tmp_path / "asrtrain"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from asrtrain.high import H\n"
                                "def f():\n    from asrtrain import high\n")
    (pkg / "high.py").write_text("from asrtrain.low import f\nclass H: ...\n")
    global REPO, PACKAGE
    saved = REPO, PACKAGE
    REPO, PACKAGE = tmp_path, pkg
    try:
        files, graph = import_graph()
    finally:
        REPO, PACKAGE = saved
    assert graph["asrtrain.low"] == {"asrtrain.high": 5}
    assert graph["asrtrain.high"] == {"asrtrain.low": 1}
    assert cycles(graph) == [["asrtrain.high", "asrtrain.low"]]
    layers = [("base", ["asrtrain", "asrtrain.low"]), ("top", ["asrtrain.high.*"])]
    assert layer_of("asrtrain.low", layers) == 0 and layer_of("asrtrain.high", layers) == 1
    assert layer_of("asrtrain.high.x", layers) == 1 and layer_of("asrtrain.other", layers) is None
