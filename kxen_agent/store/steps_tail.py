"""Finding record-shaped fields in a step log's tail in one regular-expression pass (``objects_spec.md`` §6.8).

Split from :mod:`.steps` (which re-exports :func:`_candidates`): the
judgement of an uncommitted tail there, and :mod:`.salvage`, look for a
record magic whose offset field names a position in a range, and this
builds the expression that asks it.
"""

from __future__ import annotations

import re
from typing import Iterator


def _range_re(lo: int, hi: int, width: int) -> bytes:
    """A regular expression matching exactly the ``width``-byte big-endian integers in [lo, hi]."""
    if width == 0:
        return b""
    shift = 8 * (width - 1)
    full = (1 << shift) - 1
    a, b = lo >> shift, hi >> shift
    rest_lo, rest_hi = lo & full, hi & full

    def byte(x: int) -> bytes:
        return b"\\x%02x" % x

    def anything(w: int) -> bytes:
        return b"[\\s\\S]{%d}" % w if w else b""

    def sub(x: int, y: int) -> bytes:
        return anything(width - 1) if (x, y) == (0, full) else _range_re(x, y, width - 1)

    if a == b:
        return byte(a) + sub(rest_lo, rest_hi)
    alts = [byte(a) + sub(rest_lo, full)]
    if b - a > 1:
        alts.append(b"[" + byte(a + 1) + b"-" + byte(b - 1) + b"]" + anything(width - 1))
    alts.append(byte(b) + sub(0, rest_hi))
    return b"(?:" + b"|".join(alts) + b")"


def _candidates(buf: bytes, magic: bytes, start: int, lo: int, hi: int) -> Iterator[int]:
    """Positions >= ``start`` where ``magic`` begins fields whose offset (bytes 8-16) lies in [lo, hi]."""
    if lo > hi:
        return iter(())
    # The magics have no border (no proper prefix is also a suffix): matches
    # never overlap, and the magic itself can be consumed.
    pat = re.compile(re.escape(magic) + b"(?=[\\s\\S]{4}" + _range_re(lo, hi, 8) + b")")
    return (m.start() for m in pat.finditer(buf, start))
