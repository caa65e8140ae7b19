"""Benchmarks of kxen-agent against Git, dulwich and JSONL session files.

``python -m bench.run`` runs every comparison side by side and prints a
table of ratios (see :mod:`bench.run` and ``bench/README.md``). The modules
here are the harness: :mod:`bench._content` makes realistic conversations,
:mod:`bench._kxen` builds kxen state dirs, :mod:`bench._peers` drives the
peers. ``bundle_memory.py`` and ``pack_compression.py`` are separate,
opt-in measurements of the pack and bundle code.
"""
