"""The model's view of a long run under ``[policy] context_tokens`` (issue #18, compaction).

    .venv/bin/python -m bench.compaction [--turns 200] [--budget 8000] [--result-bytes 3000]

One in-process run (the real :class:`~kxen_agent.runtime.runner.Runner`, a
memory store, an in-process model) of ``--turns`` tool turns, each adding a
``read_file`` result of ``--result-bytes``, with ``context_tokens`` set to
``--budget``. Every request the model receives is sized with the estimate
the runner itself uses (:func:`~kxen_agent.runtime.compaction.view_tokens`);
the table compares the largest request with the budget, and with the size
the same history would have without compaction (everything the session
keeps). Nothing is timed: the figures are sizes and counts.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

from kxen_agent.runtime.compaction import SUMMARY_REQUEST, provider_view, view_tokens
from kxen_agent.runtime.providers import AssistantTurn, ToolCall, Usage
from kxen_agent.runtime.runner import Runner
from kxen_agent.runtime.tools import tool_specs
from kxen_agent.session.agent_def import parse_agent_definition
from kxen_agent.session.sessions import SessionStore
from kxen_agent.store.memory import MemoryStore

__all__ = ["main", "measure"]


class _Model:
    """Reads the same file turn after turn, summarizes when asked, answers after ``turns`` calls."""

    def __init__(self, turns: int) -> None:
        self.turns = turns
        self.requests: list[tuple[bool, list[dict], list[dict]]] = []  # (a summary request?, messages, tools)
        self.model, self.base_url = "bench-compaction", None

    def complete(self, messages: list[dict], tools: list[dict], *, cancel: Any = None, on_text: Any = None) -> Any:
        summary = messages[-1]["content"] == SUMMARY_REQUEST
        self.requests.append((summary, list(messages), tools))
        if summary:
            return AssistantTurn("SUMMARY: reading notes.txt, turn after turn", (), self.model, "stop", Usage(10, 5))
        done = sum(1 for s, _, _ in self.requests if not s)
        if done > self.turns:
            return AssistantTurn("finished", (), self.model, "stop", Usage(10, 1))
        return AssistantTurn(None, (ToolCall(f"c{done}", "read_file", '{"path": "notes.txt"}'),), self.model,
                             "tool_calls", Usage(10, 1))

    def close(self) -> None:
        pass


def measure(turns: int, budget: int, result_bytes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as work:
        ws = os.path.join(work, "ws")
        os.mkdir(ws)
        with open(os.path.join(ws, "notes.txt"), "w") as f:
            f.write("n" * result_bytes)
        lock = parse_agent_definition(
            f'name = "bench"\nprovider = "openai"\nmodel = "bench-compaction"\ntools = ["read_file"]\n'
            f'[policy]\nmax_turns = {turns + 10}\ncontext_tokens = {budget}\n', work, "agent.toml")
        model = _Model(turns)
        store = MemoryStore("bench")
        res = Runner(store, providers=lambda lock, endpoint: model).start(ws, "read notes.txt again and again", lock)
        if res.status != "completed":
            raise SystemExit(f"the run ended {res.status}: {res.error}")
        sizes = [(s, view_tokens(m[0]["content"], m[1:], t)) for s, m, t in model.requests]
        sessions = SessionStore(store)
        history = sessions.history(sessions.get(res.session).head)
        uncompacted = [m for m in history if m.role != "compaction"]
        specs = tool_specs(["read_file"])
        full = view_tokens("", provider_view(uncompacted), specs)
    normal = [n for s, n in sizes if not s]
    summaries = [n for s, n in sizes if s]
    return {"turns": turns, "budget": budget, "resultBytes": result_bytes, "requests": len(normal),
            "compactions": len(summaries), "largestRequest": max(normal), "largestSummaryRequest": max(summaries or [0]),
            "messagesKept": len(history), "uncompactedTokens": full}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--budget", type=int, default=8000)
    ap.add_argument("--result-bytes", type=int, default=3000)
    a = ap.parse_args(argv)
    m = measure(a.turns, a.budget, a.result_bytes)
    print("| figure | value | budget | ratio | target |")
    print("|---|---|---|---|---|")
    print(f"| largest model request of {m['requests']} (tokens, estimated) | {m['largestRequest']:,} | "
          f"{m['budget']:,} | {m['largestRequest'] / m['budget']:.2f} | <= 1 |")
    print(f"| largest summary request ({m['compactions']} compactions) | {m['largestSummaryRequest']:,} | "
          f"{m['budget']:,} | {m['largestSummaryRequest'] / m['budget']:.2f} | (context: the turn that crossed it) |")
    print(f"| the same history uncompacted (what the session keeps: {m['messagesKept']:,} messages) | "
          f"{m['uncompactedTokens']:,} | {m['budget']:,} | {m['uncompactedTokens'] / m['budget']:.1f} | (context) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
