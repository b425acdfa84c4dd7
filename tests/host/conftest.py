"""Fixtures for the in-process host surface tests: one reference center per worker."""

from __future__ import annotations

from mcphost.testing.pytest_plugin import devcenter_session

__all__ = ["devcenter_session"]
