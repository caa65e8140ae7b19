"""Who may use a state dir, and in which mode: ``objects_spec.md`` §10.4.

A state dir holds transcripts, tool output and the agent's locks: it is its
owner's alone (0700 directories, 0600 files, :mod:`.fsio`), unless it was
created in the **shared mode** (``KXEN_AGENT_SHARED=group``: 02770
directories, 0660 files), for a group of users or a server. The mode is
recorded by the state dir's own permission bits, set when it is made: a
root directory with the set-group-id bit and the group's write bit is
shared. That record is made by the same ``mkdir`` that makes the state dir
(no file to write before ``FORMAT``, none to lose after it), and every
member of the group reads it with the ``stat`` that the owner check below
needs anyway.

A state dir owned by another user is refused, as Git refuses a repository
owned by someone else: its hooks, locks and objects are theirs to change
under this process. ``KXEN_AGENT_SAFE_DIRECTORIES`` (paths separated by
``os.pathsep``; ``*`` for any) lists the ones to use anyway, as Git's
``safe.directory``; it applies to root too. This module only decides; the
:class:`~.repo.Store` raises and registers the mode with its seam.
"""

from __future__ import annotations

import os
import stat as _stat

from .fsio import PRIVATE_DIR_MODE, SHARED_DIR_MODE, FileIO

__all__ = ["SAFE_DIRECTORIES_ENV", "SHARED_ENV", "SHARED_VALUES", "AccessRefused", "check_state_dir", "root_mode",
           "wants_shared"]

SAFE_DIRECTORIES_ENV = "KXEN_AGENT_SAFE_DIRECTORIES"
SHARED_ENV = "KXEN_AGENT_SHARED"
#: The values of ``KXEN_AGENT_SHARED``: ``group`` makes a new state dir shared.
SHARED_VALUES = ("group", "private")


#: The bits that record the shared mode on the root: set-group-id and the group's rwx.
_SHARED_MARK = _stat.S_ISGID | 0o070


class AccessRefused(Exception):
    """What to say when a state dir may not be used (the store raises its own error with it)."""


def wants_shared(environ: "os._Environ[str] | dict[str, str]" = os.environ) -> bool:
    """Whether ``KXEN_AGENT_SHARED`` asks for the shared mode (an unknown value is refused)."""
    value = environ.get(SHARED_ENV, "").strip()
    if value not in ("", *SHARED_VALUES):
        raise AccessRefused(f"{SHARED_ENV}={value!r} is not 'group' or 'private'; set it to one of them or unset it")
    return value == "group"


def _listed_safe(root: str, io: FileIO) -> bool:
    entries = [e.strip() for e in os.environ.get(SAFE_DIRECTORIES_ENV, "").split(os.pathsep)]
    if "*" in entries:
        return True
    real = io.realpath(root)
    return any(e and (os.path.abspath(e) in (root, real) or io.realpath(e) == real) for e in entries)


def check_state_dir(root: str, io: FileIO) -> bool | None:
    """Check that this process may use the state dir ``root``; its mode: True shared, False private.

    None when ``root`` does not exist yet (its first write makes it, in
    the mode :func:`wants_shared` says). Raises :class:`AccessRefused` for
    a directory owned by another user that ``KXEN_AGENT_SAFE_DIRECTORIES``
    does not list, and for ``KXEN_AGENT_SHARED=group`` on a private one.
    """
    try:
        st = io.stat(root)
    except FileNotFoundError:
        return None
    except OSError:
        return None  # unreadable or not a directory: the FORMAT check says which, in its words
    if not _stat.S_ISDIR(st.st_mode):
        return None
    me = os.geteuid()
    if st.st_uid != me and not _listed_safe(root, io):
        raise AccessRefused(
            f"state dir {root} is owned by uid {st.st_uid}, not by this user (uid {me}); if you trust it, "
            f"add it to {SAFE_DIRECTORIES_ENV} (paths separated by '{os.pathsep}', '*' for any)")
    shared = st.st_mode & _SHARED_MARK == _SHARED_MARK
    if not shared and wants_shared():
        if not io.exists(os.path.join(root, "FORMAT")):
            return True  # made by hand, still empty: its first write makes it shared (settle_root)
        raise AccessRefused(
            f"state dir {root} is private (mode {_stat.S_IMODE(st.st_mode):04o}) but {SHARED_ENV}=group: the mode is "
            f"set when a state dir is made; share this one with `chgrp -R GROUP DIR && chmod -R g+rwX DIR && "
            f"find DIR -type d -exec chmod g+s {{}} +`, or unset {SHARED_ENV}")
    return shared


def root_mode(root: str, io: FileIO, *, shared: bool, creating: bool) -> int | None:
    """The mode to give the state dir's root before a write, or None when it is right (§10.4).

    ``creating`` (no ``FORMAT`` yet): the root gets exactly its mode, 0700
    or 02770 — a directory made by hand (``mkdir``, 0755) becomes the state
    dir's. Otherwise only a private root open to others is closed (a state
    dir made 0755 before §10.4: closing the root shuts every other user out
    of all of it at once); a shared one is left as its owner set it.
    """
    try:
        st = io.stat(root)
    except OSError:
        return None
    if st.st_uid != os.geteuid() or not _stat.S_ISDIR(st.st_mode):
        return None
    mode = _stat.S_IMODE(st.st_mode)
    if creating:
        want = SHARED_DIR_MODE if shared else PRIVATE_DIR_MODE
        return want if mode != want else None
    return PRIVATE_DIR_MODE if not shared and mode & 0o077 else None
