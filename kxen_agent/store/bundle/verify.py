"""Opening a bundle file and checking it completely, without a state dir.

Owns the choice of a bundle's form from its first bytes (:func:`_open_reader`),
opening the file through the :class:`~kxen_agent.store.fsio.FileIO` seam
(:func:`_reading`, which import shares), and the public checks:
:func:`verify_bundle`, :func:`verify_bundle_with_ref_targets`,
:func:`iter_bundle_objects`. Every problem is one :class:`~.header.BadBundle`
naming the first one.

It must never write: verification leaves no file behind, not even a state dir.
"""

from __future__ import annotations

import contextlib
from typing import Any, BinaryIO, Callable, Iterator, Mapping

from ..fsio import OS_IO, FileIO
from ..objects import ObjectId, RawObject, Schema
from .hashing_reader import stream_size
from .header import BUNDLE_MAGIC, BadBundle, BundleInfo, BundleLimits, Progress, _set_total
from .json_form import _JsonBundleReader
from .pack_form import _PackBundleReader

__all__ = ["JudgeRefs", "iter_bundle_objects", "verify_bundle", "verify_bundle_with_ref_targets"]


#: Whitespace (SP, TAB, CR, LF) that may precede a JSON-form bundle's ``{``
#: (``objects_spec.md`` §12.8): what an editor or a shell may add, and
#: little enough that the form is known from the first bytes.
MAX_JSON_LEADING_WHITESPACE = 64


def _open_reader(path: str, f: BinaryIO, io: FileIO,
                 limits: BundleLimits | None = None) -> "_PackBundleReader | _JsonBundleReader":
    where = str(path)
    limits = limits or BundleLimits.from_env()
    head = f.read(MAX_JSON_LEADING_WHITESPACE + 1)
    f.seek(0)
    if head[: len(BUNDLE_MAGIC)] == BUNDLE_MAGIC:
        return _PackBundleReader(f, where, where, stream_size(io, f), limits)
    if not head:
        raise BadBundle(where, "empty file")
    if BUNDLE_MAGIC.startswith(head):
        raise BadBundle(where, f"truncated: the file ends after {len(head)} bytes, inside the magic", 0)
    stripped = head.lstrip(b" \t\r\n")
    if stripped[:1] == b"{" or (not stripped and len(head) <= MAX_JSON_LEADING_WHITESPACE):
        return _JsonBundleReader(f, where, where, io, limits)  # (whitespace only: the JSON reader says what is missing)
    if not stripped:
        raise BadBundle(where, f"not a kxen bundle: more than {MAX_JSON_LEADING_WHITESPACE} bytes of whitespace "
                        "before its first character", MAX_JSON_LEADING_WHITESPACE)
    raise BadBundle(where, f"not a kxen bundle (starts with {head[: len(BUNDLE_MAGIC)]!r})", 0)


#: Called with a bundle's refs (group -> ref name -> id) once its header is
#: read, before any object: a caller refuses there what the header shows.
JudgeRefs = Callable[[Mapping[str, Mapping[str, bytes]]], None]


@contextlib.contextmanager
def _reading(path: str, schema: Schema | None = None, io: FileIO = OS_IO,
             judge_refs: JudgeRefs | None = None, limits: BundleLimits | None = None) -> Iterator[Any]:
    try:
        f = io.open_read(path)
    except OSError as e:
        raise BadBundle(str(path), f"cannot open: {e.strerror}") from None
    with f:
        r = _open_reader(path, f, io, limits)
        if judge_refs is not None:
            judge_refs(r.header.refs)
        # A bundle is checked against the schema when every group it holds is
        # one the schema governs (a session bundle); one that mixes in other
        # groups is checked byte by byte only (and a session import refuses it).
        if schema is not None and all(schema.governs(g) for g in r.header.refs):
            r.closure.use_schema(schema)
        yield r


def verify_bundle(path: str, *, progress: Progress | None = None, schema: Schema | None = None,
                  io: FileIO = OS_IO, on_object: Callable[[RawObject], None] | None = None,
                  limits: BundleLimits | None = None) -> BundleInfo:
    """Check a bundle completely without a state dir; its refs, object count and sizes.

    Raises :class:`BadBundle` naming the first problem. With ``schema``,
    every object's shape and the kind each link and ref names are checked too.
    ``io`` opens the file. ``on_object`` sees each object once it is verified
    (the caller's look at its contents, in the same pass). ``limits``: the
    object bytes accepted (default :meth:`BundleLimits.from_env`, §12.13).
    """
    with _reading(path, schema, io, limits=limits) as r:
        _set_total(progress, r.header.objects)
        for item in r:
            if on_object is not None:
                on_object(item.obj)
            if progress:
                progress(1)
        assert r.info is not None
        return r.info


def verify_bundle_with_ref_targets(path: str, *, progress: Progress | None = None, schema: Schema | None = None,
                                   io: FileIO = OS_IO, judge_refs: JudgeRefs | None = None,
                                   limits: BundleLimits | None = None,
                                   ) -> tuple[BundleInfo, dict[ObjectId, RawObject]]:
    """:func:`verify_bundle`, also keeping the objects the bundle's refs name.

    So a caller can judge the refs (a session's binding) before it touches
    a state dir: an import refused then writes nothing, not even a state dir.
    ``judge_refs`` is called with the header's refs before any object is
    read: what the header shows is refused without reading the bundle.
    """
    with _reading(path, schema, io, judge_refs, limits) as r:
        _set_total(progress, r.header.objects)
        wanted = {oid for refs in r.header.refs.values() for oid in refs.values()}
        kept: dict[ObjectId, RawObject] = {}
        for item in r:
            if item.obj.id in wanted:
                kept[item.obj.id] = item.obj
            if progress:
                progress(1)
        assert r.info is not None
        return r.info, kept


def iter_bundle_objects(path: str, *, io: FileIO = OS_IO) -> Iterator[RawObject]:
    """Every object of a bundle, verified, decompressed, in bundle order.

    The bundle is fully checked by the time the iteration ends; a problem
    raises :class:`BadBundle` (possibly after some objects were yielded).
    """
    with _reading(path, io=io) as r:
        for item in r:
            yield item.obj
