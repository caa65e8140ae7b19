"""A push's pack compressed by two threads is the single-threaded pack, byte for byte (and so is its index)."""

from __future__ import annotations

import os

from kxen_agent.session.push_pack import THREADED_FROM, indexed_pack
from kxen_agent.store.gitmap import encode_indexed_pack, group_commit, objects_commit
from kxen_agent.store.objects import encode_object


def test_the_threaded_pack_is_the_plain_one() -> None:
    objs = [encode_object("blob", os.urandom(30) + b"words of a message " * (i % 50))
            for i in range(THREADED_FROM + 77)]
    made = objects_commit(objs, 1_700_000_000)
    gc = group_commit("sessions/ses_0123456789", 0, {"meta": objs[0].id}, [made[-1].oid], 1_700_000_000)
    given = made + gc + made[:9]  # an object given twice is packed once
    assert len(given) > THREADED_FROM
    assert indexed_pack(given) == encode_indexed_pack(given)
    small = made[:50]
    assert indexed_pack(small) == encode_indexed_pack(small)
