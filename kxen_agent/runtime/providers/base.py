"""The provider seam: what crosses between a run and a language model.

This module owns the :class:`Provider` protocol, the records a provider
returns (:class:`AssistantTurn`, :class:`ToolCall`, :class:`Usage`), the
per-run choice of model and endpoint (:class:`ModelEndpoint`) and the errors
a provider raises (:class:`ProviderError` with its ``transient`` verdict and
the server's ``Retry-After``, :class:`ProviderCanceled`). It never calls a
model and never decides whether to retry: providers report, the runtime's
retry policy (:mod:`kxen_agent.runtime.retry`) decides.

Messages in are Chat Completions style plain dicts::

    {"role": "system" | "user" | "assistant" | "tool",
     "content": str | None,
     "tool_calls": [{"id": str, "name": str, "arguments": str}],  # assistant only, optional
     "tool_call_id": str}                                          # tool only
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kxen_agent.errors import KxenError

__all__ = [
    "AssistantTurn",
    "ModelEndpoint",
    "OnText",
    "Provider",
    "ProviderCanceled",
    "ProviderError",
    "ToolCall",
    "Usage",
    "one_line",
]

#: Called with each piece of the answer's text as it arrives (streaming).
OnText = Callable[[str], None]


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model asked for; ``arguments`` is JSON text."""

    id: str | None  # None: the server gave none (the runner makes one)
    name: str
    arguments: str


@dataclass(frozen=True)
class Usage:
    """Tokens one answer cost, as the server reported them.

    ``cached_tokens`` is the part of ``input_tokens`` the server served from
    its prompt cache, when it says (None: not reported).
    """

    input_tokens: int
    output_tokens: int
    cached_tokens: int | None = None


@dataclass(frozen=True)
class AssistantTurn:
    """The model's answer to one request: text, tool calls, or both.

    ``finish_reason`` is the server's (``stop``, ``tool_calls``, ``length``,
    ``content_filter``, ...; None when it gave none). ``dropped_calls`` names
    the kinds of tool calls the answer held that kxen-agent cannot run (not
    ``function``); they are not in ``tool_calls``. The runner, not the
    provider, decides whether such an answer can complete a run.
    """

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    model: str
    finish_reason: str | None = None
    usage: Usage | None = None
    dropped_calls: tuple[str, ...] = ()
    #: The server's own word for why the answer ended, when its API does not speak Chat Completions'
    #: (Anthropic's ``stop_reason``: ``max_tokens`` where ``finish_reason`` says ``length``); None otherwise.
    stop_reason: str | None = None


@dataclass(frozen=True)
class ModelEndpoint:
    """The model a run asks for and the endpoint it calls.

    From the agent lock unless the run was given ``--model`` / ``--base-url``;
    recorded in the run's state (``requestedModel``, ``baseUrl``, spec §14.5)
    so a resumed run keeps them. ``base_url`` None: the provider's own
    (the script provider has none).
    """

    model: str
    base_url: str | None


class ProviderError(KxenError):
    """The provider could not produce a turn.

    ``transient`` is True when the same request may succeed later (connection
    failure, timeout, 408/409/429, 5xx, a stream cut short), False when it
    never will as is (bad request, bad key, missing key, unknown model).
    ``status`` is the HTTP status, when there was one; ``retry_after`` the
    delay in seconds the server asked for (``retry-after-ms`` or
    ``Retry-After``), when it did.
    """

    def __init__(self, message: str, *, transient: bool, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status
        self.retry_after = retry_after


class ProviderCanceled(KxenError):
    """The request was abandoned because the run's cancel event was set.

    The connection is closed before this is raised; nothing of the answer
    is returned. The runner turns it into a ``canceled`` run.
    """

    exit_code = 130


class Provider(Protocol):
    """A language model behind one call: history + tool specs -> next turn.

    ``complete`` returns within about 0.1 s of ``cancel`` being set, raising
    :class:`ProviderCanceled`. With ``on_text`` it streams: each piece of
    text is handed to ``on_text`` (on the calling thread) as it arrives; the
    turn returned is the whole answer, as without streaming. ``close``
    releases connections and threads; the provider is not used after it.
    """

    model: str
    base_url: str | None

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
                 cancel: threading.Event | None = None, on_text: OnText | None = None) -> AssistantTurn: ...

    def close(self) -> None: ...


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line (whitespace runs folded), cut to ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
