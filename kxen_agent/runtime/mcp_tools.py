"""MCP tools in a run: the lock's tool listing, the tools the model sees, and each call's outcome (§14.15).

This module owns what an MCP server's tool is to the runtime:

- :func:`record_listings`: when an agent revision is made (``run``, or
  ``--resume --agent``), each server is started and its ``tools/list`` for
  the tools the definition allows is written into the lock (``listing``:
  canonical JSON of each tool's name, description, input schema and
  annotations; ``listingHash``), so a run's capabilities are fixed by its lock;
- :func:`mcp_specs`: the function specs the model gets, from the lock alone
  (no server is started to ask a model);
- :class:`RunMcp`: a run's servers, started at their first call (never before
  the run passed its trust gate, so an imported session's launch commands
  wait for ``session trust``), each checked against the lock's listing: one
  that now offers a different tool list is refused in one line naming what
  changed;
- :class:`McpTool`: one tool under the :class:`~.tools.Tool` protocol, so a
  call goes through the journal as any tool's does.

The recovery mapping (the seed's rule, MCP's annotations being untrusted
hints): a tool is re-run after a crash, and its failed or canceled calls are
known outcomes, only when the definition declares it ``read_only``; any other
MCP call found ``Started``, killed by a crash of its server, timed out or
canceled is UNKNOWN. ``readOnlyHint``, ``idempotentHint`` and
``destructiveHint`` (absent: true) are shown (``session trust``), never
obeyed.

The SDK is imported only through :mod:`.mcp_link`, and that only when a run
starts a server.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from kxen_agent.errors import UsageError
from kxen_agent.session.mcp_def import exposed_name, listing_hash, mcp_tools

from .redaction import tool_environment
from .tools.protocol import ToolContext, ToolOutcome, ToolOutcomeUnknown, redact

if TYPE_CHECKING:
    from .mcp_link import McpLinks, ServerLink

__all__ = ["McpTool", "RunMcp", "annotations_doc", "hint_line", "mcp_doc", "mcp_specs", "pid_dir", "record_listings"]

_ANNOTATIONS = ("title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


def pid_dir(store: Any) -> str | None:
    """The state dir's ``mcp/`` (the stdio servers' pgid records), None for a store without a directory."""
    root = getattr(store, "root", None)
    return os.path.join(root, "mcp") if isinstance(root, str) and os.path.isdir(root) else None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def listing_of(server: str, offered: list[Any], wanted: list[str]) -> str:
    """The canonical listing of ``wanted`` (the definition's order) from the server's ``tools/list``
    (SDK ``Tool`` models); raises :class:`UsageError` when one is not offered."""
    by_name = {t.name: t for t in offered}
    out = []
    for name in wanted:
        tool = by_name.get(name)
        if tool is None:
            raise UsageError(f"MCP server {server!r} offers no tool {name!r} (it offers: "
                             f"{', '.join(sorted(by_name)) or 'none'}); fix tools in [mcp.servers.{server}]")
        dumped = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
        entry = {"name": name, "description": dumped.get("description", ""),
                 "inputSchema": dumped.get("inputSchema", {"type": "object"})}
        notes = {k: v for k, v in (dumped.get("annotations") or {}).items() if k in _ANNOTATIONS}
        if notes:
            entry["annotations"] = notes
        out.append(entry)
    return _canonical(out)


def _what_changed(server: str, recorded: str, now: str) -> str:
    was = {t["name"]: t for t in json.loads(recorded)}
    new = {t["name"]: t for t in json.loads(now)}
    for name, t in was.items():
        if name not in new:
            return f"tool {name!r} is gone"
        for key in ("inputSchema", "description", "annotations"):
            if t.get(key) != new[name].get(key):
                return f"tool {name!r} has a different {key}"
    return "its tool list differs"


def _sdk() -> Any:
    """:mod:`.mcp_link` (the ``mcp`` SDK), or a one-line error when the SDK is not installed."""
    try:
        from . import mcp_link
    except ImportError as e:
        raise UsageError(f"this agent has MCP servers but the mcp package cannot be imported ({e}); "
                         "install it: pip install 'mcp>=2.3,<3'") from None
    return mcp_link


def _server_env(lock: dict, spec: dict) -> dict[str, str]:
    """A stdio server's environment: the run's tool environment (§14.11) and the server's ``env_keep`` names."""
    keep = tuple(lock.get("policy", {}).get("env_keep", ())) + tuple(spec.get("env_keep", ()))
    drop = tuple(n for n in [lock.get("api_key_env")] if n)
    return tool_environment(os.environ, keep, drop)


def _link(store: Any, lock: dict, name: str, spec: dict, cwd: str) -> ServerLink:
    from .mcp_link import ServerLink

    return ServerLink(name, spec, _server_env(lock, spec) if "command" in spec else {}, cwd, pid_dir(store))


def _start(links: McpLinks, link: ServerLink) -> list[Any]:
    from .mcp_link import McpFailure

    try:
        return links.start(link)
    except McpFailure as e:
        raise UsageError(f"{e}") from None


def record_listings(store: Any, lock: dict, cwd: str) -> list[str]:
    """Start each server of ``lock`` (a definition being made into a lock) and record its ``listing``;
    return suggestions for the person (a tool whose server calls it read-only, not declared ``read_only``).

    Raises :class:`UsageError` (one line) when a server cannot start or lacks a tool: nothing is written."""
    servers = (lock.get("mcp") or {}).get("servers", {})
    if not servers or all("listing" in s for s in servers.values()):
        return []
    links = _sdk().McpLinks(pid_dir(store))
    try:
        for name, spec in servers.items():
            offered = _start(links, _link(store, lock, name, spec, cwd))
            spec["listing"] = listing_of(name, offered, spec["tools"])
            spec["listingHash"] = listing_hash(spec["listing"])
    except BaseException:
        links.close()
        raise
    _park(links, cwd)
    return [f"note: MCP tool {h['tool']} says readOnlyHint=true; if its calls change nothing, list it in read_only "
            "so a crash runs it again (the server's hint alone never does)"
            for h in annotations_doc(lock) if h["readOnlyHint"] and not h["declaredReadOnly"]]


# The servers record_listings started, kept for the run this process makes next (the same launch specs in
# the same directory): starting each a second time would double the cost of a run's start. Closed at exit
# if no run takes them.
_parked: tuple[McpLinks, str] | None = None


def _park(links: McpLinks, cwd: str) -> None:
    global _parked
    if _parked is not None:
        _parked[0].close()
    else:
        import atexit

        atexit.register(_close_parked)
    _parked = (links, os.path.realpath(cwd))


def _close_parked() -> None:
    global _parked
    if _parked is not None:
        _parked[0].close()
        _parked = None


def _launch(spec: dict) -> str:
    return _canonical({k: spec.get(k) for k in ("command", "args", "env_keep", "url")})


def mcp_specs(lock: dict) -> list[dict[str, Any]]:
    """The function specs of the lock's MCP tools, from its listings (nothing is started)."""
    specs = []
    for server, spec in (lock.get("mcp") or {}).get("servers", {}).items():
        for t in json.loads(spec.get("listing", "[]")):
            specs.append({"type": "function", "function": {
                "name": exposed_name(server, t["name"]), "description": t.get("description", ""),
                "parameters": t.get("inputSchema") or {"type": "object"}}})
    return specs


def annotations_doc(lock: dict) -> list[dict[str, Any]]:
    """Each MCP tool's hints as shown to a person, with what recovery does (``read_only`` decides, §14.15)."""
    out = []
    for server, spec in (lock.get("mcp") or {}).get("servers", {}).items():
        for t in json.loads(spec.get("listing", "[]")):
            notes = t.get("annotations", {})
            out.append({"tool": exposed_name(server, t["name"]), "readOnlyHint": notes.get("readOnlyHint", False),
                        "idempotentHint": notes.get("idempotentHint", False),
                        "destructiveHint": notes.get("destructiveHint", True),
                        "declaredReadOnly": t["name"] in spec.get("read_only", ()),
                        "onRecovery": "run again" if t["name"] in spec.get("read_only", ()) else "UNKNOWN"})
    return out


def hint_line(h: dict[str, Any]) -> str:
    """One line of an MCP tool's hints and what recovery does with its calls (``session trust``, ``run show``)."""
    flags = ", ".join(f"{k}={str(h[k]).lower()}" for k in ("readOnlyHint", "idempotentHint", "destructiveHint"))
    return (f"server hints (not trusted): {flags}; declared read_only: {'yes' if h['declaredReadOnly'] else 'no'}; "
            f"after a crash: {'run again' if h['declaredReadOnly'] else 'UNKNOWN'}")


def mcp_doc(lock: dict) -> dict[str, Any] | None:
    """What ``session trust`` shows of the lock's MCP servers: the commands this machine would start."""
    servers = (lock.get("mcp") or {}).get("servers")
    if not servers:
        return None
    return {"servers": {n: {k: s[k] for k in ("command", "args", "env_keep", "url", "tools", "read_only", "listingHash")
                            if k in s} for n, s in servers.items()},
            "tools": annotations_doc(lock)}


class McpTool:
    """One MCP tool under the :class:`~.tools.Tool` protocol (``side_effects``: not declared read-only)."""

    def __init__(self, run: RunMcp, server: str, tool: str, entry: dict, read_only: bool) -> None:
        self.name = exposed_name(server, tool)
        self.server, self.tool = server, tool
        self.side_effects = not read_only
        self.description = entry.get("description", "")
        self.parameters = entry.get("inputSchema", {"type": "object"})
        self._run = run

    def prepare(self) -> None:
        """Start the server if it is not running (before the call's ``Started``); raises :class:`UsageError`."""
        self._run.link(self.server)

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome:
        from .mcp_link import McpFailure

        link = self._run.links.servers[self.server]  # started by prepare(), before the call's Started
        try:
            result = self._run.links.call(link, self.tool, arguments, timeout_s=ctx.timeout_s, cancel=ctx.cancel)
        except McpFailure as e:
            message = redact(str(e), ctx.secret_values())
            if e.kind == "protocol" and link.session is not None:
                return ToolOutcome(message, True)  # the server answered: an error, not a mystery
            if not self.side_effects:
                return ToolOutcome(f"{message} (the tool is declared read_only: nothing changed)", True)
            raise ToolOutcomeUnknown(f"{self.name}: {message}; the call may have taken effect") from None
        return ToolOutcome(_capped(redact(_result_text(result), ctx.secret_values()), ctx.output_cap),
                           bool(getattr(result, "is_error", False)))


def _result_text(result: Any) -> str:
    parts = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(getattr(block, "resource", None), "text"):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind or 'content'} block left out: only text reaches the model]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(_canonical(structured))
    return "\n".join(parts)


def _capped(text: str, cap: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= cap:
        return text
    half = cap // 2
    return (data[:half].decode("utf-8", "ignore") + f"\n[... {len(data) - cap} bytes left out ...]\n"
            + data[-half:].decode("utf-8", "ignore"))


class RunMcp:
    """The MCP servers of one pass of a run: its tools, and its servers started at their first call."""

    def __init__(self, store: Any, lock: dict, cwd: str, ses: str = "SESSION") -> None:
        self.store, self.lock, self.cwd, self.ses = store, lock, cwd, ses
        self._links: McpLinks | None = None
        self.servers = (lock.get("mcp") or {}).get("servers", {})

    def tools(self) -> dict[str, McpTool]:
        out = {}
        for name, (server, tool) in mcp_tools(self.lock).items():
            spec = self.servers[server]
            entry = next((t for t in json.loads(spec.get("listing", "[]")) if t["name"] == tool), {})
            out[name] = McpTool(self, server, tool, entry, tool in spec.get("read_only", ()))
        return out

    @property
    def links(self) -> McpLinks:
        global _parked
        if self._links is None:
            if _parked is not None and _parked[1] == os.path.realpath(self.cwd) and all(
                    name in self.servers and _launch(link.spec) == _launch(self.servers[name])
                    for name, link in _parked[0].servers.items()):
                self._links, _parked = _parked[0], None  # the servers the lock was just made from
            else:
                self._links = _sdk().McpLinks(pid_dir(self.store))
        return self._links

    def link(self, server: str) -> ServerLink:
        """The running server ``server``, started (and its tool list checked against the lock) if need be."""
        link = self.links.servers.get(server)
        if link is not None and link.session is not None and link.returncode is None:
            if link.spec.get("listingHash") == self.servers[server].get("listingHash"):
                return link
        if link is not None:
            self.links.stop(link)
        spec = self.servers[server]
        link = _link(self.store, self.lock, server, spec, self.cwd)
        offered = _start(self.links, link)
        now = listing_of(server, offered, spec["tools"]) if {t.name for t in offered} >= set(spec["tools"]) else None
        if now is None or listing_hash(now) != spec.get("listingHash"):
            changed = (_what_changed(server, spec["listing"], now) if now is not None else
                       "tool " + repr(next(t for t in spec["tools"] if t not in {o.name for o in offered}))
                       + " is gone")
            self.close()
            raise UsageError(f"MCP server {server!r} now offers a different tool list than the agent lock recorded "
                             f"({changed}); a run's tools are fixed by its lock: make a new agent revision with "
                             f"`kxen-agent --resume {self.ses} --agent FILE` (or start a new session)")
        return link

    def close(self) -> None:
        if self._links is not None:
            self._links.close()
            self._links = None
