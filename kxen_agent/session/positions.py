"""Message positions: a session's history as message ids by position, so that finding a message in it costs
one lookup instead of a walk back from the head.

``session fork --at MSG`` must know that MSG is in *this* session's
history (forks share objects): walking back from the head to MSG's depth
costs a read per message in between, O(history). This derived cache
(``objects_spec.md`` §11a.1, kind :data:`POSITIONS`,
``cache/positions/sessions/<ses>``) holds the line ``kxen-positions 1``
then one 32-byte message id per position: the i-th is the history's
message of ``seq`` i. A lookup reads the file's size, the entry at MSG's
``seq``, and the entry the head's history is joined to.

How it is trusted: a message id is its content's hash and names its
parent, so the entry at position k being the head's ancestor of ``seq`` k
(found by walking back from the head over the messages added since the
file was last brought up to date) makes every entry before it the head's
history too — as long as the entries before k are right, which holds for
every file its writers make (below). A file that does not join (a rewind,
another history, damage) is written anew from a walk; a negative answer is
checked by the walk all the same, so a damaged entry can cost time, never
a wrong refusal. Never needed: delete it and the next lookup walks.

Who writes it: the run loop, beside its history index after a run, and
after a run whose view was cut (no index then; :func:`sync`, from the ids
it holds: no message read), so the next run's walk takes the ids older
than the view's bound from here (:func:`prefix`) instead of reading them, and the lookup
itself, after it walked (the whole history once; then only what was added
since, O(added)), appending the new entries when the file ends where the
walk joined it, else writing it anew (temp file and rename). Never fsynced. Two lookups appending at once both append the same
entries after the same end: the second copy lies at positions whose message
has another ``seq``, so the next lookup's join fails there and it writes the
file anew — an entry at a position is never wrong unless every later one is.

Every file call goes through the store's ``FileIO``.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from kxen_agent.errors import KxenError
from kxen_agent.store.caches import CacheKind, replace_cache_file

__all__ = ["MAGIC", "POSITIONS", "ID_SIZE", "find", "prefix", "sync", "verify_positions"]

#: The file's first bytes (§11a.1).
MAGIC = b"kxen-positions 1\n"
ID_SIZE = 32

NS = "sessions"


def _verify_store(store: Any) -> tuple[list[tuple[str, str]], list[str]]:
    return verify_positions(store)


#: Message positions as a kind of derived cache of the store (§11a.1): removed with the session's group,
#: checked by fsck (a store given it: ``Store(root, caches=...)``, as the CLI's fsck does).
POSITIONS = CacheKind("positions", verify=_verify_store, problem="positions-cache", title="message positions")


def _path(store: Any, group: str) -> str | None:
    caches = getattr(store, "caches", None)
    if caches is None or getattr(store, "io", None) is None:
        return None  # a store without files (the memory store): lookups walk
    return caches.path(POSITIONS, group)


def _message(store: Any, oid: bytes) -> dict:
    from .schema import read

    return read(store, oid, "message")


def _read_entry(f: Any, i: int) -> bytes:
    f.seek(len(MAGIC) + ID_SIZE * i)
    return f.read(ID_SIZE)


def find(store: Any, group: str, head: bytes | None, oid: bytes, seq: int) -> bool | None:
    """Whether message ``oid`` (of ``seq``) is in the history ending at ``head``, from the positions file,
    brought up to date on the way; None when this store keeps no files (the caller walks).

    Cost: the messages added since the file was last brought up to date are
    read (none on a second lookup), then one entry. A False is never given
    from the file alone (a damaged entry): the caller's walk confirms it.
    """
    path = _path(store, group)
    if path is None or head is None:
        return None
    io = store.io
    head_seq = _message(store, head)["seq"]
    if seq > head_seq:
        return False
    if head == oid:
        return True
    n = 0
    try:
        f = io.open_read(path)
    except OSError:
        f = None
    if f is not None:
        with f:
            size = io.fstat(f).st_size
            if size >= len(MAGIC) and f.read(len(MAGIC)) == MAGIC:
                n = (size - len(MAGIC)) // ID_SIZE
            k = min(n, head_seq + 1) - 1
            if k >= 0:
                # Walk back from the head to position k: the messages after it, newest first.
                gap: list[bytes] = []
                cur: bytes | None = head
                joined = False
                while cur is not None:
                    v = _message(store, cur)
                    if v["seq"] == k:
                        joined = _read_entry(f, k) == cur
                        break
                    gap.append(cur)
                    cur = v.get("parent")
                if joined:
                    if gap and n == k + 1:
                        _append(io, path, reversed(gap), size)
                    if seq <= k:
                        return _read_entry(f, seq) == oid or None  # None: not here, the caller's walk decides
                    return oid in gap
    # No file, or one that does not join the head: written anew from the whole history.
    ids = _walk(store, head)
    _write(io, path, ids)
    return seq < len(ids) and ids[seq] == oid


def prefix(io: Any, path: str, k: int, last: bytes) -> list[bytes] | None:
    """The ids at positions 0..``k`` (oldest first) when the file's entry at ``k`` is ``last``, else None
    (no file, a short or damaged one, another history).

    The join is the same trust as :func:`find`'s: ``last`` is a message the caller read (the parent of
    one it read), so the entry at ``k`` being it makes every entry before it that history too, for every
    file its writers make. One read of ``32 * (k + 1)`` bytes; no message read.
    """
    if k < 0:
        return None
    try:
        f = io.open_read(path)
    except OSError:
        return None
    with f:
        size = io.fstat(f).st_size
        if size < len(MAGIC) + ID_SIZE * (k + 1) or f.read(len(MAGIC)) != MAGIC:
            return None
        data = f.read(ID_SIZE * (k + 1))
    if len(data) != ID_SIZE * (k + 1) or data[-ID_SIZE:] != last:
        return None
    return [data[i:i + ID_SIZE] for i in range(0, len(data), ID_SIZE)]


def sync(io: Any, path: str, ids: Sequence[bytes]) -> None:
    """Make the file at ``path`` hold ``ids`` (a whole history from ``seq`` 0, as the run loop holds it
    after a run): append what it lacks when its last entry is ``ids``' at that position, else write it
    anew; nothing when it holds them already. So the first lookup after a run reads no message. No
    fsync; an error leaves the file to the next lookup."""
    try:
        f = io.open_read(path)
    except OSError:
        _write(io, path, list(ids))
        return
    with f:
        size = io.fstat(f).st_size
        n = -1  # -1: written anew
        if size >= len(MAGIC) and f.read(len(MAGIC)) == MAGIC and (size - len(MAGIC)) % ID_SIZE == 0:
            n = (size - len(MAGIC)) // ID_SIZE
            if n > len(ids) or (n and _read_entry(f, n - 1) != ids[n - 1]):
                n = -1
    if n == len(ids):
        return
    if n >= 0:
        _append(io, path, ids[n:], size)
    else:
        _write(io, path, list(ids))


def _walk(store: Any, head: bytes) -> list[bytes]:
    out: list[bytes] = []
    cur: bytes | None = head
    while cur is not None:
        out.append(cur)
        cur = _message(store, cur).get("parent")
    out.reverse()
    return out


def _append(io: Any, path: str, ids: Iterable[bytes], size: int) -> None:
    data = b"".join(ids)
    extra = (size - len(MAGIC)) % ID_SIZE
    if extra:
        return  # a torn append ends the file: the next full write replaces it
    try:
        io.append(path, data, sync=False)
    except OSError:
        pass  # a cache: the next lookup walks again


def _write(io: Any, path: str, ids: list[bytes]) -> None:
    try:
        replace_cache_file(io, path, MAGIC + b"".join(ids))
    except OSError:
        pass  # a full disk, a read-only state dir: lookups walk


def verify_positions(store: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """fsck's hook: every positions file against the objects. A problem is an entry that is not the
    message of its position's ``seq`` whose parent is the entry before (a lookup would trust it); a note,
    what is normal for a cache (a torn tail, a file whose messages gc pruned after a rewind)."""
    from kxen_agent.store import MissingObject

    problems: list[tuple[str, str]] = []
    notes: list[str] = []
    for path in store.caches.files(POSITIONS, NS):
        try:
            data = store.io.read(path)
        except OSError as e:
            problems.append((path, f"cannot be read: {e.strerror}"))
            continue
        if not data.startswith(MAGIC):
            problems.append((path, "does not start with 'kxen-positions 1': delete it (the next lookup writes it "
                                   "again)"))
            continue
        body = data[len(MAGIC):]
        if len(body) % ID_SIZE:
            notes.append(f"{path}: a torn last entry (ignored by readers; the next lookup rewrites the file)")
        prev: bytes | None = None
        for i in range(len(body) // ID_SIZE):
            oid = body[ID_SIZE * i:ID_SIZE * (i + 1)]
            try:
                v = _message(store, oid)
            except MissingObject:
                notes.append(f"{path}: entry {i} names message {oid.hex()}, which is gone (pruned after a rewind)")
                break
            except KxenError:
                problems.append((path, f"entry {i} names {oid.hex()}, which does not read as a message: delete the "
                                       "file (the next lookup writes it again)"))
                break
            if v["seq"] != i or v.get("parent") != prev:
                what = f"entry {i} names message {oid.hex()}, which is message {v['seq']} of another history"
                if _joins_later(store, body, i):
                    # A lookup joining the head at a later entry would trust this one.
                    problems.append((path, f"{what}: delete the file (the next lookup writes it again)"))
                else:
                    # Two lookups appended the same entries at once: no later entry joins, readers stop here.
                    notes.append(f"{path}: {what}, as is every later one (ignored by readers; the next lookup "
                                 "rewrites the file)")
                break
            prev = oid
    return problems, notes


def _joins_later(store: Any, body: bytes, i: int) -> bool:
    """Whether an entry after ``i`` names a message of its own position's ``seq`` (one a lookup could join)."""
    for j in range(i + 1, len(body) // ID_SIZE):
        try:
            if _message(store, body[ID_SIZE * j:ID_SIZE * (j + 1)])["seq"] == j:
                return True
        except KxenError:
            continue
    return False
