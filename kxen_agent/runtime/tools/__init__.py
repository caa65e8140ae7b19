"""The tools an agent run executes in a workspace.

The tool set is ``shell``, ``read_file``, ``write_file``, ``edit_file``,
``list_files`` and ``search``; the package is split by concept:

- :mod:`.protocol`: the contract every tool meets (:class:`Tool`,
  :class:`ToolContext`, :class:`ToolOutcome`, :class:`ToolOutcomeUnknown`)
  and the checking of a call's arguments (what is secret, and how it is
  redacted, is :mod:`kxen_agent.runtime.redaction`'s);
- :mod:`.files`: the file tools and the confinement of their paths to the
  workspace;
- :mod:`.search`: the ``search`` tool (content search, read-only, confined
  and bounded like the file tools);
- :mod:`.shell`: the ``shell`` tool and the supervision of its process group
  (timeout, output cap, cancellation window, SIGTERM/SIGKILL escalation, an
  environment without the secrets);
- :mod:`.registry`: :data:`TOOLS` and :func:`tool_specs`.

No tool journals, retries or decides what a run does next: a tool reports
one :class:`ToolOutcome` (or raises :class:`ToolOutcomeUnknown`) and the
runtime decides. Bad arguments and refused paths are outcomes the model can
read and correct, never exceptions. Each module's docstring states its
limitations.
"""

from __future__ import annotations

from .protocol import Tool, ToolContext, ToolOutcome, ToolOutcomeUnknown
from .registry import TOOLS, tool_specs

__all__ = [
    "TOOLS",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolOutcomeUnknown",
    "tool_specs",
]
