"""The generated pages (mcphost/docpages.py): docs/ctl.md is what `mcphost ctl`'s parser says,
docs/metrics.md what the metrics module declares and docs/fleet-keys.md what the fleet model
declares (each key's type, default and reload behaviour); a page that differs fails here, naming the
command that writes it again (`python -m mcphost.docpages`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mcphost import docpages
from mcphost.supervisor import fleet
from mcphost.supervisor.operator import ctl, metrics
from mcphost.supervisor.values import Reload

ROOT = docpages.ROOT

AGAIN = f"differs from the code: run `{docpages.REGENERATE}` and commit the page"


def test_the_ctl_page_is_what_the_parser_says() -> None:
    assert (ROOT / "docs" / "ctl.md").read_text() == docpages.ctl_page(), f"docs/ctl.md {AGAIN}"


def test_the_metrics_page_is_what_the_metrics_module_declares() -> None:
    page = (ROOT / "docs" / "metrics.md").read_text()
    assert page == docpages.metrics_page(), f"docs/metrics.md {AGAIN}"


def test_a_new_option_of_ctl_is_on_its_page() -> None:
    parser = ctl._parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    commands.choices["reload"].add_argument("--quietly", action="store_true", help="say less")
    page = docpages.ctl_page(parser)
    assert "| `--quietly` |  |  | say less |" in page
    assert page != docpages.ctl_page()


def test_every_family_the_module_declares_is_on_the_metrics_page_with_its_scraped_type() -> None:
    page = docpages.metrics_page()
    assert [name for name in metrics.NAMES if f"| `{name}` |" not in page] == []
    assert "| `mcphost_center_call_duration_seconds` | histogram | `tool` |" in page
    assert "| `mcphost_agent_state` | gauge | `agent`, `state` |" in page


def test_check_names_no_page_while_every_page_is_current() -> None:
    assert docpages.stale() == []
    assert docpages.main(["--check"]) == 0


def test_the_generator_stays_off_the_commands_start_up_path() -> None:
    probe = (
        "import sys, mcphost.supervisor.cli, mcphost.supervisor.operator.ctl, mcphost.cli; "
        "print('mcphost.docpages' in sys.modules, 'prometheus_client' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]


def test_the_fleet_keys_page_is_the_models() -> None:
    page = (ROOT / "docs" / "fleet-keys.md").read_text()
    assert page == docpages.fleet_keys_page(), f"docs/fleet-keys.md {AGAIN}"


def test_every_key_of_every_table_is_on_the_fleet_keys_page_with_its_declaration() -> None:
    text = docpages.fleet_keys_page()
    for section, model in fleet.SECTIONS.items():
        assert f"## `{fleet.table_of(section)}`" in text
        for key in model.model_fields:
            kind = fleet.reload_of(section, key)
            assert kind in Reload
            if section != "agent" or key == "id":
                assert f"| `{key}` |" in text and f"`{kind}`" in text, (section, key)


def test_a_changed_reload_declaration_changes_the_fleet_keys_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    field = fleet.MetricsSection.model_fields["listen"]
    monkeypatch.setattr(field, "json_schema_extra", {"reload": "restart_supervisor"})
    page = docpages.fleet_keys_page()
    assert "| `listen` | string | required | `restart_supervisor` |" in page
    assert page != (ROOT / "docs" / "fleet-keys.md").read_text()
