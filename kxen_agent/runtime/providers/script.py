"""The script provider: a deterministic, offline model for tests and demos.

It owns playing back a list of steps as assistant turns. It never reads the
network, the clock or the environment, so its answer is a pure function of
the history: a resumed or forked session gets the turn it would have got
the first time.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kxen_agent.errors import UsageError
from kxen_agent.runtime.answer_check import AnswerLimits, check_turn

from .base import AssistantTurn, OnText, ProviderCanceled, ToolCall

__all__ = ["SCRIPT_FINISHED", "ScriptProvider"]

SCRIPT_FINISHED = "script finished"
# Streamed in words (each with the whitespace after it), as a model's
# tokens arrive: live output and the mid-stream fault point behave as with
# a real server.
_PIECES = re.compile(r"\s*\S+\s*|\s+")


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class ScriptProvider:
    """A deterministic provider that plays back a list of steps.

    Each step is ``{"content": str | None, "tool_calls": [{"name": str,
    "arguments": dict}]}`` (both keys optional). The step played is the number
    of assistant messages already in the history. Tool call ids are
    ``call_<step>_<n>`` and arguments are canonical JSON (sorted keys, no
    spaces).

    Past the last step it returns a final turn with content
    ``"script finished"`` and no tool calls, so a run always ends. It
    reports no usage and no finish reason.
    """

    base_url: str | None = None

    def __init__(self, steps: Sequence[Mapping[str, Any]], model: str = "script",
                 limits: AnswerLimits | None = None) -> None:
        self.model = model
        self.limits = limits or AnswerLimits()
        self._turns = tuple(self._compile(i, step) for i, step in enumerate(steps))

    def _compile(self, index: int, step: object) -> tuple[str | None, tuple[ToolCall, ...]]:
        where = f"script step {index}"
        if not isinstance(step, Mapping):
            raise UsageError(f"{where} must be an object, got {type(step).__name__}; fix the agent's script")
        unknown = sorted(set(step) - {"content", "tool_calls"})
        if unknown:
            raise UsageError(f"{where} has unknown key(s) {', '.join(unknown)}; allowed: content, tool_calls")
        content = step.get("content")
        if content is not None and not isinstance(content, str):
            raise UsageError(f"{where}: content must be a string or null; fix the agent's script")
        raw_calls = step.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise UsageError(f"{where}: tool_calls must be a list; fix the agent's script")
        calls: list[ToolCall] = []
        for n, call in enumerate(raw_calls):
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                raise UsageError(f"{where}, tool call {n}: needs a string 'name'; fix the agent's script")
            args = call.get("arguments", {})
            if not isinstance(args, Mapping):
                raise UsageError(f"{where}, tool call {n}: arguments must be an object; fix the agent's script")
            calls.append(ToolCall(id=f"call_{index}_{n}", name=call["name"], arguments=_canonical(args)))
        return content, tuple(calls)

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], *,
                 cancel: threading.Event | None = None, on_text: OnText | None = None) -> AssistantTurn:
        if cancel is not None and cancel.is_set():
            raise ProviderCanceled("the script provider's answer was abandoned: the run was canceled")
        step = sum(1 for m in messages if m.get("role") == "assistant")
        if step >= len(self._turns):
            content, calls = SCRIPT_FINISHED, ()
        else:
            content, calls = self._turns[step]
        if on_text is not None and content:
            for piece in _PIECES.findall(content):
                if cancel is not None and cancel.is_set():
                    raise ProviderCanceled("the script provider's answer was abandoned: the run was canceled")
                on_text(piece)
        # The door, as for a real model: steps are an agent's (maybe a foreign lock's) text.
        return check_turn(AssistantTurn(content=content, tool_calls=calls, model=self.model), self.limits)

    def close(self) -> None:
        """Nothing to release."""
