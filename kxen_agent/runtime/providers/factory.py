"""Making a provider from an agent lock, and the model and endpoint of a run.

This module owns three decisions: which :class:`~.base.ModelEndpoint` a run
uses (the lock's, a recorded run's, or the run's ``--model`` /
``--base-url``), which provider a lock and endpoint make, and whether the
provider's SDK is installed (the check and its install command live in
:mod:`.sdk`, which the providers themselves also raise from). It never
calls a model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kxen_agent.errors import UsageError
from kxen_agent.runtime.answer_check import limits_of
from kxen_agent.session.agent_def import base_url_problem

from .base import ModelEndpoint, Provider
from .script import ScriptProvider
from .sdk import ProviderUnavailable, install_command, missing_sdk_error, require_sdk

__all__ = ["ProviderUnavailable", "install_command", "make_provider", "missing_sdk_error", "model_endpoint",
           "require_sdk"]

# The providers that call an endpoint (``base_url``), with the endpoint a lock without one calls.
_ENDPOINT_PROVIDERS = ("openai", "anthropic")


def model_endpoint(lock: Mapping[str, Any], *, model: str | None = None, base_url: str | None = None,
                   recorded: Mapping[str, Any] | None = None) -> ModelEndpoint:
    """The model and endpoint of a run.

    ``recorded`` is a run state: a run resumed keeps what it recorded
    (``requestedModel``, ``baseUrl``; states written before these keys
    existed used the lock's). ``model`` and ``base_url`` (the run's
    ``--model`` / ``--base-url``) override either; they are checked here
    (UsageError), before anything is written.
    """
    if model is not None and (not model.strip() or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in model)):
        raise UsageError(f"--model {model!r} is not a model name (one line of text, not empty); "
                         "give the name the provider knows, e.g. --model gpt-4.1-mini")
    kind = lock.get("provider")
    if base_url is not None:
        if kind not in _ENDPOINT_PROVIDERS:
            raise UsageError(f"--base-url applies to the openai and anthropic providers; agent {lock.get('name')!r} uses the "
                             f"{kind} provider, which calls no endpoint; leave --base-url out")
        problem = base_url_problem(base_url)
        if problem is not None:
            raise UsageError(f"--base-url {base_url!r}: {problem}")
    rec = recorded or {}
    chosen_model = model or rec.get("requestedModel") or lock.get("model") or str(kind)
    if base_url is not None:
        chosen_url: str | None = base_url
    elif "baseUrl" in rec:
        chosen_url = rec["baseUrl"]
    else:
        chosen_url = lock.get("base_url")
    if kind == "openai" and chosen_url is None:
        from .openai_compat import DEFAULT_BASE_URL

        chosen_url = DEFAULT_BASE_URL
    if kind == "anthropic" and chosen_url is None:
        from .anthropic import DEFAULT_ANTHROPIC_URL

        chosen_url = DEFAULT_ANTHROPIC_URL
    return ModelEndpoint(chosen_model, chosen_url)


def make_provider(lock: Mapping[str, Any], endpoint: ModelEndpoint | None = None) -> Provider:
    """The provider an agent lock body describes, for ``endpoint`` (default: the lock's own).

    Keys: ``provider`` ("script" | "openai" | "anthropic"), ``model``, ``base_url``,
    ``api_key_env``, ``script`` (canonical JSON text of the steps, or None).
    The API key always comes from the lock's ``api_key_env``, whatever the
    endpoint: an overridden endpoint gets no other key.
    """
    kind = lock.get("provider")
    model = lock.get("model")
    if kind == "script":
        text = lock.get("script")
        if not isinstance(text, str):
            raise UsageError("agent lock has provider 'script' but no script; add the steps to the agent")
        try:
            steps = json.loads(text)
        except json.JSONDecodeError as e:
            raise UsageError(f"agent lock script is not valid JSON ({e}); fix the agent's script") from None
        if not isinstance(steps, list):
            raise UsageError("agent lock script must be a JSON list of steps; fix the agent's script")
        return ScriptProvider(steps, model=endpoint.model if endpoint else (model or "script"), limits=limits_of(lock))
    if kind in _ENDPOINT_PROVIDERS:
        if not isinstance(model, str) or not model:
            raise UsageError(f"agent lock has provider {kind!r} but no model; set the model name")
        ep = endpoint or model_endpoint(lock)
        # The lock's limits: each call's overall deadline, and what an answer may hold (answer_check).
        deadline_ms = (lock.get("policy") or {}).get("model_timeout_ms")
        if not (type(deadline_ms) is int and 0 < deadline_ms <= 86_400_000):
            deadline_ms = None  # the default (a version-3 lock has none)
        common: dict[str, Any] = {"base_url": ep.base_url, "model": ep.model, "api_key_env": lock.get("api_key_env"),
                                  "deadline_s": None if deadline_ms is None else deadline_ms / 1000,
                                  "limits": limits_of(lock)}
        # The lock's [model] settings (§14.2, version 6), each only when the definition set it.
        if type(lock.get("max_tokens")) is int:
            common["max_tokens"] = lock["max_tokens"]
        if isinstance(lock.get("temperature"), str):
            common["temperature"] = float(lock["temperature"])
        # Imported here: a script run (and every read command) never pays for the HTTP providers' imports.
        if kind == "anthropic":
            from .anthropic import AnthropicProvider

            return AnthropicProvider(**common)
        from .openai_compat import OpenAIProvider

        return OpenAIProvider(**common)
    raise UsageError(f"agent lock names unknown provider {kind!r}; use 'script', 'openai' or 'anthropic'")
