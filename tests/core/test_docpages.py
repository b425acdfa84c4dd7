"""The generated pages (mcphost/docpages.py): docs/ctl.md is what `mcphost ctl`'s parser says and
docs/metrics.md what the metrics module declares; a page that differs fails here, naming the
command that writes it again (`python -m mcphost.docpages`)."""

from __future__ import annotations

import subprocess
import sys

from mcphost import docpages
from mcphost.supervisor.operator import ctl, metrics

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
