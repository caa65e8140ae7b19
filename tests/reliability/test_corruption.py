"""Corruption torture: the normal workloads' state dirs, one file damaged at a time, then fsck and repair.

For each trial one file of a finished workload's state dir (a loose
object, a pack, an index, a step log, a ref file, a reflog) gets random
bits flipped, a random range zeroed, or is truncated at a random length.
Then (``objects_spec.md`` §18):

- nothing raises anything but the library's own errors (a command would
  print one line, never a traceback): fsck, the sessions' classification,
  reading and exporting each session, repair;
- fsck names the damaged file — except where the format cannot tell
  (a ref file or reflog has no checksum: a flipped digit can be another
  valid file; a step log cut at a record boundary, or in its last record,
  is a torn append by the record rule, §6.8): those are counted, not failed;
- every session fsck calls intact still reads and exports, and one of them
  still forks (a durable step: the store still writes);
- ``repair --from`` a bundle made after the last write brings fsck back to
  clean with no acknowledged message lost (each session's head, or its new
  branch's, is the one it had);
- ``repair --apply`` with no source leaves fsck clean, every object of every
  step record that still checked readable, and no group's fence lowered.

The default run is a seeded subset (``TRIALS_FAST``); ``KXEN_TEST_LONG=1``
runs ``TRIALS_LONG`` (RELIABILITY.md, "Corruption torture"). A failing
trial's seed and mutation are in the assertion message: ``KXEN_CORRUPTION_SEED``
and ``KXEN_CORRUPTION_TRIALS`` rerun it alone.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kxen_agent.errors import KxenError
from kxen_agent.session.damage import classify
from kxen_agent.session.repair import bundle_source, _on_lost
from kxen_agent.session.schema import SESSION_SCHEMA
from kxen_agent.session.sessions import NS, SessionStore
from kxen_agent.store import Store, fsck
from kxen_agent.store.bundle import export_bundle
from kxen_agent.store.objects import decompress_loose, parse_object
from kxen_agent.store.repair import repair
from kxen_agent.store.salvage import salvage_log
from tests.helpers import depth

from .crashsim import FastIO, open_store, quiet_lease, scratch_dir
from .workloads import AutoPackWorkload, ForkWorkload, GcWorkload, ImportWorkload, LooseWorkload, RunWorkload

pytestmark = pytest.mark.slow

TRIALS_FAST = 24
TRIALS_LONG = 2000
KINDS = ("flip", "zero", "truncate")


def _templates(top: str) -> list[tuple[str, str, list[str]]]:
    """(name, state dir, the bundle of every session made after the last write) per workload."""
    out = []
    with quiet_lease():
        for w in (RunWorkload(), ForkWorkload(), GcWorkload(), ImportWorkload(), AutoPackWorkload(),
                  LooseWorkload()):
            root = os.path.join(top, w.name)
            aux = os.path.join(root, "aux")
            os.makedirs(aux)
            w.setup(root, aux)
            store = open_store(os.path.join(root, "state"), io=FastIO())
            w.run(store)
            ids = [i.id for i in SessionStore(store).list()]
            bundle = os.path.join(root, "all.bundle")
            groups = [g for g in store.refs.groups() if store.refs.read(g).deleted_ns is None
                      and store.refs.read(g).refs]
            export_bundle(store, groups, bundle)
            out.append((w.name, os.path.join(root, "state"), ids))
    return out


def _files(state: str) -> list[str]:
    out = []
    for top in ("objects", "refs", "logs", "steps"):
        for d, _dirs, files in os.walk(os.path.join(state, top)):
            out += [os.path.join(d, f) for f in files if not f.startswith("tmp_")]
    return sorted(out)


def _kind_of(state: str, path: str) -> str:
    rel = os.path.relpath(path, state)
    if rel.startswith("objects/pack/"):
        return "idx" if rel.endswith(".idx") else "pack"
    return rel.split(os.sep)[0]  # objects | refs | logs | steps


def _mutate(rng: random.Random, path: str) -> str:
    data = bytearray(open(path, "rb").read())
    kind = rng.choice(KINDS)
    if not data:
        kind = "truncate"
    if kind == "flip":
        n = rng.randint(1, 3)
        at = [rng.randrange(len(data)) for _ in range(n)]
        for a in at:
            data[a] ^= 1 << rng.randrange(8)
        what = f"flip bits at {at}"
    elif kind == "zero":
        a = rng.randrange(len(data))
        b = min(len(data), a + rng.randint(1, 64))
        data[a:b] = bytes(b - a)
        what = f"zero [{a}, {b})"
    else:
        cut = rng.randrange(len(data)) if data else 0
        what = f"truncate to {cut} of {len(data)} bytes"
        del data[cut:]
    with open(path, "wb") as f:
        f.write(data)
    return what


@dataclass
class Tally:
    trials: int = 0
    by_file: dict[str, int] = field(default_factory=dict)
    undetected: dict[str, int] = field(default_factory=dict)
    no_change: int = 0
    #: Undetectable cuts of a step log that took a fence raise with the records they cut.
    fence_lost_with_cut: int = 0
    failures: list[str] = field(default_factory=list)


def _heads(store: Store) -> dict[str, bytes | None]:
    ss = SessionStore(store)
    return {i.id: i.head for i in ss.list(include_deleted=True)}


def _fences(store: Store) -> dict[str, int]:
    out = {}
    for g in store.refs.groups():
        try:
            out[g] = store.refs.read(g).fence
        except KxenError:
            pass
    return out


def _record_objects(store: Store) -> dict[bytes, bytes]:
    """The object bytes of every step record that checks, in every step log (damaged or not)."""
    out: dict[bytes, bytes] = {}
    for g in store.steps.groups():
        path = store.steps.path(g)
        try:
            data = open(path, "rb").read()
        except OSError:
            continue
        sal = salvage_log(store.io, path, g, (0, 1, 2, 3))
        if sal is None:
            try:
                log = store.steps.load(g, fresh=True)
            except KxenError:
                continue
            recs = log.records if log is not None else []
        else:
            recs = sal.records
        for r in recs:
            for oid, at, n in r.objects:
                try:
                    out[oid] = parse_object(decompress_loose(data[at:at + n], path), path, expect_id=oid).raw
                except KxenError:
                    pass
    return out


def _reads_same(store: Store, path: str, before: bytes) -> bool:
    """Whether the loose file at ``path`` still holds the object it held (``before``: its old bytes)."""
    try:
        old = parse_object(decompress_loose(before, path), path)
        new = parse_object(decompress_loose(open(path, "rb").read(), path), path)
    except KxenError:
        return False
    return old.raw == new.raw


def _reads_as_torn(store: Store, state: str, path: str) -> bool:
    """Whether the step log at ``path`` still reads (its damage looks like a torn append)."""
    rel = os.path.relpath(path, os.path.join(state, "steps")).split(os.sep)
    try:
        store.steps.load("/".join(rel[:2]), fresh=True)
        return True
    except (KxenError, ValueError):
        return False


def _named(rep, state: str, path: str) -> bool:
    rel = os.path.relpath(path, state)
    group = "/".join(rel.split(os.sep)[1:3]) if rel.split(os.sep)[0] in ("refs", "logs", "steps") else None
    texts = [f"{p.where} {p.message}" for p in rep.problems] + rep.stray_files
    return any(path in t or (group and group in t) for t in texts)


def _one(rng: random.Random, seed: int, name: str, template: str, sessions: list[str], work: str, tally: Tally) -> None:
    state = os.path.join(work, "state")
    shutil.copytree(template, state, symlinks=True)
    bundle = os.path.join(os.path.dirname(template), "all.bundle")
    files = _files(state)
    target = rng.choice(files)
    before = open(target, "rb").read()
    clean = open_store(state, io=FastIO())
    heads = _heads(clean)
    fences = _fences(clean)
    others = {g: clean.refs.read(g).refs for g in clean.refs.groups() if not g.startswith(f"{NS}/")}
    kind = _kind_of(state, target)
    what = _mutate(rng, target)
    tag = f"seed {seed} {name}: {os.path.relpath(target, state)} ({kind}): {what}"
    tally.by_file[kind] = tally.by_file.get(kind, 0) + 1
    if open(target, "rb").read() == before:
        tally.no_change += 1
        return
    store = open_store(state, io=FastIO())
    try:
        rep = fsck(store, schema=SESSION_SCHEMA)
        sessions_now = classify(store, rep.unreadable_groups) if not rep.clean else [
            {"id": i.id, "state": "intact"} for i in SessionStore(store).list(include_deleted=True)]
    except KxenError as e:
        tally.failures.append(f"{tag}: fsck raised {e}")
        return
    except Exception as e:  # a traceback in the CLI
        tally.failures.append(f"{tag}: fsck raised {type(e).__name__}: {e}")
        return
    undetected = False
    if rep.clean and kind == "objects" and _reads_same(store, target, before):
        tally.no_change += 1  # a frame flag that decodes to the very same object: nothing is damaged
        return
    if rep.clean or not _named(rep, state, target):
        # What the format cannot tell (see the module docstring): counted, then the rest still checked.
        # A step log that its reader still reads (the damage broke both checks of its last record, which
        # is then a torn append) is one: the record rule cannot tell it from a crash (§6.8).
        if kind in ("refs", "logs") or (kind == "steps" and (what.startswith("truncate")
                                                             or _reads_as_torn(store, state, target))):
            tally.undetected[kind] = tally.undetected.get(kind, 0) + 1
            undetected = True
        else:
            tally.failures.append(f"{tag}: fsck does not name the file: {[p.line() for p in rep.problems]}")
            return
    # Sessions that do not reach the damage still read and export; one still forks.
    ss = SessionStore(store)
    intact = [s["id"] for s in sessions_now if s["state"] == "intact"]
    try:
        for ses in intact:
            info = ss.get(ses, include_deleted=True)
            ss.history(info.head)
            export_bundle(store, [f"{NS}/{ses}"], os.path.join(work, f"{ses}.bundle"))
        live = [s for s in intact if ss.get(s, include_deleted=True).deleted_ns is None]
        if live:
            try:
                ss.fork(rng.choice(live))
            except KxenError as e:  # a refusal in words (a fork point inside a turn), not a failure
                if "cannot fork" not in str(e):
                    raise
    except Exception as e:
        tally.failures.append(f"{tag}: an intact session failed: {type(e).__name__}: {e}")
        return
    # Repair from the bundle made after the last write: clean, no acknowledged message lost.
    fixed = os.path.join(work, "fixed")
    shutil.copytree(state, fixed, symlinks=True)
    try:
        fstore = open_store(fixed, io=FastIO())
        r = repair(fstore, sources=[bundle_source(bundle)], apply=True, on_lost=_on_lost, schema=SESSION_SCHEMA)
        after = fsck(open_store(fixed, io=FastIO()), schema=SESSION_SCHEMA)
    except Exception as e:
        tally.failures.append(f"{tag}: repair --from raised {type(e).__name__}: {e}")
        return
    if not after.clean:
        tally.failures.append(f"{tag}: repair --from left {[p.line() for p in after.problems]}; "
                              f"did {[a.line() for a in r.actions]}")
        return
    now = _heads(open_store(fixed, io=FastIO()))
    by_parent: dict[str, list[bytes | None]] = {}
    fss = SessionStore(open_store(fixed, io=FastIO()))
    for info in fss.list(include_deleted=True):
        by_parent.setdefault(info.meta.get("parentId") or "", []).append(info.head)
    for ses, head in heads.items():
        if undetected:
            break  # nothing tells what was lost: `session import` of the bundle brings it back, as ever
        if now.get(ses, b"?") != head and head not in by_parent.get(ses, []):
            tally.failures.append(f"{tag}: repair --from lost session {ses}'s head; did "
                                  f"{[a.line() for a in r.actions]}")
            return
    fixed_store = open_store(fixed, io=FastIO())
    for g, refs in others.items():
        if not undetected and fixed_store.refs.read(g).refs != refs:
            tally.failures.append(f"{tag}: repair --from changed group {g}: {fixed_store.refs.read(g).refs}")
            return
    # Repair with no source: clean, every record that checked still reads, no fence lowered. Where the
    # format cannot tell the damage (a step log cut at or in its last records: a torn append, §6.8), the
    # cut took its records' fence raises with it, invisibly: repair is then held to the fences it found.
    kept = _record_objects(open_store(state, io=FastIO()))
    if undetected or (kind == "steps" and what.startswith("truncate")):
        # A cut step log is a torn append by the record rule, whatever else fsck sees: the fence raises it
        # took are invisible to every reader, repair too.
        found = _fences(open_store(state, io=FastIO()))
        if any(g in found and found[g] < f for g, f in fences.items()):
            tally.fence_lost_with_cut += 1
        fences = {**fences, **found}
    try:
        store = open_store(state, io=FastIO())
        r = repair(store, apply=True, on_lost=_on_lost, schema=SESSION_SCHEMA)
        store = open_store(state, io=FastIO())
        after = fsck(store, schema=SESSION_SCHEMA)
    except Exception as e:
        tally.failures.append(f"{tag}: repair --apply raised {type(e).__name__}: {e}")
        return
    if not after.clean:
        tally.failures.append(f"{tag}: repair --apply left {[p.line() for p in after.problems]}; "
                              f"did {[a.line() for a in r.actions]}")
        return
    for oid, raw in kept.items():
        try:
            if store.read_raw(oid).raw != raw:
                raise KxenError("different bytes")
        except KxenError as e:
            tally.failures.append(f"{tag}: object {oid.hex()} of a record that checked is lost: {e}")
            return
    for g, f in _fences(store).items():
        if g in fences and f < fences[g]:
            tally.failures.append(f"{tag}: {g}'s fence went from {fences[g]} down to {f}")
            return


def run_torture(trials: int, seed: int) -> Tally:
    tally = Tally()
    base = scratch_dir()
    top = tempfile.mkdtemp(prefix="kxen-corrupt-", dir=base)
    try:
        templates = _templates(os.path.join(top, "templates"))
        rng = random.Random(seed)
        with quiet_lease():
            only = os.environ.get("KXEN_CORRUPTION_ONLY")  # "workload:seed", from a failure's message
            for i in range(trials):
                name, template, sessions = templates[i % len(templates)]
                s = rng.randrange(1 << 30)
                if only:
                    if i:
                        break
                    want, _, sd = only.partition(":")
                    name, template, sessions = next(t for t in templates if t[0] == want)
                    s = int(sd)
                work = os.path.join(top, f"t{i}")
                os.makedirs(work)
                try:
                    _one(random.Random(s), s, name, template, sessions, work, tally)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                tally.trials += 1
    finally:
        shutil.rmtree(top, ignore_errors=True)
    return tally


def test_corruption_torture() -> None:
    trials = int(os.environ.get("KXEN_CORRUPTION_TRIALS") or depth(fast=TRIALS_FAST, long=TRIALS_LONG))
    seed = int(os.environ.get("KXEN_CORRUPTION_SEED") or 20261205)
    tally = run_torture(trials, seed)
    print(f"corruption torture: {tally.trials} trials, files {tally.by_file}, unchanged {tally.no_change}, "
          f"undetectable by the format {tally.undetected} (of which a cut took a fence raise: "
          f"{tally.fence_lost_with_cut}), failures {len(tally.failures)}")
    assert not tally.failures, "\n".join(tally.failures[:20])
