"""docs/fleet-keys.md, generated from the fleet model: `python -m mcphost.supervisor.operator.fleetdoc
> docs/fleet-keys.md`.

Owns: the page that lists every key of the fleet file, table by table, with its type, its
default, what a reload does with a change of it and its description, each read from the fleet
model (mcphost/supervisor/fleet.py: the sections' pydantic fields, their descriptions and their
declared reload behaviour, `fleet.reload_of`; the agents' defaults from `plan.AgentDefaults`;
what each behaviour means from `values.RELOAD_MEANS`). `render` is pure; tests/supervisor/
operator/test_fleetdoc.py fails when the committed page differs from it.

Must never: be imported by the running supervisor (nothing imports it; it is a command), or
say anything of a key that the model does not (a new key, a changed default or a changed
declaration changes the page, or the test fails).
"""

from __future__ import annotations

import sys
import types
import typing
from typing import Any

from pydantic_core import PydanticUndefined

from mcphost.supervisor.fleet import SECTIONS, reload_of, table_of
from mcphost.supervisor.plan import AgentDefaults
from mcphost.supervisor.values import RELOAD_MEANS, Reload

COMMAND = "python -m mcphost.supervisor.operator.fleetdoc > docs/fleet-keys.md"
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
    declared, toggled = reload_of(section, key), reload_of(section, key, toggled=True)
    cell = f"`{declared}`"
    if toggled != declared:
        cell += f" (set or taken out: `{toggled}`)"
    return cell


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    """The whole page."""
    out = [
        "# Fleet keys",
        "",
        f"<!-- Generated from the fleet model by `{COMMAND}`; do not edit. -->",
        "",
        "Every key of the fleet file (`mcphost supervise --fleet FILE`), table by table: its type, "
        "its default, what a reload (`mcphost ctl reload`, SIGHUP) does with a change of it, and "
        "what it takes. Generated from the fleet model (`mcphost/supervisor/fleet.py`) by "
        f"`{COMMAND}`; `tests/supervisor/operator/test_fleetdoc.py::test_the_committed_page_is_the_models` "
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


if __name__ == "__main__":
    sys.stdout.write(render())
