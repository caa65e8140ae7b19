"""The run layer: the agent loop, its providers and tools, leases and cancellation.

Third layer of kxen-agent, above :mod:`kxen_agent.session` and
:mod:`kxen_agent.store`, below :mod:`kxen_agent.cli`; it imports only
downwards. What an embedding program needs is re-exported here:

- :mod:`.runner`: :class:`Runner` runs a task in a Session to a terminal
  state, with the durable tool journal and recovery; :class:`RunResult`.
- :mod:`.lease`: :class:`Lease`, at most one active run per Session.
- :mod:`.providers`: the :class:`Provider` seam to a language model
  (cancellable, streamed on request), and the model and endpoint of a run.
- :mod:`.retry`: the one retry policy of model calls.
- :mod:`.events`: what a run reports while it works (live output,
  ``--events``) and what it is waiting for.
- :mod:`.tools`: the tools a run calls (:data:`TOOLS`) and their contract.
- :mod:`.redact`: what is taken out of every text a run persists
  (:func:`redact`), the scan for what was not (:func:`find_secrets`), and
  the tools' environment without credentials.
- :mod:`.cancel`: :func:`cancel_on_signals`, SIGINT/SIGTERM as the event
  the runner cancels on.
- :mod:`.faults`: crash points for tests (``KXEN_AGENT_FAULT``).

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
