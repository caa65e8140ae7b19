"""Agent definition files: parse and validate a TOML definition into a lock body.

This module owns the definition format (keys, types, defaults) and turns a
file into the plain value a DCPAgent lock stores: only str, int, list, dict
and None, with the script provider's steps captured as canonical JSON text so
a session can resume where the steps file does not exist. It reads the
definition and its steps file and never writes anything; it never reads the
API key's value either, only the name of the variable that holds it.

Format (paths relative to the definition file)::

    name = "demo"
    provider = "script"                  # or "openai", "anthropic"
    script = "steps.json"                # script provider only
    model = "gpt-4.1-mini"               # required for openai and anthropic
    base_url = "http://127.0.0.1:8000/v1"
    api_key_env = "OPENAI_API_KEY"       # default without base_url: OPENAI_API_KEY / ANTHROPIC_API_KEY
    system = "You are a careful coding agent."
    tools = ["shell", "read_file", "write_file", "edit_file", "list_files"]  # default; "search" too (version 6)
    [policy]
    max_turns = 20                       # 1 .. 1_000_000
    tool_timeout_s = 120                 # > 0 .. 86400, int or float, ms precision
    cancel_window_s = 5                  # 0 .. 3600, int or float, ms precision
    env_keep = ["GITHUB_TOKEN", "AWS_*"] # credential-looking variables the shell keeps (default: none)
    approve = ["shell", "write_file"]    # tools whose calls wait for a yes on the terminal (default: none)
    context_tokens = 100000              # compact the model's view above this (default: never; not script)
    model_timeout_s = 300                # one model call's overall deadline, > 0 .. 86400 (version 4)
    max_tool_calls = 64                  # tool calls one answer may hold, 1 .. 10000 (version 4)
    max_argument_bytes = 1048576         # one call's arguments, 1024 .. 16 MiB (version 4)
    max_file_bytes = 8388608             # the most a file tool reads/writes of one file, 1024 .. 1 GiB (version 4)
    checkpoints = true                   # workspace checkpoints per tool call that may change it (version 5)
    checkpoint_max_file_bytes = 10485760 # a checkpoint leaves out larger files, 0 .. 1 TiB (version 5)
    checkpoint_max_files = 10000         # ... new or changed files past this many, 0 .. 10_000_000 (version 5)
    checkpoint_max_bytes = 268435456     # ... and past this many bytes of them in all, 0 .. 1 TiB (version 5)
    instructions = ["AGENTS.md"]         # project instruction file names read at run start (version 6 if not this)
    no_terminal = "pause"                # a call to approve with nobody to ask: "pause" the run, or "refuse" (6)
    commit_trailer = false               # true: the shell's commits get "Kxen-Session: <ses>@<msg>" (6)
    [mcp.servers.git]                    # MCP servers (version 6, §14.15; parsed by :mod:`.mcp_def`)
    command = "mcp-server-git"           # or url = "https://..." (streamable HTTP)
    args = ["--repository", "."]
    env_keep = ["GITHUB_TOKEN"]          # variable names the server gets, never values
    tools = ["git_status", "git_commit"] # the model calls mcp__git__git_status ...
    read_only = ["git_status"]           # run again after a crash; any other call is UNKNOWN

The lock is format version :data:`LOCK_VERSION` (6, ``objects_spec.md``
§14.2 and §14.15; written as 3 unless it records a limit only version 4 has:
``model_timeout_ms``, ``max_tool_calls``, ``max_argument_bytes``,
``max_file_bytes``, or a checkpoint key only version 5 has: ``checkpoints``,
``checkpoint_max_file_bytes``, ``checkpoint_max_files``,
``checkpoint_max_bytes``, or a key only version 6 has, each only when set
to other than its default: ``instructions``, ``no_terminal``, ``commit_trailer``, ``max_tokens``, ``temperature``,
``mcp`` servers, or the ``search`` tool): it records ``version`` and ``policy.env_keep`` (from 2) and may name
the ``anthropic`` provider (from 3). A lock without ``version`` is version
1, written before the shell tool dropped credential-looking variables: it
keeps its meaning (:func:`env_keep_of` says None: the shell keeps every
variable but the API key's); version 3 also records ``policy.approve``
and ``policy.context_tokens``.
``api_key_env`` defaults to the provider's
usual variable (:data:`DEFAULT_KEY_ENV`) only when the definition sets no
``base_url`` (the provider's own endpoint); the default is written into the
lock, so a lock's meaning never depends on the kxen-agent reading it.

Limitations: seconds must be whole milliseconds (``0.0005`` is refused, not
rounded) so the stored value is exactly what was written. A definition file
is at most :data:`MAX_DEFINITION_BYTES` (1 MiB) and a steps file at most
:data:`MAX_STEPS_BYTES` (16 MiB), checked before either is read whole; the
lock they make must fit one object (``MAX_OBJECT_SIZE``, 64 MiB). TOML and
JSON nested deeper than Python's recursion limit (about 1000 levels) are
refused as "nested too deeply", and JSON integers longer than 4000 digits
as too long.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
import urllib.parse
from decimal import Decimal, InvalidOperation
from typing import Any

from kxen_agent.errors import UsageError
from kxen_agent.store import codec
from kxen_agent.store.objects import MAX_OBJECT_SIZE

from .mcp_def import McpDefinitionError, mcp_tools, parse_mcp

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "DEFAULT_KEY_ENV",
    "DEFAULT_SYSTEM",
    "DEFAULT_TOOLS",
    "KNOWN_TOOLS",
    "MAX_DEFINITION_BYTES",
    "MAX_STEPS_BYTES",
    "PROVIDERS",
    "SIDE_EFFECT_TOOLS",
    "AgentDefinitionError",
    "LOCK_VERSION",
    "POLICY_V5_KEYS",
    "POLICY_V6_KEYS",
    "V6_TOOLS",
    "base_url_problem",
    "canonical_steps_json",
    "default_agent_definition",
    "env_keep_of",
    "instructions_of",
    "load_agent_definition",
    "parse_agent_definition",
    "validate_script_steps",
]

#: The largest agent definition file: far more than any system prompt needs.
MAX_DEFINITION_BYTES = 1 << 20
#: The largest script steps file; its canonical JSON is stored in the lock.
MAX_STEPS_BYTES = 16 << 20

KNOWN_TOOLS = ("shell", "read_file", "write_file", "edit_file", "list_files", "search")
#: A definition's tools when it names none: the five a version-3 lock knows (so a definition without ``tools``
#: still makes the lock, and the id, it always made); ``search`` is named to be had (version 6).
DEFAULT_TOOLS = ("shell", "read_file", "write_file", "edit_file", "list_files")
#: Tools only a version-6 lock may name (an older reader refuses such a lock as newer, not as corrupt).
V6_TOOLS = ("search",)
#: ``[policy] instructions`` when a definition sets none: the project instruction files read at a run's start.
DEFAULT_INSTRUCTIONS = ("AGENTS.md",)
_INSTRUCTIONS_MAX = 8
#: The tools that can change something (§14.6 ``sideEffects``): the only ones ``approve`` may list.
SIDE_EFFECT_TOOLS = ("shell", "write_file", "edit_file")
PROVIDERS = ("script", "openai", "anthropic")
#: The variable holding the key of a provider's own endpoint: the lock's
#: ``api_key_env`` when the definition names none and sets no ``base_url``.
DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
DEFAULT_SYSTEM = "You are a careful coding agent."

TOP_LEVEL_KEYS = ("name", "provider", "script", "model", "base_url", "api_key_env", "system", "tools", "policy",
                  "mcp")
STEP_KEYS = ("tool_calls", "content")
TOOL_CALL_KEYS = ("id", "name", "arguments")

# (TOML key, lock key, minimum, maximum, minimum is exclusive) — seconds in
# the file, milliseconds in the lock so no float ever reaches storage.
_POLICY_SECONDS = (
    ("tool_timeout_s", "tool_timeout_ms", 0, 86_400, True),
    ("cancel_window_s", "cancel_window_ms", 0, 3_600, False),
)
_MAX_TURNS_RANGE = (1, 1_000_000)
_POLICY_DEFAULTS = {"max_turns": 20, "tool_timeout_s": 120, "cancel_window_s": 5}
# Version 4 (§14.2): recorded only when the definition sets them (absent: the defaults), so that a
# definition without them still makes the version-3 lock it always made.
_POLICY_V4_INTS = {"max_tool_calls": (1, 10_000), "max_argument_bytes": (1024, 16 << 20),
                   "max_file_bytes": (1024, 1 << 30)}
# Version 5 (§14.2, §14.14): the workspace checkpoints, recorded only when the definition sets them.
_POLICY_V5_INTS = {"checkpoint_max_file_bytes": (0, 1 << 40), "checkpoint_max_files": (0, 10_000_000),
                   "checkpoint_max_bytes": (0, 1 << 40)}
_POLICY_KEYS = (*_POLICY_DEFAULTS, "env_keep", "approve", "context_tokens", "model_timeout_s", *_POLICY_V4_INTS,
                "checkpoints", *_POLICY_V5_INTS, "instructions", "no_terminal", "commit_trailer")
#: ``[policy] no_terminal`` (§14.2, version 6): a call needing approval that nobody can be asked about waits
#: (``pause``, the default: not recorded) or is refused (``refuse``: recorded).
NO_TERMINAL = ("pause", "refuse")
_CONTEXT_TOKENS_RANGE = (1_000, 100_000_000)

#: The agent lock's format version (§14.2): 2 added ``version`` and ``policy.env_keep``,
#: 3 the ``anthropic`` provider, ``policy.approve`` and ``policy.context_tokens``, 4 the answer limits,
#: 5 the workspace checkpoint keys, 6 ``mcp`` (§14.15), ``policy.instructions``, ``policy.no_terminal``,
#: ``policy.commit_trailer`` (§14.17), ``max_tokens``/``temperature`` and the ``search`` tool.
LOCK_VERSION = 6
#: ``policy`` keys only a version-4 lock has (its limits; absent, the defaults).
POLICY_V4_KEYS = ("model_timeout_ms", "max_tool_calls", "max_argument_bytes", "max_file_bytes")
#: ``policy`` keys only a version-5 lock has (workspace checkpoints; absent, on with the default bounds).
POLICY_V5_KEYS = ("checkpoints", *_POLICY_V5_INTS)
#: ``policy`` keys only a version-6 lock has, each written only when the definition sets it (absent: the default).
POLICY_V6_KEYS = ("instructions", "no_terminal", "commit_trailer")
#: Top-level lock keys only a version-6 lock has, each written only when the definition sets it.
LOCK_V6_KEYS: tuple[str, ...] = ("max_tokens", "temperature", "mcp")
#: ``[model] max_tokens``: the most tokens one answer may hold (the server's own limit still applies).
_MAX_TOKENS_RANGE = (1, 1_000_000)
#: ``[model] temperature``: 0 to 2, at most three decimals; the lock keeps it as text ("0.2": no float stored).
_TEMPERATURE = re.compile(r"(?:[0-1](?:\.[0-9]{1,3})?|2(?:\.0{1,3})?)")


def lock_version_for(policy: dict[str, Any], lock: dict[str, Any] | None = None) -> int:
    """The version a lock with ``policy`` (and top-level keys ``lock``, its ``tools`` among them) is written as:
    6, 5 or 4 when it records a key (or names a tool) of that version, else 3 (an older reader refuses a lock
    whose keys it cannot honour)."""
    lock = lock or {}
    if (any(k in policy for k in POLICY_V6_KEYS) or any(k in lock for k in LOCK_V6_KEYS)
            or any(t in V6_TOOLS for t in lock.get("tools", ()))):
        return 6
    if any(k in policy for k in POLICY_V5_KEYS):
        return 5
    return 4 if any(k in policy for k in POLICY_V4_KEYS) else 3
#: An ``env_keep`` entry: a variable name, ``*`` standing for any characters.
_ENV_KEEP = re.compile(r"[A-Za-z_*][A-Za-z0-9_*]*")
_ENV_KEEP_MAX = 256

_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
# Keys that look like an inline secret get a pointed message instead of "unknown key".
_SECRET_KEY = re.compile(r"(?:.*[_-])?(?:api[_-]?key|token|secret|password|passwd)", re.IGNORECASE)


class AgentDefinitionError(UsageError):
    """An agent definition file (or its steps file) is missing or invalid.

    ``source`` is the definition as the user named it; ``key`` the offending
    key (dotted for tables), or None for file-level problems.
    """

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        where = f"{source}: key '{key}'" if key is not None else source
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.key = key


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "table"
    return type(value).__name__  # TOML dates and times


def _json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "number"
    return _type_name(value)


# -- steps ----------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        # 1e400 parses to inf, which canonical JSON cannot write back.
        raise ValueError(f"number {text} is out of range")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > 4000:  # int() refuses more than 4300 with a message about sys.set_int_max_str_digits
        raise ValueError(f"an integer of {digits} digits is too long")
    return int(text)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            # Canonicalizing would silently keep one of the two; refuse instead.
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def canonical_steps_json(steps: list[Any]) -> str:
    """The canonical JSON text of ``steps`` as stored in the lock body."""
    return json.dumps(steps, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def validate_script_steps(steps: Any, tools: tuple[str, ...] | list[str], *, source: str) -> None:
    """Refuse (AgentDefinitionError naming ``source`` and key 'script') steps that are not a valid script.

    A script is a non-empty list of objects, each with ``tool_calls`` (a
    non-empty list of ``{"name": str, "arguments": object}``, optional
    ``"id": str``) and/or ``content`` (str); tool names must be in ``tools``.
    """
    problem = _steps_problem(steps, tools)
    if problem is not None:
        raise AgentDefinitionError(source, "script", problem)


def _steps_problem(steps: Any, tools: tuple[str, ...] | list[str]) -> str | None:
    if not isinstance(steps, list) or not steps:
        return f"steps must be a non-empty JSON array, got {'an empty array' if steps == [] else _json_type_name(steps)}"
    for i, step in enumerate(steps):
        at = f"steps[{i}]"
        if not isinstance(step, dict):
            return f"{at} must be an object, got {_json_type_name(step)}"
        unknown = [k for k in step if k not in STEP_KEYS]
        if unknown:
            return f"{at}: unknown key {unknown[0]!r} (expected: {', '.join(STEP_KEYS)})"
        if "tool_calls" not in step and "content" not in step:
            return f"{at} needs \"tool_calls\" or \"content\""
        if "content" in step and not isinstance(step["content"], str):
            return f"{at}.content must be a string, got {_json_type_name(step['content'])}"
        if "tool_calls" in step:
            calls = step["tool_calls"]
            if not isinstance(calls, list) or not calls:
                return f"{at}.tool_calls must be a non-empty array"
            for j, call in enumerate(calls):
                cat = f"{at}.tool_calls[{j}]"
                if not isinstance(call, dict):
                    return f"{cat} must be an object, got {_json_type_name(call)}"
                unknown = [k for k in call if k not in TOOL_CALL_KEYS]
                if unknown:
                    return f"{cat}: unknown key {unknown[0]!r} (expected: {', '.join(TOOL_CALL_KEYS)})"
                if not isinstance(call.get("name"), str):
                    return f"{cat}.name must be a string"
                if call["name"] not in tools:
                    return f"{cat}.name: tool {call['name']!r} is not in the definition's tools ({', '.join(tools) or 'none'})"
                if not isinstance(call.get("arguments"), dict):
                    return f"{cat}.arguments must be an object"
                if "id" in call and not isinstance(call["id"], str):
                    return f"{cat}.id must be a string"
    return None


def _read_limited(path: str, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``path``: one more than allowed tells "too big" without reading it all."""
    with open(path, "rb") as f:
        return f.read(limit + 1)


def _read_steps(source: str, base_dir: str, script: str) -> list[Any]:
    path = os.path.join(base_dir, script)
    try:
        data = _read_limited(path, MAX_STEPS_BYTES)
    except FileNotFoundError:
        raise AgentDefinitionError(
            source, "script", f"steps file {path} not found; create it or fix the path (relative to the definition)"
        ) from None
    except OSError as e:
        raise AgentDefinitionError(source, "script", f"cannot read steps file {path}: {e.strerror}") from None
    if len(data) > MAX_STEPS_BYTES:
        raise AgentDefinitionError(
            source, "script", f"steps file {path} is larger than the {MAX_STEPS_BYTES}-byte limit; shorten the script"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AgentDefinitionError(source, "script", f"steps file {path} is not UTF-8 (byte {e.start})") from None
    try:
        return json.loads(
            text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant, parse_float=_finite_float,
            parse_int=_bounded_int,
        )
    except json.JSONDecodeError as e:
        raise AgentDefinitionError(
            source, "script", f"steps file {path} is not valid JSON: {e.msg} (at line {e.lineno}, column {e.colno})"
        ) from None
    except ValueError as e:
        raise AgentDefinitionError(source, "script", f"steps file {path} is not valid JSON: {e}") from None
    except RecursionError:
        raise AgentDefinitionError(source, "script", f"steps file {path} is nested too deeply; flatten it") from None


# -- definition -----------------------------------------------------------------------------


def _string(source: str, doc: dict[str, Any], key: str, *, non_empty: bool = True) -> str | None:
    if key not in doc:
        return None
    value = doc[key]
    if not isinstance(value, str):
        raise AgentDefinitionError(source, key, f"expected a string, got {_type_name(value)}")
    if non_empty and not value.strip():
        raise AgentDefinitionError(source, key, "must not be empty")
    return value


def _seconds_to_ms(source: str, key: str, value: Any, low: int, high: int, exclusive: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AgentDefinitionError(source, key, f"expected a number of seconds, got {_type_name(value)}")
    try:
        # str(float) is the shortest repr, so 0.1 becomes exactly 100 ms, not 100.000000000000005.
        ms = Decimal(str(value)) * 1000
    except InvalidOperation:
        raise AgentDefinitionError(source, key, f"{value!r} is not a number") from None
    if not ms.is_finite():
        raise AgentDefinitionError(source, key, f"must be finite, got {value!r}")
    bound = f"{'greater than' if exclusive else 'at least'} {low} and at most {high}"
    if ms < low * 1000 or (exclusive and ms == low * 1000) or ms > high * 1000:
        raise AgentDefinitionError(source, key, f"{value!r} is out of range (must be {bound} seconds)")
    if ms != ms.to_integral_value():
        raise AgentDefinitionError(source, key, f"{value!r} is finer than a millisecond; use at most 3 decimals")
    return int(ms)


def _policy(source: str, doc: dict[str, Any]) -> dict[str, int]:
    table = doc.get("policy", {})
    if not isinstance(table, dict):
        raise AgentDefinitionError(source, "policy", f"expected a table ([policy]), got {_type_name(table)}")
    for key in table:
        if key not in _POLICY_KEYS:
            raise AgentDefinitionError(source, f"policy.{key}", f"unknown key (expected one of: {', '.join(_POLICY_KEYS)})")
    values = {**_POLICY_DEFAULTS, **table}
    turns = values["max_turns"]
    if isinstance(turns, bool) or not isinstance(turns, int):
        raise AgentDefinitionError(source, "policy.max_turns", f"expected an integer, got {_type_name(turns)}")
    if not _MAX_TURNS_RANGE[0] <= turns <= _MAX_TURNS_RANGE[1]:
        raise AgentDefinitionError(
            source, "policy.max_turns", f"{turns} is out of range (must be {_MAX_TURNS_RANGE[0]} to {_MAX_TURNS_RANGE[1]})"
        )
    policy: dict[str, Any] = {"max_turns": turns}
    for toml_key, lock_key, low, high, exclusive in _POLICY_SECONDS:
        policy[lock_key] = _seconds_to_ms(source, f"policy.{toml_key}", values[toml_key], low, high, exclusive)
    policy["env_keep"] = _env_keep(source, table.get("env_keep", []))
    policy["approve"] = _approve(source, table.get("approve", []))
    tokens = table.get("context_tokens")
    if tokens is not None:
        low, high = _CONTEXT_TOKENS_RANGE
        if isinstance(tokens, bool) or not isinstance(tokens, int):
            raise AgentDefinitionError(source, "policy.context_tokens", f"expected an integer, got {_type_name(tokens)}")
        if not low <= tokens <= high:
            raise AgentDefinitionError(source, "policy.context_tokens", f"{tokens} is out of range (must be {low} to {high})")
        if doc.get("provider") == "script":
            raise AgentDefinitionError(source, "policy.context_tokens", "the script provider replays its steps by "
                                       "the history it is shown, which compaction shortens; remove it")
    policy["context_tokens"] = tokens
    if "model_timeout_s" in table:
        policy["model_timeout_ms"] = _seconds_to_ms(source, "policy.model_timeout_s", table["model_timeout_s"],
                                                    0, 86_400, True)
    for key, (low, high) in _POLICY_V4_INTS.items():
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise AgentDefinitionError(source, f"policy.{key}", f"expected an integer, got {_type_name(value)}")
            if not low <= value <= high:
                raise AgentDefinitionError(source, f"policy.{key}", f"{value} is out of range (must be {low} to {high})")
            policy[key] = value
    if "checkpoints" in table:
        if not isinstance(table["checkpoints"], bool):
            raise AgentDefinitionError(source, "policy.checkpoints",
                                       f"expected true or false, got {_type_name(table['checkpoints'])}")
        policy["checkpoints"] = table["checkpoints"]
    for key, (low, high) in _POLICY_V5_INTS.items():
        if key in table:
            value = table[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise AgentDefinitionError(source, f"policy.{key}", f"expected an integer, got {_type_name(value)}")
            if not low <= value <= high:
                raise AgentDefinitionError(source, f"policy.{key}", f"{value} is out of range (must be {low} to {high})")
            policy[key] = value
    if "instructions" in table:
        names = _instructions(source, table["instructions"])
        if tuple(names) != DEFAULT_INSTRUCTIONS:  # the default is not recorded: the lock (and its id) stays as it was
            policy["instructions"] = names
    if "no_terminal" in table:
        if table["no_terminal"] not in NO_TERMINAL:
            raise AgentDefinitionError(source, "policy.no_terminal", f"expected \"pause\" or \"refuse\", got "
                                       f"{table['no_terminal']!r}")
        if table["no_terminal"] != "pause":  # the default is not recorded: the lock stays what it was
            policy["no_terminal"] = table["no_terminal"]
    if "commit_trailer" in table:
        if not isinstance(table["commit_trailer"], bool):
            raise AgentDefinitionError(source, "policy.commit_trailer",
                                       f"expected true or false, got {_type_name(table['commit_trailer'])}")
        if table["commit_trailer"]:  # false, the default, is not recorded: the lock stays what it was
            policy["commit_trailer"] = True
    return policy


def _instructions(source: str, names: Any) -> list[str]:
    """``[policy] instructions``: the file names read as project instructions in each directory (§14.5)."""
    key = "policy.instructions"
    if not isinstance(names, list):
        raise AgentDefinitionError(source, key, f"expected an array of file names, got {_type_name(names)}")
    if len(names) > _INSTRUCTIONS_MAX:
        raise AgentDefinitionError(source, key, f"{len(names)} names, more than {_INSTRUCTIONS_MAX}")
    out: list[str] = []
    for name in names:
        if not isinstance(name, str):
            raise AgentDefinitionError(source, key, f"expected file names (strings), got {_type_name(name)}")
        if (not name or name in (".", "..") or "/" in name or "\\" in name or len(name.encode("utf-8")) > 255
                or any(ord(c) < 32 or ord(c) == 127 for c in name)):
            raise AgentDefinitionError(source, key, f"{name!r} is not a file name (one path component, no / or "
                                       "control characters), e.g. \"AGENTS.md\"")
        if name in out:
            raise AgentDefinitionError(source, key, f"{name!r} is listed twice; list each once")
        out.append(name)
    return out


def instructions_of(lock: dict[str, Any]) -> tuple[str, ...]:
    """The project instruction file names a run of this lock reads (absent, or a lock older than version 6:
    the default)."""
    names = lock.get("policy", {}).get("instructions") if lock.get("version", 1) >= 6 else None
    return DEFAULT_INSTRUCTIONS if names is None else tuple(names)


def _approve(source: str, tools: Any) -> list[str]:
    """``[policy] approve``: the tools whose calls wait for a person's yes (tools with side effects only)."""
    key = "policy.approve"
    if not isinstance(tools, list):
        raise AgentDefinitionError(source, key, f"expected an array of tool names, got {_type_name(tools)}")
    out: list[str] = []
    for tool in tools:
        if not isinstance(tool, str):
            raise AgentDefinitionError(source, key, f"expected tool names (strings), got {_type_name(tool)}")
        if tool.startswith("mcp__") and tool not in out:  # an MCP tool: checked against [mcp.servers] later
            out.append(tool)
            continue
        if tool not in KNOWN_TOOLS:
            raise AgentDefinitionError(source, key, f"unknown tool {tool!r} (expected any of: {', '.join(SIDE_EFFECT_TOOLS)})")
        if tool not in SIDE_EFFECT_TOOLS:
            raise AgentDefinitionError(source, key, f"{tool!r} changes nothing, so its calls never ask; remove it "
                                       f"(tools that can: {', '.join(SIDE_EFFECT_TOOLS)})")
        if tool in out:
            raise AgentDefinitionError(source, key, f"tool {tool!r} is listed twice; list each tool once")
        out.append(tool)
    return out


def _env_keep(source: str, keep: Any) -> list[str]:
    """``[policy] env_keep``: the credential-looking variables the shell tool keeps (names, ``*`` globs)."""
    key = "policy.env_keep"
    if not isinstance(keep, list):
        raise AgentDefinitionError(source, key, f"expected an array of variable names, got {_type_name(keep)}")
    if len(keep) > _ENV_KEEP_MAX:
        raise AgentDefinitionError(source, key, f"{len(keep)} entries, more than {_ENV_KEEP_MAX}; use a * pattern")
    out: list[str] = []
    for name in keep:
        if not isinstance(name, str):
            raise AgentDefinitionError(source, key, f"expected variable names (strings), got {_type_name(name)}")
        if not _ENV_KEEP.fullmatch(name):
            raise AgentDefinitionError(source, key, f"{name!r} is not a variable name (A-Z, a-z, 0-9, _; * for any "
                                       "characters), e.g. \"GITHUB_TOKEN\" or \"AWS_*\"")
        if name in out:
            raise AgentDefinitionError(source, key, f"{name!r} is listed twice; list each once")
        out.append(name)
    return out


def env_keep_of(lock: dict[str, Any]) -> tuple[str, ...] | None:
    """The credential-looking variables the shell keeps for this lock; None for a version-1 lock (it keeps all)."""
    if lock.get("version", 1) < 2:
        return None
    return tuple(lock["policy"]["env_keep"])


def _tools(source: str, doc: dict[str, Any]) -> list[str]:
    if "tools" not in doc:
        return list(DEFAULT_TOOLS)
    tools = doc["tools"]
    if not isinstance(tools, list):
        raise AgentDefinitionError(source, "tools", f"expected an array of tool names, got {_type_name(tools)}")
    seen: list[str] = []
    for tool in tools:
        if not isinstance(tool, str):
            raise AgentDefinitionError(source, "tools", f"expected tool names (strings), got {_type_name(tool)}")
        if tool not in KNOWN_TOOLS:
            raise AgentDefinitionError(
                source, "tools", f"unknown tool {tool!r} (expected any of: {', '.join(KNOWN_TOOLS)})"
            )
        if tool in seen:
            raise AgentDefinitionError(source, "tools", f"tool {tool!r} is listed twice; list each tool once")
        seen.append(tool)
    return seen


def base_url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as a provider's base URL (§14.2), or None.

    The rule of the definition's ``base_url``, shared with a run's
    ``--base-url``: an http:// or https:// URL without user-info.
    """
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as e:  # "http://[::1" (unclosed IPv6 bracket), "http://h:99999"
        return f"not a valid URL ({e}); expected e.g. http://127.0.0.1:8000/v1"
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "expected an http:// or https:// URL"
    if "@" in parts.netloc:
        return "must not contain credentials (user:key@); use api_key_env for the key"
    return None


def parse_agent_definition(text: str, base_dir: str, source: str) -> dict[str, Any]:
    """The lock body of the definition ``text``; ``source`` names it in errors.

    Reads nothing but the script provider's steps file, resolved against
    ``base_dir``.
    """
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AgentDefinitionError(source, None, f"invalid TOML: {e}") from None
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise AgentDefinitionError(source, None, "invalid TOML: arrays or tables nested too deeply") from None

    for key in doc:
        if key in TOP_LEVEL_KEYS:
            continue
        if _SECRET_KEY.fullmatch(key):
            # Never echo the value: it is probably a live credential.
            raise AgentDefinitionError(
                source, key, "secrets must not be written in the definition; put the variable's name in "
                "api_key_env (e.g. api_key_env = \"OPENAI_API_KEY\") and export the key there"
            )
        raise AgentDefinitionError(source, key, f"unknown key (expected one of: {', '.join(TOP_LEVEL_KEYS)})")

    name = _string(source, doc, "name")
    if name is None:
        raise AgentDefinitionError(source, "name", "missing; add e.g. name = \"my-agent\"")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise AgentDefinitionError(source, "name", "must be one line without control characters")

    provider = _string(source, doc, "provider")
    if provider is None:
        raise AgentDefinitionError(source, "provider", f"missing; add provider = \"script\" (one of: {', '.join(PROVIDERS)})")
    if provider not in PROVIDERS:
        raise AgentDefinitionError(
            source, "provider", f"unknown provider {provider!r} (expected one of: {', '.join(PROVIDERS)})"
        )

    doc, settings = _model_table(source, doc)
    if settings and provider == "script":
        raise AgentDefinitionError(source, "model", "max_tokens and temperature are settings of a model's server; "
                                   "the script provider replays its steps: remove them")
    model = _string(source, doc, "model")
    if model is not None and any(ord(c) < 32 or 127 <= ord(c) < 160 for c in model):
        raise AgentDefinitionError(source, "model", "must be one line without control characters")
    base_url = _string(source, doc, "base_url")
    problem = None if base_url is None else base_url_problem(base_url)
    if problem is not None:
        raise AgentDefinitionError(source, "base_url", problem)
    api_key_env = _string(source, doc, "api_key_env")
    if api_key_env is not None and not _ENV_NAME.fullmatch(api_key_env):
        raise AgentDefinitionError(
            source, "api_key_env",
            "expected an environment variable NAME like OPENAI_API_KEY (A-Z, 0-9, _), not the key itself",
        )
    if api_key_env is None and base_url is None and provider in DEFAULT_KEY_ENV:
        # The provider's own endpoint wants its usual key; a custom one gets a key only from a variable named.
        api_key_env = DEFAULT_KEY_ENV[provider]
    system = _string(source, doc, "system", non_empty=False)
    tools = _tools(source, doc)
    policy = _policy(source, doc)
    if api_key_env is not None:
        import fnmatch

        kept = [k for k in policy["env_keep"] if fnmatch.fnmatchcase(api_key_env, k)]
        if kept:
            raise AgentDefinitionError(source, "policy.env_keep", f"{kept[0]!r} keeps {api_key_env}, the provider "
                                       "key's variable, which is never given to tools; remove it")

    mcp = _mcp(source, doc, policy, api_key_env)
    script_text: str | None = None
    script = _string(source, doc, "script")
    if provider == "script":
        if script is None:
            raise AgentDefinitionError(source, "script", "missing; the script provider needs script = \"steps.json\"")
        steps = _read_steps(source, base_dir, script)
        problem = _steps_problem(steps, [*tools, *mcp_tools({"mcp": mcp})])
        if problem is not None:
            raise AgentDefinitionError(source, "script", f"{script}: {problem}")
        try:
            script_text = canonical_steps_json(steps)
        except RecursionError:  # the encoder recurses like the decoder, a few frames deeper
            raise AgentDefinitionError(source, "script", f"{script}: steps nested too deeply; flatten them") from None
        if model is None:
            model = "script"
    else:
        if script is not None:
            raise AgentDefinitionError(source, "script", f"only valid with provider = \"script\", not {provider!r}; remove it")
        if model is None:
            raise AgentDefinitionError(source, "model", f"required for provider {provider!r}; add e.g. model = \"gpt-4.1-mini\"")

    lock = {
        "version": 3,  # set below, from what the lock records
        "name": name,
        "provider": provider,
        "model": model,
        "base_url": base_url,
        "api_key_env": api_key_env,
        "system": DEFAULT_SYSTEM if system is None else system,
        "tools": tools,
        "policy": policy,
        "script": script_text,
        **({"mcp": mcp} if mcp is not None else {}),  # only when set: a lock without servers keeps its id
    }
    lock.update(settings)  # only the settings the definition gave: without them the lock is what it was
    lock["version"] = lock_version_for(policy, lock)
    _check_lock_size(source, lock)
    return lock


def _mcp(source: str, doc: dict[str, Any], policy: dict[str, Any], api_key_env: str | None) -> dict | None:
    """The lock's ``mcp`` (:mod:`.mcp_def`), None without ``[mcp]``; ``[policy] approve`` may name its tools."""
    mcp = None
    if "mcp" in doc:
        try:
            mcp = parse_mcp(doc["mcp"], api_key_env=api_key_env)
        except McpDefinitionError as e:
            raise AgentDefinitionError(source, e.key, e.problem) from None
    named = mcp_tools({"mcp": mcp})
    for tool in policy["approve"]:
        if tool.startswith("mcp__"):
            server, name = named.get(tool, (None, None))
            if server is None:
                raise AgentDefinitionError(source, "policy.approve", f"{tool!r} is not a tool of the definition's "
                                           f"MCP servers ({', '.join(named) or 'none'})")
            if name in mcp["servers"][server]["read_only"]:
                raise AgentDefinitionError(source, "policy.approve", f"{tool!r} is declared read_only, so its "
                                           "calls never ask; remove it")
    return mcp


def _model_table(source: str, doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``[model]`` as a table (``name``, ``max_tokens``, ``temperature``): the document with ``model`` its
    name, and the settings it gave, as the lock records them (version 6; ``model = "NAME"`` gives none)."""
    table = doc.get("model")
    if not isinstance(table, dict):
        return doc, {}
    for key in table:
        if key not in ("name", "max_tokens", "temperature"):
            raise AgentDefinitionError(source, f"model.{key}", "unknown key (expected one of: name, max_tokens, "
                                       "temperature)")
    settings: dict[str, Any] = {}
    if "max_tokens" in table:
        value, (low, high) = table["max_tokens"], _MAX_TOKENS_RANGE
        if isinstance(value, bool) or not isinstance(value, int):
            raise AgentDefinitionError(source, "model.max_tokens", f"expected an integer, got {_type_name(value)}")
        if not low <= value <= high:
            raise AgentDefinitionError(source, "model.max_tokens", f"{value} is out of range (must be {low} to {high})")
        settings["max_tokens"] = value
    if "temperature" in table:
        value = table["temperature"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AgentDefinitionError(source, "model.temperature", f"expected a number, got {_type_name(value)}")
        text = f"{float(value):.3f}".rstrip("0").rstrip(".")
        if not _TEMPERATURE.fullmatch(text) or float(text) != float(value):
            raise AgentDefinitionError(source, "model.temperature", f"{value} is not a number from 0 to 2 with at "
                                       "most three decimals")
        settings["temperature"] = text
    rest = {k: v for k, v in doc.items() if k != "model"}
    return (dict(rest, model=table["name"]) if "name" in table else rest), settings


def _check_lock_size(source: str, lock: dict[str, Any]) -> None:
    """Refuse a lock that would not fit one object, before any session (or state dir) exists.

    The file limits make this unlikely but do not rule it out: canonical
    JSON can be longer than the steps file (``9e15`` becomes
    ``9000000000000000.0``), and parse_agent_definition takes any text.
    """
    try:
        size = len(codec.encode(lock))  # the object's body; the limit is on the body
    except codec.EncodeError as e:
        raise AgentDefinitionError(source, None, f"cannot be stored as an agent lock: {e}") from None
    if size > MAX_OBJECT_SIZE:
        raise AgentDefinitionError(
            source, None, f"the agent lock would be {size} bytes, over the {MAX_OBJECT_SIZE}-byte object limit; "
            "shorten system or the script's steps"
        )


def load_agent_definition(path: str) -> dict[str, Any]:
    """The lock body of the definition file at ``path`` (see :func:`parse_agent_definition`)."""
    try:
        data = _read_limited(path, MAX_DEFINITION_BYTES)
    except FileNotFoundError:
        raise AgentDefinitionError(path, None, "agent definition not found; check the path") from None
    except IsADirectoryError:
        raise AgentDefinitionError(path, None, "is a directory, not an agent definition file") from None
    except OSError as e:
        raise AgentDefinitionError(path, None, f"cannot read agent definition: {e.strerror}") from None
    if len(data) > MAX_DEFINITION_BYTES:
        raise AgentDefinitionError(
            path, None, f"agent definition is larger than the {MAX_DEFINITION_BYTES}-byte limit; shorten it "
            "(the script provider's steps go in the steps file, which may be larger)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AgentDefinitionError(path, None, f"not UTF-8 (byte {e.start}); TOML files must be UTF-8") from None
    return parse_agent_definition(text, os.path.dirname(os.path.abspath(path)), path)


def default_agent_definition(steps: list[Any], *, name: str = "default") -> dict[str, Any]:
    """The lock body of a script-provider agent with every default and ``steps`` embedded."""
    if not isinstance(name, str) or not name.strip():
        raise AgentDefinitionError("<embedded steps>", "name", "must be a non-empty string")
    validate_script_steps(steps, DEFAULT_TOOLS, source="<embedded steps>")
    try:
        script = canonical_steps_json(steps)
    except (TypeError, ValueError) as e:
        raise AgentDefinitionError("<embedded steps>", "script", f"steps are not JSON-serializable: {e}") from None
    return {
        "version": 3,  # no version-4 policy key
        "name": name,
        "provider": "script",
        "model": "script",
        "base_url": None,
        "api_key_env": None,
        "system": DEFAULT_SYSTEM,
        "tools": list(DEFAULT_TOOLS),
        "policy": {
            "max_turns": _POLICY_DEFAULTS["max_turns"],
            "tool_timeout_ms": _POLICY_DEFAULTS["tool_timeout_s"] * 1000,
            "cancel_window_ms": _POLICY_DEFAULTS["cancel_window_s"] * 1000,
            "env_keep": [],
            "approve": [],
            "context_tokens": None,
        },
        "script": script,
    }
