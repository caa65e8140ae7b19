"""Memory is bounded for every input: the real CLI, measured, on the inputs that blew it up.

Each case runs ``kxen-agent`` in a fresh process and reads its peak resident
set (``ru_maxrss`` from ``wait4``, which counts libzstd's and cbor2's C
allocations too): ``bundle verify``, ``session import`` and ``fsck`` stay
under 256 MiB whatever the bytes. A measured bound, not a timing.

The inputs are byte-valid: every checksum and id right, the CBOR canonical.
Before the decode budget (``objects_spec.md`` §2.7) a bundle holding one
``run`` object of 2**24 empty maps (a 16 MiB body) made ``bundle verify``
take 1.4 GB and ``session import`` check it whole before refusing it for
what its header already showed; a 64 MiB one took 5.4 GB. Here:

- the 2**24-empty-maps object, in both bundle forms and as a loose object;
- 64 MiB of empty maps in 2**10 arrays of 2**16: no single head is over the
  budget, so the decoder builds values until the budget runs out (the most
  an input can make it allocate);
- the largest *valid* structured object: a message whose text is 64 MiB,
  verified, imported and fsck'd (accepted, in bounded memory).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import blake3
import pytest
import zstandard

from kxen_agent.store import Store
from kxen_agent.store import codec
from kxen_agent.store.codec import MAX_BODY_ITEMS
from kxen_agent.store.objects import MAX_OBJECT_SIZE, RawObject, compress_loose
from kxen_agent.store.refs import RefUpdate
from tests.helpers import CLI_TIMEOUT_S, kxen_argv

ROOT = Path(__file__).resolve().parents[2]
LIMIT_KB = 256 << 10
SES = "ses_0123456789abcdef0123"
RUN = "run_0123456789abcdef0123"


def _corpus_helpers():
    spec = importlib.util.spec_from_file_location("kxen_hostile_bundles", ROOT / "tests" / "store" / "hostile" / "make_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


HB = _corpus_helpers()


def raw_object(kind: str, body: bytes) -> RawObject:
    """Object bytes built by hand: the encoder refuses what these tests need."""
    header = b"%s %d\x00" % (kind.encode(), len(body))
    raw = header + body
    return RawObject(blake3.blake3(raw).digest(), kind, raw, len(header))


def empty_maps(n: int) -> bytes:
    """An array of ``n`` empty maps, canonical (its head in the shortest form)."""
    return codec.encode([0] * n)[: -n] .replace(b"", b"", 0) + b"\xa0" * n if n < 24 else (
        b"\x98" + bytes([n]) if n < 256 else b"\x99" + n.to_bytes(2, "big") if n < 65536
        else b"\x9a" + n.to_bytes(4, "big")) + b"\xa0" * n


def pack_bundle(obj: RawObject, refs: dict) -> bytes:
    frame = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(obj.raw)
    ent = HB.entry(obj.id, frame, method=1, raw_len=len(obj.raw))
    return HB.bundle(HB.header_cbor(refs, order=[obj]), HB.pack_section([ent]))


def json_bundle(obj: RawObject, refs: dict) -> bytes:
    return HB.json_bundle(refs, [obj])


#: Put first on the CLI's PYTHONPATH: at exit the process writes its own peak
#: resident set (VmHWM). Not ru_maxrss from wait4: Linux carries the parent's
#: resident set at fork into the child's ru_maxrss across exec, so a child of
#: a test process that built a 64 MiB input would be charged for it.
_HWM_HOOK = """
import atexit, os

def _write_hwm():
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM:"))
    with open(os.environ["KXEN_TEST_HWM_FILE"], "w") as out:
        out.write(kb)

if os.environ.get("KXEN_TEST_HWM_FILE"):
    atexit.register(_write_hwm)
"""


def measured(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str, str, int]:
    """(exit status, stdout, stderr, peak RSS in KiB) of one ``kxen-agent`` process."""
    hook = cwd / "hwm-hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(_HWM_HOOK)
    hwm = cwd / "hwm.txt"
    hwm.unlink(missing_ok=True)
    env = dict(env, PYTHONPATH=f"{hook}{os.pathsep}{env.get('PYTHONPATH', ROOT)}", KXEN_TEST_HWM_FILE=str(hwm))
    with open(cwd / "out.txt", "wb") as out, open(cwd / "err.txt", "wb") as err:
        code = subprocess.run(kxen_argv(*args), env=env, cwd=cwd, stdout=out, stderr=err,
                              timeout=CLI_TIMEOUT_S * 5).returncode
    return (code, (cwd / "out.txt").read_text("utf-8", "replace"), (cwd / "err.txt").read_text("utf-8", "replace"),
            int(hwm.read_text()))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return dict(os.environ, KXEN_AGENT_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=str(ROOT))


def test_a_trivial_command_is_far_below_the_bound(env: dict[str, str], tmp_path: Path) -> None:
    """The baseline the figures below are read against (Python, typer, the store)."""
    code, _out, err, rss = measured(["fsck"], env, tmp_path)
    assert code == 0, err
    assert rss < 96 << 10, rss


@pytest.mark.parametrize("form", ["pack", "json"])
def test_an_object_of_2pow24_empty_maps_is_refused_at_its_first_byte(form: str, env: dict[str, str],
                                                                     tmp_path: Path) -> None:
    run = raw_object("run", empty_maps(1 << 24))
    refs = {f"sessions/{SES}": {f"runs/{RUN}": run.id}}
    path = tmp_path / f"maps.{'kxb' if form == 'pack' else 'json'}"
    path.write_bytes(pack_bundle(run, refs) if form == "pack" else json_bundle(run, refs))
    code, _out, err, rss = measured(["bundle", "verify", str(path)], env, tmp_path)
    assert code == 1
    assert err.count("\n") == 1 and "more than the 524288 items one object may hold" in err, err
    assert "array declares 16777216 elements" in err
    assert rss < LIMIT_KB, f"bundle verify peaked at {rss} KiB"


def test_session_import_judges_the_header_before_reading_any_object(env: dict[str, str], tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    tiny = tmp_path / "tiny.kxb"  # the spec's 566-byte example: one group, ses/demo, not a session
    tiny.write_bytes((ROOT / "tests" / "store" / "hostile" / "valid.kxb").read_bytes())
    code, _out, err_tiny, rss_tiny = measured(["session", "import", str(tiny), "--workspace", str(ws)], env, tmp_path)
    assert code == 2 and "ref group 'ses/demo', which is not a session" in err_tiny, err_tiny

    run = raw_object("run", empty_maps(1 << 24))
    path = tmp_path / "not-a-session.kxb"
    path.write_bytes(pack_bundle(run, {"ses/demo": {"head": run.id}}))
    code, _out, err, rss = measured(["session", "import", str(path), "--workspace", str(ws)], env, tmp_path)
    assert code == 2, err
    assert err == err_tiny.replace(str(tiny), str(path))
    # Refused from the header: the 16 MiB object was not even decompressed
    # (that alone would take 16 MiB more than the 566-byte bundle did).
    assert rss < rss_tiny + (8 << 10), f"session import peaked at {rss} KiB, {rss_tiny} KiB for a 566-byte bundle"
    assert not (tmp_path / "state").exists()


def test_session_import_refuses_what_the_header_shows_before_any_object_is_checked(tmp_path: Path) -> None:
    """In-process: a bundle whose object is garbage is refused for its header's group, never for the object."""
    from kxen_agent.session.transfer import import_sessions
    from kxen_agent.errors import UsageError

    run = raw_object("run", empty_maps(3))
    data = bytearray(pack_bundle(run, {"ses/demo": {"head": run.id}}))
    data[-40] ^= 0xFF  # inside the pack section: a checksum fails if anything reads it
    path = tmp_path / "b.kxb"
    path.write_bytes(bytes(data))
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(UsageError, match="which is not a session"):
        import_sessions(Store(str(tmp_path / "state")), str(path), str(ws))
    for refs, why in (({f"sessions/{SES}": {"head": run.id}}, "has no metadata ref"),
                      ({f"sessions/{SES}": {"meta": run.id, "tip": run.id}}, "has ref 'tip', which no session has")):
        data = bytearray(pack_bundle(run, refs))
        data[-40] ^= 0xFF
        path.write_bytes(bytes(data))
        with pytest.raises(UsageError, match=why):
            import_sessions(Store(str(tmp_path / "state")), str(path), str(ws))
    assert not (tmp_path / "state").exists()


def test_import_of_a_session_bundle_with_the_hostile_run_is_refused_in_bounded_memory(
        env: dict[str, str], tmp_path: Path) -> None:
    meta = raw_object("session", empty_maps(1 << 24))  # the kind the meta ref asks for: its body is judged
    path = tmp_path / "session.kxb"
    path.write_bytes(pack_bundle(meta, {f"sessions/{SES}": {"meta": meta.id}}))
    ws = tmp_path / "ws"
    ws.mkdir()
    code, _out, err, rss = measured(["session", "import", str(path), "--workspace", str(ws)], env, tmp_path)
    assert code == 1 and "more than the 524288 items" in err, err
    assert rss < LIMIT_KB, f"session import peaked at {rss} KiB"
    assert not (tmp_path / "state").exists()


def test_many_small_containers_are_built_only_until_the_budget_runs_out(env: dict[str, str],
                                                                       tmp_path: Path) -> None:
    # 2**10 arrays of 2**16 empty maps: 64 MiB + heads, each head within the
    # budget, so the strict decoder builds maps until the 8th array's head.
    inner = b"\x9a" + (1 << 16).to_bytes(4, "big") + b"\xa0" * (1 << 16)
    body = b"\x99" + (1 << 10).to_bytes(2, "big") + inner * (1 << 10)
    body = body[: MAX_OBJECT_SIZE]  # the last array is cut short: the budget refuses long before
    run = raw_object("run", body)
    path = tmp_path / "arrays.kxb"
    path.write_bytes(pack_bundle(run, {"other/x": {"r": run.id}}))
    code, _out, err, rss = measured(["bundle", "verify", str(path)], env, tmp_path)
    assert code == 1
    assert "array declares 65536 elements, more than the 524288 items one object may hold" in err, err
    assert rss < LIMIT_KB, f"bundle verify peaked at {rss} KiB"


def _message_64mib() -> RawObject:
    # {"seq": 0, "role": "user", "content": <text>}: the largest body there is.
    prefix = b"\xa3" + b"\x63seq\x00" + b"\x64role\x64user" + b"\x67content" + b"\x7a"
    n = MAX_OBJECT_SIZE - len(prefix) - 4
    return raw_object("message", prefix + n.to_bytes(4, "big") + b"a" * n)


def test_the_largest_valid_object_is_verified_imported_and_fsckd_in_bounded_memory(
        env: dict[str, str], tmp_path: Path) -> None:
    msg = _message_64mib()
    assert len(msg.raw) - msg.body_offset == MAX_OBJECT_SIZE
    path = tmp_path / "big.kxb"
    path.write_bytes(pack_bundle(msg, {"other/big": {"head": msg.id}}))
    code, _out, err, rss = measured(["bundle", "verify", str(path)], env, tmp_path)
    assert code == 0, err
    assert rss < LIMIT_KB, f"bundle verify peaked at {rss} KiB"

    _plant_loose(Store(env["KXEN_AGENT_STATE_DIR"], namespaces=("sessions",)), msg, "other/big")
    code, out, err, rss = measured(["fsck", "--json"], env, tmp_path)
    assert code == 0, err
    assert json.loads(out)["clean"] and json.loads(out)["bytes"] == len(msg.raw)
    assert rss < LIMIT_KB, f"fsck peaked at {rss} KiB"


def _plant_loose(store: Store, obj: RawObject, group: str) -> None:
    """``obj`` as a loose file and a ref naming it, bypassing the encoder's budget."""
    store.ensure_initialized()
    path = store.loose.path(obj.id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(compress_loose(obj.raw))
    store.refs.transaction(group, [RefUpdate("r", None, obj.id)], reason="planted")


def test_fsck_reports_the_hostile_loose_object_in_bounded_memory(env: dict[str, str], tmp_path: Path) -> None:
    run = raw_object("run", empty_maps(1 << 24))
    _plant_loose(Store(env["KXEN_AGENT_STATE_DIR"], namespaces=("sessions",)), run, "other/x")
    code, out, err, rss = measured(["fsck", "--json"], env, tmp_path)
    assert code == 1, err
    problems = json.loads(out)["problems"]
    # Named once, as damage with the ref that reaches it (not again as a missing object).
    assert [p["kind"] for p in problems] == ["corrupt-object"], problems
    assert problems[0]["message"].endswith("reached from other/x/r"), problems
    assert "more than the 524288 items one object may hold" in problems[0]["message"]
    assert rss < LIMIT_KB, f"fsck peaked at {rss} KiB"


def test_the_budget_is_the_spec_s() -> None:
    assert MAX_BODY_ITEMS == 524288
    assert "at most 524 288 data items" in " ".join((ROOT / "objects_spec.md").read_text().split())


def test_inputs_are_byte_valid() -> None:
    """The hostile objects break the budget only: canonical CBOR item by item."""
    import cbor2

    small = empty_maps(5)
    assert cbor2.dumps(cbor2.loads(small)) == small
    assert json.loads(json_bundle(raw_object("run", small), {"a/b": {"r": b"\0" * 32}}))["objectCount"] == 1
    assert base64.b64decode(json.loads(json_bundle(raw_object("run", small), {"a/b": {"r": b"\0" * 32}}))
                            ["objects"][0]["bytes"]).endswith(small)
