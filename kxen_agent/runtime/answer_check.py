"""The door a model's answer passes before anything of it is recorded.

A model endpoint is not trusted: an answer may hold tool-call arguments
nested 1,500 deep (Python's JSON decoder and every SDK recurse on them and
raise ``RecursionError``), strings that are not Unicode (a lone surrogate,
``"\\ud800"``, that no file name, UTF-8 encoder or CBOR writer takes),
arguments of 50 MB, or ten thousand calls. Recorded as they came, such a
value crashes every later read of the session. This module owns the rules
an answer must meet and what happens to a part that breaks them:

- arguments are JSON text of at most ``max_argument_bytes`` bytes (UTF-8),
  nested at most :data:`MAX_DEPTH` deep, holding an object, with no lone
  surrogate in any key or string; otherwise the call's arguments are
  recorded as :func:`refused_arguments` — a JSON string saying why — so
  the call is never run and its tool result is that error, for the model
  to read (:func:`parse_arguments` raises it);
- at most ``max_tool_calls`` calls per answer: an answer with more runs
  none of them (the first ``max_tool_calls`` are recorded, refused, so the
  model is told; the rest are left out);
- texts (content, tool names, ids, model name, finish reason) are made
  valid Unicode: a lone surrogate becomes U+FFFD.

It is pure: no I/O, no clock; the providers call :func:`check_turn` as an
answer enters, the runner :func:`parse_arguments` before a call runs (so
values recorded before this door existed are refused, not crashed on), and
the history loader :func:`safe_provider_message` before old values are
sent to a model again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "DEFAULT_MAX_ARGUMENT_BYTES",
    "DEFAULT_MAX_TOOL_CALLS",
    "MAX_DEPTH",
    "AnswerLimits",
    "BadArguments",
    "arguments_problem",
    "check_turn",
    "clean_text",
    "limits_of",
    "parse_arguments",
    "refused_arguments",
    "safe_provider_message",
]

#: How deep a call's arguments may nest (objects and arrays). Fixed: Python's JSON
#: decoder and the SDKs recurse once per level, and real tool arguments use 2 or 3.
MAX_DEPTH = 64
#: ``[policy] max_argument_bytes`` by default: one call's arguments, UTF-8 bytes.
DEFAULT_MAX_ARGUMENT_BYTES = 1 << 20
#: ``[policy] max_tool_calls`` by default: tool calls in one answer.
DEFAULT_MAX_TOOL_CALLS = 64
#: What a refused call's recorded arguments (a JSON string) start with.
REFUSED_PREFIX = "kxen-agent refused these arguments: "
# Tool names and call ids longer than this are not a model's (ours are < 64 characters).
_MAX_NAME = 256

_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class AnswerLimits:
    """The limits of one answer (``[policy]`` of the agent lock, or the defaults)."""

    max_argument_bytes: int = DEFAULT_MAX_ARGUMENT_BYTES
    max_tool_calls: int = DEFAULT_MAX_TOOL_CALLS


def limits_of(lock: Mapping[str, Any] | None) -> AnswerLimits:
    """The limits an agent lock sets (absent keys: the defaults)."""
    policy = (lock or {}).get("policy") or {}

    def value(key: str, default: int, high: int) -> int:
        # Within what a definition may set (agent_def), whatever a foreign lock says.
        v = policy.get(key) if isinstance(policy, Mapping) else None
        return v if type(v) is int and 1 <= v <= high else default

    return AnswerLimits(max_argument_bytes=value("max_argument_bytes", DEFAULT_MAX_ARGUMENT_BYTES, 16 << 20),
                        max_tool_calls=value("max_tool_calls", DEFAULT_MAX_TOOL_CALLS, 10_000))


class BadArguments(ValueError):
    """A call's arguments break a rule of the door; the text says which, for the model."""


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (what UTF-8 can carry)."""
    return _SURROGATE.sub("\ufffd", text) if _SURROGATE.search(text) else text


def _too_deep(value: Any, limit: int) -> bool:
    """Whether parsed JSON ``value`` nests objects and arrays more than ``limit`` deep (a loop, no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        if d > limit:
            return True
        stack.extend((c, d + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _loads(text: str) -> Any:
    """``json.loads`` of ``text``, NaN and Infinity refused; :class:`BadArguments` for what does not parse.

    The decoder recurses once per level, guarded by Python's recursion limit: a text nested past it
    (1,500 deep) raises RecursionError, reported here as too deep, never raised on.
    """
    try:
        return json.loads(text, parse_constant=_no_constant)
    except BadArguments:
        raise
    except RecursionError:
        raise BadArguments(f"arguments nested more than {MAX_DEPTH} levels deep; send a flatter object") from None
    except ValueError as e:
        raise BadArguments(f"arguments are not valid JSON ({e})") from None


def _lone_surrogate(text: str) -> bool:
    return not text.isascii() and _SURROGATE.search(text) is not None


def _no_constant(name: str) -> Any:
    raise BadArguments(f"{name} is not JSON")


def parse_arguments(text: Any, *, max_bytes: int | None = None, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    """The object a call's arguments ``text`` hold, or :class:`BadArguments` saying why not.

    Never raises RecursionError and never returns a string that is not Unicode. ``max_bytes`` None: no size limit (a value already recorded).
    A refused call's arguments (:func:`refused_arguments`) raise with the reason
    they were refused.
    """
    if not isinstance(text, str):
        raise BadArguments(f"arguments must be JSON text, not {type(text).__name__}")
    if max_bytes is not None and len(text) > max_bytes:  # at least as many bytes as characters
        raise BadArguments(f"arguments of {len(text):,} characters, over the limit of {max_bytes:,} bytes "
                           "([policy] max_argument_bytes); send less at a time")
    if _lone_surrogate(text):
        raise BadArguments("arguments hold a lone surrogate (not Unicode); send valid UTF-8 text")
    if max_bytes is not None:
        size = len(text.encode("utf-8"))
        if size > max_bytes:
            raise BadArguments(f"arguments of {size:,} bytes, over the limit of {max_bytes:,} bytes "
                               "([policy] max_argument_bytes); send less at a time")
    value = _loads(text)
    if _too_deep(value, max_depth):
        raise BadArguments(f"arguments nested more than {max_depth} levels deep; send a flatter object")
    if isinstance(value, str) and value.startswith(REFUSED_PREFIX):
        raise BadArguments(value[len(REFUSED_PREFIX):])
    if not isinstance(value, dict):
        raise BadArguments("arguments must be a JSON object")
    if "\\u" in text and _has_surrogate(value):  # only an escape can have made one
        raise BadArguments("arguments hold a lone surrogate (\\ud800-\\udfff escape, not Unicode); "
                           "send valid Unicode text")
    return value


def _has_surrogate(value: Any) -> bool:
    stack = [value]  # depth is bounded already; a stack all the same (no recursion at all)
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def arguments_problem(text: Any, *, max_bytes: int | None = None) -> str | None:
    """Why ``text`` would be refused by :func:`parse_arguments`, or None."""
    try:
        parse_arguments(text, max_bytes=max_bytes)
    except BadArguments as e:
        return str(e)
    return None


def refused_arguments(problem: str) -> str:
    """The arguments recorded for a refused call: a JSON string (ASCII) saying why."""
    return json.dumps(REFUSED_PREFIX + clean_text(problem))


def _clean_id(cid: Any) -> str | None:
    if not isinstance(cid, str) or not cid or len(cid) > _MAX_NAME or _SURROGATE.search(cid):
        return None  # the runner makes one (§14.1)
    return cid


def check_turn(turn: Any, limits: AnswerLimits) -> Any:
    """``turn`` (an :class:`~.providers.base.AssistantTurn`) as it may be recorded.

    Calls whose arguments break a rule get :func:`refused_arguments`
    instead; over ``limits.max_tool_calls`` calls, every call is refused and
    only the first ``max_tool_calls`` are kept. Texts are made valid Unicode.
    Returns ``turn`` itself when nothing needed changing.
    """
    calls = turn.tool_calls
    over = len(calls) > limits.max_tool_calls
    checked: list[Any] = []
    changed = over
    for c in calls[: limits.max_tool_calls]:
        name = c.name if isinstance(c.name, str) else ""
        if len(name) > _MAX_NAME:
            name = name[:_MAX_NAME]
        name = clean_text(name)
        cid = _clean_id(c.id)
        if over:
            args = refused_arguments(
                f"the answer asked for {len(calls)} tool calls, over the limit of {limits.max_tool_calls} per answer "
                "([policy] max_tool_calls); none was run; ask for fewer at a time")
        else:
            problem = arguments_problem(c.arguments, max_bytes=limits.max_argument_bytes)
            args = c.arguments if problem is None else refused_arguments(problem)
        if (name, cid, args) != (c.name, c.id, c.arguments):
            changed = True
            c = replace(c, id=cid, name=name, arguments=args)
        checked.append(c)
    texts = {k: getattr(turn, k) for k in ("content", "model", "finish_reason")}
    cleaned = {k: clean_text(v) if isinstance(v, str) else v for k, v in texts.items()}
    dropped = tuple(clean_text(k) if isinstance(k, str) else str(k) for k in turn.dropped_calls)
    if not changed and cleaned == texts and dropped == turn.dropped_calls:
        return turn
    return replace(turn, tool_calls=tuple(checked), dropped_calls=dropped, **cleaned)


def safe_provider_message(message: dict[str, Any]) -> dict[str, Any]:
    """A recorded message in provider form, with any tool call whose arguments the door would refuse
    (recorded before it existed) carrying :func:`refused_arguments` instead: what is sent to a model
    again never crashes an SDK. ``message`` itself when nothing changes (the common case)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = None
    for i, c in enumerate(calls):
        args = c.get("arguments")
        if not isinstance(args, str) or _quick_ok(args):
            continue  # (the schema holds arguments to text)
        problem = _crash_problem(args)
        if problem is None:
            continue
        if fixed is None:
            fixed = list(calls)
        fixed[i] = {**c, "arguments": refused_arguments(problem)}
    return message if fixed is None else {**message, "tool_calls": fixed}


def _crash_problem(text: str) -> str | None:
    """Why recorded arguments ``text`` would crash a reader (too deep, not Unicode), or None. Other faults
    (not JSON, not an object) are left as recorded: the runner refuses them and providers send them as text."""
    if _lone_surrogate(text):
        return "arguments hold a lone surrogate (not Unicode)"
    try:
        value = json.loads(text)
    except RecursionError:
        return f"arguments nested more than {MAX_DEPTH} levels deep"
    except ValueError:
        return None
    if _too_deep(value, MAX_DEPTH):
        return f"arguments nested more than {MAX_DEPTH} levels deep"
    if "\\u" in text and _has_surrogate(value):
        return "arguments hold a lone surrogate (\\ud800-\\udfff escape, not Unicode)"
    return None


def _quick_ok(text: str) -> bool:
    """True when ``text`` surely cannot crash a reader: shallow, and no surrogate raw or escaped."""
    return text.count("[") + text.count("{") <= MAX_DEPTH and "\\u" not in text and not _lone_surrogate(text)
