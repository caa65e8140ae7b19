"""Whether a run could call its model: the provider's SDK and API key, checked before anything is written.

``run``, ``--resume`` and the interactive session call :func:`check_provider`
before a session or a run is created, so a missing SDK or an unset key is one
usage-error line (exit 2) and the state dir is left as it was — not a session
with a failed run that then needs ``--retry``. Imports nothing heavy unless
asked to import the SDK itself (the interactive start-up only looks for it).
:func:`default_agent` is the agent a new session gets without ``--agent``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from kxen_agent.errors import UsageError

__all__ = ["AGENT_ENV", "check_provider", "default_agent"]

#: Names the default agent definition for `run` (and the interactive session) without --agent.
AGENT_ENV = "KXEN_AGENT_AGENT"

# The providers that call an endpoint with a key, and the module of each one's SDK.
_SDK_MODULE = {"openai": "openai", "anthropic": "anthropic"}


def check_provider(lock: Mapping[str, Any], key_env: str | None = None, *, import_sdk: bool = True) -> None:
    """UsageError if the lock's provider has no SDK here or its API key variable is unset or empty.

    ``key_env``: the variable the run will read instead of the lock's (``--api-key-env``, or what a
    run being continued recorded). ``import_sdk=False`` only looks for the SDK (no import: start-up
    time); the run imports it before it is created all the same.
    """
    provider = str(lock.get("provider"))
    module = _SDK_MODULE.get(provider)
    if module is None:
        return  # the script provider: no SDK, no key
    # The cheap checks first, so a refusal never pays for the SDK's import (anthropic: ~2 s of CPU):
    # is the SDK there (no import), is the key set; only then the import itself.
    if importlib.util.find_spec(module) is None:
        from kxen_agent.runtime.providers.sdk import missing_sdk_error

        raise UsageError(str(missing_sdk_error(provider)))
    var = key_env or lock.get("api_key_env")
    if var and not os.environ.get(var):
        raise UsageError(f"environment variable {var} is not set or empty: agent {lock.get('name')!r} ({provider} "
                         f"provider) sends it as the API key; export the key in it, or name the variable that "
                         "holds it with --api-key-env NAME")
    if import_sdk:
        from kxen_agent.runtime.providers.sdk import ProviderUnavailable, require_sdk

        try:
            require_sdk(lock)
        except ProviderUnavailable as e:
            raise UsageError(str(e)) from None


def default_agent() -> str:
    """The agent definition `run` uses without --agent: ``KXEN_AGENT_AGENT``, else the XDG config file.

    Refuses (one line naming both, and ``kxen-agent demo``) when neither is
    set up: a run on real work never falls back to the scripted demo agent.
    """
    named = os.environ.get(AGENT_ENV)
    if named:
        if not os.path.exists(named):
            raise UsageError(f"{AGENT_ENV}={named} names no file; point it at an agent definition (TOML) or unset it")
        return named
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    path = os.path.join(config, "kxen-agent", "agent.toml")
    if os.path.exists(path):
        return path
    raise UsageError(f"no agent: give --agent FILE, or set up a default agent in {AGENT_ENV} or {path}; "
                     "`kxen-agent demo` runs the bundled demo agent offline")
