"""`mcphost supervise`: read the supervisor's settings and the fleet file, then run the fleet.

Owns: the command line (`--fleet`, `--state`, `--log-format`; `MCPHOST_FLEET`, `MCPHOST_STATE`,
`MCPHOST_LOG_FORMAT` when a flag is absent; flags win) on the settings base, and the start-up refusals: a bad setting or fleet file
exits 2 with one stderr line per problem, naming the file and key (or variable, or flag) and
what is expected; so do a state directory too long for its sockets and a `user =` that cannot
start its agents' attach entries (reach.py), in `--check` too. It runs in the foreground
(systemd or a terminal supervises it) and exits 0 after a graceful stop. Its events reach
stderr as JSON lines, or as readable lines (events.py's `use_format`) with `--log-format text`
or, by default (`auto`), when stderr is a terminal; its journal (`<state>/logs/supervisor.log`)
is JSON whatever the flag. `--check` is the preflight (center/health.py's `preflight`): the fleet
file as at start (exit 2), then the token file, one pinned, harmless call to the center, the
state directory, each fenced agent's program as that agent will look for it (reach.py), and a
real probe of each group of alike agents, run as their uid in their fence through the agents'
own spawn path, that they can run their program and their pumps (reachprobe.py: one probe per
group, bounded, nothing written in the state directory), one line per problem naming the fleet
key (exit 1), or exit 0. Before those it
says what the fence will be, whom the agents run as (`plan.identity_lines`: their own uids, a
warning for `user = "root"`) and, per client kind, whether the agents start signed in
(signin.py: informative lines, never a problem).

Must never: write to stdout (logs and events go to stderr), or show a token (none is in the
fleet file; the token file is read by the supervisor itself).
"""

from __future__ import annotations

import os
import sys
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from mcphost.settings import SettingError, Settings


class SuperviseSettings(Settings):
    """Where the fleet file is and where the supervisor keeps its state."""

    model_config = SettingsConfigDict(env_prefix="MCPHOST_")

    fleet: str = Field(
        description="the path of the fleet file (TOML), as --fleet FILE or in MCPHOST_FLEET"
    )
    state: str = Field(
        description="the supervisor's state directory, as --state DIR or in MCPHOST_STATE"
    )
    log_format: Literal["auto", "json", "text"] = Field(
        default="auto",
        description="auto, json or text, as --log-format or in MCPHOST_LOG_FORMAT",
    )

    @field_validator("fleet", "state", mode="before")
    @classmethod
    def _absolute(cls, raw: object) -> object:
        if isinstance(raw, str) and raw and "\0" not in raw:
            return os.path.abspath(raw)
        return raw

    @field_validator("state")
    @classmethod
    def _state_fits(cls, value: str) -> str:
        """A state directory whose sockets cannot be bound is refused here, before anything
        runs (`--check` too): one line naming it and the limit (reach.py)."""
        from mcphost.settings import Invalid
        from mcphost.supervisor.agents.reach import state_problem

        problem = state_problem(value)
        if problem is not None:
            raise Invalid(problem, repr(value))
        return value


def _parser() -> object:
    from mcphost.cliargs import Parser

    p = Parser(
        prog="mcphost supervise",
        description="Run a worker's fleet of agents and serve their MCP sessions (foreground).",
    )
    p.add_argument("--fleet", help="the fleet file (TOML; else MCPHOST_FLEET)")
    p.add_argument("--state", help="the state directory (else MCPHOST_STATE)")
    p.add_argument(
        "--log-format",
        choices=("auto", "json", "text"),
        help="how events reach stderr: json (one object per line), text (one readable line "
        "each) or auto, the default: text on a terminal, json otherwise (else "
        "MCPHOST_LOG_FORMAT); <state>/logs/supervisor.log is JSON always",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="preflight: validate the fleet, reach the center (pinned), check the state "
        "directory and each fenced agent's program, probe as each agent's uid in its fence "
        "that it can run its program and pumps, then exit (0 ok, 1 problems, 2 bad fleet "
        "file, state directory or user)",
    )
    return p


def main(argv: list[str]) -> int:
    import argparse

    parser = _parser()
    assert isinstance(parser, argparse.ArgumentParser)
    args = parser.parse_args(argv)
    check = args.check
    flags = {k: v for k, v in vars(args).items() if v is not None and k != "check"}
    try:
        settings = SuperviseSettings.load(env=os.environ, cli=flags)
        from mcphost import events

        events.use_format(settings.log_format)
        from mcphost.supervisor.agents.reach import check_reach
        from mcphost.supervisor.confine.probe import probe
        from mcphost.supervisor.fleet import load_fleet
        from mcphost.supervisor.plan import check_sandbox, check_users, identity_lines

        fleet = load_fleet(settings.fleet, env=os.environ)
        check_users(fleet)
        support = probe()
        if check:
            print(f"mcphost supervise --check: fence: {support.describe()}", file=sys.stderr)
            print(f"mcphost supervise --check: limits: {_limits()}", file=sys.stderr)
            for line in identity_lines(fleet):
                print(f"mcphost supervise --check: {line}", file=sys.stderr)
        check_sandbox(fleet, support.missing())
        check_reach(fleet, settings.state)
    except SettingError as exc:
        for line in exc.lines():
            print(f"mcphost supervise: {line}", file=sys.stderr)
        return 2
    if check:
        from mcphost.supervisor.agents.signin import check_lines, read_operator

        for line in check_lines(fleet, read_operator(os.environ)):
            print(f"mcphost supervise --check: {line}", file=sys.stderr)
        return _preflight(fleet, settings.state, support)
    from mcphost.supervisor.supervisor import run_supervisor

    return run_supervisor(fleet, settings.state)


def _limits() -> str:
    """The cgroup backend the supervisor would use here, or why there is none (cgroups.py)."""
    from mcphost.supervisor.confine import cgroups
    from mcphost.supervisor.values import format_size

    backend = cgroups.detect()
    if backend.kind == "none":
        return f"none: {backend.reason} (agents would run without limits)"
    memory, pids = cgroups.ceilings(backend)
    defaults = cgroups.default_limits(memory, pids)
    memory_max = "max" if defaults.memory_max is None else format_size(defaults.memory_max)
    return (
        f"{backend.reason}; per agent by default: memory_max {memory_max}, "
        f"pids_max {defaults.pids_max}, cpu_weight {defaults.cpu_weight}"
    )


def _preflight(fleet: object, state: str, support: object) -> int:
    """`--check`: one stderr line per problem, each naming the fleet key; 0 when none."""
    import asyncio

    from mcphost.supervisor.agents.reach import program_problems
    from mcphost.supervisor.agents.reachprobe import probe_problems
    from mcphost.supervisor.center.preflight import preflight
    from mcphost.supervisor.confine.probe import Support
    from mcphost.supervisor.plan import Fleet

    assert isinstance(fleet, Fleet) and isinstance(support, Support)
    problems = asyncio.run(preflight(fleet, state))
    problems += program_problems(fleet, state, os.environ)
    probed, lines = probe_problems(fleet, state, os.environ, support)
    print(f"mcphost supervise --check: probes: {probed}", file=sys.stderr)
    problems += lines
    for line in problems:
        print(f"mcphost supervise: {line}", file=sys.stderr)
    verdict = "OK" if not problems else f"{len(problems)} problem(s)"
    print(f"mcphost supervise --check: {verdict} ({fleet.path})", file=sys.stderr)
    return 1 if problems else 0
