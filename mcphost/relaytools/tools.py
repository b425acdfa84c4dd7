"""The tool catalog as data: names, kinds, descriptions, commands, and the `tools/list` specs.

Owns: the two orders upstream clients see (registration order for `tools/list`: list, help, send,
look, raww, choose, updown, new, change; inventory order for `help`: list, send, look, raww,
choose, updown, new, change, help), every description, and each meta-tool's commands.

Must never: do I/O or hold behaviour; handlers live in `surface`, schemas in `params`.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcphost.relaytools.params import TOOL_PARAMS
from mcphost.surface import ToolSpec


@dataclass(frozen=True, slots=True)
class Command:
    key: str  # "list.principals"
    description: str


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    commands: tuple[Command, ...] = ()
    read_only: bool = False
    destructive: bool = False

    @property
    def kind(self) -> str:
        return "meta_tool" if self.commands else "tool"


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (
        Tool(
            "list",
            "List the principals of one namespace (or of every configured bundle with "
            "namespace '*'), or the pending ACP choice decisions of the associated bundle.",
            (
                Command(
                    "list.principals",
                    "Sessions and their readiness per bundle; the GLOBAL view is always appended.",
                ),
                Command(
                    "list.decisions",
                    "Pending ACP choice requests of the associated bundle, oldest first.",
                ),
            ),
            read_only=True,
        ),
        Tool(
            "help",
            "Describe these tools and commands and return their JSON schemas.",
            read_only=True,
        ),
        Tool(
            "send",
            "Send a message to named sessions (bare ids are in the associated bundle) or "
            "broadcast it to every other member of the bundle.",
        ),
        Tool(
            "look",
            "Read a session's latest snapshot: tmux pane lines or ACP replay entries. "
            "The target must be fully qualified as <id>@<namespace>.",
            read_only=True,
        ),
        Tool(
            "raww",
            "Type raw text straight into one session's input, outside message delivery "
            "(no envelope, no batching); the target must be <id>@<namespace>. Use sparingly.",
            destructive=True,
        ),
        Tool("choose", "Answer a pending ACP choice request: select an option or cancel it."),
        Tool(
            "updown",
            "Host (up) or unhost (down) the associated bundle's sessions.",
            (
                Command("updown.up", "Host the associated bundle."),
                Command("updown.down", "Unhost the associated bundle."),
            ),
            destructive=True,
        ),
        Tool(
            "new",
            "Register a new principal with the relay and mint its pre-shared key.",
            (Command("new.peer", "Register a principal and mint its PSK."),),
        ),
        Tool(
            "change",
            "Rotate the pre-shared key of a registered principal.",
            (Command("change.psk", "Rotate a principal's PSK."),),
            destructive=True,
        ),
    )
}

REGISTRATION_ORDER = ("list", "help", "send", "look", "raww", "choose", "updown", "new", "change")
INVENTORY_ORDER = ("list", "send", "look", "raww", "choose", "updown", "new", "change", "help")


def tool_specs() -> list[ToolSpec]:
    specs = []
    for name in REGISTRATION_ORDER:
        tool = TOOLS[name]
        annotations: dict[str, bool] = {"readOnlyHint": tool.read_only}
        if not tool.read_only:
            annotations["destructiveHint"] = tool.destructive
        specs.append(ToolSpec(name, tool.description, TOOL_PARAMS[name], annotations))
    return specs
