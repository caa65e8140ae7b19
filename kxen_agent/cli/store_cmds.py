"""``kxen-agent gc`` and ``kxen-agent bundle verify``.

Registered on the main app by :func:`register` (main.py calls it; this
module must not import main.py, which imports it). Each command calls the
store library and renders text or ``--json``; errors are
:class:`~kxen_agent.errors.KxenError` subclasses that main.py prints as one
line and maps to an exit code.
"""

from __future__ import annotations

import typer

from kxen_agent.session.schema import SESSION_SCHEMA
from kxen_agent.session.sessions import NS
from kxen_agent.store import Store
from kxen_agent.store.bundle import BundleInfo, verify_bundle
from kxen_agent.store.gc import DEFAULT_PRUNE, gc as run_gc, parse_duration

from ._render import Progress, emit_json, out, term_text as t

__all__ = ["bundle_app", "register"]


# Without a command: one usage-error line listing the commands (main.click_error_line), not the help.
bundle_app = typer.Typer(help="Check bundles (session export/import files).", no_args_is_help=False)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def gc_cmd(
    prune: str = typer.Option(
        DEFAULT_PRUNE, "--prune", metavar="DURATION",
        help="Remove unreachable objects older than this (2w, 3d, 12h, 30m, 0 or now; never to keep them).",
    ),
    json_out: bool = typer.Option(False, "--json", help="Print a JSON report."),
) -> None:
    """Pack reachable objects; prune unreachable ones and deleted sessions past the grace period."""
    parse_duration(prune)  # a bad value is a usage error before anything is opened
    store = Store.open(namespaces=(NS,))
    prog = Progress("gc", enabled=not json_out)
    rep = run_gc(store, prune=prune, progress=prog)
    prog.done()
    if json_out:
        emit_json(rep.to_json())
        return
    packed = f"packed {rep.packed} objects into pack-{rep.pack[:16]}" if rep.pack else "nothing to pack"
    out(
        f"gc {store.root}: {rep.reachable} reachable; {packed}; removed {rep.loose_removed} packed loose copies, "
        f"{rep.packs_removed} old packs; pruned {rep.pruned} unreachable objects older than {rep.prune}, "
        f"kept {rep.kept_unreachable} younger; removed {len(rep.groups_removed)} deleted groups; "
        f"{_size(rep.bytes_before)} -> {_size(rep.bytes_after)}"
    )
    for g in rep.groups_removed:
        out(f"removed deleted group {t(g)}")


def bundle_verify_cmd(
    file: str = typer.Argument(..., metavar="FILE", help="A bundle (pack or JSON form)."),
    json_out: bool = typer.Option(False, "--json", help="Print what the bundle holds as JSON."),
) -> None:
    """Check a bundle completely (no state dir needed): header, every object's hash and shape, the closure.

    Also warns, one line per hit on stderr, of text that looks like a
    credential (the exit status does not change).
    """
    from .secret_scan import SecretScan

    prog = Progress("verify", enabled=not json_out)
    scan = SecretScan()
    try:
        info = verify_bundle(file, progress=prog, schema=SESSION_SCHEMA, on_object=scan)
    finally:
        prog.done()
        scan.warn(f"bundle {t(file)}")
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
    """Add ``gc`` and ``bundle verify`` to ``app`` (idempotent)."""
    names = {c.name for c in app.registered_commands}
    if "gc" not in names:
        app.command("gc")(gc_cmd)
    if not any(g.name == "bundle" for g in app.registered_groups):
        app.add_typer(bundle_app, name="bundle")


bundle_app.command("verify")(bundle_verify_cmd)
