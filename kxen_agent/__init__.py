"""kxen-agent: a command-line agent whose sessions are durable, forkable and portable.

Layers, lowest first; imports point down only:

- :mod:`kxen_agent.store`: content-addressed objects (strict deterministic
  CBOR, BLAKE3 ids, zstd loose files, packs), refs with compare-and-swap
  steps and reflogs, step logs, locks, fsck, gc, bundles. Knows nothing of
  sessions.
- :mod:`kxen_agent.session`: DCPAgent locks, Sessions, messages, run
  records, workspace binding, forks, Git worktrees, bundles and Git remotes
  as transports, trust.
- :mod:`kxen_agent.runtime`: the run loop, providers, tools, the durable
  tool journal, recovery, approvals, compaction, run leases and
  cancellation.
- :mod:`kxen_agent.cli`: Typer commands that parse, call the library and
  render.

Beside the layers, used by all of them:

- :mod:`.errors` — :class:`~kxen_agent.errors.KxenError`, the one base
  class of every error a user can meet (a message and an exit code);
- :mod:`.lazy` — lazy package surfaces (PEP 562) for a fast CLI start-up;
- :mod:`.statedir` — where the state dir is when no path is given (the
  store's rule, also read by ``session grep``'s start, which has no store);
- :mod:`.__main__` — ``python -m kxen_agent``, the same as ``kxen-agent``;
- ``examples/demo-agent`` — the scripted agent ``kxen-agent demo`` runs
  (data, not code).

The byte formats are ``objects_spec.md``'s; the user's guide is the README
and ``docs/``.
"""

__version__ = "0.1.0"
