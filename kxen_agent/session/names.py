"""Session names: a word a person gives a session, taken wherever a session id or prefix is.

A name lives in the session's metadata (``objects_spec.md`` §14.3 key
``name``, §14.16): the ``meta`` ref is the session's mutable record, so a
rename is one new metadata revision (reason ``rename``, linking to the
previous one, like a rebind) and one compare-and-swap of ``meta`` — the
old names stay readable down the ``previous`` chain, and a name travels in
bundles and pushes with the metadata, with no new ref or format an older
reader would refuse.

Names are unique in a state dir (deleted sessions, until gc removes them,
keep theirs). The check-then-write of every name (create, fork, rename,
import, pull) happens under one lock, the group lock of ``sessions/names``
(a group that never exists: its lock file only), taken before any other
group lock. A name never looks like an id (``ses_…``, ``run_…``, ``op_…``,
``msg_…``, or hex digits only), so the id-or-prefix reading of a text
always comes first and a name can never hide an id. An imported or pulled
name that another session here holds is dropped (the session arrives
without a name; :class:`NameDropped` says which), so nothing from
elsewhere can take a name this state dir uses.

This module never writes outside :func:`rename` and the callers' steps.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, NamedTuple

from kxen_agent.errors import KxenError, UsageError

if TYPE_CHECKING:
    from .sessions import SessionInfo, SessionStore

__all__ = ["LOCK_GROUP", "NAME_MAX", "NameDropped", "NameTaken", "UnknownName", "check_name", "fork_name", "holder",
           "importable", "lock", "looks_like_id", "name_of", "names", "rename"]

#: The longest name, in characters.
NAME_MAX = 100
#: Segments of letters, digits, ``.``, ``_``, ``-``, joined by ``/`` (a fork's default ``<parent>/<n>``);
#: a segment starts with a letter or digit.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9][A-Za-z0-9._-]*)*")
_ID_LIKE = re.compile(r"(?:ses|run|op|msg)_.*|[0-9a-fA-F]+", re.IGNORECASE)
#: The group whose lock serializes every name's check and write (§14.16).
LOCK_GROUP = "sessions/names"


class NameTaken(UsageError):
    """A name another session of this state dir holds."""

    def __init__(self, name: str, holder: "SessionInfo", root: str) -> None:
        deleted = holder.deleted_ns is not None
        hint = (f"session {holder.id} is deleted and keeps it until gc removes it "
                f"(or `kxen-agent session undelete {holder.id}` and rename it)" if deleted
                else f"choose another, or free it: kxen-agent session rename {holder.id} OTHER")
        super().__init__(f"session name {name!r} is taken by session {holder.id} in state dir {root}; {hint}")
        self.holder = holder.id


class UnknownName(KxenError):
    """No session of this state dir has the name."""

    def __init__(self, name: str, root: str) -> None:
        super().__init__(f"no session is named {name!r} in state dir {root}: names are local to a state dir; "
                         "`kxen-agent session list` shows each session's name")


class NameDropped(NamedTuple):
    """An imported or pulled session's name that was not kept: ``holder`` holds it here; ``kept``: the name
    the session keeps instead (its own name here, when it had one), or None."""

    ses: str
    name: str
    holder: str
    kept: str | None = None

    def line(self) -> str:
        instead = (f"it keeps its name here, {self.kept!r}" if self.kept is not None
                   else f"kept without a name (name it: kxen-agent session rename {self.ses} NAME)")
        return f"session {self.ses}: its name {self.name!r} is taken here by session {self.holder}; {instead}"


def looks_like_id(text: str) -> bool:
    """Whether ``text`` could be read as an id or id prefix (a name must not: ids are read first)."""
    return bool(_ID_LIKE.fullmatch(text))


def check_name(text: str) -> str:
    """``text`` as a session name, or a UsageError saying why it cannot be one."""
    if looks_like_id(text):
        raise UsageError(f"session name {text!r} looks like an id or an id prefix (ses_, run_, op_, msg_ "
                         "or hex digits only); choose a name with another letter in it")
    if len(text) > NAME_MAX or not _NAME_RE.fullmatch(text):
        raise UsageError(f"session name {text!r} is not a name: up to {NAME_MAX} letters, digits, '.', '_', "
                         "'-', in parts joined by '/', each part starting with a letter or digit")
    return text


def is_name(text: str) -> bool:
    try:
        check_name(text)
    except UsageError:
        return False
    return True


def name_of(meta: dict) -> str | None:
    """The session's name in its metadata (§14.3), or None."""
    name = meta.get("name")
    return name if isinstance(name, str) else None


def names(sessions: "SessionStore") -> dict[str, list["SessionInfo"]]:
    """Every name in the state dir and the sessions holding it (deleted ones included).

    More than one holder happens only when sessions came in without the lock
    (a hand-made state dir): resolution refuses such a name as ambiguous.
    """
    out: dict[str, list[SessionInfo]] = {}
    for info in sessions.list(include_deleted=True, on_damaged=lambda g, e: None):
        name = name_of(info.meta)
        if name is not None:
            out.setdefault(name, []).append(info)
    return out


def holder(sessions: "SessionStore", name: str, *, besides: str | None = None) -> "SessionInfo | None":
    """The session other than ``besides`` that holds ``name``, or None."""
    for info in names(sessions).get(name, []):
        if info.id != besides:
            return info
    return None


def find(sessions: "SessionStore", text: str, *, include_deleted: bool) -> str | None:
    """The session named ``text`` (None: no such name); several: a UsageError listing them."""
    found = [i for i in names(sessions).get(text, []) if include_deleted or i.deleted_ns is None]
    if len(found) > 1:
        raise UsageError(f"session name {text!r} names {len(found)} sessions in state dir "
                         f"{sessions.store.root}: {', '.join(i.id for i in found)}; give an id, and rename "
                         "all but one (kxen-agent session rename SES NAME)")
    return found[0].id if found else None


@contextmanager
def lock(sessions: "SessionStore") -> Iterator[None]:
    """Hold the names lock (§14.16): no other process checks or writes a name meanwhile."""
    ensure = getattr(sessions.store, "ensure_initialized", None)
    if ensure is not None:
        ensure()
    with sessions.store.refs.lock(LOCK_GROUP):
        yield


def claim(sessions: "SessionStore", name: str | None, ses: str | None = None) -> None:
    """Refuse ``name`` if it is no name or another session holds it (call under :func:`lock`)."""
    if name is None:
        return
    check_name(name)
    other = holder(sessions, name, besides=ses)
    if other is not None:
        raise NameTaken(name, other, sessions.store.root)


def fork_name(sessions: "SessionStore", parent: "SessionInfo") -> str | None:
    """A fork's default name: ``<parent's name>/<n>``, the smallest n >= 1 free; None if the parent has none
    (or the name would be too long). Call under :func:`lock`."""
    base = name_of(parent.meta)
    if base is None:
        return None
    taken = set(names(sessions))
    n = 1
    while f"{base}/{n}" in taken:
        n += 1
    name = f"{base}/{n}"
    return name if is_name(name) else None


def importable(sessions: "SessionStore", ses: str, meta: dict,
               local: str | None = None) -> tuple[str | None, NameDropped | None]:
    """The name an imported or pulled session ``ses`` with metadata ``meta`` keeps here, and what was
    dropped: a name another session here holds (or that is no name) is dropped, and the session keeps
    ``local``, its own name here if it has one. Call under :func:`lock`."""
    name = name_of(meta)
    if name is None or name == local:
        return name, None
    other = None if is_name(name) else "-"
    if other is None:
        held = holder(sessions, name, besides=ses)
        other = held.id if held is not None else None
    if other is not None:
        return local, NameDropped(ses, name, other, local)
    return name, None


def rename(sessions: "SessionStore", ses: str, name: str | None) -> "SessionInfo":
    """Give session ``ses`` the name ``name`` (None: take its name away): a new metadata revision, reason
    ``rename``, and one compare-and-swap of its ``meta`` ref. The same name again writes nothing."""
    if name is not None:
        check_name(name)
    with lock(sessions):
        info = sessions.get(ses)
        if name_of(info.meta) == name:
            return info
        claim(sessions, name, ses)
        import time

        from .schema import put

        meta = {k: v for k, v in info.meta.items() if k != "name"}
        meta.update(reason="rename", previous=info.meta_oid, revisedNs=time.time_ns())
        if name is not None:
            meta["name"] = name
        step = sessions.store.step(sessions.group(ses))
        oid = put(step, "session", meta)
        step.update("meta", info.meta_oid, oid)
        step.commit(f"session: rename {name}" if name is not None else "session: rename (no name)")
    return sessions.get(ses)
