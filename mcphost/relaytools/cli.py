"""`mcphost relay-tools`: parse argv, resolve the layout, serve the surface over stdio.

Owns: the command line (agentmux's `host mcp` flags, plus the older spellings), the two timeout
overrides (`MCPHOST_RELAY_REQUEST_TIMEOUT_MS`, `MCPHOST_RELAY_HELLO_TIMEOUT_MS`; defaults 5000 and
2000, as upstream; read by `relaytools.settings.RelayTimeouts`: a value that is not a positive
number of milliseconds exits 2 naming the variable), and wiring layout -> stream -> surface ->
`mcpserve.stdio.run`.

Must never: write to stdout (JSON-RPC owns it; usage and errors go to stderr), take an abbreviated
option for a longer one or echo an unknown argument's value (`mcphost.cliargs`), exit non-zero for
an association problem (the server starts and reports it per call), or wait for the relay before
serving (the stream's Hello goes out in the background when the server is built).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcphost.relaytools.layout import Layout
    from mcphost.relaytools.stream import RelayStream


def _parser() -> argparse.ArgumentParser:
    from mcphost.cliargs import Parser

    p = Parser(
        prog="mcphost relay-tools",
        description="Serve the agentmux relay tools (list, help, look, send, raww, choose, "
        "updown, new, change) over MCP stdio, bound to one bundle session.",
    )
    p.add_argument(
        "--bundle",
        "--bundle-name",
        dest="bundle",
        help="the bundle this session belongs to (else AGENTMUX_BUNDLE, then mcp.toml)",
    )
    p.add_argument(
        "--session-name",
        dest="session",
        help="this session's id in the bundle (else AGENTMUX_SESSION, then the member whose "
        "directory holds the working directory)",
    )
    p.add_argument(
        "--default-bundle", dest="default_bundle", help="the bundle to use when none is given"
    )
    p.add_argument(
        "--configuration-directory",
        "--config-directory",
        dest="configuration",
        action="append",
        default=[],
        help="where bundles/<bundle>.toml live; repeatable (else "
        "AGENTMUX_CONFIGURATION_DIRECTORY, then $XDG_CONFIG_HOME/agentmux)",
    )
    p.add_argument(
        "--state-directory",
        dest="state",
        help="where relay.sock and session PSKs live (else AGENTMUX_STATE_DIRECTORY, then "
        "$XDG_STATE_HOME/agentmux)",
    )
    p.add_argument(
        "--inscriptions-directory",
        dest="inscriptions",
        help="where mcp.tool.* event lines are written (default: <state>/inscriptions)",
    )
    return p


def make_stream(
    layout: Layout, on_events: Callable[[int], None], on_note: Callable[..., None]
) -> RelayStream:
    from mcphost.relaytools.settings import RelayTimeouts
    from mcphost.relaytools.stream import RelayStream

    timeouts = RelayTimeouts.from_env()  # checked at start by `main`
    return RelayStream(
        str(layout.socket_path),
        layout.principal_id,
        layout.identity_token,
        hello_timeout=timeouts.hello_s,
        request_timeout=timeouts.request_s,
        on_events=on_events,
        on_note=on_note,
        register_now=True,  # seed 000: Hello-registered when the server is built
    )


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.state == "":
        print("mcphost relay-tools: --state-directory must not be empty", file=sys.stderr)
        return 2
    from mcphost.relaytools.settings import RelayTimeouts
    from mcphost.settings import SettingError

    try:
        RelayTimeouts.from_env()
    except SettingError as exc:
        for line in exc.lines():  # one line per bad variable
            print(f"mcphost relay-tools: {line}", file=sys.stderr)
        return 2

    from mcphost.mcpserve import stdio
    from mcphost.relaytools import layout as layout_mod
    from mcphost.relaytools.surface import RelayToolsSurface

    layout = layout_mod.resolve(
        bundle_flag=args.bundle,
        session_flag=args.session,
        default_bundle=args.default_bundle,
        configuration_flags=args.configuration,
        state_flag=args.state,
        inscriptions_flag=args.inscriptions,
    )
    return stdio.run(lambda: RelayToolsSurface(layout, make_stream))
