"""The one-pass closure check of a bundle's objects, and the verified item a reader yields.

Owns ``objects_spec.md`` §12.5's ordering rule: objects come parents first,
each after an object that links to it or the ref that names it, so one
streaming pass that remembers only ids checks that a bundle holds exactly
the closure of its refs — nothing missing, nothing extra, nothing twice —
and, with a :class:`~kxen_agent.store.objects.Schema`, the shape of every
object and the kind each link and ref names.

It must never read a file or a stream: both bundle forms' readers feed it
objects (:mod:`.pack_form`, :mod:`.json_form`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..objects import CorruptObject, ObjectId, RawObject, Schema, SchemaViolation, a_kind, decode_body, links_of
from .header import BadBundle, _Header

__all__: list[str] = []  # private to the bundle package


@dataclass(slots=True)
class _Item:
    obj: RawObject
    head: bytes  # the entry header (pack form), for copying verbatim
    stored: bytes
    offset: int
    crc: int = 0  # the entry's CRC (pack form), checked over head and stored


class _Closure:
    """Checks, in one pass, that the objects are exactly the closure of the refs."""

    def __init__(self, hdr: _Header, where: str) -> None:
        self.where = where
        self.hdr = hdr
        # id -> who asked for it: "ref G/R", or the id of the linking object
        self.pending: dict[ObjectId, str | bytes] = {}
        for g in sorted(hdr.refs):
            for name, oid in sorted(hdr.refs[g].items()):
                self.pending.setdefault(oid, f"ref {g}/{name}")
        self.seen: set[ObjectId] = set()
        self.content = hdr.content_digest()  # fed each id in order (§12.7)
        self.count = 0
        self.bytes = 0
        self.kinds: dict[str, int] = {}
        self.schema: Schema | None = None

    def use_schema(self, schema: Schema) -> None:
        """Also check every object's shape and the kind each link and ref names (before any object)."""
        self.schema = schema
        self.kind_of: dict[ObjectId, str] = {}
        # id -> (kind it must be, who says so)
        self.expect: dict[ObjectId, tuple[str, str | bytes]] = {}
        for g in sorted(self.hdr.refs):
            for name, oid in sorted(self.hdr.refs[g].items()):
                k = schema.ref_kind(g, name)
                if k is not None:
                    self._expect(oid, k, f"ref {g}/{name}", None, "byte")

    def add(self, obj: RawObject, offset: int | None, unit: str = "byte") -> None:
        where = self.where
        if obj.id in self.seen:
            raise BadBundle(where, f"object {obj.hex} appears twice (duplicate entry)", offset, unit)
        if self.pending.pop(obj.id, None) is None:
            raise BadBundle(
                where,
                f"object {obj.hex} is not reachable from the refs at this point "
                "(each object must follow an object that links to it)",
                offset, unit,
            )
        if self.count >= self.hdr.objects:
            raise BadBundle(where, f"more objects than the {self.hdr.objects} the header declares", offset, unit)
        self.charge(len(obj.raw), offset, unit)
        kind = obj.kind
        self.seen.add(obj.id)
        self.content.update(obj.id)
        self.count += 1
        self.bytes += len(obj.raw)
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if self.schema is not None:
            self.kind_of[obj.id] = kind
            want = self.expect.pop(obj.id, None)
            if want is not None and want[0] != kind:
                raise BadBundle(where, f"{self._who(want[1])} must name {a_kind(want[0])} object, "
                                f"but object {obj.hex} is {a_kind(kind)}", offset, unit)
        if kind == "blob":  # raw bytes: nothing to decode, no links
            return
        try:
            value = decode_body(obj)
        except CorruptObject as e:
            raise BadBundle(where, f"object {obj.hex}: {e.reason}", offset, unit) from None
        seen, pending = self.seen, self.pending
        for child in links_of(kind, value):
            if child not in seen and child not in pending:
                # who asked for it: the linking object's id (named in an error only)
                pending[child] = obj.id
        if self.schema is not None:
            try:
                typed = self.schema.check(kind, value)
            except SchemaViolation as e:
                raise BadBundle(where, f"object {obj.hex} ({kind}): {e}", offset, unit) from None
            for child, k in typed:
                self._expect(child, k, obj.id, offset, unit)

    def charge(self, raw_len: int, offset: int | None, unit: str = "byte") -> None:
        """Refuse an object of ``raw_len`` bytes that would take the objects past the header's ``size``.

        The pack form asks before it decompresses an entry (its ``raw_len``
        is exact, §12.3), so no reader ever decompresses or hashes more than
        the header declared, which :func:`~.header.check_header_limits`
        bounded before the first object.
        """
        if self.bytes + raw_len > self.hdr.size:
            raise BadBundle(self.where, f"the objects hold more than the {self.hdr.size} object bytes the header "
                            f"declares (this one has {raw_len})", offset, unit)

    def _expect(self, oid: ObjectId, kind: str, who: str | bytes, offset: int | None, unit: str) -> None:
        seen_kind = self.kind_of.get(oid)
        if seen_kind is None:
            self.expect.setdefault(oid, (kind, who))
            if self.expect[oid][0] != kind:
                raise BadBundle(self.where, f"object {oid.hex()} must be {a_kind(self.expect[oid][0])} for "
                                f"{self._who(self.expect[oid][1])} and {a_kind(kind)} for {self._who(who)}", offset, unit)
        elif seen_kind != kind:
            raise BadBundle(self.where, f"{self._who(who)} must name {a_kind(kind)} object, "
                            f"but object {oid.hex()} is {a_kind(seen_kind)}", offset, unit)

    def _who(self, who: str | bytes) -> str:
        return who if isinstance(who, str) else f"object {who.hex()}"

    def finish(self, offset: int | None, unit: str = "byte") -> None:
        if self.pending:
            oid, asker = next(iter(self.pending.items()))
            who = self._who(asker)
            verb = "points to" if who.startswith("ref ") else "links to"
            raise BadBundle(self.where, f"{who} {verb} object {oid.hex()}, which the bundle does not contain", offset, unit)
        if self.count != self.hdr.objects:
            raise BadBundle(self.where, f"header declares {self.hdr.objects} objects, the bundle holds {self.count}", offset, unit)
        if self.bytes != self.hdr.size:
            raise BadBundle(self.where, f"header declares {self.hdr.size} object bytes, the objects hold {self.bytes}", offset, unit)
