"""Ref files and reflogs as bytes: their formats, names and values, pure (no I/O).

A ref group's committed state (:class:`RefGroupState`), an update
(:class:`RefUpdate`), a reflog line (:class:`ReflogEntry`), the rules for
names (§6.1) and values (§6.4), and the byte formats of the ref file
(§6.3) and the reflog (§7.1), with their parsers. The ref store
(:mod:`.refs`) and the step logs (:mod:`.steps`) both build on this
module, and it on neither: nothing here opens a file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kxen_agent.errors import KxenError, UsageError

__all__ = [
    "ANY",
    "BadRefName",
    "BadRefValue",
    "CorruptRef",
    "MAX_GENERATION",
    "MAX_NUMBER",
    "RefConflict",
    "RefGroupState",
    "RefUpdate",
    "ReflogEntry",
    "StaleFence",
    "TEMP_NAME",
    "TEMP_PREFIX",
    "ZERO",
    "clean_reason",
    "format_ref_file",
    "format_reflog_line",
    "parse_ref_file",
    "parse_reflog",
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
TEMP_NAME = re.compile(r"tmp_[0-9a-f]{16}")
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
