"""``kxen-agent fsck``, ``gc``, ``cat-object`` and ``bundle verify``: the plumbing.

main.py loads these by name when one is run (:data:`~.main.COMMANDS`); this
module must not import main.py, and it imports the store only inside the
commands, so that listing them costs nothing. Each command calls the store
library and renders text or ``--json``; errors are
:class:`~kxen_agent.errors.KxenError` subclasses that main.py prints as one
line and maps to an exit code.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING, Any, Optional

import typer

from kxen_agent.errors import KxenError

from ._render import Progress, dumps_json, emit_json, err, out, term_text as t, to_jsonable

if TYPE_CHECKING:
    from kxen_agent.store import Store
    from kxen_agent.store.bundle import BundleInfo

__all__ = ["bundle_app", "cat_object_cmd", "fsck_cmd", "gc_cmd", "register"]

#: ``gc --prune``'s default, as git's ``gc.pruneExpire`` (the store's ``gc.DEFAULT_PRUNE``,
#: repeated here so the help needs no store import; a test holds them equal).
DEFAULT_PRUNE = "2w"

# Without a command: one usage-error line listing the commands (main.click_error_line), not the help.
bundle_app = typer.Typer(
    help="Check bundles (session export/import files).\n\n\b\nExample:\n  kxen-agent bundle verify session.bundle",
    no_args_is_help=False, rich_markup_mode=None, add_completion=False)


def _store(**kw: Any) -> Store:
    from kxen_agent.session.sessions import NS
    from kxen_agent.store import Store

    return Store.open(namespaces=(NS,), **kw)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def fsck_cmd(
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON report: counts, problems [{kind, where, message}], dangling, strayFiles."),
) -> None:
    """Verify every object, ref and reflog, and the closure between them.

    Every object is re-hashed and its shape checked; exit 1 if anything is
    wrong, each problem named on stderr.

    \b
    Example:
      kxen-agent fsck
    """
    from kxen_agent.session.schema import SESSION_SCHEMA
    from kxen_agent.store import fsck as run_fsck

    from kxen_agent.runtime.history_index import CACHES
    from kxen_agent.runtime.run_reader import verify_run_states
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.store import Problem

    store = _store(caches=CACHES)  # the run loop's caches: fsck runs their checks (the history index, §14.12)
    prog = Progress("fsck", enabled=not json_out)
    rep = run_fsck(store, progress=prog, schema=SESSION_SCHEMA)
    # A run whose states or journal break the §14.5/§14.6 state machines (a resume refuses it).
    rep.problems.extend(Problem("run-state", oid, text) for oid, text in verify_run_states(SessionStore(store)))
    from kxen_agent.session.damage import classify, describe

    # Sessions in their own words: intact, damaged (where it stops), unreadable (objects_spec.md §18).
    sessions = classify(store, rep.unreadable_groups) if not rep.clean else []
    if not rep.clean:
        rep.extra["sessions"] = sessions
    prog.done()
    if json_out:
        emit_json(rep.to_json())
    else:
        # A problem line can quote what a damaged or hostile state dir holds (ref names, file names).
        for p in rep.problems:
            err(t(p.line(), quote=False))
        for s in sessions:
            if s["state"] != "intact":
                err(t(describe(s), quote=False))
        for kind in dict.fromkeys(p.kind for p in rep.problems):
            err(f"next, for {kind}: {rep.problems[[p.kind for p in rep.problems].index(kind)].next}")
        for d in rep.dangling:
            out(f"dangling object {d}")
        for title, note in rep.notes:
            out(f"{title} {t(note)}")
        for f in rep.stray_files:
            # Temp files (an interrupted write's; gc removes those under objects/) and names no
            # writer makes (objects_spec.md §11 steps 1, 6, 7): nothing reads either.
            out(f"stray file {t(f)} (nothing reads it: the temp file of an interrupted or running "
                "write, or a name no writer makes)")
        status = "clean" if rep.clean else f"{len(rep.problems)} problem(s)"
        out(
            f"fsck {t(store.root)}: {rep.objects} objects ({rep.loose} loose, {rep.packed} packed, "
            f"{rep.in_steps} in step logs), "
            f"{rep.refs} ref{'' if rep.refs == 1 else 's'} in {rep.groups} group{'' if rep.groups == 1 else 's'}, "
            f"{rep.reachable} reachable, "
            f"{len(rep.dangling)} dangling: {status}"
        )
    if not rep.clean:
        raise typer.Exit(1)


def cat_object_cmd(
    oid: str = typer.Argument(..., metavar="ID",
                              help="An object id or unique prefix (8+ hex digits); a msg_ id works too."),
    json_out: bool = typer.Option(False, "--json", help="Print {id, kind, size, value} as JSON (links as hex)."),
) -> None:
    """Print one object (plumbing, like git cat-file -p).

    \b
    Examples:
      kxen-agent cat-object 3f2a9c01
      kxen-agent cat-object msg_3f2a9c01 --json
    """
    from kxen_agent.errors import UsageError
    from kxen_agent.store import decode_body

    text = oid.strip()
    if text.startswith("msg_"):
        text = text[len("msg_"):]  # a message id is its object's id (§14.1)
    elif text[:4] in ("ses_", "run_") or text.startswith("op_"):
        raise UsageError(f"{oid} names a session, run or operation, not an object; "
                         "`kxen-agent session show`/`run show` print those")
    store = _store()
    obj = store.read_raw(store.resolve(text))
    value = decode_body(obj)
    if json_out:
        body = value.decode("utf-8", "replace") if obj.kind == "blob" else to_jsonable(value)
        emit_json({"id": obj.hex, "kind": obj.kind, "size": len(obj.body), "value": body})
    elif obj.kind == "blob":
        sys.stdout.buffer.write(value)
    else:
        out(f"{obj.kind} {obj.hex}")
        out(dumps_json(to_jsonable(value), indent=2))


def _checkpoint_roots(store: Any) -> dict[str, str]:
    """``{ses: repository}`` of the deleted sessions a gc may remove; {} when the sessions cannot be listed
    (damage: the gc itself says what it skips, and a checkpoint ref left behind only keeps objects)."""
    from kxen_agent.session import checkpoints as ckpt
    from kxen_agent.session.sessions import SessionStore

    try:
        return ckpt.checkpoint_roots(SessionStore(store))
    except (KxenError, OSError, ValueError):
        return {}


def gc_cmd(
    prune: str = typer.Option(
        DEFAULT_PRUNE, "--prune", metavar="DURATION",
        help="Remove unreachable objects and deleted sessions older than DURATION: 2w, 3d, 12h, 30m, 6mo, 1y, "
             "2.weeks.ago; 0 or now for no grace; never to keep them.",
    ),
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON report: reachable, packedObjects, pruned, bytesBefore/After, packSkipped..."),
) -> None:
    """Pack reachable objects; prune unreachable ones and deleted sessions past the grace period.

    A pack that would not be smaller than the loose objects and packs it
    replaces is not written: gc never grows the store.

    \b
    Examples:
      kxen-agent gc
      kxen-agent gc --prune=1y
    """
    from kxen_agent.store.gc import gc as run_gc, parse_duration

    parse_duration(prune)  # a bad value is a usage error before anything is opened
    store = _store()
    prog = Progress("gc", enabled=not json_out)
    # The repositories of deleted sessions are named by their metadata, which the gc removes with them: read
    # first, so their workspace checkpoint refs go too (Git's own gc then reclaims the objects).
    roots = _checkpoint_roots(store)
    rep = run_gc(store, prune=prune, progress=prog)
    prog.done()
    from kxen_agent.session import checkpoints as ckpt

    refs_gone = ckpt.delete_pruned(roots, rep.groups_removed)
    if json_out:
        emit_json({**rep.to_json(), "checkpointRefsDeleted": refs_gone})
        return
    if rep.pack:
        packed = f"packed {rep.packed} objects into pack-{rep.pack[:16]}"
    elif rep.pack_skipped:
        packed = f"wrote no pack ({rep.pack_skipped})"
    else:
        packed = "nothing to pack"
    out(
        f"gc {t(store.root)}: {rep.reachable} reachable; {packed}; removed {rep.loose_removed} packed loose copies, "
        f"{rep.packs_removed} old packs; pruned {rep.pruned} unreachable objects older than {t(rep.prune)}, "
        f"kept {rep.kept_unreachable} younger; removed {len(rep.groups_removed)} deleted groups; "
        f"{_size(rep.bytes_before)} -> {_size(rep.bytes_after)} on disk"
    )
    for g in rep.groups_removed:
        out(f"removed deleted group {t(g)}")
    for ref in refs_gone:
        out(f"deleted workspace checkpoint ref {t(ref)}")
    if rep.damaged:
        for what in rep.damaged[:20]:
            err(t(f"damaged: {what}", quote=False))
        more = f" (and {len(rep.damaged) - 20} more)" if len(rep.damaged) > 20 else ""
        err(f"gc packed what reads and pruned nothing{more}: the damaged part might reach any unreachable "
            "object; `kxen-agent repair` (a dry run) says what it would mend")


@bundle_app.command("verify")
def bundle_verify_cmd(
    file: str = typer.Argument(..., metavar="FILE", help="A bundle (pack or JSON form)."),
    json_out: bool = typer.Option(
        False, "--json", help="Print what the bundle holds as JSON: format, version, refs, objects, digest."),
    identity: Optional[list[str]] = typer.Option(
        None, "--identity", "-i", metavar="FILE", help="An age identity file or SSH private key that opens an "
        "encrypted bundle. Repeatable."),
    allowed_signers: Optional[str] = typer.Option(
        None, "--allowed-signers", metavar="FILE", help="Check the bundle's SSH signature against this allowed "
        "signers file (refused: unsigned, an unknown signer, a changed byte)."),
) -> None:
    """Check a bundle completely (no state dir needed): header, every object's hash and shape, the closure.

    Also warns, one line per hit on stderr, of text that looks like a
    credential (the exit status does not change).

    \b
    Example:
      kxen-agent bundle verify session.bundle
    """
    from kxen_agent.session.schema import SESSION_SCHEMA
    from kxen_agent.session.share import open_bundle
    from kxen_agent.store.bundle import verify_bundle

    from .secret_scan import SecretScan

    prog = Progress("verify", enabled=not json_out)
    scan = SecretScan()
    with open_bundle(file, identities=identity, allowed_signers=allowed_signers) as opened:  # §12.14
        try:
            info = verify_bundle(opened.path, progress=prog, schema=SESSION_SCHEMA, on_object=scan)
        finally:
            prog.done()
            scan.warn(f"bundle {t(file)}")
    if opened.path != file:  # an envelope: say what it was, and name the file given
        info = dataclasses.replace(info, path=file)
        if json_out:
            emit_json(dict(info.to_json(), envelope=opened.envelope_json()))
            return
        _print_info(info)
        if opened.encrypted:
            out("encrypted (age): opened with the identity given")
        if opened.signature is not None:
            out(t(opened.signature.line(), quote=False))
        return
    if json_out:
        emit_json(info.to_json())
        return
    _print_info(info)


def _print_info(info: BundleInfo) -> None:
    caps = ", ".join(map(t, info.capabilities)) or "none"
    out(f"bundle {t(info.path)}: ok, {info.format} form, version {info.version}, capabilities: {caps}")
    for g in sorted(info.refs):
        for name, oid in sorted(info.refs[g].items()):
            out(f"{oid.hex()} {t(f'{g}/{name}')}")
    kinds = ", ".join(f"{n} {t(k)}" for k, n in sorted(info.kinds.items()))
    pack = f", pack {_size(info.pack_bytes)}" if info.format == "pack" else ""
    out(f"{info.objects} objects ({kinds}), {_size(info.object_bytes)} of objects{pack}, file {_size(info.file_bytes)}")
    out(f"digest {info.digest}")


def register(app: typer.Typer) -> None:
    """Nothing to do: main.py loads these commands by name (:data:`~.main.COMMANDS`).

    Kept for callers written when main.py registered them eagerly.
    """
