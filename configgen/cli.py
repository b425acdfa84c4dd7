"""`configgen <client> [options] [--out PATH] [--merge PATH] [--force] [--from-env]`.

Owns: argv -> `AgentConfig` -> bytes -> stdout or a private file. Center bindings come from
options, from the current `AC_MCP_*` environment (`--from-env`), or both (options win); they
are validated with the host's grammar. `--attach-center` / `--attach-relay` write attach
entries instead (a supervisor's socket; no bindings, no secret). Every error is one stderr line and exit status 2.
Must never: print the token (stdout carries the config, which may hold it, only without --out),
take an abbreviated option for a longer one, or echo the value of an option it does not know.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from configgen import generate
from configgen.clients import CLIENTS
from configgen.files import read_existing, write_private
from configgen.model import (
    CENTER_NAME,
    RELAY_NAME,
    AgentConfig,
    AttachBinding,
    CenterBinding,
    ConfigError,
    RelayBinding,
)
from mcphost import binding as grammar
from mcphost.cliargs import Parser, redact

# option dest -> the AC_MCP_* variable it sets
_CENTER_OPTIONS = {
    "agent_id": grammar.AGENT_ID,
    "admin_url": grammar.ADMIN_URL,
    "token_file": grammar.WORKER_TOKEN_FILE,
    "fingerprint": grammar.SERVER_FINGERPRINT,
    "agent_root": grammar.AGENT_ROOT,
    "runtime_socket": grammar.RUNTIME_SOCKET,
    "tier_tools": grammar.TIER_TOOLS,
    "generation": grammar.GENERATION,
}
_FLAG = {variable: "--" + dest.replace("_", "-") for dest, variable in _CENTER_OPTIONS.items()}


class UsageError(Exception):
    pass


class _Parser(Parser):
    """No abbreviations (`--token` is not `--token-file`), unknown values never echoed."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{redact(message)} (see configgen --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="configgen",
        description="Write an MCP client config holding the agent-center host and the relay tools.",
        epilog="Clients: "
        + "; ".join(f"{f.name} = {f.title} ({f.where})" for f in CLIENTS.values()),
    )
    p.add_argument("client", choices=list(CLIENTS), help="which client's format to write")
    c = p.add_argument_group("center host bindings (the AC_MCP_* variables)")
    c.add_argument(
        "--from-env", action="store_true", help="start from the current AC_MCP_* environment"
    )
    c.add_argument("--agent-id", help=grammar.AGENT_ID)
    c.add_argument(
        "--admin-url", help=f"{grammar.ADMIN_URL}: unix:/abs/path.sock or tcp://host:port"
    )
    c.add_argument(
        "--token-file",
        help=f"{grammar.WORKER_TOKEN_FILE}: the host reads the token from this 0600 file "
        "(the config then holds no secret)",
    )
    c.add_argument(
        "--fingerprint",
        action="append",
        help=f"{grammar.SERVER_FINGERPRINT}: the center's certificate pin; repeat for a pin set",
    )
    c.add_argument("--agent-root", help=f"{grammar.AGENT_ROOT}: absolute workspace root")
    c.add_argument("--runtime-socket", help=f"{grammar.RUNTIME_SOCKET}: absolute socket path")
    c.add_argument(
        "--tier-tools",
        help=f"{grammar.TIER_TOOLS}: true/false (default: false for codex, else true)",
    )
    c.add_argument("--generation", help=f"{grammar.GENERATION}: a non-negative integer")
    c.add_argument("--no-center", action="store_true", help="leave the center host out")
    r = p.add_argument_group("relay tools (added when --bundle is given)")
    r.add_argument("--bundle", help="the relay bundle")
    r.add_argument("--session-name", help="the relay session this agent speaks for")
    r.add_argument("--configuration-directory", action="append", default=[], help="repeatable")
    r.add_argument("--state-directory")
    r.add_argument("--inscriptions-directory")
    r.add_argument(
        "--upstream-agentmux",
        action="store_true",
        help="launch upstream's `agentmux host mcp` instead of `mcphost relay-tools`",
    )
    a = p.add_argument_group(
        "attach entries (agents run by `mcphost supervise`: the config holds no identity or "
        "secret, only the supervisor's socket)"
    )
    a.add_argument(
        "--attach-center", metavar="SOCK", help="the center tools' attach socket (absolute)"
    )
    a.add_argument("--attach-relay", metavar="SOCK", help="the relay tools' attach socket")
    a.add_argument(
        "--attach-python", metavar="PATH", help="absolute interpreter (default: this Python)"
    )
    a.add_argument(
        "--attach-script",
        metavar="PATH",
        help="absolute path of the pump (default: the installed mcphost/attach.py)",
    )
    s = p.add_argument_group("launch")
    s.add_argument("--mcphost-command", help="absolute path (default: the installed mcphost)")
    s.add_argument("--agentmux-command", help="absolute path (default: agentmux on PATH)")
    s.add_argument("--center-name", default=CENTER_NAME, help=f"default {CENTER_NAME}")
    s.add_argument("--relay-name", default=RELAY_NAME, help=f"default {RELAY_NAME}")
    s.add_argument("--startup-timeout-sec", type=int, default=30, help="codex (default 30)")
    s.add_argument("--tool-timeout-sec", type=int, default=300, help="codex, gemini (default 300)")
    o = p.add_argument_group("output")
    o.add_argument("--out", help="write here (atomically, mode 0600) instead of stdout")
    o.add_argument(
        "--merge",
        metavar="PATH",
        help="add/replace our servers in this existing config (a missing file counts as empty)",
    )
    o.add_argument(
        "--force", action="store_true", help="with --merge: replace servers we did not write"
    )
    return p


def _center(args: argparse.Namespace) -> CenterBinding | AttachBinding | None:
    given = {
        dest: getattr(args, dest) for dest in _CENTER_OPTIONS if getattr(args, dest) is not None
    }
    if args.attach_center is not None:
        if given or args.from_env or args.no_center:
            other = "--from-env" if args.from_env else "--no-center"
            if given:
                other = f"--{next(iter(given)).replace('_', '-')}"
            raise UsageError(f"--attach-center with {other}: an attach entry takes no bindings")
        return AttachBinding(socket=args.attach_center)
    if args.no_center:
        if given:
            raise UsageError(f"--no-center with --{next(iter(given)).replace('_', '-')}")
        return None
    if not given and not args.from_env:
        return None
    env: dict[str, str] = {}
    if args.from_env:
        env = {k: v for k, v in os.environ.items() if k.startswith(grammar.PREFIX)}
    if "token_file" in given:  # the file replaces an inherited inline token
        env.pop(grammar.WORKER_TOKEN, None)
    if "fingerprint" in given:
        given["fingerprint"] = ",".join(given["fingerprint"])
    env.update({_CENTER_OPTIONS[dest]: value for dest, value in given.items()})
    try:
        return CenterBinding.from_env(env)
    except ConfigError as exc:
        flag = _FLAG.get(exc.field)
        raise ConfigError(exc.field, f"{exc} ({flag})" if flag else str(exc)) from None


def _relay(args: argparse.Namespace) -> RelayBinding | AttachBinding | None:
    if args.attach_relay is not None:
        relay_options = (
            args.bundle,
            args.session_name,
            args.configuration_directory or None,
            args.state_directory,
            args.inscriptions_directory,
            args.upstream_agentmux or None,
        )
        if any(value is not None for value in relay_options):
            raise UsageError(
                "--attach-relay takes no relay options (the supervisor knows the agent's bundle)"
            )
        return AttachBinding(socket=args.attach_relay)
    if args.bundle is None and args.session_name is None:
        extras = args.configuration_directory or args.state_directory or args.inscriptions_directory
        if extras or args.upstream_agentmux:
            raise UsageError("relay options need --bundle and --session-name")
        return None
    if args.bundle is None or args.session_name is None:
        raise UsageError("the relay needs both --bundle and --session-name")
    return RelayBinding(
        bundle=args.bundle,
        session_name=args.session_name,
        configuration_directories=tuple(args.configuration_directory),
        state_directory=args.state_directory,
        inscriptions_directory=args.inscriptions_directory,
        upstream=args.upstream_agentmux,
    )


def run(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    if args.force and not args.merge:
        raise UsageError("--force only makes sense with --merge")
    center, relay = _center(args), _relay(args)
    if center is None and relay is None:
        raise UsageError(
            "nothing to generate: give center bindings (--agent-id/--admin-url or --from-env) "
            "and/or a relay (--bundle/--session-name), or attach sockets (--attach-center, "
            "--attach-relay)"
        )
    attaching = isinstance(center, AttachBinding) or isinstance(relay, AttachBinding)
    if not attaching and (args.attach_python or args.attach_script):
        raise UsageError("--attach-python and --attach-script need --attach-center/--attach-relay")
    config = AgentConfig(
        center=center,
        relay=relay,
        mcphost=args.mcphost_command,
        agentmux=args.agentmux_command,
        python=args.attach_python,
        attach_script=args.attach_script,
        center_name=args.center_name,
        relay_name=args.relay_name,
        startup_timeout_sec=args.startup_timeout_sec,
        tool_timeout_sec=args.tool_timeout_sec,
    )
    existing = read_existing(args.merge) if args.merge else None
    data = generate(args.client, config, existing=existing, force=args.force)
    if args.out:
        write_private(args.out, data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except (ConfigError, UsageError) as exc:
        print(f"configgen: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            f"configgen: error: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "),
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
