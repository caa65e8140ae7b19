"""The run layer: the agent loop, its providers and tools, leases and cancellation.

Third layer of kxen-agent, above :mod:`kxen_agent.session` and
:mod:`kxen_agent.store`, below :mod:`kxen_agent.cli`; it imports only
downwards. What an embedding program needs is re-exported here (the names
below); every module, one line each:

- :mod:`.runner` — :class:`Runner`: a task in a Session run to a terminal
  state, the durable tool journal, recovery and resolution; :class:`RunResult`;
- :mod:`.plan` — step plans the runner commits;
- :mod:`.tool_call` — one tool call from refusal check to settled;
- :mod:`.run_reader` — reading a run's state back;
- :mod:`.recovery` — run and operation states as types, recovery as a pure function;
- :mod:`.results` — a run's result record, its errors, the states that end it, usage sums;
- :mod:`.run_status` — what a reader is shown of a stored run;
- :mod:`.history` — a run's history in memory: the provider's message list;
- :mod:`.history_bound` — how much of a history a run holds in memory;
- :mod:`.history_index` — a session's history in one file, so a resume reads no message objects;
- :mod:`.compaction` — the model's view of a long history kept under a budget;
- :mod:`.instructions` — the project instructions (``AGENTS.md``) a run reads at its start and gives the model;
- :mod:`.approvals` — a person says yes or no to a tool call before it runs;
- :mod:`.pending` — calls that wait for a person (``run approve`` / ``run deny``);
- :mod:`.task_note` — a new task's message after an abandoned run says so;
- :mod:`.answer_end` — whether a model's answer can end or continue a run;
- :mod:`.answer_check` — the door a model's answer passes before anything is recorded;
- :mod:`.trust` — the gate a run passes (``objects_spec.md`` §14.13);
- :mod:`.redaction` — what is taken out of every text a run persists
  (:func:`redact`), the scan for what was not (:func:`find_secrets`);
- :mod:`.lease` — :class:`Lease`, at most one active run per Session;
- :mod:`.remote_lease` — the cross-machine run lease held on a Git remote;
- :mod:`.cancel` — :func:`cancel_on_signals`: SIGINT/SIGTERM as the event the runner cancels on;
- :mod:`.retry` — the one retry policy of model calls;
- :mod:`.events` — what a run reports while it works (live output, ``--events``);
- :mod:`.faults` — crash points for tests (``KXEN_AGENT_FAULT``);
- :mod:`.providers` — the :class:`Provider` seam to a language model (package);
- :mod:`.tools` — the tools a run calls (:data:`TOOLS`) and their contract (package);
- :mod:`.commit_trailer` — ``[policy] commit_trailer``: the hooks directory that puts ``Kxen-Session`` on the
  shell's commits, and the shell's Git environment for it (§14.17);
- :mod:`.mcp_tools` — MCP servers' tools in a run: lock listing, specs, outcomes, recovery (§14.15);
- :mod:`.mcp_link` — the connections to MCP servers through the ``mcp`` SDK (imported only when used);
- :mod:`.mcp_procs` — the stdio servers' process-group records, and reaping those a killed run left.

Nothing here renders text for a terminal or exits the process; that is the
CLI's. Each module's docstring says what it owns and its limitations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import kxen_agent.lazy

if TYPE_CHECKING:  # the names below, for type checkers and readers; at run time they load on first use
    from .cancel import CANCEL_SIGNALS, CancelSetupError, OnSignal, cancel_on_signals
    from .faults import FaultSpecError
    from .lease import Lease, LeaseBusy, LeaseLost, lease_ttl_s
    from .providers import AssistantTurn, OpenAIProvider, Provider, ProviderError, ScriptProvider, ToolCall, make_provider
    from .redaction import Hit, find_secrets, redact
    from .runner import TERMINAL, RunError, Runner, RunResult
    from .tools import TOOLS, Tool, ToolContext, ToolOutcome, ToolOutcomeUnknown, tool_specs

# Name -> the module that defines it. Imported on first use (PEP 562), so
# that importing one module of this package (the CLI's start-up: a read
# command needs a few of them) does not import them all.
_LAZY: dict[str, str] = {
    "AssistantTurn": ".providers",
    "CANCEL_SIGNALS": ".cancel",
    "CancelSetupError": ".cancel",
    "FaultSpecError": ".faults",
    "Hit": ".redaction",
    "Lease": ".lease",
    "LeaseBusy": ".lease",
    "LeaseLost": ".lease",
    "OnSignal": ".cancel",
    "OpenAIProvider": ".providers",
    "Provider": ".providers",
    "ProviderError": ".providers",
    "RunError": ".runner",
    "RunResult": ".runner",
    "Runner": ".runner",
    "ScriptProvider": ".providers",
    "TERMINAL": ".runner",
    "TOOLS": ".tools",
    "Tool": ".tools",
    "ToolCall": ".providers",
    "ToolContext": ".tools",
    "ToolOutcome": ".tools",
    "ToolOutcomeUnknown": ".tools",
    "cancel_on_signals": ".cancel",
    "find_secrets": ".redaction",
    "lease_ttl_s": ".lease",
    "make_provider": ".providers",
    "redact": ".redaction",
    "tool_specs": ".tools",
}


__getattr__, __dir__ = kxen_agent.lazy.lazy_surface(__name__, _LAZY, globals())
del kxen_agent  # bound by the import above; not a name of this package


__all__ = [
    "AssistantTurn",
    "CANCEL_SIGNALS",
    "CancelSetupError",
    "FaultSpecError",
    "Hit",
    "Lease",
    "LeaseBusy",
    "LeaseLost",
    "OnSignal",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "RunError",
    "RunResult",
    "Runner",
    "ScriptProvider",
    "TERMINAL",
    "TOOLS",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolOutcome",
    "ToolOutcomeUnknown",
    "cancel_on_signals",
    "find_secrets",
    "lease_ttl_s",
    "make_provider",
    "redact",
    "tool_specs",
]
