"""Replay the hostile-bundle corpus (tests/store/hostile/): each file is refused with one
clear BadBundle, by verify and by import, writing nothing, in bounded memory and time."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from kxen_agent.cli import main as cli_main
from kxen_agent.cli.store_cmds import register
from kxen_agent.store import Store, fsck
from kxen_agent.store.bundle import BadBundle, import_bundle, verify_bundle

HOSTILE = Path(__file__).parent / "hostile"
MANIFEST: dict[str, str] = json.loads((HOSTILE / "MANIFEST.json").read_text())
BAD = sorted(n for n, why in MANIFEST.items() if why)
GOOD = sorted(n for n, why in MANIFEST.items() if not why)


def _make_corpus():
    spec = importlib.util.spec_from_file_location("make_corpus", HOSTILE / "make_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_corpus_is_what_its_generator_makes():
    mc = _make_corpus()
    assert mc.check(str(HOSTILE)) == []
    files = {p.name for p in HOSTILE.iterdir() if p.is_file()} - {"make_corpus.py", "MANIFEST.json"}
    assert files == set(MANIFEST) == set(mc.corpus())
    assert len(BAD) >= 60


@pytest.mark.parametrize("name", GOOD)
def test_the_valid_controls_verify_and_import(name, tmp_path):
    info = verify_bundle(str(HOSTILE / name))
    res = import_bundle(Store(str(tmp_path / "s")), str(HOSTILE / name))
    assert res.new_objects == info.objects > 0 and fsck(Store(str(tmp_path / "s"))).clean


@pytest.mark.parametrize("name", BAD)
def test_a_hostile_bundle_is_refused_writing_nothing(name, tmp_path):
    path = str(HOSTILE / name)
    expect = MANIFEST[name]
    store = Store(str(tmp_path / "s"))
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(BadBundle) as verified:
            verify_bundle(path)
        with pytest.raises(BadBundle) as imported:
            import_bundle(store, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    elapsed = time.monotonic() - t0
    assert expect in verified.value.reason, verified.value.reason
    assert imported.value.reason == verified.value.reason
    assert "\n" not in str(verified.value) and path in str(verified.value)
    assert peak < 64 << 20 and elapsed < 10, (peak, elapsed)
    s = Store(store.root)
    assert list(s.refs.groups()) == [] and list(s.iter_ids()) == []
    assert not os.path.isdir(s.pack_dir) or os.listdir(s.pack_dir) == []
    assert fsck(s).clean


def test_bundle_verify_prints_one_line_and_exits_non_zero(tmp_path, capsys, monkeypatch):
    register(cli_main.app)
    monkeypatch.setenv("KXEN_AGENT_STATE_DIR", str(tmp_path / "unused"))
    for name in BAD:
        assert cli_main.main(["bundle", "verify", str(HOSTILE / name)]) == 1, name
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith("kxen-agent: error: bad bundle"), (name, err)
        assert MANIFEST[name] in lines[0]
        assert cli_main.main(["bundle", "verify", "--json", str(HOSTILE / name)]) == 1
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "unused")


REPLAY = r"""
import json, resource, sys, tempfile
from kxen_agent.store import Store
from kxen_agent.store.bundle import BadBundle, import_bundle, verify_bundle
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
refused = 0
for path in sys.argv[1:]:
    with tempfile.TemporaryDirectory() as d:
        for fn in (lambda: verify_bundle(path), lambda: import_bundle(Store(d + "/s"), path)):
            try:
                fn()
            except BadBundle:
                refused += 1
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"refused": refused, "baseKiB": base, "peakKiB": peak}))
"""


@pytest.mark.slow
def test_the_whole_corpus_in_a_fresh_process_stays_small():
    r = subprocess.run([sys.executable, "-c", REPLAY, *(str(HOSTILE / n) for n in BAD)], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    got = json.loads(r.stdout)
    assert got["refused"] == 2 * len(BAD)
    assert got["peakKiB"] - got["baseKiB"] < 256 * 1024, got
