"""A push's pack and its index, the entries compressed by two threads.

:func:`~kxen_agent.store.gitmap.encode_indexed_pack` writes a pack of
whole objects, each zlib-compressed (level 1), and the index ``git
index-pack`` would write for it. zlib was the largest single cost of a
first push (0.53 s of the 1.4 s of Python of a 10,000-message session's):
it releases the GIL, so from :data:`THREADED_FROM` objects on
:func:`indexed_pack` hands ``encode_indexed_pack`` a ``deflate`` that
compresses the two halves in two threads: the same pack, byte for byte (a
test compares the two). On two cores the wall time of the compression halves;
its CPU time stays what it was.

It only encodes bytes; :mod:`.gitio` writes them.
"""

from __future__ import annotations

import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from kxen_agent.store.gitmap import GitObject, encode_indexed_pack

__all__ = ["THREADED_FROM", "indexed_pack"]

#: From this many objects on, a pack's entries are compressed by two threads (zlib releases the GIL).
THREADED_FROM = 1024


def indexed_pack(objects: Sequence[GitObject]) -> tuple[bytes, bytes]:
    """``encode_indexed_pack(objects)``'s pack and index, byte for byte; past a few objects, in two threads."""
    many = len(objects) >= THREADED_FROM and (os.cpu_count() or 1) >= 2
    return encode_indexed_pack(objects, deflate=_in_two_threads if many else None)


def _in_two_threads(objs: list[GitObject]) -> list[bytes]:
    half = len(objs) // 2
    with ThreadPoolExecutor(max_workers=2) as pool:
        first, second = pool.map(_deflate_all, (objs[:half], objs[half:]))
    return first + second


def _deflate_all(objs: Sequence[GitObject]) -> list[bytes]:
    return [zlib.compress(o.body, 1) for o in objs]  # level 1, as encode_indexed_pack
