"""``python -m kxen_agent``: the same as the ``kxen-agent`` command."""

from kxen_agent.cli.main import entry

entry()
