"""zstd for pack entries: bounded decompression, per-entry compression, the pack's dictionary.

Owns the compression contexts (:class:`Compressor`, :class:`Decompressor`)
and the dictionary policy of ``objects_spec.md`` §12.4: which objects are
sampled (:func:`sample_dictionary`), how big a dictionary is, and whether
it pays for itself (:func:`choose_dictionary`). Every function here maps
bytes to bytes; object bytes to sample come from a ``read`` callable.

It must never touch a file, and knows nothing of the entry layout beyond
the method numbers (:mod:`.format`).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import zstandard

from ..objects import MAX_WINDOW, CorruptObject, ObjectId, RawObject, check_frame_parameters
from .format import METHOD_STORED, METHOD_ZSTD, METHOD_ZSTD_DICT, BadPack, Entry

__all__ = sorted(
    [
        "COMPRESSION_LEVEL",
        "Compressor",
        "DICT_SAMPLE_BUDGET",
        "DICT_SAMPLE_MAX_OBJECT",
        "Decompressor",
        "choose_dictionary",
        "dictionary_size_for",
        "sample_dictionary",
    ]
)

COMPRESSION_LEVEL = 3


class Decompressor:
    """Bounded decompression of entries, with the pack's dictionary if any.

    Not shared between threads: zstd contexts are not thread-safe.
    """

    def __init__(self, dictionary: bytes | None) -> None:
        self._plain = zstandard.ZstdDecompressor()
        self._dict = None
        # A method-2 frame may name the pack's dictionary by its id (bytes
        # 4-7 after the magic, little-endian: what `zstd -D` writes) or by
        # none; any other id, or any in a method-1 frame, is refused (§12.3).
        self._dict_ids = (0, int.from_bytes(dictionary[4:8], "little")) if dictionary and len(dictionary) >= 8 else (0,)
        if dictionary:
            try:
                zd = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)
                self._dict = zstandard.ZstdDecompressor(dict_data=zd)
            except zstandard.ZstdError as e:
                raise BadPack("dictionary", f"unusable zstd dictionary ({e})") from None

    def decompress(self, e: Entry, stored: bytes | memoryview, where: str) -> bytes:
        return self.decompress_raw(e.method, e.raw_len, stored, where)

    def decompress_raw(self, method: int, raw_len: int, stored: bytes | memoryview, where: str) -> bytes:
        """:meth:`decompress` for an entry given by its method and ``raw_len`` (checked headers only)."""
        if method == METHOD_STORED:
            return bytes(stored)
        # The frame must declare exactly the entry's length, which was
        # already checked against the limit: the one allocation below is
        # bounded, and a frame that would expand further fails in libzstd.
        try:
            params = zstandard.get_frame_parameters(stored)
        except zstandard.ZstdError as ex:
            raise CorruptObject(where, f"stored bytes are not a zstd frame ({ex})") from None
        if params.content_size != raw_len:
            size = "no size" if params.content_size == zstandard.CONTENTSIZE_UNKNOWN else f"{params.content_size} bytes"
            raise CorruptObject(where, f"zstd frame declares {size}, the entry {raw_len}")
        if params.window_size > MAX_WINDOW or params.dict_id not in (self._dict_ids if method == METHOD_ZSTD_DICT else (0,)):
            if method == METHOD_ZSTD_DICT:  # the check again, for the precise error
                check_frame_parameters(params, where, dict_ids=self._dict_ids,
                                       why=f"this pack's dictionary is {self._dict_ids[-1]}")
            else:
                check_frame_parameters(params, where, why="a method-1 entry uses none")
        dctx = self._dict if method == METHOD_ZSTD_DICT else self._plain
        if dctx is None:
            raise CorruptObject(where, "entry needs a dictionary the pack does not have")
        try:
            out = dctx.decompress(stored, allow_extra_data=False)
        except zstandard.ZstdError as ex:
            raise CorruptObject(where, f"zstd frame does not decompress ({ex})") from None
        if len(out) != raw_len:  # pragma: no cover - libzstd enforces the declared size
            raise CorruptObject(where, f"zstd frame holds {len(out)} bytes, the entry declares {raw_len}")
        return out


class Compressor:
    """Per-entry zstd, with the pack's dictionary if any; raw when that is smaller."""

    def __init__(self, dictionary: bytes | None, level: int = COMPRESSION_LEVEL) -> None:
        self.has_dict = bool(dictionary)
        if dictionary:
            zd = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)
            zd.precompute_compress(level=level)
            self._cctx = zstandard.ZstdCompressor(
                dict_data=zd, write_content_size=True, write_checksum=False, write_dict_id=False
            )
        else:
            self._cctx = zstandard.ZstdCompressor(level=level, write_content_size=True, write_checksum=False)

    def compress(self, raw: bytes) -> tuple[int, bytes]:
        frame = self._cctx.compress(raw)
        if len(frame) >= len(raw):
            return METHOD_STORED, raw
        return (METHOD_ZSTD_DICT if self.has_dict else METHOD_ZSTD), frame

    def compress_many(self, raws: Sequence[bytes]) -> list[tuple[int, bytes]]:
        """:meth:`compress` of each of ``raws``, in order: the same bytes, faster.

        Several objects are compressed in one call, in parallel threads, by
        python-zstandard's ``multi_compress_to_buffer``: each input is still
        one frame, made with this compressor's parameters and dictionary by
        the same one-shot call as :meth:`compress`, so the frames are byte for
        byte those of :meth:`compress` (whatever the thread count; the tests
        check it). Falls back to a loop where that API is missing (the CFFI
        backend) or for a handful of objects.
        """
        if len(raws) < _MULTI_MIN or not _MULTI_OK:
            return [self.compress(r) for r in raws]
        # Threads only for small objects: each thread's context is sized for
        # its largest input, and for large ones they cost memory (and time)
        # that the parallelism does not pay back.
        threads = _compress_threads() if max(map(len, raws)) <= _THREADED_MAX_OBJECT else 1
        frames = self._cctx.multi_compress_to_buffer(raws, threads=threads)
        method = METHOD_ZSTD_DICT if self.has_dict else METHOD_ZSTD
        out = []
        for raw, seg in zip(raws, frames):
            if len(seg) >= len(raw):
                out.append((METHOD_STORED, raw))
            else:
                out.append((method, seg.tobytes()))
        if len(out) != len(raws):  # pragma: no cover - one frame per input
            raise RuntimeError("zstd returned fewer frames than inputs")
        return out


#: Batches smaller than this are compressed one call at a time.
_MULTI_MIN = 8
#: Batches with an object larger than this are compressed in one thread.
_THREADED_MAX_OBJECT = 64 << 10
_MULTI_OK = hasattr(zstandard.ZstdCompressor, "multi_compress_to_buffer") and getattr(zstandard, "backend", "cext") == "cext"


def _compress_threads() -> int:
    """Threads for batch compression: the CPUs this process may use, at most 4."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(4, n))


# -------------------------------------------------------------- dictionary

#: Objects sampled for training: at most this many bytes.
DICT_SAMPLE_BUDGET = 8 << 20
#: Only objects up to this size are sampled (and counted): a dictionary helps
#: small objects, larger ones compress well on their own.
DICT_SAMPLE_MAX_OBJECT = 64 << 10
_DICT_MIN_SAMPLE_BYTES = 64 << 10
_DICT_MIN_SAMPLES = 32


def dictionary_size_for(total_bytes: int) -> int:
    """About 1/64 of the data, between 4 KiB and zstd's default 110 KiB (measured, §12.4)."""
    return max(4096, min(112640, total_bytes // 64))


def choose_dictionary(samples: Sequence[bytes], total_bytes: int, level: int = COMPRESSION_LEVEL) -> bytes | None:
    """Train a dictionary on ``samples``; return it only if it pays for itself.

    ``total_bytes`` is the size of everything the pack will hold; the
    saving measured on the samples is scaled to it and must exceed the
    dictionary's own size. Deterministic for given samples (one thread).
    """
    return _choose_dictionary(samples, total_bytes, level)[0]


def _choose_dictionary(
    samples: Sequence[bytes], total_bytes: int, level: int
) -> tuple[bytes | None, int, list[tuple[int, bytes]]]:
    """:func:`choose_dictionary`, and what its estimate compressed: the probe's
    step (every k-th sample) and each probed sample as :meth:`Compressor.compress`
    with the dictionary at ``level`` gives it (empty without a dictionary)."""
    sample_bytes = sum(len(s) for s in samples)
    if sample_bytes < _DICT_MIN_SAMPLE_BYTES or len(samples) < _DICT_MIN_SAMPLES:
        return None, 1, []
    size = dictionary_size_for(total_bytes)
    try:
        zd = zstandard.train_dictionary(size, list(samples), k=1024, d=8, steps=0, level=level, threads=1)
    except zstandard.ZstdError:
        return None, 1, []  # too little or too uniform data to train on
    d = zd.as_bytes()
    plain = Compressor(None, level)
    with_d = Compressor(d, level)
    # Estimate on at most ~2 MiB of the samples (every k-th), scaled up.
    step = max(1, sample_bytes // (2 << 20))
    probe = samples[::step]
    probe_bytes = sum(len(s) for s in probe)
    with_frames = with_d.compress_many(probe)
    saving = sum(len(f) for _m, f in plain.compress_many(probe)) - sum(len(f) for _m, f in with_frames)
    saving = saving * total_bytes // max(1, probe_bytes)
    if saving > len(d):
        return d, step, with_frames
    return None, 1, []


def sample_dictionary(
    read: Callable[[ObjectId], RawObject],
    small: Sequence[ObjectId],
    small_total: int,
    compressed: dict[ObjectId, tuple[int, bytes]] | None = None,
) -> bytes | None:
    """A dictionary for a pack, trained on a sample of its small objects.

    ``small`` lists the pack's objects of at most :data:`DICT_SAMPLE_MAX_OBJECT`
    bytes (``small_total`` bytes together); every k-th is read, at most
    :data:`DICT_SAMPLE_BUDGET` bytes in all — a constant, whatever the pack's
    size. None when a dictionary would not pay for itself.

    ``compressed``, if given, receives the objects that the choice already
    compressed with the dictionary it returns (about 2 MiB of them), as
    ``id -> (method, stored bytes)``: what :class:`~.stream.PackStream` with
    that dictionary would make of them, for
    :meth:`~.stream.PackStream.add_many`'s ``precompressed``.
    """
    if small_total < _DICT_MIN_SAMPLE_BYTES or len(small) < _DICT_MIN_SAMPLES:
        return None
    mean = small_total / len(small)
    step = max(1, int(len(small) * mean / DICT_SAMPLE_BUDGET) + 1) if small_total > DICT_SAMPLE_BUDGET else 1
    samples: list[bytes] = []
    ids: list[ObjectId] = []
    budget = DICT_SAMPLE_BUDGET
    for oid in small[::step]:
        raw = read(oid).raw
        if len(raw) > budget:
            break
        samples.append(raw)
        ids.append(oid)
        budget -= len(raw)
    d, probe_step, frames = _choose_dictionary(samples, small_total, COMPRESSION_LEVEL)
    if d is not None and compressed is not None:
        compressed.update(zip(ids[::probe_step], frames))
    return d
