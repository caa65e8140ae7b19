"""Issue 25, reproduction 6: the redaction and scanning gaps, through the real CLI.

Planted where a tool prints them (``cat ~/.aws/credentials``, a ``.env``,
``.netrc``, ``.pgpass``, docker's ``config.json``, webhook URLs, base64 and
percent-encoded copies of a value the runner holds) and in the runner's
``DB_PASS``/``MYSQL_PWD``: none reaches a byte of the state dir, and what
was stored scans clean. The control writes them past the runner (a message
made with the library): ``session export --scan`` refuses, ``bundle
verify`` warns, ``session push`` refuses without ``--allow-secrets`` and
pushes nothing, then pushes with it. A format only the scanning library
knows (a Stripe key) is found too.
"""

from __future__ import annotations

import base64
import secrets as rnd
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from tests.helpers import Cli, git, git_workspace, write_agent
from tests.reliability.test_secrets import files_under, leaks
from tests.remote.gitserver import bare_repo


def _alnum(n: int) -> str:
    return "".join(rnd.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") for _ in range(n))


@pytest.fixture
def planted() -> dict[str, str]:
    known = _alnum(10) + "/@:" + _alnum(10)  # a runner's SERVICE_TOKEN, with characters that percent-encoding changes
    basic = base64.b64encode(f"admin:{known}".encode()).decode()
    return {
        "known": known,
        "aws secret": _alnum(30) + "/+" + _alnum(8),
        "dotenv DB_PASS": _alnum(12) + "7",
        "netrc": _alnum(16),
        "pgpass": _alnum(16),
        "docker auth": base64.b64encode(f"robot:{_alnum(20)}".encode()).decode(),
        "slack hook": f"T{_alnum(8)}/B{_alnum(8)}/{_alnum(24)}",
        "discord hook": _alnum(68),
        "query token": _alnum(32),
        "basic header": basic,
        "basic middle": basic[8:-4],  # what depends on the known value's bytes alone
        "percent": urllib.parse.quote(known, safe=""),
        "runner DB_PASS": _alnum(14) + "1",
        "runner MYSQL_PWD": _alnum(14) + "2",
    }


FILES = {
    "aws_credentials": "[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = {aws secret}\n",
    ".env": "DEBUG=1\nDB_PASS={dotenv DB_PASS}\n",
    ".netrc": "machine api.example.com login deploy password {netrc}\n",
    ".pgpass": "db.example.com:5432:app:alice:{pgpass}\n",
    "docker_config.json": '{{\n  "auths": {{\n    "registry.example.com": {{\n      "auth": "{docker auth}"\n    }}\n  }}\n}}\n',
    "hooks.txt": ("https://hooks.slack.com/services/{slack hook}\n"
                  "https://discord.com/api/webhooks/123456789012345678/{discord hook}\n"
                  "https://ci.example.com/invoke?job=build&token={query token}\n"),
    "auth.txt": "Authorization: Basic {basic header}\nhttps://example.com/login?user=alice&pass={percent}\n",
}


def _files(p: dict[str, str]) -> dict[str, str]:
    return {name: text.format(**p) for name, text in FILES.items()}


def test_each_planted_secret_is_redacted_at_write_time(tmp_path: Path, planted: dict[str, str]) -> None:
    p = planted
    ws = git_workspace(tmp_path / "ws", _files(p))
    state = tmp_path / "state"
    env = {"SERVICE_TOKEN": p["known"], "DB_PASS": p["runner DB_PASS"], "MYSQL_PWD": p["runner MYSQL_PWD"]}
    cli = Cli(state, env=env)
    show = f"cat {' '.join(FILES)}; echo \"db=$DB_PASS pwd=$MYSQL_PWD\"; env"
    steps = [{"tool_calls": [{"name": "shell", "arguments": {"command": show}},
                             {"name": "read_file", "arguments": {"path": "auth.txt"}}]},
             {"content": "done"}]
    agent = write_agent(tmp_path / "agent", steps)
    res = cli.run_json(ws, "look around", agent, expect=0).json()
    out = [m["content"] for m in cli.log(res["session"]) if m["role"] == "tool"]
    # *_PASS* and *_PWD* are credential-looking now: the shell no longer gets them.
    assert "db= pwd= " in out[0] or "db= pwd=\n" in out[0], out[0][-2000:]
    for shown in ("aws_secret_access_key = [REDACTED]", "DB_PASS=[REDACTED]", "login deploy password [REDACTED]",
                  "alice:[REDACTED]", '"auth": "[REDACTED]"', "hooks.slack.com/services/[REDACTED]",
                  "/api/webhooks/123456789012345678/[REDACTED]", "&token=[REDACTED]", "pass=[REDACTED]"):
        assert shown in out[0], (shown, out[0])
    assert "[REDACTED]" in out[1] and p["basic header"] not in out[1]
    planted_here = {k: v for k, v in p.items() if k != "known"} | {"known": p["known"]}
    assert leaks(files_under(state), planted_here) == []
    # What was stored scans clean: export --scan writes, bundle verify has nothing to say.
    bundle = tmp_path / "b.kxb"
    cli("session", "export", res["session"], "--scan", "-o", str(bundle), expect=0)
    assert cli("bundle", "verify", str(bundle), expect=0).err == ""
    assert leaks([bundle], planted_here) == []


def _remote(tmp_path: Path) -> tuple[Path, Path]:
    remote = bare_repo(tmp_path / "remote.git")
    ws = git_workspace(tmp_path / "ws")
    git(ws, "remote", "add", "origin", str(remote))
    git(ws, "push", "-q", "origin", "main")
    return remote, ws


def _remote_refs(remote: Path) -> str:
    return subprocess.run(["git", "-C", str(remote), "for-each-ref", "refs/kxen/"], capture_output=True, text=True,
                          check=True).stdout


def test_a_secret_past_the_runner_is_found_and_push_refuses_without_allow_secrets(
        tmp_path: Path, planted: dict[str, str]) -> None:
    from kxen_agent.session.agent_def import default_agent_definition
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.workspace import inspect_workspace
    from kxen_agent.store import RefUpdate, Store

    p = planted
    remote, ws = _remote(tmp_path)
    state = tmp_path / "state"
    ss = SessionStore(Store(str(state), namespaces=("sessions",)))
    info = ss.create(default_agent_definition([{"content": "hi"}]), inspect_workspace(str(ws)))
    stripe = "sk_live_" + _alnum(24)  # a format only the scanning library knows
    texts = [*_files(p).values(), f"env\nMYSQL_PWD={p['runner MYSQL_PWD']}\n", f"billing key {stripe}\n"]
    head = ss.append_messages(None, [{"role": "user", "content": "look"}]
                              + [{"role": "assistant", "content": text} for text in texts])
    ss.store.refs.transaction(ss.group(info.id), [RefUpdate("head", None, head)], reason="planted past the runner")
    # The runner's known value is looked for by the scanner's own environment (rule 1).
    cli = Cli(state, env={"SERVICE_TOKEN": p["known"]})

    refused = cli("session", "export", info.id, "--scan", "-o", str(tmp_path / "b.kxb"), expect=1)
    warnings = [line for line in refused.err.splitlines() if line.startswith("kxen-agent: warning:")]
    for looks in ("credential assignment", ".netrc", ".pgpass", "JSON or YAML", "Slack webhook", "Discord webhook",
                  "URL's query", "encoded copy", "Stripe"):
        assert any(looks in w for w in warnings), (looks, refused.err)
    assert len(warnings) >= 11, refused.err
    assert not (tmp_path / "b.kxb").exists()
    for value in [*p.values(), stripe]:
        assert value not in refused.err

    cli("session", "export", info.id, "--scan", "--allow-secrets", "-o", str(tmp_path / "b.kxb"), expect=0)
    verify = cli("bundle", "verify", str(tmp_path / "b.kxb"), expect=0)
    assert verify.err.count("kxen-agent: warning:") == len(warnings), verify.err

    before = _remote_refs(remote)
    push = cli("session", "push", info.id, expect=1, cwd=ws)
    assert "refusing to push" in push.err and "--allow-secrets" in push.err and "Traceback" not in push.err, push.err
    assert push.err.count("kxen-agent: warning:") == len(warnings)
    assert _remote_refs(remote) == before == ""
    for value in [*p.values(), stripe]:
        assert value not in push.err
    cli("session", "push", info.id, "--allow-secrets", expect=0, cwd=ws)
    assert info.id in _remote_refs(remote)


def test_push_of_a_clean_session_is_not_held_up(tmp_path: Path) -> None:
    remote, ws = _remote(tmp_path)
    cli = Cli(tmp_path / "state")
    agent = write_agent(tmp_path / "agent", [{"tool_calls": [{"name": "shell", "arguments": {"command": "git log"}}]},
                                             {"content": "done"}])
    ses = cli.run_json(ws, "show the log", agent, expect=0).json()["session"]
    p = cli("session", "push", ses, expect=0, cwd=ws)
    assert "warning" not in p.err and ses in _remote_refs(remote)


def test_the_shipped_scan_finds_every_planted_kind_and_flags_no_clean_output() -> None:
    """RELIABILITY.md's claim, on a small corpus of the benchmark: recall 100 %, no false positive."""
    import random

    from bench.secret_scan import _clean, _planted, _shipped, measure

    rng = random.Random(7)
    planted, clean = _planted(rng, 3), _clean(rng, 400)
    r = measure(_shipped, planted, clean)
    assert r["found"] == r["planted"] == 27 * 3, {k: v for k, v in r["perKind"].items() if v < 1}
    assert r["falsePositives"] == 0


def test_every_library_pattern_holds_one_of_its_detectors_anchors() -> None:
    """A detector is skipped on a text lacking its anchors: each must be a literal of every pattern it guards."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    from kxen_agent.cli.secret_scan import LIBRARY_ANCHORS, LIBRARY_DETECTORS

    by_name = {cls.__name__: cls for cls in get_mapping_from_secret_type_to_class().values()}
    assert set(LIBRARY_ANCHORS) == set(LIBRARY_DETECTORS)
    for name in LIBRARY_DETECTORS:
        for rx in by_name[name]().denylist:
            literal = rx.pattern.replace("\\", "")
            assert any(a in literal for a in LIBRARY_ANCHORS[name]), (name, rx.pattern)
