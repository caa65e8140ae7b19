"""Every input that ever crashed a fuzz target (``fuzz/crashers/<target>/``), replayed.

A crasher stays committed forever: its test fails again if the bug returns.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kxen_agent.store import Store, fsck, gc
from kxen_agent.store.objects import CorruptObject

from . import load_targets

_targets = load_targets()
TARGETS = _targets.TARGETS
split_pack_input = _targets.split_pack_input
ROOT = Path(__file__).resolve().parents[2]
CRASHERS = ROOT / "fuzz" / "crashers"
FILES = sorted(
    (d.name, f.name) for d in CRASHERS.iterdir() if d.is_dir() for f in d.iterdir() if f.is_file()
) if CRASHERS.is_dir() else []


def test_crashers_are_filed_under_a_known_target():
    for target, _name in FILES:
        assert target in TARGETS, f"fuzz/crashers/{target}/ is not a fuzz target ({', '.join(TARGETS)})"


@pytest.mark.parametrize(("target", "name"), FILES, ids=[f"{t}/{n}" for t, n in FILES])
def test_crasher_no_longer_crashes(target, name):
    TARGETS[target]((CRASHERS / target / name).read_bytes())


# ------------------------------------------------------------------ the bugs, stated directly


def _install_pack(store: Store, data: bytes) -> str:
    idx, pack = split_pack_input(data)
    os.makedirs(store.pack_dir, exist_ok=True)
    base = os.path.join(store.pack_dir, "pack-" + pack[-32:].hex())
    Path(base + ".pack").write_bytes(pack)
    Path(base + ".idx").write_bytes(idx)
    return base + ".pack"


def test_a_pack_whose_zstd_dictionary_does_not_load_is_reported_not_fatal(tmp_path):
    """pack/unusable-dictionary-min: the header CRC is right, libzstd refuses the dictionary.

    fsck must name the pack (not abort with "bad pack dictionary: ... run
    'kxen-agent fsck'"), reading its objects must raise CorruptObject (the
    ObjectSource contract fsck and gc rely on), and gc must not crash on it.
    """
    store = Store(str(tmp_path / "state"))
    store.put("blob", b"an object outside the pack")
    path = _install_pack(store, (CRASHERS / "pack" / "unusable-dictionary-min").read_bytes())
    store = Store(store.root)
    rep = fsck(store)  # raised BadPack before the fix
    assert not rep.clean and any(path in p.where or path in p.message for p in rep.problems), rep.problems
    for p in store.packs:
        for oid in p.iter_ids():
            try:
                p.read_raw(oid)
            except CorruptObject:
                pass
    shutil.copytree(store.root, tmp_path / "copy")
    gc(Store(str(tmp_path / "copy")), prune=None)
