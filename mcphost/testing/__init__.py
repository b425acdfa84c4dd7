"""Fixtures that admin-side teams import for integration tests against the reference center.

Owns: `DevCenter` (launch the real `mcphost devcenter` subprocess, wait for it, talk to it with
the standard library only) and the pytest plugin (`mcphost.testing.pytest_plugin`).
Must never: be imported by product code paths, or reach into the center's internals: the
fixture talks to the center only over its sockets, like any other client.
"""

from mcphost.testing.devcenter import DevCenter, DevCenterError
from mcphost.testing.http import Reply

__all__ = ["DevCenter", "DevCenterError", "Reply"]
