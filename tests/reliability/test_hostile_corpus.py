"""Every hostile input found or crafted, replayed: refused with the typed error, in bounded memory, writing nothing.

The corpus, by kind (each file's expected error is in its directory's ``MANIFEST.json``):

- bundles: ``tests/store/hostile/`` (reused, not copied), imported into a
  *populated* state dir, which must come out byte for byte unchanged;
- object bytes, loose frames and packs: ``fuzz/hostile/`` (made by
  ``fuzz/make_corpus.py --hostile``), read from bytes, then planted in a
  populated state dir (a frame as a loose object file, a pack with its
  index) where reads and fsck must report them — never crash, never write;
- the in-memory cases of ``tests/store/hostile_cases.py``, and every
  crasher of ``fuzz/crashers/``, in the memory measurement.

Memory: a tracemalloc peak per input in this process, and the peak RSS of
one fresh interpreter that replays the whole corpus (its ``VmHWM``, which
sees libzstd's allocations too): both under 256 MiB, although several inputs
make the reader allocate the largest object there is (64 MiB).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from kxen_agent.store import BadBundle, Store, fsck, import_bundle, verify_bundle
from kxen_agent.store.objects import CorruptObject, decode_body, decompress_loose, parse_object
from kxen_agent.store.pack import BadPack, PackReader

ROOT = Path(__file__).resolve().parents[2]
BUNDLES = ROOT / "tests" / "store" / "hostile"
HOSTILE = ROOT / "fuzz" / "hostile"
CRASHERS = ROOT / "fuzz" / "crashers"
LIMIT = 256 << 20

BUNDLE_MANIFEST: dict[str, str] = json.loads((BUNDLES / "MANIFEST.json").read_text())
MANIFEST: dict[str, str] = json.loads((HOSTILE / "MANIFEST.json").read_text())
OBJECTS = sorted(n for n in MANIFEST if n.startswith("object/"))
FRAMES = sorted(n for n in MANIFEST if n.startswith("loose/"))
PACKS = sorted(n[: -len(".pack")] for n in MANIFEST if n.startswith("pack/") and n.endswith(".pack"))


# ------------------------------------------------------------------ replaying one input
# Each returns None when the input is accepted, else the reason(s) it was
# refused for; any exception other than the typed one propagates (a crash).


def replay_object(raw: bytes) -> str | None:
    try:
        decode_body(parse_object(raw, "hostile"))
    except CorruptObject as e:
        return e.reason
    return None


def replay_frame(frame: bytes) -> str | None:
    try:
        decode_body(parse_object(decompress_loose(frame, "hostile"), "hostile"))
    except CorruptObject as e:
        return e.reason
    return None


def replay_pack(pack_path: str, idx: bytes) -> list[str]:
    """Open, read every object, verify: the reasons of every refusal (empty: all good)."""
    try:
        reader = PackReader(pack_path, idx, check_name=False)
    except BadPack as e:
        return [e.reason]
    reasons = []
    try:
        for oid in reader.iter_ids():
            try:
                if reader.read_raw(oid) is None:
                    reasons.append(f"{oid.hex()} not found")
            except CorruptObject as e:  # the ObjectSource contract: nothing else
                reasons.append(e.reason)
        try:
            reader.verify()
        except BadPack as e:
            reasons.append(e.reason)
    finally:
        reader.close()
    return reasons


def replay_bundle(path: str, state_dir: str) -> str | None:
    try:
        verify_bundle(path)
        verified = None
    except BadBundle as e:
        verified = e.reason
    try:
        import_bundle(Store(state_dir), path)
    except BadBundle as e:
        assert e.reason == verified, (e.reason, verified)
        return e.reason
    assert verified is None, verified
    return None


# ------------------------------------------------------------------ a populated target state dir


def snapshot(root: str) -> dict[str, str]:
    """Every file and directory under ``root`` with a digest of its content."""
    out = {}
    for d, dirs, files in os.walk(root):
        for x in dirs:
            out[os.path.relpath(os.path.join(d, x), root) + "/"] = "dir"
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def populated(tmp_path_factory) -> str:
    """A state dir with a finished session (loose objects, refs, reflogs) and a gc'd pack."""
    from kxen_agent.runtime.runner import Runner
    from kxen_agent.session.agent_def import default_agent_definition
    from kxen_agent.store import gc
    from tests.helpers import git_workspace

    top = tmp_path_factory.mktemp("populated")
    ws = git_workspace(top / "ws")
    old = os.environ.get("KXEN_AGENT_LEASE_TTL_S")
    os.environ["KXEN_AGENT_LEASE_TTL_S"] = "3600"
    try:
        steps = [{"content": "x", "tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}}]},
                 {"content": "done"}]
        store = Store(str(top / "state"))
        res = Runner(store).start(str(ws), "populate", default_agent_definition(steps, name="hostile"))
        assert res.status == "completed"
        gc(store, prune=None)
        Runner(store).resume(res.session, task="more, loose this time")
    finally:
        if old is None:
            os.environ.pop("KXEN_AGENT_LEASE_TTL_S", None)
        else:
            os.environ["KXEN_AGENT_LEASE_TTL_S"] = old
    assert fsck(Store(str(top / "state"))).clean
    return str(top / "state")


def _copy(populated: str, tmp_path: Path) -> str:
    dst = str(tmp_path / "state")
    shutil.copytree(populated, dst)
    return dst


def _peak(fn):
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ------------------------------------------------------------------ the tests


def test_the_corpus_is_what_its_generator_makes():
    spec = importlib.util.spec_from_file_location("kxen_fuzz_make_corpus", ROOT / "fuzz" / "make_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    made = mod.hostile()
    assert set(made) == set(MANIFEST), "fuzz/hostile is stale: run fuzz/make_corpus.py --hostile"
    for rel, (data, why) in made.items():
        assert (HOSTILE / rel).read_bytes() == data and MANIFEST[rel] == why, rel
    assert len(OBJECTS) + len(FRAMES) + len(PACKS) >= 40


@pytest.mark.parametrize("name", OBJECTS)
def test_object_bytes(name):
    got, peak = _peak(lambda: replay_object((HOSTILE / name).read_bytes()))
    want = MANIFEST[name]
    assert (got is None) if not want else (got is not None and want in got), got
    assert peak < LIMIT, peak


@pytest.mark.parametrize("name", FRAMES)
def test_loose_frame_from_bytes_and_in_a_state_dir(name, populated, tmp_path):
    frame = (HOSTILE / name).read_bytes()
    got, peak = _peak(lambda: replay_frame(frame))
    want = MANIFEST[name]
    assert (got is None) if not want else (got is not None and want in got), got
    assert peak < LIMIT, peak

    # Planted as the file of an object nobody references: reads and fsck report it, write nothing.
    root = _copy(populated, tmp_path)
    oid = hashlib.sha256(b"planted " + name.encode()).digest()
    store = Store(root)
    path = store.loose.path(oid)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Path(path).write_bytes(frame)
    before = snapshot(root)
    with pytest.raises(CorruptObject):  # whatever it holds, it does not hash to this id
        Store(root).read_raw(oid)
    rep, peak = _peak(lambda: fsck(Store(root)))
    assert [p.where for p in rep.problems] == [path], rep.problems
    assert peak < LIMIT, peak
    assert snapshot(root) == before, "reading or checking a hostile loose object wrote to the state dir"


@pytest.mark.parametrize("name", PACKS)
def test_pack_from_files_and_in_a_state_dir(name, populated, tmp_path):
    pack_path = str(HOSTILE / (name + ".pack"))
    idx = (HOSTILE / (name + ".idx")).read_bytes()
    got, peak = _peak(lambda: replay_pack(pack_path, idx))
    want = MANIFEST[name + ".pack"]
    assert (not got) if not want else any(want in r for r in got), got
    assert peak < LIMIT, peak

    # Planted next to the state dir's own pack: fsck names it (or finds it good), every session reads, nothing is written.
    root = _copy(populated, tmp_path)
    pack = Path(pack_path).read_bytes()
    base = os.path.join(Store(root).pack_dir, "pack-" + (pack[-32:].hex() if len(pack) >= 32 else "0" * 64))
    shutil.copyfile(pack_path, base + ".pack")
    Path(base + ".idx").write_bytes(idx)
    before = snapshot(root)
    rep, peak = _peak(lambda: fsck(Store(root)))  # must report, not raise
    assert peak < LIMIT, peak
    if want:
        assert any(base in p.where or base in p.message for p in rep.problems), rep.problems
    else:
        assert rep.clean, rep.problems
    from kxen_agent.session.sessions import SessionStore

    ss = SessionStore(Store(root))
    for info in ss.list():
        ss.history(info.head)
    assert snapshot(root) == before, "reading or checking a hostile pack wrote to the state dir"


@pytest.mark.parametrize("name", sorted(BUNDLE_MANIFEST))
def test_bundle_into_a_populated_state_dir(name, populated, tmp_path):
    root = _copy(populated, tmp_path)
    before = snapshot(root)
    got, peak = _peak(lambda: replay_bundle(str(BUNDLES / name), root))
    want = BUNDLE_MANIFEST[name]
    assert peak < 64 << 20, peak
    if not want:
        assert got is None
        assert fsck(Store(root)).clean
        return
    assert got is not None and want in got, got
    assert snapshot(root) == before, "a refused bundle wrote to the state dir"


_REPLAY_ALL = r"""
import json, os, resource, sys, tempfile
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "store"))
from tests.reliability import test_hostile_corpus as h
import hostile_cases
from tests.fuzz import load_targets
from kxen_agent.errors import KxenError

def kib():
    # VmHWM: this process's peak RSS. (ru_maxrss would do, but Linux carries
    # it across exec from the forking parent, here the whole test session.)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

base = kib()
counts = {"inputs": 0, "refused": 0, "crashers_raising": 0}
worst = ("", 0)
def step(label, fn):
    global worst
    before = kib()
    counts["inputs"] += 1
    try:
        if fn() is not None:
            counts["refused"] += 1
    except KxenError:
        counts["refused"] += 1
    if kib() > before and kib() > worst[1]:
        worst = (label, kib())

for n in h.OBJECTS:
    step(n, lambda: h.replay_object((h.HOSTILE / n).read_bytes()))
for n in h.FRAMES:
    step(n, lambda: h.replay_frame((h.HOSTILE / n).read_bytes()))
for n in h.PACKS:
    step(n, lambda: h.replay_pack(str(h.HOSTILE / (n + ".pack")), (h.HOSTILE / (n + ".idx")).read_bytes()) or None)
for n in sorted(h.BUNDLE_MANIFEST):
    with tempfile.TemporaryDirectory() as d:
        step(n, lambda: h.replay_bundle(str(h.BUNDLES / n), d + "/s"))
for label, _expected, thunk in hostile_cases.cases():
    step(label, thunk)
targets = load_targets().TARGETS
if h.CRASHERS.is_dir():
    for t in sorted(p for p in h.CRASHERS.iterdir() if p.is_dir()):
        for f in sorted(t.iterdir()):
            def run(t=t, f=f):
                try:
                    targets[t.name](f.read_bytes())
                except BaseException:
                    counts["crashers_raising"] += 1  # test_crashers.py reports these
            step(f"{t.name}/{f.name}", run)
print(json.dumps({"baseKiB": base, "peakKiB": kib(), "worst": worst, **counts}))
"""


@pytest.mark.slow
def test_the_whole_corpus_in_a_fresh_process_stays_under_256_mib():
    p = subprocess.run([sys.executable, "-c", _REPLAY_ALL, str(ROOT)], capture_output=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr.decode()[-4000:]
    got = json.loads(p.stdout.decode().strip().splitlines()[-1])
    print(f"\nhostile corpus: {got}")
    assert got["inputs"] >= 120
    assert got["peakKiB"] * 1024 < LIMIT, got  # the whole process, interpreter included
