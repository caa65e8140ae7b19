"""``--with-checkpoints`` and ``--restore-workspace`` of ``session export|import|push|pull`` (issue #27 item 5).

The commands keep their own flow; they call these helpers (the logic is
:mod:`kxen_agent.session.checkpoint_travel`): the one-line note of what
stays behind, the scan of the files that would leave (as every export and
push scans: refused unless ``--allow-secrets``), the bundle's checkpoint
section, and on the receiving side adopting the checkpoints and writing
the session's last checkpoint into the workspace.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Sequence

from kxen_agent.errors import KxenError

from ._render import err, out, term_text as t

__all__ = ["adopt_from_bundle", "export_with_checkpoints", "note_stays_behind", "pull_checkpoints",
           "push_with_checkpoints", "restore", "scan_checkpoints"]


def _sessions(store: Any) -> Any:
    from kxen_agent.session.sessions import SessionStore

    return SessionStore(store)


def note_stays_behind(store: Any, ses_ids: Sequence[str]) -> None:
    """Without ``--with-checkpoints``: one line per session whose workspace changes stay on this machine."""
    from kxen_agent.session.checkpoint_travel import stays_behind

    sessions = _sessions(store)
    try:
        lines = stays_behind(sessions, [sessions.get(s) for s in ses_ids])
    except KxenError:
        return  # the note is a courtesy: an unreadable workspace does not stop an export
    for line in lines:
        err(f"kxen-agent: note: {t(line, quote=False)}")


def scan_checkpoints(items: Sequence[Any], what: str, *, allow_secrets: bool) -> None:
    """Scan every file the checkpoints carry; refuse (nothing written or sent) on a hit unless ``allow_secrets``."""
    from kxen_agent.runtime.redaction import credential_env_values
    from kxen_agent.session.checkpoint_travel import carried_blobs

    from .secret_scan import scan_text

    secrets = credential_env_values(os.environ)
    hits = 0
    for ses, path, blob, data in carried_blobs(items):
        if b"\0" in data[:8000]:
            continue  # binary: the rules and detectors read text
        for hit in scan_text(data.decode("utf-8", "replace"), secrets):
            hits += 1
            err(f"kxen-agent: warning: {what}: checkpoint file {t(path)} of {ses} (blob {blob[:12]}): "
                f"looks like {hit.describe()}; the text is not shown")
    if hits and not allow_secrets:
        raise KxenError(f"refusing {what}: the checkpoints hold {hits} text(s) that look like credentials (listed "
                        "above); nothing was written or sent — remove them from the workspace files (and rewind or "
                        "let a new checkpoint replace them), or give --allow-secrets")


def export_with_checkpoints(store: Any, ses_ids: Sequence[str], output: str, fmt: str | None, *, allow_secrets: bool,
                            progress: Any) -> Any:
    """``session export --with-checkpoints``: the bundle with a checkpoint section (pack form), after the scan."""
    from kxen_agent.session.checkpoint_travel import carried, write_git_bundle
    from kxen_agent.store.bundle import export_bundle, format_for_path

    sessions = _sessions(store)
    infos = [sessions.get(s) for s in dict.fromkeys(ses_ids)]
    items = carried(sessions, infos)
    if not items:
        err("kxen-agent: note: the sessions have no checkpoints here; the bundle carries none")
        return export_bundle(store, [sessions.group(i.id) for i in infos], output, fmt=format_for_path(output, fmt),
                             progress=progress)
    scan_checkpoints(items, f"export to {output}", allow_secrets=allow_secrets)
    tmpdir = tempfile.mkdtemp(prefix="kxen-export-")
    try:
        path, size = write_git_bundle(items, tmpdir)
        with open(path, "rb") as f:
            return export_bundle(store, [sessions.group(i.id) for i in infos], output,
                                 fmt=format_for_path(output, fmt), progress=progress, git_section=(f, size))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def adopt_from_bundle(store: Any, bundle: str, res: Any, *, quiet: bool = False) -> dict[str, str]:
    """After ``session import``: the bundle's checkpoints into each session's bound repository."""
    from kxen_agent.session import checkpoints as ckpt
    from kxen_agent.session.checkpoint_travel import adopt_git_bundle

    section = res.result.info.checkpoints
    if section is None:
        return {}
    offset, length = section
    sessions = _sessions(store)
    tmpdir = tempfile.mkdtemp(prefix="kxen-import-")
    done: dict[str, str] = {}
    try:
        path = os.path.join(tmpdir, "checkpoints.bundle")
        with open(bundle, "rb") as src, open(path, "wb") as dst:
            src.seek(offset)
            left = length
            while left:
                chunk = src.read(min(left, 1 << 20))
                if not chunk:
                    raise KxenError(f"bundle {bundle} changed while it was imported; import it again")
                dst.write(chunk)
                left -= len(chunk)
        by_repo: dict[str, tuple[Any, list[str]]] = {}
        for ses in res.sessions:
            info = sessions.get(ses)
            try:
                repo = ckpt.open_repo(info.workspace, sessions.agent(info).get("policy", {}))
            except ckpt.NoCheckpoints as e:
                err(f"kxen-agent: note: session {ses}: its checkpoints were not adopted: {t(str(e), quote=False)}")
                continue
            by_repo.setdefault(repo.common_dir, (repo, []))[1].append(ses)
        for repo, ids in by_repo.values():
            done.update(adopt_git_bundle(repo, path, ids))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    for ses, status in sorted(done.items()) if not quiet else ():
        note = {"kept": "kept this repository's own (newer or diverged)"}.get(status, status)
        out(f"{t(ses)}: checkpoints {note}")
    return done


def restore(store: Any, ses_ids: Sequence[str], *, quiet: bool = False) -> None:
    """``--restore-workspace``: each session's last checkpoint written into its workspace."""
    from kxen_agent.session.checkpoint_travel import restore_workspace

    sessions = _sessions(store)
    for ses in ses_ids:
        r = restore_workspace(sessions, sessions.get(ses))
        if quiet:
            continue
        out(f"{t(ses)}: workspace restored to checkpoint {r.checkpoint[:12]} ({len(r.written)} file(s) written, "
            f"{len(r.removed)} removed)")
        for path, why in r.left_alone:
            out(f"left alone: {t(path)} ({t(why, quote=False)})")


def push_with_checkpoints(store: Any, ses_ids: Sequence[str], remote: str | None, *, allow_secrets: bool) -> None:
    """``session push --with-checkpoints``: scan, then push the checkpoint refs (before the sessions)."""
    from kxen_agent.session.checkpoint_travel import carried, push_checkpoints

    sessions = _sessions(store)
    items = carried(sessions, [sessions.get(s) for s in dict.fromkeys(ses_ids)])
    if not items:
        err("kxen-agent: note: the sessions have no checkpoints here; none are pushed")
        return
    scan_checkpoints(items, "push", allow_secrets=allow_secrets)
    for ses, where, tip in push_checkpoints(items, remote):
        out(f"{t(ses)}: checkpoints {tip[:12]} on {t(where)}")


def pull_checkpoints(store: Any, ses_ids: Sequence[str], remote: str | None, *, quiet: bool = False) -> None:
    """``session pull --with-checkpoints``: fetch each session's checkpoint ref into its workspace repository."""
    from kxen_agent.session import checkpoints as ckpt
    from kxen_agent.session.checkpoint_travel import fetch_checkpoints

    sessions = _sessions(store)
    for ses in ses_ids:
        info = sessions.get(sessions.resolve_id(ses))
        repo = ckpt.open_repo(info.workspace, sessions.agent(info).get("policy", {}))
        tip, status = fetch_checkpoints(repo, info.id, remote)
        if quiet:
            continue
        if tip is None:
            err(f"kxen-agent: note: {info.id}: the remote has no checkpoints of it (push them with --with-checkpoints)")
        else:
            out(f"{t(info.id)}: checkpoints {tip[:12]} {status}")
