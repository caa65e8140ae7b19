"""Whether a provider's SDK imports, and the error with the install command when it does not.

The providers (:mod:`.anthropic`, :mod:`.openai_compat`) import their SDK
lazily and raise :func:`missing_sdk_error` when it is absent; the factory
and the runner call :func:`require_sdk` before a session or run is created.
This module sits below all of them, so none imports the factory. It never
imports an SDK except to check that it imports.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shlex
import sys
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .base import ProviderError

__all__ = ["ProviderUnavailable", "install_command", "missing_sdk_error", "require_sdk"]

# The optional extra that carries each provider's SDK (pyproject.toml), and the module it provides.
_SDK = {"openai": ("openai", "openai"), "anthropic": ("anthropic", "anthropic")}


class ProviderUnavailable(ProviderError):
    """The provider's SDK is not installed in the Python running kxen-agent.

    Raised before a session or run is created (:func:`require_sdk`); the
    message carries the install command.
    """

    exit_code = 2  # the installation, not the state, is wrong: a usage error wherever it is found

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


def require_sdk(lock: Mapping[str, Any], *, find_only: bool = False) -> None:
    """Raise :class:`ProviderUnavailable` if the lock's provider needs an SDK that does not import.

    ``find_only``: only look for it, without importing it (an SDK's import takes up to seconds: a
    command that may still refuse for another reason, or call no model, does not pay it).
    """
    provider = str(lock.get("provider"))
    sdk = _SDK.get(provider)
    if sdk is None:
        return
    if find_only:
        if importlib.util.find_spec(sdk[1]) is None:
            raise missing_sdk_error(provider)
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
    import importlib.metadata  # here: only a missing SDK's message needs it (and it costs a command's start-up)

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
    import urllib.request

    return urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
