"""No secret reaches a state dir or a bundle: planted secrets from every source, looked for in every byte.

Sources planted (``objects_spec.md`` §14.11): credential-looking variables
of the runner that the agent does not name (printed by ``env`` and by
``echo``), the agent's API key, the user-info of ``git remote -v`` (a
token in the remote's URL), token formats and a private key in a
workspace file (``cat`` and ``read_file``), the task text, what the model
answers (content and tool-call arguments) and a provider's error message.
Runs go through the real CLI, a real Git workspace, the script provider
and a fake Chat Completions server.

Looked for in every file of the state dir — raw, inside every zstd frame
(loose objects) and every pack entry (with the pack's dictionary) — after
gc too, and in both bundle forms: the pack form's entries decompressed,
the JSON form's objects decoded from base64. None is found; what the model
was sent is redacted too. A control plants a token past the runner (a
message written with the library) and shows the same search finds it, in
every place, and that ``bundle verify`` warns (exit 0, the token never
printed) and ``session export --scan`` refuses to write (exit 1) unless
``--allow-secrets``.
"""

from __future__ import annotations

import base64
import json
import secrets as rnd
import struct
from pathlib import Path
from typing import Iterator

import pytest
import zstandard

from tests.helpers import Cli, git, git_workspace, write_agent
from tests.runtime.test_openai_run import SequencedOpenAI

ZSTD_MAGIC = bytes.fromhex("28b52ffd")


def _alnum(n: int) -> str:
    return "".join(rnd.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") for _ in range(n))


# ------------------------------------------------------------------ every byte of a file, expanded


def _pack_entries(pack: bytes) -> Iterator[bytes]:
    """Each entry's object bytes (§12.2-§12.3), parsed here with struct: not the store's reader."""
    dlen = struct.unpack_from(">I", pack, 8)[0]
    d = pack[12 : 12 + dlen]
    plain = zstandard.ZstdDecompressor()
    with_dict = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(d)) if dlen else None
    pos = 12 + dlen + 4
    while pack[pos : pos + 4] == b"\x8bKXE":
        method = pack[pos + 4]
        raw_len, stored_len = struct.unpack_from(">QQ", pack, pos + 37)
        stored = pack[pos + 57 : pos + 57 + stored_len]
        yield stored if method == 0 else (with_dict if method == 2 else plain).decompress(stored, max_output_size=raw_len)
        pos += 57 + stored_len


def expansions(path: Path) -> Iterator[tuple[str, bytes]]:
    """The file's bytes; each zstd frame in it, decompressed; a pack's or pack-form bundle's entries;
    a JSON bundle's objects decoded from base64."""
    data = path.read_bytes()
    yield str(path), data
    at = data.find(ZSTD_MAGIC)
    while at >= 0:  # a frame anywhere (a loose object is one; plain pack entries are)
        try:
            yield f"{path}@{at}", zstandard.ZstdDecompressor().decompressobj().decompress(data[at:])
        except zstandard.ZstdError:
            pass
        at = data.find(ZSTD_MAGIC, at + 1)
    if data[:4] == b"KXPK":
        yield from ((f"{path}:entry", e) for e in _pack_entries(data))
    if data[:8] == b"KXBUNDLE":
        hlen = struct.unpack_from(">I", data, 12)[0]
        yield from ((f"{path}:entry", e) for e in _pack_entries(data[16 + hlen + 4 :]))
    if data.lstrip()[:1] == b"{":
        try:
            doc = json.loads(data)
        except ValueError:
            return
        for o in doc.get("objects", []):
            yield f"{path}:{o['id']}", base64.b64decode(o["bytes"])


def leaks(paths: list[Path], planted: dict[str, str]) -> list[str]:
    found = []
    for path in paths:
        for where, data in expansions(path):
            found += [f"{name} in {where}" for name, value in planted.items() if value.encode() in data]
    return found


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


# ------------------------------------------------------------------ the planted secrets

@pytest.fixture
def planted(tmp_path: Path) -> dict[str, str]:
    return {
        "GITHUB_TOKEN": "ghp_" + _alnum(36),
        "MY_SERVICE_PASSWORD": _alnum(24),  # no pattern: only its variable's name gives it away
        "CUSTOM_API_KEY": "ck-" + _alnum(30),
        "DEPLOY_PAT": "pat" + _alnum(20),
        "provider key": "sk-test-" + _alnum(24),
        "remote password": _alnum(22),
        "file sk": "sk-proj-" + _alnum(32),
        "file aws": "AKIA" + "".join(rnd.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567") for _ in range(16)),
        "file slack": "xoxb-" + _alnum(24),
        "private key body": _alnum(64),
        "task password": _alnum(18),
        "model token": "ghp_" + _alnum(40),
        "error token": "github_pat_" + _alnum(30),
    }


ENV_NAMES = ("GITHUB_TOKEN", "MY_SERVICE_PASSWORD", "CUSTOM_API_KEY", "DEPLOY_PAT")
KEY_ENV = "KXEN_TEST_PROVIDER_KEY"


def _workspace(tmp_path: Path, p: dict[str, str]) -> Path:
    ws = git_workspace(tmp_path / "ws", {
        "secrets.txt": (f"openai {p['file sk']}\naws {p['file aws']}\nslack {p['file slack']}\n"
                        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{p['private key body']}\n"
                        "-----END OPENSSH PRIVATE KEY-----\n"),
    })
    git(ws, "remote", "add", "origin", f"https://bob:{p['remote password']}@github.com/org/repo.git")
    return ws


def test_no_planted_secret_reaches_the_state_dir_the_model_or_a_bundle(tmp_path: Path, planted) -> None:
    p = planted
    ws = _workspace(tmp_path, p)
    state = tmp_path / "state"
    env = {name: p[name] for name in ENV_NAMES} | {KEY_ENV: p["provider key"]}
    cli = Cli(state, env=env)
    show_all = 'env; git remote -v; cat secrets.txt; echo "pw=$MY_SERVICE_PASSWORD key=$KXEN_TEST_PROVIDER_KEY"'
    task = f"deploy with https://alice:{p['task password']}@example.com/hook and report"

    # 1. The script provider: tools print every secret there is; one agent keeps a variable (env_keep).
    steps = [{"tool_calls": [{"name": "shell", "arguments": {"command": show_all}},
                             {"name": "read_file", "arguments": {"path": "secrets.txt"}}]},
             {"content": "done"}]
    for name, policy in (("plain", {}), ("keeps", {"env_keep": ["MY_SERVICE_*", "GITHUB_TOKEN"]})):
        agent = write_agent(tmp_path / name, steps, api_key_env=KEY_ENV, policy=policy)
        res = cli.run_json(ws, task, agent, expect=0).json()
        tool_out = [m["content"] for m in cli.log(res["session"]) if m["role"] == "tool"]
        assert "https://***@github.com/org/repo.git (fetch)" in tool_out[0]
        if name == "plain":
            assert "pw= " in tool_out[0] and "GITHUB_TOKEN" not in tool_out[0] and "DEPLOY_PAT" not in tool_out[0]
        else:  # kept: the tool had it, the store has [REDACTED]
            assert "pw=[REDACTED]" in tool_out[0] and "GITHUB_TOKEN=[REDACTED]" in tool_out[0]
        assert "-----BEGIN OPENSSH PRIVATE KEY-----[REDACTED]-----END OPENSSH PRIVATE KEY-----" in tool_out[1]

    # 2. A model that repeats secrets, in its text and in a tool call, then a provider error quoting one.
    with SequencedOpenAI() as server:
        server.reply_tool_calls([("c1", "shell", json.dumps({"command": f"echo {p['MY_SERVICE_PASSWORD']}; "
                                                                      f"{show_all}"}))],
                                content=f"I found {p['model token']} and https://x:{p['remote password']}@h/")
        server.reply_error(400, f"bad credentials {p['error token']}")
        agent = write_agent(tmp_path / "openai", None, provider="openai", script=None, model="gpt-test",
                            base_url=server.base_url, api_key_env=KEY_ENV)
        res = cli.run_json(ws, task, agent, expect=1).json()
        assert res["error"].startswith("provider error") and "[REDACTED]" in res["error"], res
        ses = res["session"]
        sent = json.dumps([r.body for r in server.requests])
        assert "[REDACTED]" in sent
        assert leaks_in_text(sent, p) == [], "the model was sent a secret"

    # 3. Every file of the state dir, then both bundle forms, then the state dir after gc.
    cli.fsck_clean()
    assert leaks(files_under(state), p) == []
    out = tmp_path / "out"
    out.mkdir()
    sessions = [s["id"] for s in cli.sessions()]
    assert len(sessions) == 3 and ses in sessions
    for name in ("b.kxb", "b.json"):
        cli("session", "export", *sessions, "--scan", "-o", str(out / name), expect=0)
        v = cli("bundle", "verify", str(out / name), expect=0)
        assert v.err == "", v.err  # no warning: nothing looks like a credential
    assert leaks(files_under(out), p) == []
    cli("gc", "--prune=now", expect=0)
    # gc writes a pack only when it takes less disk than what it replaces
    # (not so for a store this small): automatic packing's pass packs the
    # step logs whatever their size, so the secrets are looked for in a pack too.
    from kxen_agent.store import Store
    from kxen_agent.store.autopack import AutoPacker

    rep = AutoPacker(Store(str(state), namespaces=("sessions",)), 1, background=False).pack_now()
    assert rep.packed and list((state / "objects" / "pack").glob("*.pack"))
    assert leaks(files_under(state), p) == []


def leaks_in_text(text: str, planted: dict[str, str]) -> list[str]:
    return [name for name, value in planted.items() if value in text]


def test_a_secret_planted_past_the_runner_is_found_warned_of_and_refused(tmp_path: Path, planted) -> None:
    """The control: the same search finds what the runner did not write, in every place it looks."""
    from kxen_agent.session.agent_def import default_agent_definition
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.workspace import inspect_workspace
    from kxen_agent.store import RefUpdate, Store

    token = planted["model token"]
    ws = git_workspace(tmp_path / "ws")
    state = tmp_path / "state"
    ss = SessionStore(Store(str(state), namespaces=("sessions",)))
    info = ss.create(default_agent_definition([{"content": "hi"}]), inspect_workspace(str(ws)))
    long_text = f"see {token}\n" + "padding line\n" * 200  # > 1024 bytes: a blob
    head = ss.append_messages(None, [{"role": "user", "content": f"token {token}"},
                                     {"role": "assistant", "content": long_text}])
    ss.store.refs.transaction(ss.group(info.id), [RefUpdate("head", None, head)], reason="planted")
    secret = {"token": token}
    assert leaks(files_under(state), secret), "the search does not see into loose objects"

    cli = Cli(state)
    out = tmp_path / "out"
    out.mkdir()
    refused = cli("session", "export", info.id, "--scan", "-o", str(out / "b.kxb"), expect=1)
    assert "refusing to write" in refused.err and "nothing was written" in refused.err
    assert refused.err.count("looks like a GitHub token") == 2, refused.err
    assert token not in refused.err and list(out.iterdir()) == []
    for name in ("b.kxb", "b.json"):
        cli("session", "export", info.id, "--scan", "--allow-secrets", "-o", str(out / name), expect=0)
        v = cli("bundle", "verify", str(out / name), expect=0)
        warnings = [line for line in v.err.splitlines() if line.startswith("kxen-agent: warning:")]
        assert len(warnings) == 2 and v.err.count("\n") == 2, v.err
        assert "(message), content" in v.err and "(blob), blob" in v.err, v.err
        assert token not in v.err and token not in v.out
        assert leaks([out / name], secret), f"the search does not see into the {name} form"
    cli("gc", "--prune=now", expect=0)
    assert leaks(files_under(state), secret), "the search does not see into packs"
    # Without --scan an export writes (the scan is asked for), and --allow-secrets alone is a usage error.
    cli("session", "export", info.id, "--allow-secrets", "-o", str(out / "c.kxb"), expect=2)
