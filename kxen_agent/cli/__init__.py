"""The ``kxen-agent`` command line: parse, call the library, render.

Top layer of kxen-agent: Typer commands (:mod:`.main` with the root, ``fsck``
and ``cat-object``; :mod:`.run_cmds`, :mod:`.session_cmds`,
:mod:`.store_cmds`, :mod:`.demo`) over :mod:`kxen_agent.runtime`,
:mod:`kxen_agent.session` and :mod:`kxen_agent.store`. No command decides
anything about state; each renders the library's answer as text or ``--json``
and maps every :class:`~kxen_agent.errors.KxenError` to one line on stderr
and its exit code. :func:`entry` is the console script.
"""

from __future__ import annotations

from .main import entry

__all__ = ["entry"]
