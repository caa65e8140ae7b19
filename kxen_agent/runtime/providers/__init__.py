"""Model providers: the one seam between a run and a language model.

Split by concept:

- :mod:`.base`: the :class:`Provider` protocol, the records that cross it
  (:class:`AssistantTurn`, :class:`ToolCall`, :class:`Usage`,
  :class:`ModelEndpoint`) and its errors (:class:`ProviderError`,
  :class:`ProviderCanceled`);
- :mod:`.script`: :class:`ScriptProvider`, a deterministic offline model;
- :mod:`.openai_compat`: :class:`OpenAIProvider`, any Chat Completions
  endpoint, cancellable mid-request and streamed on request;
- :mod:`.anthropic`: :class:`AnthropicProvider`, the Anthropic Messages
  API with tool use, cancellable and streamed like the OpenAI one;
- :mod:`.http_base`: what the two share (key, client, cancellation, scrubbing);
- :mod:`.bridge`: the event loop that makes a request abandonable;
- :mod:`.sdk`: :func:`require_sdk` and :class:`ProviderUnavailable`, the
  missing-SDK error with the install command that fits (below the
  providers, which raise it, and the factory);
- :mod:`.factory`: :func:`make_provider` and the run's :func:`model_endpoint`.

No provider retries, stores anything or decides about a run: a provider
returns one turn or raises, and the runtime decides. Internal tool calls
are flat ``{"id", "name", "arguments"}``; only the OpenAI provider knows
OpenAI's nested form, and only the Anthropic provider its content blocks.
"""

from __future__ import annotations

import kxen_agent.lazy

# Imported on first use (kxen_agent.lazy): a run of the script provider, and a
# read command that only needs Usage, never import the HTTP providers' asyncio,
# ssl and urllib (a fifth of such a command's start-up).
_LAZY = {
    "AnthropicProvider": ".anthropic", "DEFAULT_ANTHROPIC_URL": ".anthropic",
    "AssistantTurn": ".base", "ModelEndpoint": ".base", "OnText": ".base", "Provider": ".base",
    "ProviderCanceled": ".base", "ProviderError": ".base", "ToolCall": ".base", "Usage": ".base",
    "make_provider": ".factory", "model_endpoint": ".factory",
    "DEFAULT_BASE_URL": ".openai_compat", "OpenAIProvider": ".openai_compat",
    "SCRIPT_FINISHED": ".script", "ScriptProvider": ".script",
    "ProviderUnavailable": ".sdk", "install_command": ".sdk", "require_sdk": ".sdk",
}

__all__ = [
    "AnthropicProvider",
    "AssistantTurn",
    "DEFAULT_ANTHROPIC_URL",
    "DEFAULT_BASE_URL",
    "ModelEndpoint",
    "OnText",
    "OpenAIProvider",
    "Provider",
    "ProviderCanceled",
    "ProviderError",
    "ProviderUnavailable",
    "SCRIPT_FINISHED",
    "ScriptProvider",
    "ToolCall",
    "Usage",
    "install_command",
    "make_provider",
    "model_endpoint",
    "require_sdk",
]

__getattr__, __dir__ = kxen_agent.lazy.lazy_surface(__name__, _LAZY, globals())
