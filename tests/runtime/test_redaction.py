"""Redaction (``objects_spec.md`` §14.11): the spec's rules and vectors, read from the spec, against the module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import kxen_agent.runtime.redaction as rd

SPEC = Path(__file__).resolve().parents[2] / "objects_spec.md"
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


def _blocks(tag: str) -> list[dict[str, str]]:
    out = []
    for block in _FENCE.findall(SPEC.read_text(encoding="utf-8")):
        if block.startswith(f"{tag}: "):
            out.append(dict(line.split(": ", 1) for line in block.splitlines()))
    return out


RULES = _blocks("redaction-rule")
VECTORS = _blocks("redact")


def _flags(rx: re.Pattern[str]) -> str:
    return " ".join(n for n, v in (("IGNORECASE", re.I), ("MULTILINE", re.M), ("DOTALL", re.S)) if rx.flags & v)


def test_the_spec_states_every_pattern_the_module_uses() -> None:
    spec = {r["redaction-rule"]: (r["pattern"], r.get("flags", "")) for r in RULES}
    rules = {"credential-name": rd.CREDENTIAL_NAME, "assignment-name": rd.ASSIGNMENT_NAME,
             "private-key": rd._PRIVATE_KEY, "url-userinfo": rd._USERINFO,
             **{name: rx for name, _w, rx in rd.TOKEN_RULES}, **{r[0]: r[2] for r in rd.CONTEXT_RULES}}
    assert spec == {name: (rx.pattern, _flags(rx)) for name, rx in rules.items()}


@pytest.mark.parametrize("vec", VECTORS, ids=[v["redact"] for v in VECTORS])
def test_redaction_vector(vec: dict[str, str]) -> None:
    assert set(vec) == {"redact", "text", "secrets", "redacted", "hits"}
    text, secrets, want = (ast.literal_eval(vec[k]) for k in ("text", "secrets", "redacted"))
    assert rd.redact(text, secrets) == want
    assert rd.redact(want, secrets) == want, "redacting redacted text must change nothing"
    hits = rd.find_secrets(text, secrets)
    assert [h.rule for h in hits] == ([] if vec["hits"] == "none" else vec["hits"].split())
    assert rd.find_secrets(want, secrets) == [], "redacted text must scan clean"
    for h in hits:  # a hit names where, never what
        assert text[h.start : h.start + h.length] not in h.describe()


def test_credential_names() -> None:
    for name in ("OPENAI_API_KEY", "GITHUB_TOKEN", "aws_secret_access_key", "DB_PASSWORD", "PGPASSWD",
                 "GOOGLE_APPLICATION_CREDENTIALS", "GITLAB_PAT", "npm_token", "DB_PASS", "SMTP_PASS_FILE",
                 "MYSQL_PWD", "db_pwd", "GPG_PASSPHRASE"):
        assert rd.is_credential_name(name), name
    for name in ("PATH", "HOME", "PAT_HOME", "SSH_AUTH_SOCK", "LANG", "TERM", "PATHEXT", "PWD", "OLDPWD"):
        assert not rd.is_credential_name(name), name


def test_the_shell_environment_loses_pass_and_pwd_variables() -> None:
    """The §14.11 change: ``*_PASS*`` and ``*_PWD*`` are credential-looking, so the tool no longer gets them."""
    env = {"PATH": "/bin", "PWD": "/w", "OLDPWD": "/", "DB_PASS": "hunter2hunter2", "MYSQL_PWD": "x" * 9}
    assert rd.tool_environment(env, ()) == {"PATH": "/bin", "PWD": "/w", "OLDPWD": "/"}
    assert set(rd.tool_environment(env, ("DB_PASS",))) == {"PATH", "PWD", "OLDPWD", "DB_PASS"}
    assert rd.credential_env_values(env) == ["hunter2hunter2", "x" * 9]


def test_credential_env_values_are_those_of_8_characters_or_more() -> None:
    env = {"A_TOKEN": "12345678", "B_TOKEN": "1234567", "PLAIN": "123456789", "C_KEY": ""}
    assert rd.credential_env_values(env) == ["12345678"]


def test_tool_environment() -> None:
    env = {"PATH": "/bin", "GITHUB_TOKEN": "t" * 40, "AWS_SECRET_ACCESS_KEY": "s" * 40, "OPENAI_API_KEY": "k" * 40}
    assert rd.tool_environment(env, (), ["OPENAI_API_KEY"]) == {"PATH": "/bin"}
    assert set(rd.tool_environment(env, ("AWS_*",), ["OPENAI_API_KEY"])) == {"PATH", "AWS_SECRET_ACCESS_KEY"}
    assert set(rd.tool_environment(env, ("aws_*",), [])) == {"PATH", "OPENAI_API_KEY"} - {"OPENAI_API_KEY"}
    # A version-1 lock (None): every variable but the API key's, as before.
    assert set(rd.tool_environment(env, None, ["OPENAI_API_KEY"])) == {"PATH", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"}
    assert "OPENAI_API_KEY" not in rd.tool_environment(env, ("*",), ["OPENAI_API_KEY"])


def test_a_token_that_is_also_a_variables_value_is_one_hit() -> None:
    tok = "ghp_" + "a" * 36
    assert [h.rule for h in rd.find_secrets(f"x {tok} y", [tok])] == ["secret-value"]
    assert rd.redact(f"x {tok} y", [tok]) == "x [REDACTED] y"


def test_a_long_text_without_any_secret_is_redacted_as_it_is() -> None:
    """Letters, schemes that never finish, headers that never end: 1 MiB each, nothing to replace.

    (No timing asserted: with an unbounded repetition these took hours, see §14.11.)
    """
    for text in ("a" * (1 << 20), "https://" + "b" * (1 << 20), "-----BEGIN " + "A" * (1 << 20),
                 ("ab1+" * (1 << 18)) + "://"):
        assert rd.redact(text) == text
        assert rd.find_secrets(text) == []
    assert rd.redact("x" * (1 << 20) + " https://u:p@h") == "x" * (1 << 20) + " https://***@h"


def test_the_user_info_search_finds_what_the_pattern_finds() -> None:
    """``_userinfo`` tries the pattern only near each ``://``: the same matches as ``finditer``."""
    import random

    rng = random.Random(7)
    alphabet = "ab:/@ .-+h1s"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        text = text.replace("h1s", "https://", rng.randint(0, 2))
        want = [(m.start(), m.end(), m.groups()) for m in rd._USERINFO.finditer(text)]
        assert [(m.start(), m.end(), m.groups()) for m in rd._userinfo(text)] == want, text
    long_scheme = "x" * 40 + "://user@host"  # the scheme is the last 32 letters before ://
    assert rd.redact(long_scheme) == "x" * 40 + "://***@host" == rd._USERINFO.sub(r"\1***@", long_scheme)


def test_anchors_hold_every_match() -> None:
    """A rule is skipped when its literals are missing: every match must hold one."""
    for rule, _what, rx in [*rd.TOKEN_RULES, *(r[:3] for r in rd.CONTEXT_RULES)]:
        for vec in VECTORS:
            for m in rx.finditer(ast.literal_eval(vec["text"])):
                assert any(a in m[0] for a in rd._ANCHORS[rule]), (rule, m[0])


def test_the_line_rules_find_what_their_patterns_find() -> None:
    """``_matches`` tries a line rule only on lines holding its needles: the same kept matches as ``finditer``."""
    import random

    rng = random.Random(25)
    pieces = ["DB_PASS", "api_key", "Token", "password", "login x", "machine", ":", "=", " ", "\t", "\n", "'", '"',
              "5432", "*", "abc123+/", "export ", "İ", "é", "secret", "_pat", "PWD", "x.y", "#", ","]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        for rule, _w, rx, _g, check in rd.CONTEXT_RULES:
            def kept(ms):  # a line without the needles has no match the rule's check keeps
                return [(m.span(), m.groups()) for m in ms if check is None or check(m)]
            assert kept(rd._matches(rule, rx, text)) == kept(rx.finditer(text)), (rule, text)


def test_encoded_forms_of_undecodable_environment_bytes() -> None:
    """os.environ keeps bytes that are not UTF-8 as lone surrogates: their encodings are of the bytes, and a
    surrogate no byte gave has none (it must not crash every run)."""
    odd = "\udcff\udcfeabcdefgh"  # b"\xff\xfeabcdefgh"
    assert "%FF%FEabcdefgh" in rd.encoded_forms(odd)
    assert rd.redact(f"x {odd} y %ff%feabcdefgh", [odd]) == "x [REDACTED] y [REDACTED]"
    assert rd.encoded_forms("\ud800abcdefgh") == set()
    assert rd.redact("x \ud800abcdefgh y", ["\ud800abcdefgh"]) == "x [REDACTED] y"
