"""Fixtures that admin-side teams import for integration tests against the reference center.

Owns: `DevCenter` (launch the real `mcphost devcenter` subprocess, wait for it, talk to it with
the standard library only), the pytest plugin (`mcphost.testing.pytest_plugin`), and for runs of
`mcphost supervise` (the suite, `mcphost demo fleet`) the stand-in agent (`standin_agent.py`)
and fleet files (`mcphost.testing.fleet`); and what the suite and `bench/` share (bench never
imports `tests/`): the relay tools' fake relay and process drivers (`relayharness`), a real relay
on real tmux (`realrelay`), and the MCP stdout validator (`mcpschema`). None of these is imported
here: each costs only whoever imports it.
Must never: be imported by product code paths (the demos are not product paths), or reach into the center's internals: the
fixture talks to the center only over its sockets, like any other client.
"""

from mcphost.testing.devcenter import DevCenter, DevCenterError
from mcphost.testing.http import Reply

__all__ = ["DevCenter", "DevCenterError", "Reply"]
