"""The generated reference pages: docs/ctl.md from `mcphost ctl`'s argparse parser,
docs/metrics.md from the metrics module's declarations and docs/fleet-keys.md from the fleet
model, so no page can drift from the code.

    python -m mcphost.docpages           # write every page
    python -m mcphost.docpages --check   # exit 1, naming each page that differs, writing nothing

Owns: the text of those pages (`ctl_page`, `metrics_page`, `fleet_keys_page`) and where they
are (`PAGES`).
`ctl_page` walks the parser `mcphost.supervisor.operator.ctl` builds: every command, its usage,
its arguments with their choices, defaults and help, and the exit codes of its epilog.
`metrics_page` takes every family of `metrics.NAMES` with its help; its type and labels come from
a scrape of a real `Metrics` (the module's own exposition, parsed with prometheus_client's
parser) of one agent with every figure (`USAGE_FIGURES`, and `LIMIT_FIGURES` where the module
has them), one center call and one relay delivery; for a family that scrape does not show, from
`AGENT_FAMILIES` (an agent's family is labelled `agent`) or its name.
tests/core/test_docpages.py fails while a page in docs/ differs from what this writes.

Must never: be imported by the supervisor, ctl or any other command (it imports
prometheus_client and the whole ctl parser: nothing on a start-up path pays for it); write
anything but the pages of `PAGES`.
"""

from __future__ import annotations

import argparse
import functools
import sys
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 100  # the usage lines are wrapped at this width, whatever the terminal
REGENERATE = "python -m mcphost.docpages"


def _banner(source: str) -> str:
    return (
        f"<!-- Generated from {source} by `{REGENERATE}`: do not edit by hand. "
        "tests/core/test_docpages.py fails while this page differs from the code. -->\n"
    )


def _cell(text: str) -> str:
    """Text fit for a cell of a markdown table: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


# -- docs/ctl.md ---------------------------------------------------------------------------------


def _wide(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.formatter_class = functools.partial(argparse.HelpFormatter, width=WIDTH)
    return parser


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(_wide(parser).format_usage().removeprefix("usage: ").split())


def _spelling(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(f"`{o}`" for o in action.option_strings)
        if action.nargs == 0:
            return names
        return f"{names} `{action.metavar or action.dest.upper()}`"
    return f"`{action.metavar or action.dest}`" + ("..." if action.nargs in ("*", "+") else "")


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.default == []:
        return ""
    return f"`{action.default}`"


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
        rows.append(
            f"| {_spelling(action)} | {choices} | {_default(action)} | {_cell(action.help or '')} |"
        )
    if not rows:
        return []
    return ["| argument | choices | default | what |", "|---|---|---|---|", *rows, ""]


def ctl_page(parser: argparse.ArgumentParser | None = None) -> str:
    """docs/ctl.md: every command of `mcphost ctl`'s parser (the real one unless given)."""
    if parser is None:
        from mcphost.supervisor.operator import ctl

        parser = ctl._parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help or "" for choice in subparsers._choices_actions}
    lines = [
        _banner("the parser of `mcphost/supervisor/operator/ctl.py`"),
        "# `mcphost ctl` reference",
        "",
        f"{parser.description} What each command does and why, with examples: "
        '[supervisor.md, "Control"](supervisor.md#control); the supervisor\'s other '
        "references: [supervisor.md](supervisor.md).",
        "",
        "```",
        _usage(parser),
        "```",
        "",
        *_arguments(parser),
        f"{parser.epilog[0].upper()}{parser.epilog[1:]}." if parser.epilog else "",
        "",
    ]
    for name, command in subparsers.choices.items():
        lines += [
            f"## `{name}`",
            "",
            f"{helps.get(name, '')[:1].upper()}{helps.get(name, '')[1:]}.",
            "",
            "```",
            _usage(command),
            "```",
            "",
            *_arguments(command),
        ]
    return "\n".join(lines).rstrip("\n") + "\n"


# -- docs/metrics.md -----------------------------------------------------------------------------


def _scraped() -> dict[str, tuple[str, set[str]]]:
    """Each family a real `Metrics` exposes for one agent with every figure, one center call and
    one relay delivery: name as scraped -> (type, label names)."""
    from prometheus_client.parser import text_string_to_metric_families

    from mcphost.supervisor.operator import metrics
    from mcphost.supervisor.operator.operations import Snapshot

    row = {
        "agent_id": "agent-1",
        "state": "running",
        "restarts": 1,
        "generation": 2,
        "sessions": 2,
        "sandbox": "bwrap",
        "usage": {figure: 1 for figure in metrics.USAGE_FIGURES},
        # the limits a row carries, where the module reads them (none before it did)
        "limits": {figure: 1 for figure in getattr(metrics, "LIMIT_FIGURES", ())},
    }
    status = {"center": {"state": "ok"}, "agents": [row]}
    figures = metrics.RelayFigures(outcomes={"delivered": 1}, queued=0)
    made = metrics.Metrics(lambda: Snapshot(1, status), lambda: figures)
    made.center_call("agent-1", "get_my_work", "ok", 0.01)
    families = text_string_to_metric_families(made.exposition().decode())
    found: dict[str, tuple[str, set[str]]] = {}
    for family in families:
        labels = {k for s in family.samples for k in s.labels if k not in ("le", "quantile")}
        found[family.name] = (family.type, labels)
        if family.type == "counter":  # the parser names a counter without its `_total`
            found[family.name + "_total"] = (family.type, labels)
    return found


def _kind(name: str, scraped: dict[str, tuple[str, set[str]]]) -> tuple[str, list[str]]:
    from mcphost.supervisor.operator import metrics

    declared = dict(metrics.AGENT_FAMILIES)
    kind, labels = scraped.get(name, (declared.get(name, ""), set()))
    if name in declared:  # an agent's family: labelled `agent`, with a figure in the scrape or not
        labels = labels | {"agent"}
    kind = kind or ("counter" if name.endswith("_total") else "gauge")
    return kind, sorted(labels, key=lambda label: (label != "agent", label))


def _paragraph(doc: str, head: str) -> str:
    """The paragraph of a docstring that starts with `head`, on one line."""
    for block in doc.split("\n\n"):
        if block.startswith(head):
            return " ".join(block.split())
    return ""


def metrics_page() -> str:
    """docs/metrics.md: every family of `metrics.NAMES`, its type, labels and help."""
    from mcphost.supervisor.agents.states import AgentState
    from mcphost.supervisor.operator import metrics

    scraped = _scraped()
    rows = []
    for name, text in metrics.NAMES.items():
        kind, labels = _kind(name, scraped)
        shown = ", ".join(f"`{label}`" for label in labels)
        rows.append(f"| `{name}` | {kind} | {shown} | {_cell(text)} |")
    process = sorted(
        name for name in scraped if name.startswith("process_") and name + "_total" not in scraped
    )
    lines = [
        _banner("`NAMES` of `mcphost/supervisor/operator/metrics.py`"),
        "# Metrics reference",
        "",
        "Every family the supervisor's Prometheus endpoint (`GET /metrics`, off unless the fleet "
        "file has `[metrics]`) exposes. Turning it on, scraping it and queries to start from: "
        '[operations.md, "Metrics"](operations.md#metrics).',
        "",
        "| name | type | labels | what |",
        "|---|---|---|---|",
        *rows,
        "| `process_*` | | | the supervisor's own process (prometheus_client's process "
        f"collector: {', '.join(f'`{n}`' for n in process)}) |",
        "",
        _paragraph(metrics.__doc__ or "", "Labels:")
        + " The states: "
        + ", ".join(f"`{state.value}`" for state in AgentState)
        + ".",
        "",
    ]
    return "\n".join(lines)


# -- docs/fleet-keys.md ----------------------------------------------------------------------------

# The tables in the order an operator meets them (contrib/fleet.toml's).
ORDER = ("center", "page", "metrics", "identity", "defaults", "agent")
ABOUT = {
    "center": "The worker's one binding to the center (each key may also come from "
    "`MCPHOST_CENTER__<KEY>` or `--center-<key>`, which win).",
    "page": "The read-only fleet page; off without the table.",
    "metrics": "The Prometheus endpoint; off without the table.",
    "identity": "Whom the agents of a root supervisor run as.",
    "defaults": "Every agent's keys; each `[[agent]]` table may set any of them, and wins.",
    "agent": "One table per agent: its `id`, and any key of `[defaults]` (the agent's value "
    "wins; its `env` is merged over the defaults').",
}
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}


def type_of(annotation: Any) -> str:
    """How the page writes a field's type: `"a" | "b"`, `string`, `list of string`..."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_of(a) for a in args)
    if origin is tuple:
        return f"list of {type_of(args[0])}"
    if origin is dict:
        return f"table of {type_of(args[1])}"
    return _SCALARS.get(annotation, str(annotation))


def default_of(section: str, key: str) -> str:
    """The key's default as the page shows it (`[defaults]`: the built-in one, `plan`'s)."""
    from pydantic_core import PydanticUndefined

    from mcphost.supervisor.fleet import SECTIONS
    from mcphost.supervisor.plan import AgentDefaults

    field = SECTIONS[section].model_fields[key]
    if field.is_required():
        return "required"
    if section in ("defaults", "agent"):
        if section == "agent":
            return "`[defaults]`'s"
        value = getattr(AgentDefaults(), key)
    else:
        value = field.default
    if value is None or value == () or value is PydanticUndefined:
        return "none"
    return f"`{value!r}`".replace("'", '"') if isinstance(value, str) else f"`{value}`"


def reload_cell(section: str, key: str) -> str:
    """What a reload does with the key, as declared (and when it is set or taken out)."""
    from mcphost.supervisor.fleet import reload_of

    declared, toggled = reload_of(section, key), reload_of(section, key, toggled=True)
    cell = f"`{declared}`"
    if toggled != declared:
        cell += f" (set or taken out: `{toggled}`)"
    return cell


def fleet_keys_page() -> str:
    """docs/fleet-keys.md: every key of every table of the fleet model."""
    from mcphost.supervisor.fleet import SECTIONS, table_of
    from mcphost.supervisor.values import RELOAD_MEANS, Reload

    out = [
        _banner("the fleet model of `mcphost/supervisor/fleet.py`"),
        "# Fleet keys",
        "",
        "Every key of the fleet file (`mcphost supervise --fleet FILE`), table by table: its type, "
        "its default, what a reload (`mcphost ctl reload`, SIGHUP) does with a change of it, and "
        "what it takes. Generated from the fleet model (`mcphost/supervisor/fleet.py`) by "
        f"`{REGENERATE}`; `tests/core/test_docpages.py::test_the_fleet_keys_page_is_the_models` "
        "fails when they differ. A commented example of every key: `contrib/fleet.toml`.",
        "",
        "## What a reload does",
        "",
        "`ctl reload` and `ctl reload --dry-run` name every changed key with what was (would be) "
        "done with it, and SIGHUP's reload writes the same to the journal (`supervisor.reloaded`) "
        "(`tests/supervisor/test_supervise_reload_keys.py`). Each key declares one of:",
        "",
    ]
    out += [f"- `{kind}`: {RELOAD_MEANS[kind]}." for kind in Reload]
    for section in ORDER:
        model = SECTIONS[section]
        keys = [k for k in model.model_fields if section != "agent" or k == "id"]
        out += ["", f"## `{table_of(section)}`", "", ABOUT[section], ""]
        out += ["| key | type | default | reload | takes |", "|---|---|---|---|---|"]
        for key in keys:
            field = model.model_fields[key]
            out.append(
                f"| `{key}` | {type_of(field.annotation)} | {default_of(section, key)} | "
                f"{reload_cell(section, key)} | {_cell(field.description or '')} |"
            )
    return "\n".join(out) + "\n"


# -- the pages -----------------------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "docs/ctl.md": ctl_page,
    "docs/metrics.md": metrics_page,
    "docs/fleet-keys.md": fleet_keys_page,
}


def stale(pages: Iterable[str] = PAGES) -> list[str]:
    """The pages whose file differs from what their generator writes now."""
    return [
        page
        for page in pages
        if not (ROOT / page).is_file() or (ROOT / page).read_text() != PAGES[page]()
    ]


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(prog=REGENERATE, description=__doc__.split("\n\n")[0])
    args.add_argument("--check", action="store_true", help="name the pages that differ; write none")
    if args.parse_args(argv).check:
        differ = stale()
        for page in differ:
            print(f"{page} differs from the code: run `{REGENERATE}`", file=sys.stderr)
        return 1 if differ else 0
    for page, make in PAGES.items():
        (ROOT / page).write_text(make())
    return 0


if __name__ == "__main__":
    sys.exit(main())
