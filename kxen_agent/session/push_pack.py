"""A push's pack and its index, the entries compressed by two threads.

:func:`~kxen_agent.store.gitmap.encode_indexed_pack` writes a pack of
whole objects, each zlib-compressed (level 1), and the index ``git
index-pack`` would write for it. zlib was the largest single cost of a
first push (0.53 s of the 1.4 s of Python of a 10,000-message session's):
it releases the GIL, so from :data:`THREADED_FROM` objects on
:func:`indexed_pack` compresses the two halves in two threads and lays
the entries out as ``encode_indexed_pack`` does, byte for byte (a test
compares the two). On two cores the wall time of the compression halves;
its CPU time stays what it was.

It only encodes bytes; :mod:`.gitio` writes them.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from kxen_agent.store.gitmap import GIT_TYPE_CODES, GitObject, encode_indexed_pack, encode_pack_index, pack_entry_header

__all__ = ["THREADED_FROM", "indexed_pack"]

#: From this many objects on, a pack's entries are compressed by two threads (zlib releases the GIL).
THREADED_FROM = 1024


def indexed_pack(objects: Sequence[GitObject]) -> tuple[bytes, bytes]:
    """``encode_indexed_pack(objects)``'s pack and index, byte for byte; past a few objects, in two threads."""
    objs = list({o.oid: o for o in objects}.values())
    if len(objs) < THREADED_FROM or (os.cpu_count() or 1) < 2:
        return encode_indexed_pack(objs)
    half = len(objs) // 2
    with ThreadPoolExecutor(max_workers=2) as pool:
        parts = list(pool.map(_deflate_all, (objs[:half], objs[half:])))
    out = bytearray(b"PACK" + struct.pack(">II", 2, len(objs)))
    entries = []
    for o, body in zip(objs, parts[0] + parts[1]):
        at = len(out)
        out += pack_entry_header(GIT_TYPE_CODES[o.type], len(o.body))
        out += body
        entries.append((o.oid, zlib.crc32(memoryview(out)[at:]), at))
    pack_sum = hashlib.sha1(out).digest()
    out += pack_sum
    return bytes(out), encode_pack_index(entries, pack_sum)


def _deflate_all(objs: Sequence[GitObject]) -> list[bytes]:
    return [zlib.compress(o.body, 1) for o in objs]  # level 1, as encode_indexed_pack
