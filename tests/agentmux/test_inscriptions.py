"""Inscriptions (mcphost/agentmux/inscriptions.py): names, paths, one private JSON record per line."""

from __future__ import annotations

import json
from pathlib import Path

from mcphost.agentmux.inscriptions import Inscriptions, log_path, sanitize


def test_inscriptions(tmp_path: Path) -> None:
    assert sanitize("a/b c") == "a_b_c"
    assert sanitize("") == "unknown"
    assert log_path(tmp_path, None, None) == tmp_path / "mcp/unassociated.log"
    path = log_path(tmp_path, "p", "s")
    sink = Inscriptions(path)
    sink.write("mcp.startup", x=1)
    sink.close()
    record = json.loads(path.read_text())
    assert set(record) == {"timestamp", "pid", "event", "details"}
    assert record["timestamp"].endswith("Z")
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "bundles").stat().st_mode & 0o777 == 0o700
