"""The session layer's public surface: a sorted ``__all__`` that tells the truth, and no private reach-ins.

``kxen_agent.session`` re-exports the names an embedder needs; each must
be the object of the same name in the module that defines it, and public
there. Across layers (store -> session -> runtime -> cli) no module may
import a name beginning with ``_`` from the layer below: that name is free
to change with no notice.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import kxen_agent
import kxen_agent.session as session

PACKAGE_DIR = Path(kxen_agent.__file__).parent


def test_all_is_sorted_unique_and_true() -> None:
    names = session.__all__
    assert names == sorted(names) and len(names) == len(set(names))
    modules = [importlib.import_module(f"kxen_agent.session.{m.name}") for m in pkgutil.iter_modules(session.__path__)]
    for name in names:
        obj = getattr(session, name)
        homes = [m for m in modules if name in getattr(m, "__all__", ()) and getattr(m, name) is obj]
        assert homes, f"kxen_agent.session.{name} is not a public name of any session module"
    # Every session module's own __all__ names what it has.
    for m in modules:
        for name in getattr(m, "__all__", ()):
            assert hasattr(m, name), f"{m.__name__}.__all__ lists {name}, which it does not define"


def _private_imports(path: Path, lower: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(lower):
            found += [f"{path.relative_to(PACKAGE_DIR)}: from {node.module} import {a.name}"
                      for a in node.names if a.name.startswith("_")]
    return found


def test_no_layer_imports_a_private_name_of_the_session_layer_or_the_store() -> None:
    bad = []
    for layer, lower in (("session", "kxen_agent.store"), ("runtime", "kxen_agent.session"),
                         ("runtime", "kxen_agent.store"), ("cli", "kxen_agent.session")):
        for path in sorted((PACKAGE_DIR / layer).rglob("*.py")):
            bad += _private_imports(path, lower)
    assert bad == []
