"""The store's public surface: ``kxen_agent.store.__all__`` and each module's own.

As httpx tests its ``__all__``: the package's list is sorted, complete (every
public name a module of the store offers the layers above through the
package is in it) and true (every name in it exists); each module's list
names only what exists; and the layers above import from the store only
names a module lists as public (issue #12: no upper layer imports a private
name of a lower one).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import kxen_agent
import kxen_agent.store as store_pkg

#: The store's modules whose ``__all__`` this suite holds to (pack and bundle keep their own lists).
MODULES = ("codec", "fsck", "fsio", "gc", "locks", "loose", "objects", "refs", "repo")


def test_the_package_all_is_sorted_unique_and_true() -> None:
    names = store_pkg.__all__
    assert names == sorted(names)
    assert len(set(names)) == len(names)
    assert [n for n in names if n.startswith("_")] == []
    assert [n for n in names if not hasattr(store_pkg, n)] == []


def test_the_package_all_holds_the_surface_the_layers_above_use() -> None:
    # What the session, runtime and CLI layers use, and the lock and seam
    # classes an embedding program needs: each must stay importable from the package.
    for name in ("Store", "StoreLock", "store_lock", "FileLock", "lock_for", "file_lock", "LockBusy", "FileIO",
                 "OS_IO", "TracingIO", "FaultyIO", "IOFaultSpecError", "RefUpdate", "CorruptObject",
                 "MissingObject", "AmbiguousId", "decode_body", "fsck", "gc", "export_bundle", "import_bundle",
                 "verify_bundle"):
        assert name in store_pkg.__all__, name


def test_every_public_name_the_package_imports_is_in_all() -> None:
    src = ast.parse(Path(store_pkg.__file__).read_text())
    imported = {a.asname or a.name for n in src.body if isinstance(n, ast.ImportFrom) for a in n.names}
    assert sorted(imported - set(store_pkg.__all__)) == []


@pytest.mark.parametrize("name", MODULES)
def test_each_modules_all_is_sorted_and_names_what_exists(name: str) -> None:
    mod = importlib.import_module(f"kxen_agent.store.{name}")
    names = mod.__all__
    assert list(names) == sorted(names)
    assert [n for n in names if not hasattr(mod, n)] == []
    assert [n for n in names if n.startswith("_")] == []


def test_store_lock_moved_to_locks_and_is_still_importable_from_repo() -> None:
    from kxen_agent.store import locks, repo

    assert repo.StoreLock is locks.StoreLock and repo.store_lock is locks.store_lock
    assert locks.StoreLock.__module__ == "kxen_agent.store.locks"


def test_the_two_fault_spec_errors_have_distinct_names() -> None:
    from kxen_agent.runtime.faults import FaultSpecError
    from kxen_agent.store.fsio import IOFaultSpecError

    assert FaultSpecError is not IOFaultSpecError
    assert not hasattr(importlib.import_module("kxen_agent.store.fsio"), "FaultSpecError")


def _upper_layer_imports() -> list[tuple[str, str, str]]:
    root = Path(kxen_agent.__file__).parent
    out = []
    for info in pkgutil.walk_packages([str(root)], prefix="kxen_agent."):
        if info.name.startswith("kxen_agent.store"):
            continue
        path = importlib.util.find_spec(info.name).origin
        if path is None or not path.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kxen_agent.store"):
                out += [(info.name, node.module, a.name) for a in node.names]
    return out


def test_the_layers_above_import_only_public_names_of_the_store() -> None:
    found = _upper_layer_imports()
    assert found, "the layers above import nothing from the store?"
    bad = []
    for where, module, name in found:
        mod = importlib.import_module(module)
        is_submodule = hasattr(mod, "__path__") and importlib.util.find_spec(f"{module}.{name}") is not None
        if name.startswith("_") or not (is_submodule or name in getattr(mod, "__all__", ())):
            bad.append(f"{where}: from {module} import {name}")
    assert bad == []
