"""What a run reports: its result record, its errors, the run states that end it, usage sums.

Records and pure functions only, apart from the loop in :mod:`.runner` (which
re-exports every name here), so the CLI and embedding programs can read and
render runs without the loop's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from kxen_agent.errors import KxenError
from kxen_agent.session.status import TERMINAL, RunStatus

from .providers import Usage

__all__ = ["CUT_SHORT", "NothingToResume", "NothingToRetry", "OUTPUT_BLOB_THRESHOLD", "RunError", "RunResult", "TERMINAL", "retryable",
           "sum_usage"]

#: Tool output longer than this is kept in a blob object that the journal links.
OUTPUT_BLOB_THRESHOLD = 1024
#: Finish reasons that say the answer is not the model's whole answer (§14.5: such a turn fails the run).
CUT_SHORT = {
    "length": "was cut off at the model's output limit",
    "content_filter": "was withheld by the provider's content filter",
}

class RunError(KxenError):
    """A run cannot be started, resumed or resolved as asked."""


class NothingToRetry(RunError):
    """``--retry`` found no failed or canceled run to retry (exit 2: the request, not the state, is wrong)."""

    exit_code = 2


class NothingToResume(RunError):
    """``--resume`` without a task found no unfinished run (exit 2, as :class:`NothingToRetry`: one situation,
    one code)."""

    exit_code = 2


def _usage_json(usage: Usage) -> dict[str, int]:
    d = {"inputTokens": usage.input_tokens, "outputTokens": usage.output_tokens}
    if usage.cached_tokens is not None:
        d["cachedTokens"] = usage.cached_tokens
    return d


def sum_usage(usages: Iterable[dict | None]) -> dict | None:
    """The sum of §14.5 usage maps: run totals (with ``turns``) or one turn's (counting 1); None if all are None."""
    total: dict | None = None
    for u in usages:
        if u is None:
            continue
        total = dict(total or {"inputTokens": 0, "outputTokens": 0, "turns": 0})
        total["inputTokens"] += u["inputTokens"]
        total["outputTokens"] += u["outputTokens"]
        total["turns"] += u.get("turns", 1)
        if "cachedTokens" in u:
            total["cachedTokens"] = total.get("cachedTokens", 0) + u["cachedTokens"]
    return total


@dataclass
class RunResult:
    session: str
    run: str
    status: str
    turn: int
    model: str
    result: str | None
    error: str | None
    unknown_ops: list[str] = field(default_factory=list)
    settled: bool = False
    requested_model: str | None = None
    base_url: str | None = None
    retry_of: str | None = None
    usage: dict | None = None

    @property
    def exit_code(self) -> int:
        return {RunStatus.COMPLETED: 0, RunStatus.INPUT_REQUIRED: 3, RunStatus.CANCELED: 130}.get(self.status, 1)

    def to_json(self) -> dict:
        return {
            "session": self.session,
            "run": self.run,
            "status": self.status,
            "turn": self.turn,
            "model": self.model,
            "result": self.result,
            "error": self.error,
            "unknownOps": self.unknown_ops,
            "settled": self.settled,
            "requestedModel": self.requested_model,
            "baseUrl": self.base_url,
            "retryOf": self.retry_of,
            "usage": self.usage,
        }


def retryable(ses: str, latest: tuple[str, bytes, dict] | None) -> tuple[str, bytes, dict]:
    """The latest run if ``--retry`` may re-attempt it; :class:`NothingToRetry` saying what to do if not."""
    if latest is None:
        raise NothingToRetry(f"nothing to retry: session {ses} has no run; give a task with "
                             f"`kxen-agent --resume {ses} --task TEXT`")
    run, _, st = latest
    status = st["status"]
    if status in (RunStatus.FAILED, RunStatus.CANCELED) and st.get("settled"):
        return latest
    if status == RunStatus.COMPLETED and st.get("settled"):
        raise NothingToRetry(f"nothing to retry: run {run} of session {ses} completed; give the next task with "
                             f"`kxen-agent --resume {ses} --task TEXT`")
    if status in TERMINAL:
        raise NothingToRetry(f"nothing to retry yet: run {run} of session {ses} is {status} but its settlement "
                             f"was interrupted; finish it with `kxen-agent --resume {ses}` (no model or tool is "
                             "called)")
    raise NothingToRetry(f"nothing to retry: run {run} of session {ses} is unfinished ({status}); continue it with "
                         f"`kxen-agent --resume {ses}`"
                         + (f" after `kxen-agent run resolve` of its UNKNOWN operation(s) (`kxen-agent run show "
                            f"{ses} {run}` lists them)" if status == RunStatus.INPUT_REQUIRED else ""))
