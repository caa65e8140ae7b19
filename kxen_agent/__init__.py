"""kxen-agent: a command-line agent whose sessions are durable, forkable and portable.

Layers, lowest first; imports point down only:

- ``kxen_agent.store``: content-addressed objects (strict deterministic CBOR,
  BLAKE3 ids, zstd loose files, packs), refs with compare-and-swap
  transactions and reflogs, locks, fsck, gc, bundles. Knows nothing of
  sessions.
- ``kxen_agent.session``: DCPAgent locks, Sessions, messages, workspace
  binding, forks and Git worktrees.
- ``kxen_agent.runtime``: the run loop, providers, tools, the durable tool
  journal, recovery, run leases and cancellation.
- ``kxen_agent.cli``: Typer commands that parse, call the library and render.
"""

__version__ = "0.1.0"
