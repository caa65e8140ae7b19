"""The contract between the runtime and a tool.

This module owns what every tool shares: the :class:`Tool` protocol, the
:class:`ToolContext` a call runs under (which secrets to hide from the
tool's environment and output: the rules are :mod:`kxen_agent.runtime.redaction`'s),
the :class:`ToolOutcome` it reports, the :class:`ToolOutcomeUnknown`
verdict, and the checking of a call's arguments against the tool's flat
JSON schema.

It must never run a tool, touch the workspace or start a process (that is
:mod:`.files` and :mod:`.shell`), and never journal, retry or decide what a
run does next: a tool reports one :class:`ToolOutcome` (or raises
:class:`ToolOutcomeUnknown`) and the runtime decides. Bad arguments are
outcomes the model can read and correct, never exceptions that reach the
runtime.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..commit_trailer import CommitTrailer
from ..redaction import credential_env_values, redact, tool_environment

__all__ = [
    "BadArguments",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "ToolOutcomeUnknown",
    "check_arguments",
    "redact",
]


@dataclass(frozen=True)
class ToolOutcome:
    """What a tool reports back to the model; ``is_error`` marks a failure."""

    output: str
    is_error: bool


class ToolOutcomeUnknown(Exception):
    """A tool had to be killed after the cancellation window and its effect
    cannot be proven; the runtime must record the call as outcome-unknown.

    ``output`` is whatever the tool produced before it was killed.
    """

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.output = output


@dataclass
class ToolContext:
    """Where and under which limits a tool runs.

    ``workspace`` is the realpath of the workspace root; ``cancel`` is set by
    the runtime on Ctrl-C/SIGTERM; ``secret_env_names`` (the API key's
    variable) are removed from the shell's environment whatever the policy;
    ``env_keep`` is the agent policy's list of credential-looking variables
    the shell keeps (names or ``*`` globs), None for an agent lock of
    version 1, whose shell keeps every variable (§14.2). The values of the
    secret and credential-looking variables are redacted from tool output.
    """

    workspace: str
    timeout_s: float
    cancel_window_s: float
    cancel: threading.Event
    secret_env_names: tuple[str, ...]
    output_cap: int = 64 * 1024
    env_keep: tuple[str, ...] | None = None
    #: ``[policy] max_file_bytes``: the most a file tool reads or writes of one file.
    max_file_bytes: int = 8 << 20
    #: ``[policy] commit_trailer`` (:mod:`..commit_trailer`): what the shell's child gets so that its
    #: commits name the session and message; None when off.
    commit_trailer: CommitTrailer | None = None

    def secret_values(self) -> list[str]:
        """The values to redact: the secret variables', and the credential-looking ones' (§14.11)."""
        named = [os.environ[n] for n in self.secret_env_names if os.environ.get(n)]
        return named + credential_env_values(os.environ)

    def environment(self) -> dict[str, str]:
        """The environment a tool's process gets (:func:`~kxen_agent.runtime.redaction.tool_environment`)."""
        env = tool_environment(os.environ, self.env_keep, self.secret_env_names)
        return self.commit_trailer.apply(env) if self.commit_trailer is not None else env


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call; ``side_effects`` says whether running it can
    change the workspace (the journal must treat those calls as effects)."""

    name: str
    side_effects: bool
    description: str
    parameters: dict[str, Any]

    def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutcome: ...


class BadArguments(Exception):
    """An argument or path problem a tool reports as an error outcome (the
    model reads the message and corrects the call); never leaves a tool."""


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "integer": int, "boolean": bool}


def check_arguments(tool: str, arguments: object, schema: Mapping[str, Any]) -> dict[str, Any]:
    """Validate arguments against the tool's flat JSON schema; defaults filled in.

    Raises :class:`BadArguments` naming the tool and the argument.
    """
    if not isinstance(arguments, dict):
        raise BadArguments(
            f"{tool}: arguments must be a JSON object, got {type(arguments).__name__}"
        )
    props: Mapping[str, Any] = schema["properties"]
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        raise BadArguments(
            f"{tool}: unknown argument(s) {', '.join(unknown)}; expected: {', '.join(props)}"
        )
    out: dict[str, Any] = {}
    for key, prop in props.items():
        if key not in arguments:
            if key in schema.get("required", ()):
                raise BadArguments(f"{tool}: missing required argument '{key}'")
            if "default" in prop:
                out[key] = prop["default"]
            continue
        value = arguments[key]
        want = prop["type"]
        # bool is an int in Python; JSON says otherwise.
        if not isinstance(value, _JSON_TYPES[want]) or (want == "integer" and isinstance(value, bool)):
            raise BadArguments(
                f"{tool}: argument '{key}' must be a {want}, got {type(value).__name__}"
            )
        out[key] = value
    return out
