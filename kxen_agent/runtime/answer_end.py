"""Whether a model's answer can end or continue a run (``objects_spec.md`` §14.5).

An answer that is not the model's whole answer (cut off at the output
limit, withheld by a filter) or that says nothing usable fails the run
instead of completing it; this module words why, and what to do next.
Pure: it reads and writes nothing.
"""

from __future__ import annotations

from .providers import AssistantTurn
from .results import CUT_SHORT

#: What the anthropic provider asks for when the lock sets no ``max_tokens`` (its ``MAX_TOKENS``; not imported
#: from it: that module loads the HTTP provider's machinery, which a script run never needs).
ANTHROPIC_DEFAULT_MAX_TOKENS = 8192

__all__ = ["unusable_answer"]


def unusable_answer(turn: AssistantTurn, number: int, ses: str, lock: dict | None = None) -> str | None:
    """Why ``turn`` can neither complete the run nor go on with it, or None.

    A cut-off or withheld answer is not the model's answer, and an answer
    with no text and nothing to run says nothing: each fails the run
    (nothing of it is recorded) rather than complete it with a fragment
    or an empty result. The server's reason is named in its own word (Anthropic's ``stop_reason``
    ``max_tokens``, not Chat Completions' ``length``); a cut-off answer names the limit that cut it and the
    setting that raises it (``[model] max_tokens``, in the lock ``lock``).
    """
    if turn.finish_reason in CUT_SHORT:
        said = (f"stop_reason '{turn.stop_reason}'" if turn.stop_reason else f"finish_reason '{turn.finish_reason}'")
        if turn.finish_reason == "length":
            limit = (lock or {}).get("max_tokens")
            if limit is None and (lock or {}).get("provider") == "anthropic":
                limit = ANTHROPIC_DEFAULT_MAX_TOKENS
            now = f"{limit} tokens" if limit is not None else "the server's default"
            hint = (f"raise max_tokens in the agent definition's [model] table (now {now}), or ask for less; "
                    f"`kxen-agent --resume {ses} --retry` tries again (add `--agent FILE` to use the changed "
                    "definition)")
        else:
            hint = f"rephrase the task and give it with `kxen-agent --resume {ses} --task TEXT`"
        return (f"the model's answer on turn {number} {CUT_SHORT[turn.finish_reason]} ({said}); nothing of it "
                f"was recorded; {hint}")
    if turn.tool_calls or (turn.content or "").strip():
        return None
    dropped = ""
    if turn.dropped_calls:
        kinds = ", ".join(sorted({repr(k) for k in turn.dropped_calls}))
        dropped = (f" (it asked for {len(turn.dropped_calls)} tool call(s) of type {kinds}, which are not "
                   "function calls)")
    return (f"the model's answer on turn {number} had no text and no tool call kxen-agent can run{dropped}; "
            f"nothing of it was recorded; `kxen-agent --resume {ses} --retry` asks again")
