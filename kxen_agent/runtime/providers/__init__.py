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

from .anthropic import DEFAULT_ANTHROPIC_URL, AnthropicProvider
from .base import AssistantTurn, ModelEndpoint, OnText, Provider, ProviderCanceled, ProviderError, ToolCall, Usage
from .factory import make_provider, model_endpoint
from .openai_compat import DEFAULT_BASE_URL, OpenAIProvider
from .script import SCRIPT_FINISHED, ScriptProvider
from .sdk import ProviderUnavailable, install_command, require_sdk

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
