"""``session import --trust``: a bundle signed by an allowed signer, accepted in the same step.

The trust boundary (``objects_spec.md`` §14.13) asks this machine to accept
what a session from elsewhere would make it do before a run goes on. When
the bundle's signature was checked against the user's allowed-signers
file (§12.14), ``--trust`` records that acceptance right after the import,
exactly as ``session trust SES --yes`` would (the agent lock, and this
machine's yes on each pending call recorded elsewhere); it never does so
for an unsigned or unchecked bundle.
"""

from __future__ import annotations

from typing import Any

from kxen_agent.errors import UsageError

from ._render import out, term_text as t

__all__ = ["check_trust_flags", "trust_imported"]


def check_trust_flags(trust: bool, allowed_signers: str | None) -> None:
    """``--trust`` is refused before anything is read unless a signature will be checked."""
    if trust and allowed_signers is None:
        raise UsageError("--trust accepts only a bundle signed by a key you allow: give --allowed-signers FILE "
                         "too (or import, then `kxen-agent session trust SES`)")


def trust_imported(store: Any, sessions: list[str], signer: str, *, quiet: bool) -> list[str]:
    """Accept, in this state dir, what each imported session asks; the sessions that needed it."""
    from kxen_agent.runtime.runner import Runner

    runner = Runner(store)
    accepted = []
    for ses in sessions:
        doc = runner.trust_report(ses)
        if doc["lockProblem"] is None and not doc["calls"]:
            continue
        runner.accept_trust(ses)
        accepted.append(ses)
        if not quiet:
            out(f"{t(ses)}: accepted in this state dir (the bundle is signed by {t(signer)}), as "
                f"`kxen-agent session trust {t(ses)} --yes` would")
    return accepted
