"""Session ids as people type them: a unique prefix, a typo of one, or an id from another state dir.

Moved out of :mod:`.sessions` (which re-exports every name here) so that the
session store stays under the house's 900-line bound: these are pure
functions of text and a list of ids, no store.
"""

from __future__ import annotations

import re
from typing import Callable

from kxen_agent.errors import KxenError, UsageError

__all__ = ["AmbiguousPrefix", "MIN_PREFIX", "SessionError", "UnknownSession", "is_id_or_prefix", "near_id",
           "resolve_prefix"]


class UnknownSession(KxenError):
    """A session id is not in this state dir: a typo (``near``: the one id here it is a character or two
    from), a prefix nothing begins with, or a whole id from another state dir."""

    def __init__(self, ses: str, state_dir: str, near: str | None = None) -> None:
        if near is not None:
            said = (f"session {ses} is not in state dir {state_dir}; did you mean {near}? "
                    "(`kxen-agent session list` shows the ids)")
        elif len(ses) < _FULL_ID_LEN:
            said = (f"no session in state dir {state_dir} begins with {ses}; `kxen-agent session list` shows "
                    "the ids")
        else:
            said = (f"session {ses} is not in state dir {state_dir}: session ids are local to the state dir "
                    "that created them (set KXEN_AGENT_STATE_DIR to it), or bring the session here with "
                    "`kxen-agent session import BUNDLE --workspace DIR`")
        super().__init__(said)


#: The length of a session id kxen-agent makes (``ses_`` and 20 hex digits): anything shorter is a prefix.
_FULL_ID_LEN = 24


def near_id(text: str, ids: list[str]) -> str | None:
    """The one id of ``ids`` whose beginning ``text`` is a typo of (one character off, two for a whole id:
    changed, missing or extra), or None when none or several are."""
    most = 2 if len(text) >= _FULL_ID_LEN else 1
    found = {i for i in ids for n in (len(text) - 1, len(text), len(text) + 1)
             if n > 4 and _edits(text, i[:n], most) <= most}
    return found.pop() if len(found) == 1 else None


def _edits(a: str, b: str, most: int) -> int:
    """The edit distance of ``a`` and ``b`` (insertions, deletions, changes), or ``most + 1`` past ``most``."""
    if abs(len(a) - len(b)) > most:
        return most + 1
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
        if min(row) > most:
            return most + 1
    return row[-1]


class SessionError(KxenError):
    """A session operation cannot be done as asked."""


class AmbiguousPrefix(UsageError):
    """An id prefix (``ses_``, ``run_``, ``op_``) names more than one thing; ``candidates`` are their ids."""

    def __init__(self, what: str, prefix: str, candidates: list[str], where: str) -> None:
        shown = ", ".join(candidates[:10]) + (f" and {len(candidates) - 10} more" if len(candidates) > 10 else "")
        super().__init__(f"{what} id prefix {prefix} is ambiguous {where}: it matches {shown}; give more characters")
        self.candidates = candidates


#: The shortest id prefix accepted after the ``ses_``/``run_``/``op_`` tag, as Git's shortest abbreviation.
MIN_PREFIX = 4
_PREFIX_RE = {tag: re.compile(rf"{tag}_[0-9a-z]{{{MIN_PREFIX},40}}") for tag in ("ses", "run", "op")}


def resolve_prefix(what: str, tag: str, text: str, ids: Callable[[], list[str]], where: str) -> str | None:
    """The one id among ``ids()`` that ``text`` names (the id itself, or a unique prefix of it).

    ``None`` when none matches (the caller says "not found" in its words);
    :class:`AmbiguousPrefix` when several do; a text that is no ``tag_``
    prefix of at least :data:`MIN_PREFIX` characters is a UsageError.
    """
    text = text.strip()
    if not _PREFIX_RE[tag].fullmatch(text):
        raise UsageError(f"{text!r} is not a {what} id (expected {tag}_ followed by at least {MIN_PREFIX} "
                         "letters and digits: an id or a unique prefix of one)")
    known = ids()
    if text in known:
        return text
    found = sorted(i for i in known if i.startswith(text))
    if len(found) > 1:
        raise AmbiguousPrefix(what, text, found, where)
    return found[0] if found else None




def is_id_or_prefix(tag: str, text: str) -> bool:
    """Whether ``text`` has the shape of a ``tag_`` id or of a prefix :func:`resolve_prefix` takes."""
    return bool(_PREFIX_RE[tag].fullmatch(text.strip()))
