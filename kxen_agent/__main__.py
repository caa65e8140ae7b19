"""``python -m kxen_agent``: the same as the ``kxen-agent`` command."""

from kxen_agent.cli.start import entry

entry()
