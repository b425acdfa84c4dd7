"""Sign-in of default agents: what a fenced agent's own home gets so that Claude Code and Codex
start signed in, taken from the operator's own sign-in or from a key in the fleet.

Why: behind the fence a claude agent whose `env` gives neither `HOME` nor `CLAUDE_CONFIG_DIR`
runs with its own home as `HOME` (homes.py, `agent_env`), and a codex agent always has its own
`CODEX_HOME` (`<home>/codex`). Claude Code 2.1.332 reads who is signed in from
`$HOME/.claude/.credentials.json` and whether onboarding is done (and which folders are trusted,
which API keys are approved) from `$HOME/.claude.json`; Codex 0.171 reads `$CODEX_HOME/auth.json`.
In an empty home both stop at their first-run screens (Claude Code's onboarding or "Unable to
connect to Anthropic services", Codex's sign-in), and a default agent, a terminal program in a
tmux pane, crash-loops or waits forever. So an operator who signed Claude Code and Codex in
once as the supervisor's user, or put a key in the fleet, gets every default agent signed in.

What a claude agent's home gets (`claude_files`, pure), by the first that applies:
1. the agent's environment gives `ANTHROPIC_API_KEY` (its `env`, else the supervisor's own,
   which it inherits): `<home>/.claude.json` marks onboarding done, the agent's workspace
   trusted and that key approved, the way Claude Code records the answer to its "use this API
   key?" question (`customApiKeyResponses.approved` holds the key's last 20 characters, after
   trimming). Nothing of the operator's is copied.
2. it gives a token Claude Code signs in with on its own (`CLAUDE_CODE_OAUTH_TOKEN`, e.g. from
   `claude setup-token`; `ANTHROPIC_AUTH_TOKEN`; a cloud provider's `CLAUDE_CODE_USE_*`): the
   record marks onboarding done and the workspace trusted. Nothing of the operator's is copied.
3. the operator is signed in (a `claudeAiOauth` in their credentials file, or a Console key
   `primaryApiKey` in their record): `<home>/.claude/.credentials.json` with that
   `claudeAiOauth` only (never the MCP servers' tokens kept beside it), and `<home>/.claude.json`
   with only the record's sign-in and onboarding keys (`RECORD_KEYS`: `hasCompletedOnboarding`,
   `lastOnboardingVersion`, `oauthAccount`, `userID`, `primaryApiKey`), onboarding marked done,
   the agent's workspace trusted. Never the operator's `projects` (their folders, trust answers,
   session history), their approved keys, settings, history, sessions, todos or anything else.
4. none of these: nothing is written (the agent starts signed out; `--check` says so).
The record is merged into the agent's own `.claude.json` (what its Claude Code wrote there
before: its own folder's state, counters), so a preparation never erases the agent's own
history, and never brings another agent's: the only other source is the operator's record,
filtered.

What a codex agent's home gets (`codex_auth`, pure): an `OPENAI_API_KEY` in its `env` written as
`codex login --with-api-key` writes it (`{"auth_mode": "apikey", ...}`), else a copy of the
operator's `auth.json` (a ChatGPT or API-key sign-in, as `codex login` wrote it: it holds
nothing but the sign-in), else nothing (an `auth.json` already there is left as it is).

Where the operator's sign-in is read (`sources`, the one answer: `read_operator`, the edge, reads
there, and the supervisor gives `Sources.directories` to every agent's fence, which hides each
directory whole): where Claude Code and Codex run as the supervisor's user, in its environment,
would look: `$CLAUDE_CONFIG_DIR` (else `$HOME/.claude`) for `.credentials.json`,
`$CLAUDE_CONFIG_DIR/.claude.json` (else `$HOME/.claude.json`, else the legacy
`$HOME/.claude/.config.json`), `$CODEX_HOME` (else `$HOME/.codex`) for `auth.json`. They are the
operator's, no fenced agent's to read or write (hidden by its fence), read by the supervisor
itself, at each home preparation (when the supervisor starts and when a reload adds or changes the
agent), so a refreshed sign-in reaches the agent at that preparation. A file (or the
`.claude`/`.codex` directory named on the way) that is a symlink, not a regular file, larger than
`MAX_BYTES` or owned by another uid than the supervisor's is not read, and `--check` names it.

Why copies, not binds of the operator's files: nothing of the operator's is ever writable by an
agent, and each agent's copy is its own: Claude Code rewrites its record at each start and its
credentials at each token refresh, and an agent that refreshes changes only its copy. Why not
read-only copies: Claude Code 2.1.332 does run a turn with both bound read-only (measured), but
it could then keep no refreshed token and none of its own state, and a read-only copy would
protect nothing of the operator's that a copy does not already keep out of reach. The
copies are 0600 and belong to the agent's user (homes.py writes them by descriptor, beneath the
home, never through a path the agent controls). What this cannot give: an OAuth refresh token
that the provider rotates on use (Codex's ChatGPT sign-in does, "refresh token was already
used") is valid in one copy only once some agent has refreshed it; for a fleet, prefer a key in
`[defaults].env` or `claude setup-token`'s long-lived `CLAUDE_CODE_OAUTH_TOKEN`.

Must never: write anything (homes.py writes), read a path an agent controls, follow a symlink
to the operator's files, copy a key of the record outside `RECORD_KEYS` or of the credentials
outside `CREDENTIAL_KEYS`, or put a secret in a message (`problems` and `check_lines` name
paths, never contents).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mcphost.supervisor.plan import AgentPlan, Fleet, plan_from_center

CLAUDE_RECORD = ".claude.json"  # beneath HOME (or CLAUDE_CONFIG_DIR)
CLAUDE_LEGACY_RECORD = ".config.json"  # beneath the config directory, from older versions
CLAUDE_DIR = ".claude"  # the config directory beneath HOME
CLAUDE_CREDENTIALS = ".credentials.json"  # beneath the config directory
CODEX_DIR = ".codex"
CODEX_AUTH = "auth.json"
MAX_BYTES = 8 << 20  # Claude Code reads at most this much of its record; so do we
# The keys of Claude Code's record that say who is signed in and that onboarding is done.
RECORD_KEYS = (
    "hasCompletedOnboarding",
    "lastOnboardingVersion",
    "oauthAccount",
    "userID",
    "primaryApiKey",
)
# The part of Claude Code's credentials file that is its own sign-in (beside it: MCP servers'
# OAuth tokens, which are not).
CREDENTIAL_KEYS = ("claudeAiOauth",)
CLAUDE_KEY_ENV = "ANTHROPIC_API_KEY"
# Variables with which Claude Code is signed in without a credentials file.
CLAUDE_TOKEN_ENV = (
    "CLAUDE_CODE_OAUTH_TOKEN",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
    "CLAUDE_CODE_USE_FOUNDRY",
)
CODEX_KEY_ENV = "OPENAI_API_KEY"
# What an agent inherits from the supervisor's environment that decides its sign-in.
INHERITED = (CLAUDE_KEY_ENV, *CLAUDE_TOKEN_ENV)
# The variables that move Claude Code's config away from the agent's home.
CLAUDE_PLACE_ENV = ("HOME", "CLAUDE_CONFIG_DIR")


@dataclass(frozen=True, slots=True)
class Operator:
    """The supervisor user's own sign-ins, as read at one home preparation (already filtered:
    `claude_record` holds `RECORD_KEYS` only, `claude_credentials` `CREDENTIAL_KEYS` only)."""

    user: str = "the supervisor's user"
    claude_record: Mapping[str, Any] | None = None
    claude_credentials: Mapping[str, Any] | None = None
    codex_auth: bytes | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # INHERITED, as agents inherit them
    claude_from: str = "~/.claude/.credentials.json"  # where, for messages
    codex_from: str = "~/.codex/auth.json"
    problems: tuple[str, ...] = ()  # files not read, and why (paths only)

    @property
    def claude_signed_in(self) -> bool:
        record = self.claude_record or {}
        return self.claude_credentials is not None or bool(record.get("primaryApiKey"))


# -- the pure selection -----------------------------------------------------------------------


def select_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of an operator's Claude Code record an agent may get: `RECORD_KEYS` only."""
    return {key: record[key] for key in RECORD_KEYS if key in record}


def select_credentials(credentials: Mapping[str, Any]) -> dict[str, Any] | None:
    """The operator's Claude Code sign-in out of their credentials file (`CREDENTIAL_KEYS`),
    or None when it holds no usable one (no access or refresh token)."""
    oauth = credentials.get("claudeAiOauth")
    if not isinstance(oauth, dict) or not (oauth.get("accessToken") or oauth.get("refreshToken")):
        return None
    return {key: credentials[key] for key in CREDENTIAL_KEYS if key in credentials}


def key_suffix(key: str) -> str:
    """How Claude Code 2.1.332 records an API key it was told to use: trimmed, its last 20
    characters (`customApiKeyResponses.approved`)."""
    return key.strip()[-20:]


def claude_home_is_its_own(plan: AgentPlan) -> bool:
    """Whether `plan`'s Claude Code keeps its config in the agent's home: a fenced claude agent
    whose `env` gives neither `HOME` nor `CLAUDE_CONFIG_DIR` (homes.py gives it its home as
    `HOME`, and drops an inherited `CLAUDE_CONFIG_DIR`)."""
    env = dict(plan.env)
    return (
        plan.client == "claude"
        and plan.sandbox != "none"
        and not any(name in env for name in CLAUDE_PLACE_ENV)
    )


def _effective(plan: AgentPlan, operator: Operator, name: str) -> str | None:
    """The value of `name` in the agent's environment: its `env`, else the supervisor's."""
    env = dict(plan.env)
    value = env[name] if name in env else operator.env.get(name)
    return value or None


def claude_source(plan: AgentPlan, operator: Operator) -> str | None:
    """How `plan`'s Claude Code will be signed in: "key", "token", "operator", or None (signed
    out). None too for an agent whose Claude config is not its home (nothing to prepare)."""
    if not claude_home_is_its_own(plan):
        return None
    if _effective(plan, operator, CLAUDE_KEY_ENV):
        return "key"
    if any(_effective(plan, operator, name) for name in CLAUDE_TOKEN_ENV):
        return "token"
    if operator.claude_signed_in:
        return "operator"
    return None


def claude_record(
    own: Mapping[str, Any] | None,
    *,
    source: str,
    operator: Operator,
    trusted: Iterable[str],
    key: str | None,
) -> dict[str, Any]:
    """The agent's `.claude.json`: its own record, with onboarding done, each of `trusted`
    (its workspace) trusted, `key` approved, and for `source == "operator"` the operator's
    `RECORD_KEYS` (pure)."""
    record = dict(own or {})
    if source == "operator":
        record.update(select_record(operator.claude_record or {}))
    record["hasCompletedOnboarding"] = True
    projects = record.get("projects")
    projects = dict(projects) if isinstance(projects, dict) else {}
    for folder in trusted:
        entry = projects.get(folder)
        projects[folder] = {
            **(entry if isinstance(entry, dict) else {}),
            "hasTrustDialogAccepted": True,
        }
    record["projects"] = projects
    if key is not None:
        responses = record.get("customApiKeyResponses")
        responses = responses if isinstance(responses, dict) else {}
        approved = [a for a in responses.get("approved") or [] if isinstance(a, str)]
        rejected = [r for r in responses.get("rejected") or [] if isinstance(r, str)]
        suffix = key_suffix(key)
        record["customApiKeyResponses"] = {
            "approved": approved if suffix in approved else [*approved, suffix],
            "rejected": [r for r in rejected if r != suffix],
        }
    return record


def parse_object(data: bytes | None) -> dict[str, Any] | None:
    """`data` as a JSON object, or None (absent, not JSON, not an object)."""
    if data is None:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _dump(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, indent=2).encode() + b"\n"


def claude_files(
    plan: AgentPlan, operator: Operator, trusted: Iterable[str], own: bytes | None
) -> tuple[bytes | None, bytes | None]:
    """The bytes of the agent's `.claude.json` and `.claude/.credentials.json` (None: do not
    write it), given its own record's bytes `own` (pure); see the module docstring."""
    source = claude_source(plan, operator)
    if source is None:
        return None, None
    key = _effective(plan, operator, CLAUDE_KEY_ENV) if source == "key" else None
    record = claude_record(
        parse_object(own), source=source, operator=operator, trusted=trusted, key=key
    )
    credentials = None
    if source == "operator" and operator.claude_credentials is not None:
        credentials = _dump(operator.claude_credentials)
    return _dump(record), credentials


def codex_auth(plan: AgentPlan, operator: Operator) -> bytes | None:
    """`auth.json` for a codex agent (pure): its `env`'s `OPENAI_API_KEY` as `codex login
    --with-api-key` writes it, else the operator's own, else None."""
    if plan.client != "codex":
        return None
    key = dict(plan.env).get(CODEX_KEY_ENV)
    if key:
        return _dump({"auth_mode": "apikey", CODEX_KEY_ENV: key})
    return operator.codex_auth


def check_lines(fleet: Fleet, operator: Operator) -> list[str]:
    """`mcphost supervise --check`'s sign-in lines: one per client kind of the fleet whose
    agents take their sign-in from the supervisor (pure). Informative: never a problem."""
    plans = list(fleet.agents)
    if fleet.center.fleet == "center":  # the agents it will assign: planned from [defaults]
        plans.append(plan_from_center(fleet.defaults, CENTER_ASSIGNED))
    lines = []
    claude = [p for p in plans if claude_home_is_its_own(p)]
    if claude:
        out = [p.agent_id for p in claude if claude_source(p, operator) is None]
        if out:
            lines.append(
                f"claude agents will start signed out ({_some(out)}): sign Claude Code in once "
                f"as {operator.user} (`claude`, then /login) or give ANTHROPIC_API_KEY in "
                "[defaults].env"
            )
        elif any(claude_source(p, operator) == "operator" for p in claude):
            lines.append(
                f"claude agents start signed in as {operator.user} ({operator.claude_from}, "
                "copied into each agent's home at its preparation)"
            )
        else:
            lines.append("claude agents start signed in with the key or token of their env")
    codex = [p for p in plans if p.client == "codex"]
    if codex:
        out = [p.agent_id for p in codex if codex_auth(p, operator) is None]
        if out:
            lines.append(
                f"codex agents will start signed out ({_some(out)}): sign Codex in once as "
                f"{operator.user} (`codex login`) or give OPENAI_API_KEY in [defaults].env"
            )
        elif any(not dict(p.env).get(CODEX_KEY_ENV) for p in codex):
            lines.append(
                f"codex agents start signed in as {operator.user} ({operator.codex_from}, "
                "copied into each agent's CODEX_HOME at its preparation)"
            )
        else:
            lines.append("codex agents start signed in with the OPENAI_API_KEY of their env")
    return [*lines, *(f"sign-in not copied: {problem}" for problem in operator.problems)]


CENTER_ASSIGNED = "center-assigned"  # stands for the agents the center will assign


def _some(ids: list[str], shown: int = 3) -> str:
    ids = [("the agents the center assigns" if i == CENTER_ASSIGNED else i) for i in ids]
    more = len(ids) - shown
    return ", ".join(ids[:shown]) + (f" and {more} more" if more > 0 else "")


# -- the edge: the operator's files, read by the supervisor, never through a symlink ----------


Place = tuple[str, tuple[str, ...]]  # a file: its base directory, and the names beneath it


@dataclass(frozen=True, slots=True)
class Sources:
    """Where the operator's sign-in is read (`sources`): each file as a `Place`, tried in order
    (`records`: the first that parses)."""

    user: str
    credentials: Place
    records: tuple[Place, ...]
    codex: Place

    def directories(self) -> tuple[str, ...]:
        """Every directory a sign-in file is read from, absolute, each once: the fence hides
        each whole from every fenced agent (fence.py, `plan`'s `signin`)."""
        places = (self.credentials, *self.records, self.codex)
        found = (os.path.abspath(os.path.join(base, *names[:-1])) for base, names in places)
        return tuple(dict.fromkeys(found))


def sources(env: Mapping[str, str]) -> Sources:
    """Where Claude Code and Codex, run in `env` as this process's user, keep their sign-in:
    the one answer both `read_operator` (which reads there) and the fence (which hides it) use;
    see the module docstring."""
    import pwd

    uid = os.geteuid()
    try:
        entry = pwd.getpwuid(uid)
        user, pw_home = entry.pw_name, entry.pw_dir
    except KeyError:
        user, pw_home = f"uid {uid}", "/"
    home = env.get("HOME") or pw_home
    config_dir = env.get("CLAUDE_CONFIG_DIR")
    codex_home = env.get("CODEX_HOME")
    if config_dir:
        credentials: Place = (config_dir, (CLAUDE_CREDENTIALS,))
        records: tuple[Place, ...] = (
            (config_dir, (CLAUDE_RECORD,)),
            (config_dir, (CLAUDE_LEGACY_RECORD,)),
        )
    else:
        credentials = (home, (CLAUDE_DIR, CLAUDE_CREDENTIALS))
        records = ((home, (CLAUDE_RECORD,)), (home, (CLAUDE_DIR, CLAUDE_LEGACY_RECORD)))
    codex: Place = (codex_home, (CODEX_AUTH,)) if codex_home else (home, (CODEX_DIR, CODEX_AUTH))
    return Sources(user=user, credentials=credentials, records=records, codex=codex)


def read_operator(env: Mapping[str, str]) -> Operator:
    """The sign-ins of the supervisor's user, from where Claude Code and Codex run in `env` as
    this process's user would read them (`sources`); see the module docstring."""
    at = sources(env)
    problems: list[str] = []
    credentials = parse_object(_read(*at.credentials, problems))
    selected = select_credentials(credentials) if credentials is not None else None
    record = None
    for base, names in at.records:
        record = parse_object(_read(base, names, problems))
        if record is not None:
            break
    codex = _read(*at.codex, problems)
    if parse_object(codex) is None:
        codex = None
    return Operator(
        user=at.user,
        claude_record=select_record(record) if record is not None else None,
        claude_credentials=selected,
        codex_auth=codex,
        env={name: env[name] for name in INHERITED if env.get(name)},
        claude_from=os.path.join(at.credentials[0], *at.credentials[1]),
        codex_from=os.path.join(at.codex[0], *at.codex[1]),
        problems=tuple(problems),
    )


def _read(base: str, names: tuple[str, ...], problems: list[str]) -> bytes | None:
    """The bytes of `base/names...`, each name opened beneath the one before without following
    a symlink; None when absent (silently) or refused (with a line in `problems`)."""
    shown = os.path.join(base, *names)
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
    fds: list[int] = []
    try:
        fds.append(os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
        for name in names[:-1]:
            fds.append(os.open(name, flags | os.O_DIRECTORY, dir_fd=fds[-1]))
        fds.append(os.open(names[-1], flags | os.O_NONBLOCK, dir_fd=fds[-1]))
        info = os.fstat(fds[-1])
        if not stat.S_ISREG(info.st_mode):
            problems.append(f"{shown} is not a regular file")
            return None
        if info.st_uid != os.geteuid():
            problems.append(f"{shown} belongs to uid {info.st_uid}, not to the supervisor's user")
            return None
        if info.st_size > MAX_BYTES:
            problems.append(f"{shown} is larger than {MAX_BYTES} bytes")
            return None
        chunks = []
        while chunk := os.read(fds[-1], 1 << 20):
            chunks.append(chunk)
            if sum(map(len, chunks)) > MAX_BYTES:
                problems.append(f"{shown} is larger than {MAX_BYTES} bytes")
                return None
        return b"".join(chunks)
    except FileNotFoundError:
        return None
    except OSError as exc:
        import errno

        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            problems.append(f"{shown}: a symlink or a non-directory on the way (not followed)")
        else:
            problems.append(f"{shown}: {exc.strerror}")
        return None
    finally:
        for fd in reversed(fds):
            os.close(fd)
