"""The look for credentials in what a bundle carries: ``bundle verify``'s warnings, ``session export --scan``.

Owns turning objects into warning lines (one per hit, naming the object,
where in it and what it looks like — never the text) with the rules of
:mod:`kxen_agent.runtime.redaction` (``objects_spec.md`` §14.11), rule 1
taking the credential-looking variables of this process. It must never
print a secret, and never decide an exit status: the commands do.
"""

from __future__ import annotations

import os

from kxen_agent.runtime.redaction import Hit, credential_env_values, scan_value
from kxen_agent.store.objects import CorruptObject, RawObject, decode_stored

from ._render import err, term_text as t

__all__ = ["SecretScan"]


class SecretScan:
    """Called with each object; collects (object, where in it, hit) and prints them as warnings."""

    def __init__(self) -> None:
        self.secrets = credential_env_values(os.environ)
        self.hits: list[tuple[RawObject, str, Hit]] = []

    def __call__(self, obj: RawObject) -> None:
        try:
            value = decode_stored(obj)
        except CorruptObject:  # the verification names it; nothing to scan
            return
        self.hits += [(obj, where, hit) for where, hit in scan_value(value, self.secrets)]

    def warn(self, what: str) -> None:
        """One warning line per hit on stderr: ``what`` names the bundle or the sessions."""
        for obj, where, hit in self.hits:
            err(f"kxen-agent: warning: {what}: object {obj.hex} ({obj.kind}), {t(where, quote=False)}: "
                f"looks like {hit.describe()}; the text is not shown")
