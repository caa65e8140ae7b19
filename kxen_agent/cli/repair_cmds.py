"""``kxen-agent repair``: mend what fsck names (objects_spec.md §18, docs/damage.md).

main.py loads this module by name when the command is run; it imports the
library inside the command. A dry run by default: it prints what it would
do; ``--apply`` does it.
"""

from __future__ import annotations

from typing import List, Optional

import typer

from ._render import emit_json, err, out, term_text as t

__all__ = ["repair_cmd"]


def repair_cmd(
    apply: bool = typer.Option(False, "--apply", help="Do it (default: a dry run that prints what it would do)."),
    sources: Optional[List[str]] = typer.Option(
        None, "--from", metavar="FILE",
        help="A bundle (session export) holding good copies; every object is checked against its id. Repeatable."),
    remote: Optional[str] = typer.Option(
        None, "--remote", metavar="NAME",
        help="Take good copies of the damaged sessions from this Git remote of the workspace (session push)."),
    workspace: Optional[str] = typer.Option(
        None, "--workspace", metavar="DIR", help="With --remote: the checkout whose remote it is (default: here)."),
    json_out: bool = typer.Option(False, "--json", help="Print {applied, actions [{kind, target, detail}], "
                                  "lostFound, left} as JSON."),
) -> None:
    """Mend what fsck names: good copies from bundles or a remote, the rest kept in lost-found/.

    Nothing is deleted: every file repair replaces is moved to
    lost-found/ with a manifest; every ref change has reason `repair`.
    Exit 1 if something is still damaged afterwards (a dry run: now).

    \b
    Examples:
      kxen-agent repair
      kxen-agent repair --from session.bundle --apply
      kxen-agent repair --remote origin --apply
    """
    from kxen_agent.session.repair import repair_sessions
    from kxen_agent.session.sessions import NS
    from kxen_agent.store import Store

    store = Store.open(namespaces=(NS,))
    if not store.exists:
        out(f"repair {t(store.root)}: no state dir, nothing to repair")
        return
    rep = repair_sessions(store, bundles=list(sources or []), remote=remote, workspace=workspace, apply=apply)
    if json_out:
        emit_json(rep.to_json())
    else:
        verb = "" if apply else "would "
        for a in rep.actions:
            out(t(f"{verb}{a.line()}", quote=False))
        if rep.lost_found:
            out(f"replaced files are in {t(rep.lost_found)} (manifest.jsonl says where each was and why)")
        if not rep.actions and not rep.left:
            out(f"repair {t(store.root)}: nothing to repair (fsck is clean)")
        elif not apply:
            out(f"repair {t(store.root)}: a dry run, nothing changed; `kxen-agent repair --apply` does the above")
        for line in rep.left:
            err(t(f"{'still ' if apply else ''}{line}", quote=False))
        if apply and not rep.left:
            out(f"repair {t(store.root)}: done; fsck is clean")
    if rep.left:
        raise typer.Exit(1)
