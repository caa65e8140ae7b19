"""The one base class of every error a user can meet.

Each layer defines its errors next to the code that raises them and derives
them from :class:`KxenError`, so the CLI can render any of them as one line
and map it to an exit code without knowing the layer.
"""

from __future__ import annotations


class KxenError(Exception):
    """An error with a message fit for one line on stderr.

    ``exit_code`` is what the CLI exits with (1 unless a subclass says
    otherwise); see the exit-code table in docs/commands.md.
    """

    exit_code: int = 1

    def __str__(self) -> str:  # one line, always
        return " ".join(super().__str__().split("\n"))


class UsageError(KxenError):
    """The command line or an input file asked for something invalid."""

    exit_code = 2
