"""``[mcp.servers.NAME]`` in an agent definition and the lock's ``mcp`` key: the vectors of
``objects_spec.md`` §14.15, and each refusal of a definition (in-process, no server is started)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kxen_agent.runtime.mcp_tools import annotations_doc, mcp_specs
from kxen_agent.session.agent_def import AgentDefinitionError, parse_agent_definition
from kxen_agent.session.mcp_def import listing_hash
from kxen_agent.session.schema import check
from kxen_agent.store.objects import SchemaViolation, encode_object

SPEC = (Path(__file__).resolve().parents[2] / "objects_spec.md").read_text(encoding="utf-8")
HEAD = 'name = "mcp-vector"\nprovider = "openai"\nmodel = "gpt-4.1-mini"\ntools = ["read_file"]\n'


def block(tag: str) -> str:
    (text,) = re.findall(rf"^```\w+ {tag}\n(.*?)^```$", SPEC, re.S | re.M)
    return text


def vector_lock() -> tuple[dict, dict[str, str]]:
    lock = parse_agent_definition(HEAD + block("mcp-definition"), ".", "spec")
    listing = block("mcp-listing").strip()
    expect = dict(line.split(": ", 1) for line in block("mcp-lock").strip().splitlines())
    git = lock["mcp"]["servers"]["git"]
    git["listing"], git["listingHash"] = listing, listing_hash(listing)
    return lock, expect


def test_the_spec_vectors() -> None:
    lock, expect = vector_lock()
    assert lock["version"] == 6
    assert lock["mcp"]["servers"]["git"]["listingHash"] == expect["listingHash"]
    assert encode_object("agent", lock).id.hex() == expect["agent id"]
    assert " ".join(s["function"]["name"] for s in mcp_specs(lock)) == expect["functions"]
    check("agent", lock)
    hints = {h["tool"]: h for h in annotations_doc(lock)}
    assert hints["mcp__git__git_commit"]["destructiveHint"] is False
    assert hints["mcp__git__git_commit"]["onRecovery"] == "UNKNOWN"
    assert hints["mcp__git__git_status"]["onRecovery"] == "run again"


def test_the_schema_refuses_a_listing_its_hash_or_tools_do_not_match() -> None:
    lock, _ = vector_lock()
    git = lock["mcp"]["servers"]["git"]
    with pytest.raises(SchemaViolation, match="not the hash of its listing"):
        check("agent", {**lock, "mcp": {"servers": {"git": {**git, "listing": git["listing"].replace("Shows", "Hides")}}}})
    one = json.dumps(json.loads(git["listing"])[:1], sort_keys=True, separators=(",", ":"))
    with pytest.raises(SchemaViolation, match="does not list exactly its tools"):
        check("agent", {**lock, "mcp": {"servers": {"git": {**git, "listing": one, "listingHash": listing_hash(one)}}}})
    with pytest.raises(SchemaViolation, match="needs a version-6 lock"):
        check("agent", {**lock, "version": 5})


def test_a_definition_without_servers_keeps_its_lock_version() -> None:
    assert parse_agent_definition(HEAD, ".", "d")["version"] == 3
    assert "mcp" not in parse_agent_definition(HEAD, ".", "d")


@pytest.mark.parametrize("table,key,words", [
    ('[mcp.servers.x]\ncommand = "s"\nurl = "http://h/"\ntools = ["t"]', "mcp.servers.x", "not both"),
    ('[mcp.servers.x]\ncommand = "s"', "mcp.servers.x.tools", "missing"),
    ('[mcp.servers.x]\ncommand = "s"\ntools = ["t"]\nenv = {GITHUB_TOKEN = "ghp_x"}', "mcp.servers.x.env",
     "never written"),
    ('[mcp.servers.x]\ncommand = "s"\ntools = ["t"]\nenv_keep = ["A=b"]', "mcp.servers.x.env_keep", "never values"),
    ('[mcp.servers.x]\ncommand = "s"\ntools = ["a.b"]', "mcp.servers.x.tools", "not a legal function name"),
    ('[mcp.servers.x__y]\ncommand = "s"\ntools = ["t"]', "mcp.servers.x__y", "single '_'"),
    ('[mcp.servers.x]\ncommand = "s"\ntools = ["t"]\nread_only = ["u"]', "mcp.servers.x.read_only", "not in"),
    ('[mcp.servers.x]\nurl = "http://user:pw@h/"\ntools = ["t"]', "mcp.servers.x.url", "without credentials"),
    ('[policy]\napprove = ["mcp__x__t"]\n[mcp.servers.x]\ncommand = "s"\ntools = ["t"]\nread_only = ["t"]',
     "policy.approve", "declared read_only"),
    ('[policy]\napprove = ["mcp__x__u"]\n[mcp.servers.x]\ncommand = "s"\ntools = ["t"]', "policy.approve",
     "not a tool of"),
    ('[mcp.servers.x]\ncommand = "s"\ntools = ["t"]\nenv_keep = ["OPENAI_API_KEY"]', "mcp.servers.x.env_keep",
     "never given to tools"),
])
def test_a_bad_definition_is_refused_naming_its_key(table: str, key: str, words: str) -> None:
    with pytest.raises(AgentDefinitionError) as e:
        parse_agent_definition(HEAD.replace('model = "gpt-4.1-mini"\n', 'model = "m"\n') + table, ".", "a.toml")
    assert e.value.key == key and words in str(e.value), str(e.value)
    assert "\n" not in str(e.value) and "ghp_x" not in str(e.value)
