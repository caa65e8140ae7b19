"""MCP servers in an agent definition: the ``[mcp.servers.NAME]`` tables and their lock value (§14.15).

This module owns the definition format of the MCP servers an agent may use
and the shape of the lock's ``mcp`` key: a server's launch spec (``command``,
``args``, ``env_keep`` for stdio; ``url`` for streamable HTTP), the tools the
agent may use (``tools``), the ones a recovery may run again (``read_only``)
and, filled in by the runtime when the lock is made, the tool ``listing``
(canonical JSON of each tool's name, description, input schema and
annotations) and its ``listingHash``. It reads and starts nothing: listing a
server's tools is the runtime's (:mod:`kxen_agent.runtime.mcp_tools`).

The model sees each tool as ``mcp__SERVER__TOOL`` (:func:`exposed_name`):
OpenAI function names allow only ``[A-Za-z0-9_-]`` and 64 characters, so a
server or tool name outside that is refused here, never mangled.

Environment values are never written: ``env_keep`` names the variables a
stdio server gets from the environment of the run, as ``[policy] env_keep``
does for the shell tool (a value would be stored in the lock and travel in
bundles).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

__all__ = ["SERVER_KEYS", "McpDefinitionError", "check_lock_mcp", "exposed_name", "listing_hash", "mcp_tools",
           "parse_mcp"]

#: The keys of one ``[mcp.servers.NAME]`` table.
SERVER_KEYS = ("command", "args", "env_keep", "url", "tools", "read_only")
_NAME = re.compile(r"[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*")  # no "__": it separates server and tool
_TOOL = re.compile(r"[A-Za-z0-9_-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_FUNCTION_NAME = 64
_MAX_SERVERS = 32
_MAX_ARGS = 256


class McpDefinitionError(ValueError):
    """``key`` (dotted) of the definition is wrong: ``problem`` says how."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(problem)
        self.key = key
        self.problem = problem


def exposed_name(server: str, tool: str) -> str:
    """The function name the model calls a server's tool by."""
    return f"mcp__{server}__{tool}"


def _kind(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "float", str: "string", list: "array",
            dict: "table"}.get(type(value), type(value).__name__)


def _strings(key: str, value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
        raise McpDefinitionError(key, f"expected an array of {what} (strings), got {_kind(value)}")
    if len(set(value)) != len(value):
        raise McpDefinitionError(key, f"{next(v for v in value if value.count(v) > 1)!r} is listed twice; "
                                      "list each once")
    return list(value)


def parse_mcp(table: Any, *, api_key_env: str | None) -> dict[str, Any]:
    """The lock value of the definition's ``[mcp]`` table (raises :class:`McpDefinitionError`)."""
    if not isinstance(table, dict) or set(table) != {"servers"} or not isinstance(table["servers"], dict):
        raise McpDefinitionError("mcp", "expected [mcp.servers.NAME] tables only, e.g. [mcp.servers.git] with "
                                        "command = \"mcp-server-git\"")
    servers: dict[str, Any] = {}
    if not table["servers"] or len(table["servers"]) > _MAX_SERVERS:
        raise McpDefinitionError("mcp.servers", f"name 1 to {_MAX_SERVERS} servers, each a [mcp.servers.NAME] table")
    for name, spec in table["servers"].items():
        at = f"mcp.servers.{name}"
        if not _NAME.fullmatch(name):
            raise McpDefinitionError(at, "a server name is letters, digits, '-' and single '_' (the model "
                                         "sees its tools as mcp__NAME__TOOL)")
        if not isinstance(spec, dict):
            raise McpDefinitionError(at, f"expected a table, got {_kind(spec)}")
        unknown = [k for k in spec if k not in SERVER_KEYS]
        if unknown:
            raise McpDefinitionError(f"{at}.{unknown[0]}", "unknown key (expected: " + ", ".join(SERVER_KEYS)
                                     + "); environment values are never written here, env_keep names the variables")
        if ("command" in spec) == ("url" in spec):
            raise McpDefinitionError(at, "give either command (a stdio server) or url (streamable HTTP), not both")
        entry: dict[str, Any] = {}
        if "command" in spec:
            if not isinstance(spec["command"], str) or not spec["command"] or "\x00" in spec["command"]:
                raise McpDefinitionError(f"{at}.command", "expected the server's program (a non-empty string)")
            entry["command"] = spec["command"]
            args = spec.get("args", [])
            if not isinstance(args, list) or any(not isinstance(a, str) or "\x00" in a for a in args):
                raise McpDefinitionError(f"{at}.args", f"expected an array of strings, got {_kind(args)}")
            if len(args) > _MAX_ARGS:
                raise McpDefinitionError(f"{at}.args", f"{len(args)} arguments, more than {_MAX_ARGS}")
            entry["args"] = list(args)
            keep = _strings(f"{at}.env_keep", spec.get("env_keep", []), "variable names")
            for var in keep:
                if not _ENV_NAME.fullmatch(var):
                    raise McpDefinitionError(f"{at}.env_keep", f"{var!r} is not a variable name; env_keep names "
                                                               "variables (e.g. \"GITHUB_TOKEN\"), never values")
                if var == api_key_env:
                    raise McpDefinitionError(f"{at}.env_keep", f"{var} is the provider key's variable, which is "
                                                               "never given to tools; remove it")
            entry["env_keep"] = keep
        else:
            if "args" in spec or "env_keep" in spec:
                raise McpDefinitionError(at, "args and env_keep apply to a stdio server (command), not to url")
            url = spec["url"]
            if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s@/]+(/\S*)?", url):
                raise McpDefinitionError(f"{at}.url", "expected an http:// or https:// URL without credentials")
            entry["url"] = url
        if "tools" not in spec:
            raise McpDefinitionError(f"{at}.tools", "missing; list the server's tools the agent may use, "
                                                    "e.g. tools = [\"git_status\"]")
        tools = _strings(f"{at}.tools", spec["tools"], "tool names")
        if not tools:
            raise McpDefinitionError(f"{at}.tools", "empty; list at least one of the server's tools")
        for tool in tools:
            if not _TOOL.fullmatch(tool) or len(exposed_name(name, tool)) > _MAX_FUNCTION_NAME:
                raise McpDefinitionError(f"{at}.tools", f"{tool!r}: the model would call it "
                                         f"{exposed_name(name, tool)!r}, not a legal function name "
                                         f"([A-Za-z0-9_-], at most {_MAX_FUNCTION_NAME} characters)")
        read_only = _strings(f"{at}.read_only", spec.get("read_only", []), "tool names")
        for tool in read_only:
            if tool not in tools:
                raise McpDefinitionError(f"{at}.read_only", f"{tool!r} is not in this server's tools")
        entry["tools"] = tools
        entry["read_only"] = read_only
        servers[name] = entry
    return {"servers": servers}


def mcp_tools(lock: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The lock's MCP tools: exposed name -> (server, the server's tool name); empty without ``mcp``."""
    servers = (lock.get("mcp") or {}).get("servers", {})
    return {exposed_name(s, t): (s, t) for s, spec in servers.items() for t in spec.get("tools", ())}


def listing_hash(listing: str) -> str:
    """``listingHash``: ``sha256:`` and the hex SHA-256 of the listing's UTF-8 text."""
    return "sha256:" + hashlib.sha256(listing.encode("utf-8")).hexdigest()


def check_lock_mcp(value: Any) -> None:
    """Raise ValueError when ``value`` is not a lock's ``mcp`` (§14.15); used by the session schema."""
    if type(value) is not dict or set(value) != {"servers"} or type(value["servers"]) is not dict:
        raise ValueError("key 'mcp' must be a map with exactly 'servers'")
    for name, spec in value["servers"].items():
        if type(name) is not str or not _NAME.fullmatch(name) or type(spec) is not dict:
            raise ValueError(f"key 'mcp.servers' holds a bad server {name!r}")
        ok = (("command" in spec) != ("url" in spec)
              and all(type(spec.get(k)) is list and all(type(x) is str for x in spec[k])
                      for k in ("tools", "read_only", *(("args", "env_keep") if "command" in spec else ())))
              and type(spec.get("command", spec.get("url"))) is str
              and type(spec.get("listing")) is str and type(spec.get("listingHash")) is str)
        if not ok:
            raise ValueError(f"key 'mcp.servers.{name}' is not a server's launch spec, tools and listing")
        if listing_hash(spec["listing"]) != spec["listingHash"]:
            raise ValueError(f"key 'mcp.servers.{name}.listingHash' is not the hash of its listing")
        try:
            listed = [t["name"] for t in json.loads(spec["listing"])]
        except (ValueError, TypeError, KeyError):
            raise ValueError(f"key 'mcp.servers.{name}.listing' is not a tool listing") from None
        if listed != spec["tools"] or not set(spec["read_only"]) <= set(spec["tools"]):
            raise ValueError(f"key 'mcp.servers.{name}.listing' does not list exactly its tools")
