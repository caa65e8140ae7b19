"""A session push that asks the remote to advertise only the refs it needs.

``git push`` speaks protocol v0 (Git has no v2 push): the remote's
``receive-pack`` first sends every ref it has. A remote holding 10,000
sessions sends 10,100 ref lines (about 0.8 MB) to a push that names one,
and the client reads and looks up each. ``receive.hideRefs`` on the
remote's side cuts that list: a push of sessions runs the remote's
receive-pack as ::

    git -c receive.hideRefs=refs/kxen -c 'receive.hideRefs=!refs/kxen/sessions/<ses>' ... \
        -c 'core.alternateRefsPrefixes=refs/kxen/sessions/<ses> ...' receive-pack

hiding every ``refs/kxen/`` ref except the ones it updates and the ones
whose history it builds on (a fork's nearest pushed ancestor,
:meth:`.gitio.Workbench.builds_on`): Git's own negotiation still finds what
the remote lacks from exactly the refs it found it from before (the
pushed ref's old value and the fork base), so no more bytes travel. Git
refuses a push to a hidden ref; the negated entries (the later entry
wins) un-hide the refs pushed, so the compare-and-swap of
``--force-with-lease`` and ``--atomic`` work as before, against the
values the remote advertises for them. The remote's connectivity check
then starts from the visible refs alone (Git 2.39 and later exclude
hidden refs from it) and, through ``core.alternateRefsPrefixes``, no
longer lists and reads every ref as an "alternate ref" of its quarantine
(:func:`receive_pack_command`). Refs outside ``refs/kxen/`` (the
code branches a ``--with-branch`` push builds on) stay advertised, and a
push of anything under ``refs/kxen/`` other than session and lease refs
(``--with-checkpoints``) is not narrowed.

**Where.** Git runs the ``--receive-pack`` command through a shell: on
this machine for a path or ``file://`` remote, on the remote machine for
``ssh`` (the command is the one argument ``ssh`` passes). Every word is
quoted for ``sh`` (:func:`shlex.quote`; ref names are the only variable
part). ``git://`` (the daemon takes the service name, not a command) and
smart HTTP(S) (the server picks its program) push as before. A hosted
service (GitHub, GitLab, gitolite, ``git-shell``) runs nothing but its
own ``git-receive-pack``: it refuses the command and closes the
connection before it says anything. Git then reports that it could not
read from the remote (:func:`never_spoke`): nothing was sent, so the same
push is made again at once with the plain ``receive-pack``; when that one
reaches the remote, the refusal is remembered for this remote (an empty
file ``<state dir>/git/kxen-plain-push/<remote key>``, a cache: deleting
it costs one refused attempt) and later pushes there go plain directly.
Nothing else is remembered, and nothing read from a workspace's
configuration ever becomes part of the command. A remote whose URL
cannot be classified pushes plainly; ``KXEN_AGENT_NARROW_PUSH=0`` makes
every push plain, ``KXEN_AGENT_NARROW_PUSH=local`` narrows only pushes to
a path or ``file://``.

It decides the command and when to fall back; :mod:`.gitio` runs ``git``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Sequence

__all__ = [
    "ENV",
    "HIDDEN",
    "MAX_SHOWN",
    "PLAIN_DIR",
    "never_spoke",
    "receive_pack_command",
    "refs_to_show",
    "remember_plain",
    "remembered_plain",
    "transport_of",
    "transports",
]

#: ``0`` (or ``off``, ``no``, ``false``): every push asks for the remote's full advertisement; ``local``: only
#: pushes to a path or ``file://`` are narrowed (an ssh server then never sees the command).
ENV = "KXEN_AGENT_NARROW_PUSH"
#: What a narrowed push hides on the remote (the negated entries un-hide the refs it needs).
HIDDEN = "refs/kxen"
#: The only refs under :data:`HIDDEN` a narrowed push may update: session and lease refs.
_NARROWED = ("refs/kxen/sessions/", "refs/kxen/leases/")
#: Past this many refs to show, the command line would outgrow what it saves: push plainly.
MAX_SHOWN = 256
#: In the mirror: one empty file per remote key whose server refused the narrowed command.
PLAIN_DIR = "kxen-plain-push"
# Git's words when the connection ended before the remote sent its first line (connect.c, die_initial_contact).
# A server that prints its refusal on the channel Git reads (not on stderr) makes Git see a bad first line.
_NEVER_SPOKE = ("Could not read from remote repository", "the remote end hung up upon initial contact",
                "protocol error: bad line length character")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_HELPER = re.compile(r"[A-Za-z0-9][A-Za-z0-9+.-]*::")


def transports() -> frozenset[str]:
    """The transports a push is narrowed over (:data:`ENV`: ``0`` none, ``local`` paths alone, else local and ssh)."""
    value = os.environ.get(ENV, "1").strip().lower()
    if value in ("0", "off", "no", "false"):
        return frozenset()
    return frozenset({"local"}) if value == "local" else frozenset({"local", "ssh"})


def transport_of(url: str) -> str:
    """How Git reaches ``url``: ``local`` (a path, ``file://``), ``ssh``, or ``other`` (git://, HTTP, a helper).

    Git's rule (``connect.c``): a scheme names the transport; without one,
    a ``:`` before the first ``/`` makes it scp-like ssh (``host:path``),
    anything else is a local path.
    """
    if _HELPER.match(url):
        return "other"
    m = _SCHEME.match(url)
    if m is not None:
        scheme = m.group(1).lower()
        if scheme == "file":
            return "local"
        return "ssh" if scheme in ("ssh", "git+ssh", "ssh+git") else "other"
    if not url or "\n" in url:
        return "other"
    return "ssh" if ":" in url.split("/", 1)[0] else "local"


def refs_to_show(updated: Sequence[str], shared: Iterable[str]) -> list[str] | None:
    """The refs under :data:`HIDDEN` the remote must still advertise; None when this push is not narrowed."""
    prefix = HIDDEN + "/"
    if any(r.startswith(prefix) and not r.startswith(_NARROWED) for r in updated):
        return None  # a checkpoint ref may build on what only other sessions' checkpoint refs reach
    shown = sorted({r for r in (*updated, *shared) if r.startswith(prefix)})
    if len(shown) > MAX_SHOWN or any(not r.isprintable() or " " in r for r in shown):
        return None
    return shown


def receive_pack_command(shown: Sequence[str]) -> str:
    """The ``--receive-pack`` command (one shell line) that hides :data:`HIDDEN` but ``shown``.

    ``core.alternateRefsPrefixes``: the remote's connectivity check
    (``rev-list --not --exclude-hidden=receive --all --alternate-refs``,
    run inside the push's quarantine, whose alternate is the repository
    itself) lists the repository's refs once more as "alternate refs", by
    a ``for-each-ref`` of every ref, hidden or not, and reads each one's
    commit: at 10,000 sessions most of what a push cost the remote. Limited
    to ``shown``, the check's starting points are the refs it had anyway;
    fewer starting points only make it walk further, never pass what it
    should refuse.
    """
    words = ["git", "-c", f"receive.hideRefs={HIDDEN}"]
    for ref in shown:
        words += ["-c", f"receive.hideRefs=!{ref}"]
    words += ["-c", "core.alternateRefsPrefixes=" + " ".join(shown), "receive-pack"]
    return " ".join(shlex.quote(w) for w in words)


def never_spoke(stderr: bytes) -> bool:
    """Whether a failed push ended before the remote said anything: its program never ran, nothing was sent."""
    text = " ".join(stderr.decode("utf-8", "replace").split())
    return any(words in text for words in _NEVER_SPOKE)


def _memory(mirror_path: str, key: str) -> str:
    return os.path.join(mirror_path, PLAIN_DIR, key)


def remembered_plain(mirror_path: str | None, key: str) -> bool:
    """Whether the remote ``key`` refused a narrowed push before (its server runs only ``git-receive-pack``)."""
    return mirror_path is not None and os.path.exists(_memory(mirror_path, key))


def remember_plain(mirror_path: str | None, key: str) -> None:
    """Record that the remote ``key`` refused the narrowed command and took the plain one (a cache: no fsync)."""
    if mirror_path is None or not os.path.isdir(mirror_path):
        return
    from kxen_agent.store import OS_IO
    from kxen_agent.store.fsio import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, SHARED_DIR_MODE, SHARED_FILE_MODE

    shared = OS_IO.is_shared(mirror_path)  # the state dir's modes (objects_spec.md §10.4)
    os.makedirs(os.path.join(mirror_path, PLAIN_DIR), mode=SHARED_DIR_MODE if shared else PRIVATE_DIR_MODE,
                exist_ok=True)
    try:
        os.close(os.open(_memory(mirror_path, key), os.O_CREAT | os.O_EXCL | os.O_WRONLY,
                         SHARED_FILE_MODE if shared else PRIVATE_FILE_MODE))
    except FileExistsError:
        pass
