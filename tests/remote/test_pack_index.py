"""The pack index a push writes itself is the one ``git index-pack`` writes for the same pack, byte for byte."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kxen_agent.store.gitmap import encode_indexed_pack, group_commit, objects_commit
from kxen_agent.store.objects import encode_object


def test_the_index_is_git_index_packs_and_each_object_is_in_it_once(tmp_path: Path) -> None:
    objs = [encode_object("blob", os.urandom(40) + b"text " * i) for i in range(700)]
    made = objects_commit(objs, 1_700_000_000)
    gc = group_commit("sessions/ses_0123456789", 0, {"meta": objs[0].id}, [made[-1].oid], 1_700_000_000)
    # The same object twice (two sessions sharing one) is written and indexed once.
    pack, idx = encode_indexed_pack(made + gc + made[:5])
    path = tmp_path / "p.pack"
    path.write_bytes(pack)
    subprocess.run(["git", "index-pack", "-o", str(tmp_path / "git.idx"), str(path)], check=True, capture_output=True)
    assert (tmp_path / "git.idx").read_bytes() == idx
    assert int.from_bytes(pack[8:12], "big") == len({o.oid for o in made + gc})
