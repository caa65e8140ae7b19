"""The ``kxen-agent`` command line: parse, call the library, render.

Top layer of kxen-agent, over :mod:`kxen_agent.runtime`,
:mod:`kxen_agent.session` and :mod:`kxen_agent.store`. No command decides
anything about state; each renders the library's answer as text or
``--json`` and maps every :class:`~kxen_agent.errors.KxenError` to one line
on stderr and its exit code. :func:`entry` is the console script.

Modules, one line each:

- :mod:`.start` — the console script: ``session grep`` without typer (:mod:`.grep_lean`), the rest to :mod:`.main`;
- :mod:`.main` — the root command, the command groups (loaded on first
  use), each error mapped to one line and its exit code, :func:`entry`;
- :mod:`.run_cmds` — ``kxen-agent run``, ``--resume`` and ``run show/resolve``;
- :mod:`.chat` — ``kxen-agent chat`` (and ``kxen-agent`` alone at a terminal):
  the interactive session and its slash commands;
- :mod:`.session_cmds` — ``session list, show, log, compact, tree, fork,
  delete, undelete, export, import``;
- :mod:`.remote_cmds` — ``session push``, ``pull`` and ``ls-remote``;
- :mod:`.names_cmds` — ``session rename``: a session's name, taken wherever its id is;
- :mod:`.tree_view` — ``session tree`` drawn as ``git log --graph`` draws branches;
- :mod:`.grep_cmds` — ``session grep``: full-text search over every session's messages;
- :mod:`.grep_lean` — ``session grep``'s work, and its command line read without typer;
- :mod:`.which_cmds` — ``session which COMMIT``: the tool call that made a Git commit;
- :mod:`.share_cmds` — ``session import --trust``: a bundle signed by an allowed signer, accepted in one step;
- :mod:`.checkpoint_cmds` — ``session diff`` and the checkpoint lines of ``session show`` and ``run show``;
- :mod:`.rewind_cmds` — ``session rewind``: the workspace and/or the conversation back to a message;
- :mod:`.checkpoint_travel_cmds` — ``--with-checkpoints``/``--restore-workspace`` of export, import, push, pull;
- :mod:`.store_cmds` — ``fsck``, ``gc``, ``cat-object`` and ``bundle verify``;
- :mod:`.repair_cmds` — ``kxen-agent repair`` (dry run, ``--apply``, ``--from``, ``--remote``);
- :mod:`.demo` — ``kxen-agent demo``, the README's main job, offline;
- :mod:`.secret_scan` — the look for credentials in what leaves the machine;
- :mod:`._args` — option parsers the command modules share (``--workspace``);
- :mod:`._ids` — ids as users type them (full ids or unique prefixes);
- :mod:`._live` — what a run shows while it works (live output, ``--events``);
- :mod:`._errors` — one line for an OSError: what failed, where, what next (a read-only state dir named);
- :mod:`._prompt` — the interactive session's prompt history file and Esc watcher;
- :mod:`._ready` — the default agent, and its provider's SDK and key checked before anything is written;
- :mod:`._render` — JSON, one-line errors, terminal-safe text, progress.
"""

from __future__ import annotations

from .start import entry  # imports neither typer nor the commands until a command line is read

__all__ = ["entry"]
