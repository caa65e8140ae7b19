"""Profile the kxen side of one benchmark workload with pyinstrument.

::

    .venv/bin/pip install pyinstrument
    .venv/bin/python -m bench.profile {fork,durable,export,import,load,fsck} [--n N] [--html FILE]
    .venv/bin/python -m bench.profile durable --cprofile [--nosync]   # cProfile, own and cumulative times

``--cprofile``: the standard library's deterministic profiler instead of
pyinstrument's sampling (every call counted: the shares of a step's many
small costs); ``--nosync``: the store skips its fsyncs (durable, fork), so
what is left is the CPU.

Builds the same content as :mod:`bench.run` (at ``--n`` messages, default
10,000; ``durable``: ``--n`` tool calls, default 20), then profiles only
the kxen operation, so setup does not blur the picture. The profiles in
``bench/README.md`` were made with it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from . import run as bench
from ._content import Conversation

OPS = ("fork", "durable", "export", "import", "load", "fsck")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("op", choices=OPS)
    ap.add_argument("--n", type=int, default=None, help="messages (durable: tool calls)")
    ap.add_argument("--html", default=None, help="write an HTML profile here too")
    ap.add_argument("--cprofile", action="store_true", help="cProfile (deterministic) instead of pyinstrument")
    ap.add_argument("--nosync", action="store_true", help="durable, fork: a store that skips its fsyncs")
    args = ap.parse_args(argv)
    if args.cprofile:
        Profiler = _CProfiler
    else:
        try:
            from pyinstrument import Profiler
        except ImportError:
            print("pyinstrument is not installed: .venv/bin/pip install pyinstrument (or --cprofile)",
                  file=sys.stderr)
            return 2
    if args.nosync:
        from . import _kxen
        from kxen_agent.session.sessions import NS
        from kxen_agent.store import Store
        from kxen_agent.store.fsio import FaultyIO

        def nosync_store(root: str) -> Store:
            return Store(root, io=FaultyIO(None, sync=False), namespaces=(NS,))

        _kxen.measuring_store = nosync_store
    from kxen_agent.session.sessions import SessionStore
    from kxen_agent.session.schema import SESSION_SCHEMA
    from kxen_agent.store import export_bundle, fsck, import_bundle

    from . import _kxen

    measuring_store = _kxen.measuring_store

    work = tempfile.mkdtemp(prefix="kxen-profile-")
    try:
        prof = Profiler(interval=0.0005)
        if args.op == "durable":
            ws, _ = bench._durable_workspace(work)
            calls = args.n or 20
            state = bench.durable_state(work, 2000)
            prof.start()
            bench.durable_run(state, ws, calls)
            prof.stop()
        elif args.op in ("fork", "load"):
            n = args.n or (100_000 if args.op == "load" else 10_000)
            hist = bench.History(work, [n], 16 << 20)
            if args.op == "fork":
                prof.start()
                for _ in range(10):
                    SessionStore(measuring_store(hist.root)).fork(hist.sessions[n])
                prof.stop()
            else:
                prof.start()
                bench._kxen_load(hist.root, hist.sessions[n])
                prof.stop()
        else:
            n = args.n or 10_000
            base = list(Conversation(1).messages(n))
            es = bench.ExportSet(work, n, base, Conversation(2))
            bundle = os.path.join(work, "x.bundle")
            if args.op == "export":
                prof.start()
                export_bundle(measuring_store(es.root), [f"sessions/{es.ses}"], bundle)
                prof.stop()
            else:
                export_bundle(measuring_store(es.root), [f"sessions/{es.ses}"], bundle)
                dest = os.path.join(work, "imported")
                if args.op == "import":
                    prof.start()
                    import_bundle(measuring_store(dest), bundle)
                    prof.stop()
                else:
                    prof.start()
                    fsck(measuring_store(es.root), schema=SESSION_SCHEMA)  # as `kxen-agent fsck` runs it
                    prof.stop()
        print(prof.output_text(unicode=True, color=False, show_all=False))
        if args.html:
            with open(args.html, "w") as f:
                f.write(prof.output_html())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


class _CProfiler:
    """pyinstrument's Profiler calls, made on cProfile (``--cprofile``)."""

    def __init__(self, interval: float = 0.0) -> None:
        import cProfile

        self._p = cProfile.Profile()

    def start(self) -> None:
        self._p.enable()

    def stop(self) -> None:
        self._p.disable()

    def output_text(self, **_kw: object) -> str:
        import io
        import pstats

        out = io.StringIO()
        st = pstats.Stats(self._p, stream=out)
        st.sort_stats("cumulative").print_stats(45)
        st.sort_stats("tottime").print_stats(30)
        return out.getvalue()

    def output_html(self) -> str:
        return "<pre>" + self.output_text() + "</pre>"


if __name__ == "__main__":
    sys.exit(main())
