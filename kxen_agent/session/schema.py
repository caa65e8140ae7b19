"""The shapes of session-layer objects (``objects_spec.md`` §14), checked where they come in.

The store proves an object's bytes (its id, strict CBOR, links); this module
proves that a ``session``, ``message``, ``run``, ``journal`` or ``agent``
object has the keys and types the readers rely on, and which kind each of
its links must name. A bundle from another machine, or a state dir edited by
hand, can hold an object that passes every byte check and still has ``seq``
as text or a ``parent`` naming a run; without this check the first reader to
index it would stop with a traceback, and an import would have landed it.

Pure functions over decoded values, no I/O. :data:`SESSION_SCHEMA` is the
hook the store's bundle reader and fsck call (they know nothing of sessions);
:func:`read` is what the session layer's readers use.

Readers ignore keys they do not know (§14: a newer writer may add some);
a key they need must be there with its type. Link kinds are checked where
the link is followed (the store's ``get`` with a kind), and by imports and fsck
for every link at once.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from kxen_agent.errors import KxenError
from kxen_agent.store.objects import CorruptObject, ObjectId, SchemaViolation
from kxen_agent.store.protocols import ObjectStore

from .status import Approval, ApproverName, OpSource, OpState, RunStatus, words

__all__ = ["RUN_RE", "SESSION_SCHEMA", "SES_RE", "SessionSchema", "check", "misplaced", "put", "read", "ref_kind", "text_blob"]

#: Ids as accepted on input (§14.1).
SES_RE = re.compile(r"ses_[0-9a-z]{8,40}")
RUN_RE = re.compile(r"run_[0-9a-z]{8,40}")
_run_id = RUN_RE.fullmatch

_SECTION = {"agent": "14.2", "session": "14.3", "message": "14.4", "run": "14.5", "journal": "14.6"}

# The words of §14.5 and §14.6, from the one module that spells them (:mod:`.status`).
RUN_STATUSES = words(RunStatus)
OP_STATES = words(OpState)
OP_SOURCES = words(OpSource)
APPROVALS = words(Approval)
APPROVERS = words(ApproverName)
ROLES = ("user", "assistant", "tool", "compaction")
FORK_KINDS = (None, "conversation", "worktree")

Links = list[tuple[ObjectId, str]]


# ---------------------------------------------------------------- field checks

def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, bytes):
        return "link"
    return {int: "int", str: "text", list: "array", dict: "map"}.get(type(v), type(v).__name__)


class _Fields:
    """Key checks over one map, collecting the links it must make."""

    __slots__ = ("d", "links")

    def __init__(self, value: Any, what: str) -> None:
        if type(value) is not dict:
            raise SchemaViolation(f"{what} must be a map, not {_type_name(value)}")
        self.d = value
        self.links: Links = []

    def _get(self, key: str, optional: bool) -> Any:
        if key not in self.d:
            if optional:
                return _ABSENT
            raise SchemaViolation(f"key {key!r} is missing")
        return self.d[key]

    def text(self, key: str, *, null: bool = False, optional: bool = False,
             one_of: tuple | None = None, match: re.Pattern | None = None) -> Any:
        v = self._get(key, optional)
        if v is _ABSENT or (v is None and null):
            return None if v is _ABSENT else v
        if type(v) is not str:
            raise SchemaViolation(f"key {key!r} must be text{' or null' if null else ''}, not {_type_name(v)}")
        if one_of is not None and v not in one_of:
            raise SchemaViolation(f"key {key!r} is {v!r}, expected one of {_names(one_of)}")
        if match is not None and not match.fullmatch(v):
            raise SchemaViolation(f"key {key!r} is {v!r}, not an id of the form {match.pattern}")
        return v

    def int(self, key: str, *, low: int = 0, optional: bool = False) -> Any:
        v = self._get(key, optional)
        if v is _ABSENT:
            return None
        if type(v) is not int:
            raise SchemaViolation(f"key {key!r} must be an int, not {_type_name(v)}")
        if v < low:
            raise SchemaViolation(f"key {key!r} is {v}, below {low}")
        return v

    def bool(self, key: str, *, optional: bool = False) -> Any:
        v = self._get(key, optional)
        if v is not _ABSENT and type(v) is not bool:
            raise SchemaViolation(f"key {key!r} must be a bool, not {_type_name(v)}")
        return None if v is _ABSENT else v

    def link(self, key: str, kind: str, *, optional: bool = False) -> Any:
        v = self._get(key, optional)
        if v is _ABSENT:
            return None
        if type(v) is not bytes:
            raise SchemaViolation(f"key {key!r} must be a link to a {kind} object, not {_type_name(v)}")
        self.links.append((v, kind))
        return v


class _Absent:
    def __repr__(self) -> str:  # pragma: no cover - never shown
        return "<absent>"


_ABSENT = _Absent()


def _names(values: tuple) -> str:
    return ", ".join("null" if v is None else v for v in values)


# ---------------------------------------------------------------- kinds

def _agent(v: Any) -> Links:
    from .agent_def import (KNOWN_TOOLS, LOCK_VERSION, SIDE_EFFECT_TOOLS, V6_TOOLS, AgentDefinitionError,
                            canonical_steps_json, validate_script_steps)

    f = _Fields(v, "an agent lock")
    f.text("name")
    provider = f.text("provider", one_of=("script", "openai", "anthropic"))
    model = f.text("model")
    if provider in ("openai", "anthropic") and not model:
        raise SchemaViolation(f"key 'model' is empty, but the provider is {provider!r}")
    f.text("base_url", null=True)
    f.text("api_key_env", null=True)
    f.text("system")
    tools = f.d.get("tools")
    if type(tools) is not list:
        raise SchemaViolation(f"key 'tools' must be an array of text, not {_type_name(tools)}")
    for t in tools:
        if t not in KNOWN_TOOLS or type(t) is not str:
            raise SchemaViolation(f"key 'tools' holds {t!r}, not one of {', '.join(KNOWN_TOOLS)}")
    if len(set(tools)) != len(tools):
        raise SchemaViolation("key 'tools' names a tool twice")
    # §14.2: no version is version 1 (before env_keep); a newer one means keys we cannot read right.
    version = f.int("version", low=1, optional=True) or 1
    if version > LOCK_VERSION:
        raise SchemaViolation(f"agent lock version {version} is newer than this kxen-agent reads ({LOCK_VERSION}); "
                              "upgrade kxen-agent")
    if provider == "anthropic" and version < 3:
        raise SchemaViolation(f"provider 'anthropic' needs a version-3 lock, not version {version}")
    newer = [t for t in tools if t in V6_TOOLS]
    if newer and version < 6:
        raise SchemaViolation(f"tool {newer[0]!r} needs a version-6 lock, not version {version}")
    p = _Fields(f.d.get("policy"), "key 'policy'")
    p.int("max_turns", low=1)
    p.int("tool_timeout_ms", low=1)
    p.int("cancel_window_ms")
    if version >= 2:
        keep = p.d.get("env_keep")
        if type(keep) is not list or any(type(k) is not str for k in keep):
            raise SchemaViolation(f"key 'policy.env_keep' must be an array of text in a version-{version} lock, "
                                  f"not {_type_name(keep)}")
    if version >= 3 and p.d.get("context_tokens") is not None:
        p.int("context_tokens", low=1)
    if version >= 4:  # the limits, each absent or an int (§14.2)
        for key in ("model_timeout_ms", "max_tool_calls", "max_argument_bytes", "max_file_bytes"):
            if key in p.d:
                p.int(key, low=1)
    if version >= 5:  # workspace checkpoints (§14.2, §14.14), each absent or of its type
        if "checkpoints" in p.d and type(p.d["checkpoints"]) is not bool:
            raise SchemaViolation("key 'policy.checkpoints' must be a bool")
        for key in ("checkpoint_max_file_bytes", "checkpoint_max_files", "checkpoint_max_bytes"):
            if key in p.d:
                p.int(key)
    mcp_names: dict = {}
    if "mcp" in f.d:  # MCP servers (§14.15), version 6 on
        from .mcp_def import check_lock_mcp, mcp_tools

        if version < 6:
            raise SchemaViolation(f"key 'mcp' needs a version-6 lock, not version {version}")
        try:
            check_lock_mcp(f.d["mcp"])
        except ValueError as e:
            raise SchemaViolation(str(e)) from None
        mcp_names = mcp_tools(f.d)
    if version >= 6 and "instructions" in p.d:  # §14.2: project instruction file names
        names = p.d["instructions"]
        if type(names) is not list or any(type(n) is not str or not n or "/" in n for n in names):
            raise SchemaViolation("key 'policy.instructions' must be an array of file names (text without '/')")
    if version >= 6:  # §14.2: the [model] settings, each absent (the server's default) or of its form
        f.int("max_tokens", low=1, optional=True)
        f.text("temperature", optional=True, match=re.compile(r"(?:[0-1](?:\.[0-9]{1,3})?|2(?:\.0{1,3})?)"))
    if version >= 6 and "no_terminal" in p.d:  # §14.2: absent means "pause"
        p.text("no_terminal", one_of=("pause", "refuse"))
    if version >= 6 and "commit_trailer" in p.d and type(p.d["commit_trailer"]) is not bool:  # §14.2, §14.17
        raise SchemaViolation("key 'policy.commit_trailer' must be a bool")
    if version >= 3 and "approve" in p.d:
        approve = p.d["approve"]
        if type(approve) is not list or any(type(t) is not str or (t not in SIDE_EFFECT_TOOLS and t not in mcp_names)
                                            for t in approve):
            raise SchemaViolation("key 'policy.approve' must be an array of the tools with side effects "
                                  f"({', '.join(SIDE_EFFECT_TOOLS)})")
    script = f.text("script", null=True)
    if provider == "script":
        if script is None:
            raise SchemaViolation("key 'script' is null, but the provider is 'script'")
        import json

        try:
            steps = json.loads(script, parse_constant=_no_constant)
            validate_script_steps(steps, [*tools, *mcp_names], source="the agent lock's script")
            canonical = canonical_steps_json(steps)
        except (ValueError, RecursionError, AgentDefinitionError) as e:
            raise SchemaViolation(f"key 'script' is not a valid steps list: {_one_line(e)}") from None
        if canonical != script:
            raise SchemaViolation("key 'script' is not canonical JSON (§14.2)")
    return f.links


def _session(v: Any) -> Links:
    from .workspace import WorkspaceError, WorkspaceIdentity

    f = _Fields(v, "session metadata")
    f.text("id", match=SES_RE)
    f.text("parentId", null=True, match=SES_RE)
    f.text("branchRootId", match=SES_RE)
    f.text("forkPoint", null=True)
    f.text("forkKind", null=True, one_of=FORK_KINDS)
    f.link("agent", "agent")
    try:
        WorkspaceIdentity.from_record(f._get("workspace", False))
    except WorkspaceError as e:
        raise SchemaViolation(_one_line(e)) from None
    f.int("createdNs")
    f.int("revisedNs")
    f.text("reason")
    f.link("previous", "session", optional=True)
    f.text("name", optional=True)
    return f.links


def _message(v: Any) -> Links:
    # Every history read checks each message (a resume loads them all), so
    # the common shapes are judged here in a few lookups; anything else, and
    # every error, goes the long way, which names the rule broken.
    if type(v) is dict:
        seq, role, parent = v.get("seq"), v.get("role"), v.get("parent")
        content = v.get("content", _ABSENT)
        run, tcid = v.get("run"), v.get("toolCallId")
        if (type(seq) is int and seq >= 0 and (role == "user" or role == "assistant" or role == "tool")
                and type(role) is str and (type(parent) is bytes if seq else "parent" not in v)
                and (content is _ABSENT or content is None or type(content) is str)
                and (run is None and "run" not in v or type(run) is str and _run_id(run) is not None)
                and (tcid is None and "toolCallId" not in v or type(tcid) is str)):
            blob = v.get("contentBlob")
            if ("contentBlob" not in v) if content is not _ABSENT else (type(blob) is bytes):
                calls = v.get("toolCalls")
                if calls is None:
                    ok = "toolCalls" not in v
                else:
                    ok = type(calls) is list and len(calls) > 0 and role == "assistant"
                    for c in calls if ok else ():
                        if not (type(c) is dict and type(c.get("id")) is str and type(c.get("name")) is str
                                and type(c.get("arguments")) is str):
                            ok = False
                            break
                if ok:
                    links = [(parent, "message")] if seq else []
                    if blob is not None:
                        links.append((blob, "blob"))
                    return links
    return _message_slow(v)


def _message_slow(v: Any) -> Links:
    f = _Fields(v, "a message")
    seq = f.int("seq")
    role = f.text("role", one_of=ROLES)
    parent = f.link("parent", "message", optional=True)
    if (parent is None) != (seq == 0):
        raise SchemaViolation(f"seq {seq} with{'out' if parent is None else ''} a parent "
                              "(seq 0 is the first message and only it has no parent)")
    has_text, has_blob = "content" in f.d, "contentBlob" in f.d
    if has_text == has_blob:
        raise SchemaViolation("exactly one of 'content' and 'contentBlob' must be present")
    if has_text:
        f.text("content", null=True)
    else:
        f.link("contentBlob", "blob")
    f.text("run", optional=True, match=RUN_RE)
    if "toolCalls" in f.d:
        calls = f.d["toolCalls"]
        if type(calls) is not list or not calls:
            raise SchemaViolation("key 'toolCalls' must be a non-empty array")
        for i, call in enumerate(calls):
            c = _Fields(call, f"toolCalls[{i}]")
            for key in ("id", "name", "arguments"):
                try:
                    c.text(key)
                except SchemaViolation as e:
                    raise SchemaViolation(f"toolCalls[{i}]: {e}") from None
        if role != "assistant":
            raise SchemaViolation(f"a {role} message carries tool calls")
    f.text("toolCallId", optional=True)
    # §14.4: a compaction message names the last message its summary covers; no other message does.
    f.link("through", "message", optional=role != "compaction")
    if role != "compaction" and "through" in f.d:
        raise SchemaViolation(f"a {role} message carries 'through' (only a compaction message does)")
    if role == "compaction" and "toolCallId" in f.d:
        raise SchemaViolation("a compaction message carries 'toolCallId'")
    return f.links


def _run(v: Any) -> Links:
    f = _Fields(v, "a run state")
    f.text("id", match=RUN_RE)
    f.text("session", match=SES_RE)
    f.int("index")
    f.text("task")
    f.text("model")
    f.link("agent", "agent")
    f.text("status", one_of=RUN_STATUSES)
    f.int("turn")
    f.text("result", null=True)
    f.text("error", null=True)
    f.bool("settled")
    f.link("startHead", "message")
    f.int("startedNs")
    f.int("updatedNs")
    f.link("previous", "run", optional=True)
    f.link("journal", "journal", optional=True)
    # Optional: states written before these keys existed lack them (§14.5).
    f.text("requestedModel", optional=True)
    f.text("baseUrl", null=True, optional=True)
    f.text("retryOf", optional=True, match=RUN_RE)
    f.int("compactedTurn", optional=True)
    f.text("apiKeyEnv", null=True, optional=True)  # §14.5: the run's --api-key-env
    if "usage" in f.d:
        _usage(f.d["usage"], "usage", ("turns",))
    if f.d.get("turnUsage") is not None:
        _usage(f.d["turnUsage"], "turnUsage", ("turn",))
    if "instructions" in f.d:
        f.links.extend(_instructions(f.d["instructions"]))
    return f.links


def _instructions(value: Any) -> Links:
    """A run's project instructions (§14.5 ``instructions``): each ``path``, ``blob``, ``size``, ``truncated``."""
    if type(value) is not list or not value:
        raise SchemaViolation(f"key 'instructions' must be a non-empty array, not {_type_name(value)}")
    links: Links = []
    for i, item in enumerate(value):
        u = _Fields(item, f"instructions[{i}]")
        try:
            u.text("path")
            u.link("blob", "blob")
            u.int("size")
            u.bool("truncated")
        except SchemaViolation as e:
            raise SchemaViolation(f"instructions[{i}]: {e}") from None
        links.extend(u.links)
    return links


def _usage(value: Any, key: str, counts: tuple[str, ...]) -> None:
    """A run's token counts (§14.5 ``usage``, ``turnUsage``): ints, ``cachedTokens`` optional."""
    u = _Fields(value, f"key {key!r}")
    try:
        for name in ("inputTokens", "outputTokens", *counts):
            u.int(name)
        u.int("cachedTokens", optional=True)
    except SchemaViolation as e:
        raise SchemaViolation(f"{key}: {e}") from None


_GIT_COMMIT_RE = re.compile(r"[0-9a-f]{40}")


def _journal(v: Any) -> Links:
    f = _Fields(v, "a journal entry")
    f.text("op")
    f.text("run", match=RUN_RE)
    f.int("turn")
    f.text("callId")
    f.text("tool")
    f.text("arguments")
    f.link("message", "message")
    f.bool("sideEffects")
    state = f.text("state", one_of=OP_STATES)
    f.text("source", one_of=OP_SOURCES)
    if "output" in f.d and "outputBlob" in f.d:
        raise SchemaViolation("both 'output' and 'outputBlob' are present")
    f.text("output", optional=True)
    f.link("outputBlob", "blob", optional=True)
    f.bool("isError", optional=state in (OpState.DECIDED, OpState.STARTED, OpState.OUTCOME_UNKNOWN,
                                         OpState.PENDING_APPROVAL))
    # §14.6: the approval of a call that needed one, from its Decided entry on.
    f.text("approval", one_of=APPROVALS, optional=state != OpState.DECIDED)
    f.text("approver", one_of=APPROVERS, optional=state != OpState.DECIDED)
    f.text("note", optional=True)
    f.text("reason", optional=True)  # §14.6: why a person refused the call (what the model is shown)
    f.text("origin", optional=True)  # §14.6: the state dir that made the decision (informative)
    # §14.6/§14.14: Git commit ids of the workspace checkpoints (not links: they name Git objects).
    f.text("checkpointBefore", optional=True, match=_GIT_COMMIT_RE)
    f.text("checkpointAfter", optional=True, match=_GIT_COMMIT_RE)
    f.link("previous", "journal", optional=True)
    f.int("timeNs")
    return f.links


_CHECKS: Mapping[str, Callable[[Any], Links]] = {
    "agent": _agent, "session": _session, "message": _message, "run": _run, "journal": _journal,
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


# ---------------------------------------------------------------- entry points

def check(kind: str, value: Any) -> Links:
    """The links ``value`` must make, with the kind each must name; raises :class:`SchemaViolation`.

    Blobs (raw bytes) have no shape; unknown kinds are the store's business.
    """
    fn = _CHECKS.get(kind)
    return [] if fn is None else fn(value)


def ref_kind(group: str, name: str) -> str | None:
    """The kind the ref ``group/name`` must name (§14.1), or None if the session layer has no rule."""
    if not group.startswith("sessions/"):
        return None
    if name == "meta":
        return "session"
    if name == "head":
        return "message"
    if name.startswith("runs/"):
        return "run"
    return None


def governs(group: str) -> bool:
    """Session rules hold for what ``sessions/`` groups reach (§14.1); the store's own tests use others."""
    return group.startswith("sessions/")


class SessionSchema:
    """The hook the store's bundle reader and fsck call (:class:`kxen_agent.store.objects.Schema`)."""

    check = staticmethod(check)
    ref_kind = staticmethod(ref_kind)
    governs = staticmethod(governs)


SESSION_SCHEMA = SessionSchema()


def read(store: ObjectStore, oid: ObjectId, kind: str) -> Any:
    """``store.get(oid, kind)``, then its shape: a malformed object is a :class:`CorruptObject` naming it."""
    value = store.get(oid, kind)
    try:
        _CHECKS[kind](value)
    except SchemaViolation as e:
        raise CorruptObject(oid.hex(), f"{kind} object does not match objects_spec.md §{_SECTION[kind]}: {e}; "
                            "`kxen-agent fsck` lists every damaged object") from None
    return value


def misplaced(ses: str, ref: str, value: Any) -> str | None:
    """Why the ``meta`` or ``runs/<run>`` ref of session ``ses`` names an object that is not its own, or None.

    A shape check cannot see this (the object is a fine session or run, of
    another one); readers and imports both ask here.
    """
    if ref == "meta" and value["id"] != ses:
        return f"the metadata of session {ses} is that of {value['id']}"
    if ref.startswith("runs/") and (value["id"], value["session"]) != (ref[5:], ses):
        return (f"ref sessions/{ses}/{ref} names the state of run {value['id']} "
                f"of session {value['session']}")
    return None


def put(store: ObjectStore, kind: str, value: Any) -> ObjectId:
    """``store.put(kind, value)`` for a value that passes :func:`check`: a writer never
    leaves an object the readers would refuse (a provider's odd answer stops the
    run here, in one line, instead of every later read)."""
    try:
        _CHECKS[kind](value)
    except SchemaViolation as e:
        raise KxenError(f"refusing to write a {kind} object that does not match objects_spec.md "
                        f"§{_SECTION[kind]}: {e}; nothing was written — report this as a kxen-agent bug, "
                        "with the provider's answer if a run was calling one") from None
    return store.put(kind, value)


def text_blob(store: ObjectStore, oid: ObjectId) -> str:
    """The UTF-8 text of a content or output blob (§14.4, §14.6)."""
    try:
        return store.get(oid, "blob").decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorruptObject(oid.hex(), f"blob holds no UTF-8 text ({e.reason} at byte {e.start}); "
                            "`kxen-agent fsck` lists every damaged object") from None
