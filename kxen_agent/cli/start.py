"""The console script ``kxen-agent``: a ``session grep`` command line is run before typer is imported.

Importing typer, the root command and a command group costs more than a
search through the index does (bench/grep.py); :func:`.grep_lean.main`
takes the ``session grep`` command lines it reads exactly as click would,
and every other command line goes to :func:`.main.main`, the typer app.
This module imports nothing else, so that choice costs nothing.
"""

from __future__ import annotations

import sys

__all__ = ["entry", "run"]


def run(args: list[str]) -> int:
    """The exit code of ``kxen-agent ARGS``."""
    if args[:2] == ["session", "grep"]:
        from .grep_lean import main as lean

        code = lean(args)
        if code is not None:
            return code
    from .main import main

    return main(args)


def entry() -> None:  # pragma: no cover - console script shim
    sys.exit(run(sys.argv[1:]))
