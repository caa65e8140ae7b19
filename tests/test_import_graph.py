"""No import circle among kxen-agent's modules, function-level imports included.

A circle hidden by importing inside a function still ties the two modules
together: neither can be read, tested or moved without the other, and the
import order decides which half-initialised module the other sees. This
test reads every module's source (``ast``, nothing imported), takes every
``import``/``from ... import`` wherever it stands — module level, inside a
function or a class, under ``try`` — except those under ``if
TYPE_CHECKING:`` (never run), resolves each to the module of this package
it loads, and fails naming each circle found among the modules of
:data:`SCOPES`.

``SCOPES`` is the whole package: every circle is open (the ref formats
in ``store/refformat.py``, the missing-SDK error in
``runtime/providers/sdk.py``, the shared option parsers in ``cli/_args.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import kxen_agent

#: Module-name prefixes whose import graph must have no circle.
SCOPES = ["kxen_agent"]

PACKAGE_DIR = Path(kxen_agent.__file__).parent


def module_files() -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package is its ``__init__``)."""
    out = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` that can run (all but those under ``if TYPE_CHECKING:``)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for n in child.orelse:
                    walk_one(n)
                continue
            walk_one(child)

    def walk_one(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        walk(node)

    walk(tree)
    return found


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that ``name`` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    out.add(alias.name)
            continue
        if node.level:
            base = name.split(".")
            if not is_package:
                base = base[:-1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            if sub in modules:
                out.add(sub)  # a submodule imported by name
            elif target in modules:
                out.add(target)
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def in_scope(name: str) -> bool:
    return any(name == s or name.startswith(s + ".") for s in SCOPES)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_in_scope() -> None:
    graph = import_graph()
    scoped = {m: {t for t in ts if in_scope(t)} for m, ts in graph.items() if in_scope(m)}
    assert scoped, f"no module found under {SCOPES}"
    found = cycles(scoped)
    assert found == [], "import circles (function-level imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_walker_sees_function_level_imports_and_finds_a_circle(tmp_path: Path) -> None:
    # The graph builder on a made-up package: a circle closed by an import inside a function.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from .a import thing\n    return thing\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    modules = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py", "pkg.c": pkg / "c.py"}
    graph = {n: imported_modules(n, p, modules) for n, p in modules.items()}
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.a"}
    assert graph["pkg.c"] == set(), "a TYPE_CHECKING import never runs"
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
