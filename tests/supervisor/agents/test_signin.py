"""Issue 25 (part 4): what a default agent's home gets to start signed in (signin.py).

The pure selection (which keys of the operator's Claude Code record and credentials, the key
approval, the merge into the agent's own record, Codex's auth), the reading of the operator's
files (symlinks, other owners, sizes refused and named), `--check`'s lines, and the writing in
the home (homes.py): modes, owner, fresh at each preparation, never through a symlink."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from configgen import attach_script
from mcphost.supervisor.agents import signin
from mcphost.supervisor.agents.homes import (
    AttachPoints,
    HomeError,
    agent_env,
    home_paths,
    prepare_home,
)
from mcphost.supervisor.agents.signin import Operator
from mcphost.supervisor.plan import (
    AgentDefaults,
    AgentPlan,
    CenterConfig,
    Fleet,
    plan_from_center,
)
from tests.supervisor.supervise_harness import Supervised, inline

OAUTH = {
    "accessToken": "sk-ant-oat01-operator-access",
    "refreshToken": "sk-ant-ort01-operator-refresh",
    "expiresAt": 4102444800000,
    "scopes": ["user:inference", "user:profile"],
    "subscriptionType": "max",
}
CREDENTIALS = {
    "claudeAiOauth": OAUTH,
    "mcpOAuth": {"some-server|abc": {"accessToken": "an MCP server's token"}},
}
ACCOUNT = {"accountUuid": "0000-1", "emailAddress": "op@example.com", "organizationUuid": "0000-2"}
# The operator's own record, as Claude Code keeps it: sign-in and onboarding beside the
# operator's history of every folder they worked in.
RECORD: dict[str, Any] = {
    "hasCompletedOnboarding": True,
    "lastOnboardingVersion": "2.1.332",
    "oauthAccount": ACCOUNT,
    "userID": "u-operator",
    "numStartups": 42,
    "theme": "dark",
    "mcpServers": {"private": {"command": "secret-tool"}},
    "projects": {
        "/srv/operator/secret-project": {
            "hasTrustDialogAccepted": True,
            "history": [{"display": "deploy with password hunter2"}],
            "lastSessionId": "s-operator",
        }
    },
    "customApiKeyResponses": {"approved": ["operator-approved-key"], "rejected": []},
    "tipsHistory": {"x": 1},
}
WORKSPACE = "/var/lib/mcphost/agents/agent-1/workspace"


def plan(agent_id: str = "agent-1", **changes: object) -> AgentPlan:
    return dataclasses.replace(plan_from_center(AgentDefaults(), agent_id), **changes)  # type: ignore[arg-type]


def signed_in(**changes: object) -> Operator:
    operator = Operator(
        user="op",
        claude_record=signin.select_record(RECORD),
        claude_credentials=signin.select_credentials(CREDENTIALS),
        codex_auth=b'{"auth_mode": "chatgpt", "tokens": {"access_token": "x"}}\n',
    )
    return dataclasses.replace(operator, **changes)  # type: ignore[arg-type]


def record_of(data: bytes | None) -> dict[str, Any]:
    assert data is not None
    value = json.loads(data)
    assert isinstance(value, dict)
    return value


# -- the pure selection -----------------------------------------------------------------------


def test_only_the_sign_in_and_onboarding_keys_of_the_operator_s_record_are_selected() -> None:
    assert signin.select_record(RECORD) == {
        "hasCompletedOnboarding": True,
        "lastOnboardingVersion": "2.1.332",
        "oauthAccount": ACCOUNT,
        "userID": "u-operator",
    }
    assert signin.select_record({"primaryApiKey": "sk-ant-console"}) == {
        "primaryApiKey": "sk-ant-console"
    }
    assert signin.select_record({}) == {}


def test_only_claude_code_s_own_oauth_sign_in_is_selected_from_the_credentials() -> None:
    assert signin.select_credentials(CREDENTIALS) == {"claudeAiOauth": OAUTH}
    assert signin.select_credentials({"mcpOAuth": CREDENTIALS["mcpOAuth"]}) is None
    assert signin.select_credentials({"claudeAiOauth": {"scopes": []}}) is None  # no token
    assert signin.select_credentials({"claudeAiOauth": "not an object"}) is None


def test_signed_in_as_the_operator_the_record_is_theirs_filtered_and_the_workspace_trusted() -> (
    None
):
    record, credentials = signin.claude_files(plan(), signed_in(), (WORKSPACE,), None)
    assert record_of(credentials) == {"claudeAiOauth": OAUTH}
    assert record_of(record) == {
        "hasCompletedOnboarding": True,
        "lastOnboardingVersion": "2.1.332",
        "oauthAccount": ACCOUNT,
        "userID": "u-operator",
        "projects": {WORKSPACE: {"hasTrustDialogAccepted": True}},
    }
    text = (record or b"") + (credentials or b"")
    for never in (b"secret-project", b"hunter2", b"mcpOAuth", b"secret-tool", b"operator-approved"):
        assert never not in text


def test_the_agent_s_own_record_is_kept_and_the_operator_s_sign_in_refreshed() -> None:
    own = {
        "numStartups": 3,
        "oauthAccount": {"accountUuid": "stale"},
        "projects": {WORKSPACE: {"lastSessionId": "s-agent", "hasTrustDialogAccepted": False}},
    }
    record, _ = signin.claude_files(plan(), signed_in(), (WORKSPACE,), json.dumps(own).encode())
    merged = record_of(record)
    assert merged["numStartups"] == 3
    assert merged["oauthAccount"] == ACCOUNT  # the operator's, fresh
    assert merged["projects"] == {
        WORKSPACE: {"lastSessionId": "s-agent", "hasTrustDialogAccepted": True}
    }
    # an own record that is not a JSON object is replaced, never half-read
    for broken in (b"{not json", b"[]", b"\xff"):
        record, _ = signin.claude_files(plan(), signed_in(), (WORKSPACE,), broken)
        assert record_of(record)["oauthAccount"] == ACCOUNT


def test_a_fleet_key_is_approved_as_claude_code_records_it_and_nothing_of_the_operator_is_copied() -> (
    None
):
    key = "  sk-ant-api03-" + "k" * 40 + "TAIL-0123456789abcd "
    agent = plan(env=(("ANTHROPIC_API_KEY", key),))
    record, credentials = signin.claude_files(agent, signed_in(), (WORKSPACE,), None)
    assert credentials is None
    assert record_of(record) == {
        "hasCompletedOnboarding": True,
        "projects": {WORKSPACE: {"hasTrustDialogAccepted": True}},
        "customApiKeyResponses": {"approved": ["kTAIL-0123456789abcd"], "rejected": []},
    }
    assert signin.key_suffix(key) == key.strip()[-20:]
    # approved once, and taken out of the rejected answers
    own = {"customApiKeyResponses": {"approved": ["old"], "rejected": [signin.key_suffix(key)]}}
    record, _ = signin.claude_files(agent, signed_in(), (WORKSPACE,), json.dumps(own).encode())
    again, _ = signin.claude_files(agent, signed_in(), (WORKSPACE,), record)
    assert record_of(again)["customApiKeyResponses"] == {
        "approved": ["old", signin.key_suffix(key)],
        "rejected": [],
    }


def test_a_key_or_token_the_agent_inherits_counts_as_its_own() -> None:
    inherited = signed_in(env={"ANTHROPIC_API_KEY": "sk-ant-inherited-0123456789abcdefghij"})
    assert signin.claude_source(plan(), inherited) == "key"
    record, credentials = signin.claude_files(plan(), inherited, (WORKSPACE,), None)
    assert credentials is None
    assert record_of(record)["customApiKeyResponses"]["approved"] == ["0123456789abcdefghij"]
    # the agent's env wins over what it inherits, even to take the key away
    emptied = plan(env=(("ANTHROPIC_API_KEY", ""),))
    assert signin.claude_source(emptied, inherited) == "operator"
    token = plan(env=(("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-long-lived"),))
    assert signin.claude_source(token, signed_in()) == "token"
    record, credentials = signin.claude_files(token, signed_in(), (WORKSPACE,), None)
    assert credentials is None and "oauthAccount" not in record_of(record)


def test_without_any_sign_in_nothing_is_written() -> None:
    assert signin.claude_source(plan(), Operator()) is None
    assert signin.claude_files(plan(), Operator(), (WORKSPACE,), None) == (None, None)
    # signed in through a record only (a Console key kept in it)
    console = Operator(claude_record={"primaryApiKey": "sk-ant-console"})
    record, credentials = signin.claude_files(plan(), console, (WORKSPACE,), None)
    assert credentials is None and record_of(record)["primaryApiKey"] == "sk-ant-console"


def test_only_agents_whose_claude_config_is_their_home_get_a_sign_in() -> None:
    for other in (
        plan(sandbox="none"),  # unfenced: the supervisor's own HOME
        plan(env=(("HOME", "/srv/a"),)),
        plan(env=(("CLAUDE_CONFIG_DIR", "/srv/a/.claude"),)),
        plan(client="codex"),
        plan(client="command", command=("x",)),
    ):
        assert signin.claude_source(other, signed_in()) is None, other
        assert signin.claude_files(other, signed_in(), (WORKSPACE,), None) == (None, None)
    assert signin.claude_source(plan(command=("claude", "-p", "x")), signed_in()) == "operator"


def test_codex_gets_the_fleet_key_else_the_operator_s_auth() -> None:
    codex = plan(client="codex")
    assert signin.codex_auth(codex, signed_in()) == signed_in().codex_auth
    keyed = plan(client="codex", env=(("OPENAI_API_KEY", "sk-fleet"),))
    assert record_of(signin.codex_auth(keyed, signed_in())) == {
        "auth_mode": "apikey",
        "OPENAI_API_KEY": "sk-fleet",
    }
    assert signin.codex_auth(codex, Operator()) is None
    assert signin.codex_auth(plan(), signed_in()) is None  # not codex


def fleet(*agents: AgentPlan) -> Fleet:
    from mcphost.admin.target import parse_target

    center = CenterConfig(
        admin_url=parse_target("unix:/run/admin.sock"), pins=(), token_file="/etc/t"
    )
    return Fleet(path="/etc/fleet.toml", center=center, agents=agents)


def test_check_says_per_client_kind_who_starts_signed_out_and_why() -> None:
    both = fleet(plan("a"), plan("b"), plan("c", client="codex"))
    assert signin.check_lines(both, Operator(user="op")) == [
        "claude agents will start signed out (a, b): sign Claude Code in once as op (`claude`, "
        "then /login) or give ANTHROPIC_API_KEY in [defaults].env",
        "codex agents will start signed out (c): sign Codex in once as op (`codex login`) or "
        "give OPENAI_API_KEY in [defaults].env",
    ]
    lines = signin.check_lines(both, signed_in())
    assert len(lines) == 2 and all("start signed in as op" in line for line in lines), lines
    keyed = fleet(plan("a", env=(("ANTHROPIC_API_KEY", "k"),)))
    assert signin.check_lines(keyed, Operator()) == [
        "claude agents start signed in with the key or token of their env"
    ]
    assert signin.check_lines(fleet(plan("x", sandbox="none")), Operator()) == []
    refused = Operator(problems=("/root/.claude.json: a symlink ... (not followed)",))
    assert signin.check_lines(fleet(), refused) == [
        "sign-in not copied: /root/.claude.json: a symlink ... (not followed)"
    ]
    from_center = dataclasses.replace(
        fleet(), center=dataclasses.replace(fleet().center, fleet="center")
    )
    assert signin.check_lines(from_center, Operator(user="op"))[0].startswith(
        "claude agents will start signed out (the agents the center assigns): "
    )
    many = fleet(*(plan(f"a{i}") for i in range(5)))
    assert "(a0, a1, a2 and 2 more)" in signin.check_lines(many, Operator())[0]


# -- reading the operator's files -------------------------------------------------------------


def operator_home(root: Path, record: dict[str, Any] | None = RECORD) -> Path:
    home = root / "operator"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / ".credentials.json").write_text(json.dumps(CREDENTIALS))
    if record is not None:
        (home / ".claude.json").write_text(json.dumps(record))
    (home / ".codex").mkdir()
    (home / ".codex" / "auth.json").write_text('{"auth_mode": "chatgpt", "tokens": {}}')
    return home


def test_the_operator_s_sign_in_is_read_from_where_their_clients_keep_it(tmp_path: Path) -> None:
    home = operator_home(tmp_path)
    env = {"HOME": str(home), "ANTHROPIC_API_KEY": "sk-inherited", "PATH": "/usr/bin"}
    operator = signin.read_operator(env)
    assert operator.claude_credentials == {"claudeAiOauth": OAUTH}
    assert operator.claude_record == signin.select_record(RECORD)
    assert json.loads(operator.codex_auth or b"") == {"auth_mode": "chatgpt", "tokens": {}}
    assert operator.env == {"ANTHROPIC_API_KEY": "sk-inherited"}
    assert operator.claude_from == str(home / ".claude" / ".credentials.json")
    assert operator.problems == ()
    # CLAUDE_CONFIG_DIR and CODEX_HOME move them, as they move the clients' own
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / ".credentials.json").write_text(json.dumps({"claudeAiOauth": {"accessToken": "m"}}))
    (moved / ".claude.json").write_text(json.dumps({"userID": "moved"}))
    (moved / "auth.json").write_text("{}")
    env = {"HOME": str(home), "CLAUDE_CONFIG_DIR": str(moved), "CODEX_HOME": str(moved)}
    operator = signin.read_operator(env)
    assert operator.claude_record == {"userID": "moved"}
    assert operator.claude_credentials == {"claudeAiOauth": {"accessToken": "m"}}
    assert operator.codex_auth == b"{}"
    # nothing there: signed out, nothing to say
    empty = tmp_path / "empty"
    empty.mkdir()
    operator = signin.read_operator({"HOME": str(empty)})
    assert (operator.claude_record, operator.claude_credentials, operator.codex_auth) == (
        None,
        None,
        None,
    )
    assert not operator.claude_signed_in and operator.problems == ()


def test_the_directories_the_sign_in_is_read_from_are_the_ones_the_fence_hides(
    tmp_path: Path,
) -> None:
    """One answer (`sources`) for where `read_operator` reads and what the fence hides: every
    file it reads (here the legacy record too, through its fallback) lies in a directory of
    `Sources.directories`, and nothing else is named."""
    home = operator_home(tmp_path, record=None)
    (home / ".claude" / ".config.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
    at = signin.sources({"HOME": str(home)})
    assert at.directories() == (str(home / ".claude"), str(home), str(home / ".codex"))
    operator = signin.read_operator({"HOME": str(home)})
    assert operator.claude_record == {"hasCompletedOnboarding": True}
    for path in (operator.claude_from, operator.codex_from, str(home / ".claude/.config.json")):
        assert os.path.dirname(path) in at.directories(), path
    moved = {"HOME": str(home), "CLAUDE_CONFIG_DIR": "/srv/ops/claude", "CODEX_HOME": "rel"}
    assert signin.sources(moved).directories() == (
        "/srv/ops/claude",
        os.path.abspath("rel"),  # as the supervisor's own open() would take it
    )
    operator = signin.read_operator(moved)
    assert (operator.claude_from, operator.codex_from) == (
        "/srv/ops/claude/.credentials.json",
        "rel/auth.json",
    )


def test_the_legacy_record_is_read_when_the_current_one_is_missing(tmp_path: Path) -> None:
    home = operator_home(tmp_path, record=None)
    (home / ".claude" / ".config.json").write_text(json.dumps({"hasCompletedOnboarding": True}))
    assert signin.read_operator({"HOME": str(home)}).claude_record == {
        "hasCompletedOnboarding": True
    }


def test_symlinks_and_odd_files_of_the_operator_are_refused_and_named(tmp_path: Path) -> None:
    home = operator_home(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.json").write_text(json.dumps(CREDENTIALS))
    os.unlink(home / ".claude.json")
    os.symlink(elsewhere / "x.json", home / ".claude.json")
    os.rename(home / ".codex", tmp_path / "codex-real")
    os.symlink(tmp_path / "codex-real", home / ".codex")
    operator = signin.read_operator({"HOME": str(home)})
    assert operator.claude_record is None and operator.codex_auth is None
    assert operator.claude_credentials is not None  # the rest is still read
    assert len(operator.problems) == 2, operator.problems
    assert all("not followed" in p for p in operator.problems), operator.problems
    # a FIFO is not opened for long (O_NONBLOCK) and not read
    os.unlink(home / ".claude" / ".credentials.json")
    os.mkfifo(home / ".claude" / ".credentials.json")
    operator = signin.read_operator({"HOME": str(home)})
    assert operator.claude_credentials is None
    assert any("not a regular file" in p for p in operator.problems)
    # too large
    os.unlink(home / ".claude" / ".credentials.json")
    (home / ".claude" / ".credentials.json").write_bytes(b" " * (signin.MAX_BYTES + 1))
    operator = signin.read_operator({"HOME": str(home)})
    assert any("larger than" in p for p in operator.problems)
    assert all("sk-ant" not in p for p in operator.problems)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file away")
def test_a_file_of_another_uid_is_not_the_operator_s(tmp_path: Path) -> None:
    home = operator_home(tmp_path)
    os.chown(home / ".claude" / ".credentials.json", 65534, 65534)
    operator = signin.read_operator({"HOME": str(home)})
    assert operator.claude_credentials is None
    assert any("belongs to uid 65534" in p for p in operator.problems), operator.problems


# -- written in the home (homes.py) -----------------------------------------------------------


@pytest.fixture
def state(tmp_path: Path) -> Path:
    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    return root


def points(state: Path) -> AttachPoints:
    return AttachPoints(sys.executable, attach_script(), str(state / "run" / "center.sock"))


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_claude_home_gets_the_operator_s_sign_in_0600_fresh_at_each_preparation(
    state: Path, tmp_path: Path
) -> None:
    operator = signin.read_operator({"HOME": str(operator_home(tmp_path))})
    home = prepare_home(str(state), plan(), points(state), operator)
    root = Path(home.root)
    credentials = root / ".claude" / ".credentials.json"
    record = root / ".claude.json"
    assert json.loads(credentials.read_text()) == {"claudeAiOauth": OAUTH}
    assert json.loads(record.read_text())["projects"] == {
        home.workspace: {"hasTrustDialogAccepted": True}
    }
    assert (mode(credentials), mode(record), mode(root / ".claude")) == (0o600, 0o600, 0o700)
    assert credentials.stat().st_uid == record.stat().st_uid == os.geteuid()
    # what the agent's Claude Code writes stays; a refreshed sign-in replaces the old one
    mine = json.loads(record.read_text())
    mine["numStartups"] = 7
    record.write_text(json.dumps(mine))
    credentials.write_text(json.dumps({"claudeAiOauth": {"accessToken": "agent-refreshed"}}))
    refreshed = {"claudeAiOauth": {**OAUTH, "accessToken": "operator-refreshed"}}
    (tmp_path / "operator" / ".claude" / ".credentials.json").write_text(json.dumps(refreshed))
    operator = signin.read_operator({"HOME": str(tmp_path / "operator")})
    prepare_home(str(state), plan(), points(state), operator)
    assert json.loads(credentials.read_text()) == refreshed
    assert json.loads(record.read_text())["numStartups"] == 7
    # another agent gets its own copy: its own workspace trusted, nothing of agent-1's
    other = prepare_home(str(state), plan("agent-2"), points(state), operator)
    theirs = json.loads((Path(other.root) / ".claude.json").read_text())
    assert list(theirs["projects"]) == [other.workspace] and "numStartups" not in theirs
    # signed out: no sign-in written (`.claude` holds only its own tools' approvals); what is
    # there stays
    bare = prepare_home(str(state), plan("agent-3"), points(state), Operator())
    assert sorted(os.listdir(bare.root)) == [".claude", "mcp.json", "workspace"]
    assert os.listdir(Path(bare.root) / ".claude") == ["settings.json"]


def test_a_symlink_the_agent_plants_for_its_sign_in_is_never_followed(
    state: Path, tmp_path: Path
) -> None:
    operator = signin.read_operator({"HOME": str(operator_home(tmp_path))})
    home = prepare_home(str(state), plan(), points(state), operator)
    root = Path(home.root)
    target = tmp_path / "target"
    target.mkdir()
    # the agent's record, swapped for a symlink: not read, not written through
    (target / "record.json").write_text(json.dumps({"projects": {"/elsewhere": {}}}))
    os.unlink(root / ".claude.json")
    os.symlink(target / "record.json", root / ".claude.json")
    with pytest.raises(HomeError):
        prepare_home(str(state), plan(), points(state), operator)
    assert json.loads((target / "record.json").read_text()) == {"projects": {"/elsewhere": {}}}
    os.unlink(root / ".claude.json")
    # its .claude directory, swapped for a symlink: refused
    os.rename(root / ".claude", tmp_path / "moved")
    os.symlink(target, root / ".claude")
    with pytest.raises(HomeError, match="is a symlink"):
        prepare_home(str(state), plan(), points(state), operator)
    assert sorted(os.listdir(target)) == ["record.json"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a `user =` agent needs a root supervisor")
def test_a_user_agent_s_sign_in_belongs_to_its_user(state: Path, tmp_path: Path) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    operator = signin.read_operator({"HOME": str(operator_home(tmp_path))})
    agent = plan(user="nobody", runner="process", command=("claude", "-p", "x"))
    home = prepare_home(str(state), agent, points(state), operator)
    for path in (
        Path(home.root) / ".claude.json",
        Path(home.root) / ".claude" / ".credentials.json",
    ):
        assert (path.stat().st_uid, mode(path)) == (nobody.pw_uid, 0o600)
    codex = plan("c", client="codex", user="nobody", runner="process", command=("codex",))
    auth = (
        Path(prepare_home(str(state), codex, points(state), operator).codex_home or "")
        / "auth.json"
    )
    assert (auth.stat().st_uid, mode(auth)) == (nobody.pw_uid, 0o600)
    assert json.loads(auth.read_text()) == {"auth_mode": "chatgpt", "tokens": {}}


def test_a_codex_home_gets_the_operator_s_auth_unless_the_fleet_gives_a_key(
    state: Path, tmp_path: Path
) -> None:
    operator = signin.read_operator({"HOME": str(operator_home(tmp_path))})
    home = prepare_home(str(state), plan(client="codex"), points(state), operator)
    auth = Path(home.codex_home or "") / "auth.json"
    assert json.loads(auth.read_text()) == {"auth_mode": "chatgpt", "tokens": {}}
    assert mode(auth) == 0o600
    keyed = plan(client="codex", env=(("OPENAI_API_KEY", "sk-fleet"),))
    prepare_home(str(state), keyed, points(state), operator)
    assert json.loads(auth.read_text()) == {"auth_mode": "apikey", "OPENAI_API_KEY": "sk-fleet"}
    # a codex home holds no Claude sign-in, a claude home no Codex one
    assert not (Path(home.root) / ".claude.json").exists()
    claude = prepare_home(str(state), plan("agent-2"), points(state), operator)
    assert not (Path(claude.root) / "codex").exists()


def test_a_fenced_agent_does_not_inherit_the_operator_s_claude_config_dir(state: Path) -> None:
    base = {"PATH": "/usr/bin", "HOME": "/root", "CLAUDE_CONFIG_DIR": "/root/.claude"}
    home = home_paths(str(state), "agent-1", "claude")
    env = agent_env(base, plan(), home)
    assert env["HOME"] == home.root and "CLAUDE_CONFIG_DIR" not in env
    given = plan(env=(("CLAUDE_CONFIG_DIR", "/srv/a"),))
    assert agent_env(base, given, home)["CLAUDE_CONFIG_DIR"] == "/srv/a"
    assert agent_env(base, plan(sandbox="none"), home)["CLAUDE_CONFIG_DIR"] == "/root/.claude"
    with_home = plan(env=(("HOME", "/srv/a"),))
    assert agent_env(base, with_home, home)["CLAUDE_CONFIG_DIR"] == "/root/.claude"


# -- `mcphost supervise --check`, the real command ---------------------------------------------


def test_supervise_check_prints_one_sign_in_line_per_client_kind(
    supervised: Supervised, tmp_path: Path
) -> None:
    """A default claude and a default codex agent, the operator signed in to neither: one line
    each, saying so and how to fix it; signed in: one line each naming whose sign-in they get.
    Informative only: the exit status is the preflight's."""
    sv = supervised
    sv.write_fleet([{"id": "agent-1", "client": "claude"}, {"id": "agent-2", "client": "codex"}])
    empty = tmp_path / "empty-home"
    empty.mkdir()
    sv.extra_env.update(HOME=str(empty))
    for name in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", *signin.INHERITED):
        sv.extra_env[name] = ""
    user = pwd.getpwuid(os.geteuid()).pw_name

    def lines() -> tuple[int, list[str]]:
        done = subprocess.run(
            [*sv.argv(), "--check"], capture_output=True, text=True, env=sv.env(), timeout=120
        )
        found = [line for line in done.stderr.splitlines() if "signed" in line]
        return done.returncode, found

    status, found = lines()
    assert status == 0, found
    assert found == [
        f"mcphost supervise --check: claude agents will start signed out (agent-1): sign Claude "
        f"Code in once as {user} (`claude`, then /login) or give ANTHROPIC_API_KEY in "
        "[defaults].env",
        f"mcphost supervise --check: codex agents will start signed out (agent-2): sign Codex in "
        f"once as {user} (`codex login`) or give OPENAI_API_KEY in [defaults].env",
    ]
    sv.extra_env["HOME"] = str(operator_home(tmp_path))
    status, found = lines()
    assert status == 0 and len(found) == 2, found
    assert f"claude agents start signed in as {user} ({tmp_path}/operator/.claude/" in found[0]
    assert f"codex agents start signed in as {user} ({tmp_path}/operator/.codex/" in found[1]
    assert "sk-ant" not in "".join(found)


def test_a_supervisor_writes_the_sign_in_at_start_and_warns_of_agents_signed_out(
    supervised: Supervised, tmp_path: Path
) -> None:
    """Through the real `mcphost supervise` (a held command stands in for Claude Code): signed
    out, one `supervisor.signed_out` warning names the claude agents and nothing is written;
    signed in, the next start writes each home's copy."""
    sv = supervised
    hold = inline("import signal; signal.pause()")
    sv.write_fleet([{"id": a, "client": "claude", "command": hold} for a in ("agent-1", "agent-2")])
    empty = tmp_path / "empty-home"
    empty.mkdir()
    sv.extra_env.update({name: "" for name in ("CLAUDE_CONFIG_DIR", *signin.INHERITED)})
    sv.extra_env["HOME"] = str(empty)
    sv.start()
    sv.wait_running("agent-1")
    warned = [e for e in sv.events() if e.get("event") == "supervisor.signed_out"]
    assert [(e["client"], e["agents"]) for e in warned] == [("claude", ["agent-1", "agent-2"])]
    assert not (sv.state / "agents" / "agent-1" / ".claude.json").exists()
    assert sv.terminate() == 0
    sv.extra_env["HOME"] = str(operator_home(tmp_path))
    sv.start()
    sv.wait_running("agent-2")
    assert (
        len([e for e in sv.events(this_run=True) if e.get("event") == "supervisor.signed_out"]) == 0
    )
    for agent_id in ("agent-1", "agent-2"):
        home = sv.state / "agents" / agent_id
        assert json.loads((home / ".claude" / ".credentials.json").read_text()) == {
            "claudeAiOauth": OAUTH
        }
        record = json.loads((home / ".claude.json").read_text())
        assert record["projects"] == {str(home / "workspace"): {"hasTrustDialogAccepted": True}}
