"""`mcphost` command line: one subcommand per entry point, each importing its machinery lazily.

Owns: argv dispatch and nothing else. `mcphost` with no subcommand is `mcphost host`.
Must never: import a subcommand's modules before that subcommand is chosen (start-up time is
multiplied by the number of agents on a worker), write to stdout on the host path, or echo a
word that does not look like a subcommand name (it may be a token).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

from mcphost import __version__

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,23}")

# subcommand -> (module, one-line help); each module exposes `main(argv: list[str]) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "host": ("mcphost.host.cli", "serve the center tools for one agent over stdio (default)"),
    "check": ("mcphost.host.check", "preflight: read bindings, dial the center, make one call"),
    "relay-tools": ("mcphost.relaytools.cli", "serve the agentmux relay tools over stdio"),
    "supervise": ("mcphost.supervisor.cli", "run a worker's fleet of agents and their sessions"),
    "ctl": (
        "mcphost.supervisor.operator.ctl",
        "control a running supervisor: status, restart, logs...",
    ),
    "devcenter": ("mcphost.devcenter.cli", "run the reference center (aiohttp + SQLite)"),
    "demo": (
        "mcphost.demo",
        "demo fleet|host|agents: guided runs; demo model: a model stand-in for real CLIs",
    ),
}


def _usage() -> str:
    lines = [f"usage: mcphost [{'|'.join(SUBCOMMANDS)}] [options]", ""]
    lines += [f"  {name:<12} {text}" for name, (_mod, text) in SUBCOMMANDS.items()]
    lines += ["", "Run `mcphost <subcommand> --help` for its options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help", "help"):
        print(_usage(), file=sys.stderr)
        return 0
    if args and args[0] == "--version":
        print(f"mcphost {__version__}", file=sys.stderr)
        return 0
    name = args.pop(0) if args and not args[0].startswith("-") else "host"
    if name not in SUBCOMMANDS:
        # A word that is no plausible subcommand name may be a token pasted in the wrong place.
        shown = repr(name) if _WORD.fullmatch(name) else "(not shown)"
        print(f"mcphost: unknown subcommand {shown}\n\n{_usage()}", file=sys.stderr)
        return 2
    entry: Callable[[list[str]], int] = import_module(SUBCOMMANDS[name][0]).main
    return entry(args)


if __name__ == "__main__":
    sys.exit(main())
