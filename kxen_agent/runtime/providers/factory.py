"""Making a provider from an agent lock, and the model and endpoint of a run.

This module owns three decisions: which :class:`~.base.ModelEndpoint` a run
uses (the lock's, a recorded run's, or the run's ``--model`` /
``--base-url``), which provider a lock and endpoint make, and whether the
provider's SDK is installed — with the install command that fits how
kxen-agent itself was installed. It never calls a model.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shlex
import sys
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from kxen_agent.errors import UsageError
from kxen_agent.runtime.answer_check import limits_of
from kxen_agent.session.agent_def import base_url_problem

from .anthropic import AnthropicProvider
from .base import ModelEndpoint, Provider, ProviderError
from .openai_compat import OpenAIProvider
from .script import ScriptProvider

__all__ = ["ProviderUnavailable", "install_command", "make_provider", "missing_sdk_error", "model_endpoint",
           "require_sdk"]

# The optional extra that carries each provider's SDK (pyproject.toml), and the module it provides.
_SDK = {"openai": ("openai", "openai"), "anthropic": ("anthropic", "anthropic")}
# The providers that call an endpoint (``base_url``), with the endpoint a lock without one calls.
_ENDPOINT_PROVIDERS = ("openai", "anthropic")


class ProviderUnavailable(ProviderError):
    """The provider's SDK is not installed in the Python running kxen-agent.

    Raised before a session or run is created (:func:`require_sdk`); the
    message carries the install command.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


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
        if kind == "anthropic":
            return AnthropicProvider(**common)
        return OpenAIProvider(**common)
    raise UsageError(f"agent lock names unknown provider {kind!r}; use 'script', 'openai' or 'anthropic'")


def require_sdk(lock: Mapping[str, Any]) -> None:
    """Raise :class:`ProviderUnavailable` if the lock's provider needs an SDK that does not import."""
    provider = str(lock.get("provider"))
    sdk = _SDK.get(provider)
    if sdk is None:
        return
    try:
        importlib.import_module(sdk[1])
    except ModuleNotFoundError as e:
        if e.name != sdk[1]:  # the SDK is there; a package it needs is not
            raise ProviderUnavailable(
                f"the {provider} provider needs the {sdk[1]} package, which is installed but does not import "
                f"({e}); reinstall it with: {install_command(sdk[0])}") from None
        raise missing_sdk_error(provider) from None
    except ImportError as e:
        raise ProviderUnavailable(
            f"the {provider} provider needs the {sdk[1]} package, which is installed but does not import "
            f"({e}); reinstall it with: {install_command(sdk[0])}") from None


def missing_sdk_error(provider: str = "openai") -> ProviderUnavailable:
    extra, module = _SDK[provider]
    return ProviderUnavailable(
        f"the {provider} provider needs the {module} package, which is not installed for {sys.executable}; "
        f"install it with: {install_command(extra)}")


def install_command(extra: str) -> str:
    """The command that adds ``kxen-agent[extra]``'s packages to this installation.

    pipx and ``uv tool`` installs get their own tool's command, an editable
    install (a source checkout) the checkout's path, anything else pip run
    by the Python running kxen-agent.
    """
    try:
        dist = importlib.metadata.distribution("kxen-agent")
    except importlib.metadata.PackageNotFoundError:
        return f"pip install 'kxen-agent[{extra}]'"
    reqs = [r.split(";")[0].strip() for r in dist.requires or () if f'extra == "{extra}"' in r.replace("'", '"')]
    prefix = os.path.realpath(sys.prefix).replace(os.sep, "/")
    if "/pipx/venvs/" in prefix:
        return "pipx inject kxen-agent " + " ".join(shlex.quote(r) for r in reqs or [extra])
    source = _editable_source(dist)
    target = f"{source}[{extra}]" if source else f"kxen-agent[{extra}]"
    if "/uv/tools/" in prefix:
        return f"uv tool install --reinstall {'-e ' if source else ''}{shlex.quote(target)}"
    return f"{shlex.quote(sys.executable)} -m pip install {'-e ' if source else ''}{shlex.quote(target)}"


def _editable_source(dist: importlib.metadata.Distribution) -> str | None:
    """The source directory of an editable install (PEP 610 ``direct_url.json``), or None."""
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except (ValueError, OSError):
        return None
    if not (isinstance(info, dict) and isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable")):
        return None
    url = info.get("url")
    if not isinstance(url, str) or not url.startswith("file:"):
        return None
    return urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
