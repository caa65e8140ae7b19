"""The tool set an agent definition can name, and its specs for the model.

This module owns :data:`TOOLS` (name -> the one instance of each tool) and
:func:`tool_specs`, the OpenAI function-calling specs of a chosen subset. It
sits above :mod:`.protocol`, :mod:`.files`, :mod:`.search` and :mod:`.shell` because it
holds an instance of each (in :mod:`.protocol` it would be an import cycle).

It must never run a tool nor change the set at run time: the tools a run may
call are fixed by the agent definition before the run starts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kxen_agent.errors import UsageError

from .files import EditFile, ListFiles, ReadFile, WriteFile
from .protocol import Tool
from .search import Search
from .shell import Shell

__all__ = ["TOOLS", "tool_specs"]

TOOLS: dict[str, Tool] = {t.name: t for t in (Shell(), ReadFile(), WriteFile(), EditFile(), ListFiles(), Search())}


def tool_specs(names: Iterable[str]) -> list[dict[str, Any]]:
    """The OpenAI function-calling specs of the named tools, in the given order.

    Raises :class:`~kxen_agent.errors.UsageError` for a name not in :data:`TOOLS`.
    """
    specs: list[dict[str, Any]] = []
    for name in names:
        tool = TOOLS.get(name)
        if tool is None:
            known = ", ".join(sorted(TOOLS))
            raise UsageError(f"unknown tool '{name}'; known tools: {known}")
        specs.append(
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                },
            }
        )
    return specs
