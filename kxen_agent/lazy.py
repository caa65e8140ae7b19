"""Lazy package surfaces (PEP 562): a package's public names, imported on first use.

``kxen_agent.store``, ``.session`` and ``.runtime`` name their public
surface in ``__all__`` but import the module behind a name only when the
name is first used, so that a command needing a few modules (a read
command's start-up, bench/startup.py) does not import them all. This module
imports nothing of kxen-agent and must stay that way: every layer uses it.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing's own value at run time: importing typing costs a lean start (session grep) ~5 ms
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

__all__ = ["lazy_surface"]


def lazy_surface(package: str, table: Mapping[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose names ``table`` maps to their modules (``.x``).

    A name is imported from its module the first time it is asked for, then
    kept in ``namespace`` (the package's globals), so it costs once.
    """

    def getattr_(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(table))

    return getattr_, dir_
