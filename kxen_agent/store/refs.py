"""Mutable refs: named pointers to objects, grouped, with a reflog each group.

A *ref group* is the unit of locking and of atomicity: all refs of one group
live in one small text file, so a transaction over several refs of a group
is one atomic rename (``objects_spec.md`` §6-§7). A group is named by two
path segments (``ns/id``, e.g. one per session); a ref inside it by one to
four more.

An update is compare-and-swap: under the group's lock, the file is re-read
(another process may have moved a ref since the caller looked) and every
expected old value must match. Every committed update also appends to the
group's reflog; the ref file records how long the committed reflog is, so a
reflog tail written by a transaction that crashed before its rename is
recognised as uncommitted and cut off by the next writer.

Each group carries a *fence*: a number that only increases. An update made
with a fence lower than the group's current one is refused (:class:`StaleFence`)
— this is what stops a paused lease holder from writing after its lease
was given to another process.

Every file-system call, listings and sizes included, goes through the
store's :class:`~.fsio.FileIO`; nothing here calls ``os`` on a file.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Iterable, Iterator

from kxen_agent.errors import KxenError, UsageError

from .fsio import FileIO
from .locks import file_lock
from .objects import decode_body, links_of

__all__ = [
    "ANY",
    "BadRefName",
    "BadRefValue",
    "CorruptRef",
    "RefConflict",
    "RefGroupState",
    "RefStore",
    "RefUpdate",
    "ReflogEntry",
    "StaleFence",
    "clean_reason",
    "is_temp_file",
    "prepare_transaction",
    "validate_group",
    "validate_namespace",
    "validate_ref_name",
    "validate_update",
]

ZERO = b"\x00" * 32
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_FORMAT_LINE = "kxen-refs 1"
#: Names beginning with this are temp files (``fsio.FileIO.write_tmp``): no
#: segment may begin with it, so a listing can skip temp files safely.
TEMP_PREFIX = "tmp_"
_TEMP_NAME = re.compile(r"tmp_[0-9a-f]{16}")
# Strict number and id syntax (§1.1): int() would also take "+1", "007",
# "1_0", " 1" and "1\r".
_DECIMAL = r"(0|[1-9][0-9]*)"
_HEADER_LINE = re.compile(r"(fence|log|steps|deleted) " + _DECIMAL)
_REF_LINE = re.compile(r"([0-9a-f]{64}) (.*)", re.S)
_REFLOG_HEAD = re.compile(r"([0-9a-f]{64}) ([0-9a-f]{64}) " + _DECIMAL + " " + _DECIMAL + r" ([^ ]*)")
#: Every number of a ref file or reflog line is at most this, as a step record's CBOR integers are
#: (§6.9 question 11); a ref file's ``steps`` at most what a step-log header's 19 digits can name.
MAX_NUMBER = (1 << 64) - 1
MAX_GENERATION = 10**19 - 1


class BadRefName(UsageError):
    """A ref or group name breaks the naming rules (§6.1)."""


class BadRefValue(KxenError, ValueError):
    """A ref update's value is not a 32-byte object id, or is the all-zero id (§6.4)."""


class CorruptRef(KxenError):
    """A ref file or reflog cannot be read or parsed."""


class RefConflict(KxenError):
    """A compare-and-swap found a different value than the caller expected."""

    def __init__(self, group: str, name: str, expected: bytes | None, found: bytes | None) -> None:
        def show(v: bytes | None) -> str:
            return "nothing" if v is None else v.hex()[:16]

        super().__init__(
            f"ref {group}/{name} changed under us: expected {show(expected)}, found {show(found)}; "
            "another process updated it — re-read and retry"
        )
        self.group = group
        self.name = name
        self.expected = expected
        self.found = found


class StaleFence(KxenError):
    """An update carried a fence older than the group's: its lease was lost."""

    exit_code = 75

    def __init__(self, group: str, fence: int, current: int) -> None:
        super().__init__(
            f"update to {group} refused: fence {fence} is stale (current fence {current}); "
            "the run lease was taken over by another process"
        )
        self.fence = fence
        self.current = current


def _check_segment(seg: str, what: str, full: str) -> None:
    if (
        not _SEGMENT.fullmatch(seg)
        or ".." in seg
        or seg.endswith(".lock")
        or seg.endswith(".")
        or seg.startswith(TEMP_PREFIX)
    ):
        raise BadRefName(
            f"invalid {what} {full!r}: segment {seg!r} must match [A-Za-z0-9_][A-Za-z0-9_.-]* "
            f"(at most 64 characters, no '..', not ending in '.' or '.lock', not starting with {TEMP_PREFIX!r})"
        )


def validate_namespace(ns: str) -> str:
    """Check a namespace, the first segment of a group name (§6.1)."""
    if type(ns) is not str:
        raise BadRefName(f"invalid namespace {ns!r}: expected a string")
    _check_segment(ns, "namespace", ns)
    return ns


def validate_group(group: str) -> str:
    parts = group.split("/")
    if len(parts) != 2:
        raise BadRefName(f"invalid ref group {group!r}: expected two segments 'namespace/id'")
    for p in parts:
        _check_segment(p, "ref group", group)
    return group


def validate_ref_name(name: str) -> str:
    parts = name.split("/")
    if not 1 <= len(parts) <= 4:
        raise BadRefName(f"invalid ref name {name!r}: expected one to four segments")
    for p in parts:
        _check_segment(p, "ref name", name)
    return name


class _Any:
    def __repr__(self) -> str:
        return "ANY"


#: Expected-old value that skips the compare (use sparingly: it is not CAS).
ANY = _Any()


@dataclass(frozen=True)
class RefUpdate:
    """Set ``name`` to ``new`` (None deletes it) if it is now ``old`` (None: absent)."""

    name: str
    old: bytes | None | _Any
    new: bytes | None


@dataclass(frozen=True)
class RefGroupState:
    """The committed content of one group's ref file."""

    group: str
    refs: dict[str, bytes] = field(default_factory=dict)
    fence: int = 0
    log_size: int = 0
    deleted_ns: int | None = None
    exists: bool = False
    #: The step log generation the ref file names (§6.8): 0 when there is no
    #: ref file, 1 when a ref file names none (format 2 wrote none).
    steps_gen: int = field(default=0, compare=False, repr=False)
    #: The step log whose first ``steps_n`` committed records this state
    #: applies (None: the ref file alone); their reflog entries are :attr:`tail`.
    steps_log: object = field(default=None, compare=False, repr=False)
    steps_n: int = field(default=0, compare=False, repr=False)

    @property
    def tail(self) -> tuple["ReflogEntry", ...]:
        """Reflog entries of the step log's records, after the reflog's ``log_size`` bytes (which count them as
        their lines would be)."""
        if self.steps_log is None:
            return ()
        return tuple(ReflogEntry(u.old, u.new, r.tx.time_ns, r.tx.fence, u.name, r.tx.reason)
                     for r in self.steps_log.records[:self.steps_n] for u in r.tx.updates)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ReflogEntry:
    old: bytes | None
    new: bytes | None
    time_ns: int
    fence: int
    name: str
    reason: str


def validate_update(u: RefUpdate) -> RefUpdate:
    """Check an update's name and values before anything is locked or written."""
    validate_ref_name(u.name)
    for what, v in (("new", u.new), ("expected old", u.old)):
        if v is None or v is ANY and what == "expected old":
            continue
        if type(v) is not bytes or len(v) != 32:
            raise BadRefValue(f"ref {u.name!r}: {what} value {v!r} is not a 32-byte object id")
        if v == ZERO:
            raise BadRefValue(
                f"ref {u.name!r}: {what} value is the all-zero id, which reflogs use for 'absent'; "
                "use None to delete or to expect no ref"
            )
    return u


def is_temp_file(path: str, io: FileIO) -> bool:
    """Whether ``path`` is a temp file as :meth:`.fsio.FileIO.write_tmp` makes them.

    Named ``tmp_`` and 16 hex digits, and not a directory (asked through
    ``io``); since no segment may begin with ``tmp_`` (§6.1), it can never
    be a ref group's file. One that has vanished counts too: a writer
    renamed it into place between a listing and this check.
    """
    return _TEMP_NAME.fullmatch(os.path.basename(path)) is not None and not io.isdir(path)


# ------------------------------------------------------------------ formats


def format_ref_file(refs: dict[str, bytes], fence: int, log_size: int, deleted_ns: int | None,
                    steps_gen: int | None = None) -> bytes:
    lines = [_FORMAT_LINE, f"fence {fence}", f"log {log_size}"]
    if steps_gen is not None:
        lines.append(f"steps {steps_gen}")
    if deleted_ns is not None:
        lines.append(f"deleted {deleted_ns}")
    for name in sorted(refs):
        lines.append(f"{refs[name].hex()} {name}")
    return ("\n".join(lines) + "\n").encode("ascii")


def parse_ref_file(data: bytes, group: str, where: str) -> RefGroupState:
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise CorruptRef(f"ref file {where} is not ASCII") from None
    if not text.endswith("\n"):
        raise CorruptRef(f"ref file {where} does not end with a newline")
    lines = text[:-1].split("\n")
    if lines[0] != _FORMAT_LINE:
        raise CorruptRef(f"ref file {where}: first line must be {_FORMAT_LINE!r}")

    def header(i: int, key: str) -> int | None:
        m = _HEADER_LINE.fullmatch(lines[i]) if i < len(lines) else None
        if m is None or m.group(1) != key:
            return None
        n = int(m.group(2))
        if n > (MAX_GENERATION if key == "steps" else MAX_NUMBER):
            raise CorruptRef(f"ref file {where}: '{key}' is {n}, over its limit "
                             f"({MAX_GENERATION if key == 'steps' else MAX_NUMBER}, objects_spec.md §6.3)")
        return n

    fence = header(1, "fence")
    if fence is None:
        raise CorruptRef(f"ref file {where}: line 2 must be 'fence <decimal>'")
    log = header(2, "log")
    if log is None:
        raise CorruptRef(f"ref file {where}: line 3 must be 'log <decimal>'")
    i = 3
    steps = header(i, "steps")
    if steps is not None:
        if steps < 1:
            raise CorruptRef(f"ref file {where}: 'steps' must be at least 1 (generation 0 is a group with no ref file)")
        i += 1
    deleted = header(i, "deleted")
    if deleted is not None:
        i += 1
    refs: dict[str, bytes] = {}
    prev = None
    for ln in lines[i:]:
        m = _REF_LINE.fullmatch(ln)
        if m is None:
            raise CorruptRef(f"ref file {where}: line {ln!r} is not '<64 lower-case hex> <name>'")
        hexid, name = m.groups()
        if hexid == ZERO.hex():
            raise CorruptRef(f"ref file {where}: ref {name!r} holds the all-zero id, which means 'absent'")
        try:
            validate_ref_name(name)
        except BadRefName as e:
            raise CorruptRef(f"ref file {where}: {e}") from None
        if prev is not None and name <= prev:
            raise CorruptRef(f"ref file {where}: names not sorted or duplicated at {name!r}")
        prev = name
        refs[name] = bytes.fromhex(hexid)
    return RefGroupState(group, refs, fence, log, deleted, True, 1 if steps is None else steps)


def _hex_or_zero(v: bytes | None) -> str:
    return (v or ZERO).hex()


#: What a reason may not hold once its whitespace is collapsed (§7.1): the
#: other C0 and C1 controls, DEL, and surrogates (text from a path that is
#: not UTF-8). A NUL or an escape sequence would end or rewrite the line on
#: a terminal; a surrogate cannot be written as UTF-8 at all.
_REASON_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def clean_reason(reason: str) -> str:
    """``reason`` as a reflog line holds it: whitespace collapsed, each control character or surrogate as U+FFFD."""
    return _REASON_UNPRINTABLE.sub("\ufffd", " ".join(reason.split()))


def format_reflog_line(e: ReflogEntry) -> bytes:
    reason = clean_reason(e.reason)  # one printable line: no tab, newline or other control inside
    return (
        f"{_hex_or_zero(e.old)} {_hex_or_zero(e.new)} {e.time_ns} {e.fence} {e.name}\t{reason}\n"
    ).encode("utf-8")


def parse_reflog(data: bytes, where: str) -> list[ReflogEntry]:
    out = []
    for n, raw in enumerate(data.split(b"\n")[:-1], 1):
        try:
            head, tab, reason = raw.decode("utf-8").partition("\t")
        except UnicodeDecodeError:
            raise CorruptRef(f"reflog {where}: line {n} is not UTF-8") from None
        m = _REFLOG_HEAD.fullmatch(head)
        if not tab or m is None:
            raise CorruptRef(
                f"reflog {where}: line {n} is not '<old> <new> <time-ns> <fence> <name>TAB<reason>' "
                "(lower-case hex ids, plain decimals)"
            )
        old, new, t, fence, name = m.groups()
        try:
            validate_ref_name(name)
        except BadRefName as e:
            raise CorruptRef(f"reflog {where}: line {n}: {e}") from None
        if reason != " ".join(reason.split()):
            raise CorruptRef(f"reflog {where}: line {n}: reason has uncollapsed whitespace")
        if int(t) > MAX_NUMBER or int(fence) > MAX_NUMBER:
            raise CorruptRef(f"reflog {where}: line {n}: a number over {MAX_NUMBER} (objects_spec.md §7.1)")
        o, w = bytes.fromhex(old), bytes.fromhex(new)
        out.append(ReflogEntry(None if o == ZERO else o, None if w == ZERO else w, int(t), int(fence), name, reason))
    if data and not data.endswith(b"\n"):
        raise CorruptRef(f"reflog {where}: last line is incomplete")
    return out


# ------------------------------------------------------------------ the store


def prepare_transaction(
    cur: RefGroupState, updates: list[RefUpdate], fence: int | None, new_fence: int | None, deleted_ns: "int | None | _Any"
) -> tuple[dict[str, bytes], list[bytes | None], int, int | None]:
    """The prepare step of a ref transaction, pure: judge ``updates`` against ``cur``.

    Returns the group's new refs, each update's old value (a reflog line's
    old value is the ref's value just before that update, so two updates of
    one ref in one transaction chain correctly), the new fence and the new
    deleted mark; raises :class:`StaleFence` or :class:`RefConflict` with
    nothing changed. Every ref store (disk, memory) commits what this
    returns, so they cannot disagree on what a transaction means.
    """
    group = cur.group
    if fence is not None and fence < cur.fence:
        raise StaleFence(group, fence, cur.fence)
    refs = dict(cur.refs)
    olds: list[bytes | None] = []
    for u in updates:
        found = refs.get(u.name)
        if u.old is not ANY and found != u.old:
            raise RefConflict(group, u.name, u.old, found)  # type: ignore[arg-type]
        olds.append(found)
        if u.new is None:
            refs.pop(u.name, None)
        else:
            refs[u.name] = u.new
    out_fence = cur.fence
    if new_fence is not None:
        if new_fence <= cur.fence:
            raise StaleFence(group, new_fence, cur.fence)
        out_fence = new_fence
    out_deleted = cur.deleted_ns if deleted_ns is ANY else deleted_ns
    return refs, olds, out_fence, out_deleted  # type: ignore[return-value]


class RefStore:
    """Ref groups: ref files under ``<state>/refs``, step logs under ``<state>/steps``, reflogs under ``<state>/logs``.

    A transaction is one record appended to the group's step log (§6.8);
    the ref file and the reflog are rewritten only by a checkpoint, which
    folds the log in once its objects are durable elsewhere.
    """

    def __init__(self, root: str, io: FileIO, lock_timeout: float = 30.0, before_write=None) -> None:
        from .steps import StepLogs

        self.root = root
        self.io = io
        self.lock_timeout = lock_timeout
        # Called (with no argument) before the first write, so the state dir
        # is initialised lazily by whoever owns it.
        self._before_write = before_write
        # refs/<ns>, logs/<ns>, steps/<ns> and their tops whose own names
        # this instance has made durable in their parents (see _ensure_dir).
        self._durable_dirs: set[str] = set()
        self.steps = StepLogs(root, io)
        # group -> (base, log, records applied, state): see _apply.
        self._applied: dict[str, tuple] = {}

    def ref_path(self, group: str) -> str:
        return os.path.join(self.root, "refs", *validate_group(group).split("/"))

    def log_path(self, group: str) -> str:
        return os.path.join(self.root, "logs", *validate_group(group).split("/"))

    def steps_path(self, group: str) -> str:
        return os.path.join(self.root, "steps", *validate_group(group).split("/"))

    def lock_path(self, group: str) -> str:
        ns, gid = validate_group(group).split("/")
        return os.path.join(self.root, "locks", ns, gid + ".lock")

    def groups(self, namespace: str | None = None) -> Iterator[str]:
        """Every name under ``refs/<ns>/`` except temp files, and every group whose step log is its state.

        Only a temp file (:func:`is_temp_file`) is skipped: no group may be
        named so (§6.1). Anything else is yielded even if it is not a valid
        group (a directory, a bad name), so that reading it fails loudly —
        in fsck, and in gc, which must not prune what an unreadable group
        might keep alive (§6.2). A group that has no ref file yet lives in
        its step log alone (generation 0, §6.8).
        """
        io = self.io
        base = os.path.join(self.root, "refs")
        names: set[str] = set()
        namespaces = [namespace] if namespace else sorted(io.listdir(base)) if io.isdir(base) else []
        for ns in namespaces:
            d = os.path.join(base, ns)
            if not io.isdir(d):
                continue
            for gid in io.listdir(d):
                if is_temp_file(os.path.join(d, gid), io):
                    continue
                names.add(f"{ns}/{gid}")
        for g in self.steps.groups(namespace):
            if g in names:
                continue
            try:
                if self.read(g).exists:
                    names.add(g)
            except (CorruptRef, UsageError):
                names.add(g)  # fsck must see it
        for g in sorted(names, key=lambda g: g.split("/", 1)):
            yield g

    def _read_base(self, group: str) -> RefGroupState:
        path = self.ref_path(group)
        try:
            data = self.io.read(path)
        except FileNotFoundError:
            return RefGroupState(group)
        except OSError as e:  # a directory, no permission: not a ref file we can use
            raise CorruptRef(f"cannot read ref file {path}: {e.strerror}") from None
        return parse_ref_file(data, group, path)

    def read(self, group: str) -> RefGroupState:
        """The committed state; consistent without the lock (see :meth:`read_with_log`)."""
        return self.read_with_log(group)[0]

    def read_with_log(self, group: str):
        """The committed state and the step log it was read with (None if the state is the ref file's alone).

        The ref file is read first, then the step log: a checkpoint writes
        the ref file before it starts the log's new generation, so a log of
        a later generation than the ref file read means a checkpoint came
        in between, and the ref file is read again (§6.8).
        """
        from .steps import CorruptSteps

        for _ in range(8):
            base = self._read_base(group)
            try:
                log = self.steps.load(group)
            except CorruptSteps as e:
                raise CorruptRef(str(e)) from None
            if log is None or log.gen < base.steps_gen:
                return base, None  # no log, or a stale one
            if log.gen > base.steps_gen:
                if not base.exists and self._read_base(group).exists == base.exists:
                    return base, None  # no ref file still: a removed group's leftover log
                continue  # a checkpoint between the two reads: read again
            return self._apply(base, log), log
        raise CorruptRef(f"step log {self.steps.path(group)} keeps naming a generation its ref file does not; run fsck")

    def _apply(self, base: RefGroupState, log) -> RefGroupState:
        """``base`` with ``log``'s committed records applied, from where this instance applied them last.

        A reader re-reads a group every time (40 reads a turn in a run), and
        a log holds thousands of records between checkpoints: applying them
        all each time cost a long run time quadratic in its length.
        """
        n = len(log.records)
        if n == 0:
            return base
        done = self._applied.get(base.group)
        if (done is not None and done[1] is log and done[0] == base and done[0].steps_gen == base.steps_gen
                and done[2] <= n):
            cur, start = done[3], done[2]
        else:
            cur, start = base, 0
        if start == n:
            return replace(cur, refs=dict(cur.refs))  # a state handed out is the caller's to change
        refs = dict(cur.refs)
        fence, deleted, size = cur.fence, cur.deleted_ns, cur.log_size
        where = log.path
        for r in log.records[start:]:
            t = r.tx
            if t.fence < fence:
                # No writer commits with a fence below the group's (§6.4 step 4): a stale holder's step
                # in the log is damage, never applied (§6.9 question 7).
                raise CorruptRef(f"step log {where} at offset {r.offset}: the record's fence {t.fence} is below "
                                 f"the group's {fence} (a stale writer's step); run fsck")
            for u in t.updates:
                try:
                    validate_ref_name(u.name)
                except BadRefName as e:
                    raise CorruptRef(f"step log {where} at offset {r.offset}: {e}") from None
                if refs.get(u.name) != u.old:
                    raise CorruptRef(f"step log {where} at offset {r.offset}: ref {u.name!r} was not what the "
                                     "record says it replaced; run fsck")
                if u.new is None:
                    refs.pop(u.name, None)
                else:
                    refs[u.name] = u.new
                size += len(format_reflog_line(ReflogEntry(u.old, u.new, t.time_ns, t.fence, u.name, t.reason)))
            if t.new_fence is not None:
                if t.new_fence <= fence:
                    raise CorruptRef(f"step log {where} at offset {r.offset}: the fence goes down or stays")
                fence = t.new_fence
            if t.deleted != "leave":
                deleted = t.deleted  # type: ignore[assignment]
        out = RefGroupState(base.group, refs, fence, size, deleted, True, base.steps_gen, log, n)
        self._applied[base.group] = (base, log, n, out)
        return replace(out, refs=dict(refs))

    def get(self, group: str, name: str) -> bytes | None:
        return self.read(group).refs.get(validate_ref_name(name))

    def reflog(self, group: str, state: RefGroupState | None = None) -> list[ReflogEntry]:
        """The committed reflog (an uncommitted tail past the recorded size is ignored), the step log's after it.

        ``state`` is a :meth:`read` of the group made earlier, to check the
        reflog against that one snapshot (fsck does); else the ref file is
        read now. Either way the reflog is read after the ref file, so a
        commit in between can only make it longer, never shorter (§6.4).
        """
        if state is None:
            state = self.read(group)
        elif state.group != group:
            raise ValueError(f"state of {state.group} given for the reflog of {group}")
        path = self.log_path(group)
        try:
            data = self.io.read(path)
        except FileNotFoundError:
            data = b""
        except OSError as e:
            raise CorruptRef(f"cannot read reflog {path}: {e.strerror}") from None
        tail_size = sum(len(format_reflog_line(e)) for e in state.tail)
        committed = state.log_size - tail_size
        if len(data) < committed:
            raise CorruptRef(f"reflog {path} is shorter ({len(data)} bytes) than its ref file records ({committed})")
        return parse_reflog(data[:committed], path) + list(state.tail)

    def lock(self, group: str, timeout: float | None = None):
        """The group's lock, for callers that must read-decide-write atomically."""
        path = self.lock_path(group)
        if self._before_write:
            self._before_write()
        self.io.makedirs(os.path.dirname(path))
        return file_lock(path, self.lock_timeout if timeout is None else timeout, self.io)

    def transaction(
        self,
        group: str,
        updates: Iterable[RefUpdate],
        *,
        reason: str,
        fence: int | None = None,
        new_fence: int | None = None,
        deleted_ns: int | None | _Any = ANY,
        locked: bool = False,
        objects: "list | tuple" = (),
    ) -> RefGroupState:
        """Apply ``updates`` to ``group`` all together or not at all.

        ``fence``: refuse with :class:`StaleFence` if the group's fence is
        higher. ``new_fence``: raise the group's fence (never lower it).
        ``deleted_ns``: mark (an int) or unmark (None) the group deleted.
        ``locked``: the caller already holds :meth:`lock`. ``objects``: raw
        objects committed in the same record (the step's new objects).
        """
        updates = list(updates)
        for u in updates:
            validate_update(u)
        if not locked:
            with self.lock(group):
                return self._commit(group, updates, reason, fence, new_fence, deleted_ns, objects)
        return self._commit(group, updates, reason, fence, new_fence, deleted_ns, objects)

    def _commit(self, group, updates, reason, fence, new_fence, deleted_ns, objects=()) -> RefGroupState:
        from .steps import StepTx, TxUpdate

        # Re-read under the lock: the caller's view may be stale (the race
        # compare-and-swap exists to catch).
        cur, log = self.read_with_log(group)
        if fence is not None and fence < cur.fence:
            raise StaleFence(group, fence, cur.fence)
        refs, olds, out_fence, out_deleted = prepare_transaction(cur, updates, fence, new_fence, deleted_ns)
        if self._before_write:
            self._before_write()
        steps_path = self.steps_path(group)
        self._ensure_dir(os.path.dirname(steps_path))
        now = time.time_ns()
        used_fence = fence if fence is not None else out_fence
        tx = StepTx(now, clean_reason(reason), used_fence, new_fence,
                    "leave" if deleted_ns is ANY else deleted_ns,  # type: ignore[arg-type]
                    tuple(TxUpdate(u.name, old, u.new) for u, old in zip(updates, olds)))
        # What the log already holds is durable with it: not written twice.
        known = log.ids if log is not None else frozenset()
        objs = [o for o in dict((o.id, o) for o in objects).values() if o.id not in known]
        carried = {o.id for o in objs}
        named = [u.new for u in updates if u.new is not None]
        for o in objs:
            if o.kind != "blob":
                named += links_of(o.kind, decode_body(o))
        for oid in named:
            if oid not in carried:
                self.steps.make_durable(oid, but=log)
        log = self.steps.append(group, cur.steps_gen, log, tx, objs)  # the commit point
        size = cur.log_size
        for u, old in zip(updates, olds):
            size += len(format_reflog_line(ReflogEntry(old, u.new, now, used_fence, u.name, tx.reason)))
        return RefGroupState(group, refs, out_fence, size, out_deleted, True, cur.steps_gen, log, len(log.records))

    def checkpoint(self, group: str, *, locked: bool = False) -> bool:
        """Fold ``group``'s step log into its ref file and reflog, and start the log's next generation.

        The caller guarantees that every object the log holds is durable
        elsewhere (a committed pack, or a loose file whose barrier passed):
        the old log's bytes are gone once this returns. False if there was
        nothing to fold.
        """
        if not locked:
            with self.lock(group):
                return self.checkpoint(group, locked=True)
        cur, log = self.read_with_log(group)
        if log is None or not log.records:
            return False
        if self._before_write:
            self._before_write()
        ref_path = self.ref_path(group)
        log_path = self.log_path(group)
        self._ensure_dir(os.path.dirname(ref_path))
        self._ensure_dir(os.path.dirname(log_path))
        lines = b"".join(format_reflog_line(e) for e in cur.tail)
        committed = cur.log_size - len(lines)
        try:
            size = self.io.getsize(log_path)
            log_existed = True
        except FileNotFoundError:
            size, log_existed = 0, False
        if size > committed:
            self.io.truncate(log_path, committed)
        elif size < committed:
            raise CorruptRef(f"reflog {log_path} is shorter than its ref file records; run fsck")
        if lines:
            self.io.append(log_path, lines)
            if not log_existed or committed == 0:
                self.io.fsync_dir(os.path.dirname(log_path))
        gen = cur.steps_gen + 1
        self.io.write_durable(ref_path, format_ref_file(cur.refs, cur.fence, cur.log_size, cur.deleted_ns, gen))
        # The ref file now holds everything the log did: the log's new,
        # empty generation may follow (a crash before leaves a stale log,
        # which readers pass over and the next writer replaces).
        self.steps.start_generation(group, gen)
        return True

    def trust_dirs(self, dirs: Iterable[str]) -> None:
        """Directories whose names are known durable (the state dir's skeleton, §10.3)."""
        self._durable_dirs.update(dirs)

    def _ensure_dir(self, d: str) -> None:
        """Create ``refs/<ns>``, ``logs/<ns>`` or ``steps/<ns>`` if missing, with a durable name.

        ``makedirs`` syncs the parent of a directory it creates; one found
        existing may have been made by a process that has not synced its
        parent yet or died before it did (and "I made it" cannot be told
        from "I lost the race to make it"). So the first time this instance
        uses a directory it syncs its parent and grandparent (§9.1).
        """
        if d in self._durable_dirs and os.path.dirname(d) in self._durable_dirs:
            return
        self.io.makedirs(d)
        named = [p for p in (d, os.path.dirname(d)) if p not in self._durable_dirs]
        for p in named:
            self.io.fsync_dir(os.path.dirname(p))
        self._durable_dirs.update(named)

    def remove_group(self, group: str, timeout: float | None = None) -> None:
        """Delete a group's ref file, step log and reflog (gc's job, after the grace period).

        Whatever could read as the group alone goes last: the ref file
        goes before a log of generation 1 or more (which without it is
        nobody's), after a generation-0 log (which without it would be
        the group's whole state, §6.8).
        """
        with self.lock(group, timeout):
            self.unlink_group(group)

    def unlink_group(self, group: str) -> None:
        """:meth:`remove_group`'s work, for a caller that holds the group's lock (gc)."""
        from .steps import CorruptSteps

        base = self._read_base(group)
        try:
            log = self.steps.load(group)
        except CorruptSteps:
            log = None
        ref, steps = self.ref_path(group), self.steps_path(group)
        # A generation-0 log beside a ref file is a stale one (a checkpoint
        # died before replacing it): alone it would read as the group, so it
        # goes before the ref file does.
        order = [ref, steps] if base.exists and (log is None or log.gen > 0) else [steps, ref]
        for p in (*order, self.log_path(group)):
            try:
                self.io.unlink(p)
                self.io.fsync_dir(os.path.dirname(p))
            except FileNotFoundError:
                pass
        self.steps.forget(group)
        # Then the group's caches (§11a): derived files, nothing without the group; no fsync (a
        # leftover is a stray file that the next gc of the group's name, or a user, removes).
        cache = os.path.join(self.root, "cache")
        try:
            kinds = self.io.listdir(cache)
        except (FileNotFoundError, NotADirectoryError):
            kinds = []
        for kind in kinds:
            try:
                self.io.unlink(os.path.join(cache, kind, *validate_group(group).split("/")))
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                pass
