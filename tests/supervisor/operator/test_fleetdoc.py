"""docs/fleet-keys.md is the fleet model's: every key, its type, default and reload behaviour."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mcphost.supervisor import fleet
from mcphost.supervisor.operator import fleetdoc
from mcphost.supervisor.values import Reload

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "fleet-keys.md"


def test_the_committed_page_is_the_models() -> None:
    assert PAGE.read_text() == fleetdoc.render(), (
        f"docs/fleet-keys.md differs from the fleet model: regenerate it with `{fleetdoc.COMMAND}`"
    )


def test_the_command_writes_the_page() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mcphost.supervisor.operator.fleetdoc"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=True,
    )  # fmt: skip
    assert done.stdout == PAGE.read_text()


def test_every_key_of_every_table_is_on_the_page_with_its_declaration() -> None:
    text = fleetdoc.render()
    for section, model in fleet.SECTIONS.items():
        assert f"## `{fleet.table_of(section)}`" in text
        for key in model.model_fields:
            kind = fleet.reload_of(section, key)
            assert kind in Reload
            if section != "agent" or key == "id":
                assert f"| `{key}` |" in text and f"`{kind}`" in text, (section, key)


def test_a_changed_declaration_changes_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    field = fleet.MetricsSection.model_fields["listen"]
    monkeypatch.setattr(field, "json_schema_extra", {"reload": "restart_supervisor"})
    assert "| `listen` | string | required | `restart_supervisor` |" in fleetdoc.render()
    assert fleetdoc.render() != PAGE.read_text()


def test_the_supervisor_never_imports_the_generator() -> None:
    code = (
        "import sys, mcphost.supervisor.cli, mcphost.supervisor.supervisor\n"
        "print('mcphost.supervisor.operator.fleetdoc' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "False\n", done.stderr
