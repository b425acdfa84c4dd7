"""Black-box: a reload says, per changed fleet key, what it applied and what needs a restart.

Through a real `mcphost supervise`, `ctl reload`, `ctl reload --dry-run` and SIGHUP (issue 34):
- `[metrics] listen` and `[page] listen` move, open and close live: the reply names each with
  its new address; the old socket is gone and the new one answers; the metrics' counters
  outlive the move; no agent restarts. SIGHUP's reload writes the same keys to the journal
  (`supervisor.reloaded`).
- `[center] admin_url` (a change the dry run once called "would change nothing") applies to
  the next call; a unix admin socket in another directory moves what the fence hides, so the
  running fenced agent restarts into the new fence, and both the dry run and the reply name it.
  `[center] poll_seconds` applies in place; `[center] runtime_socket` set where none was at
  start is named as needing a supervisor restart (every reload says so until then);
  `[center] fleet` is named as refused by the dry run.
- An agent's key: `env` restarts that agent only, a changed `[defaults] stop_grace` applies in
  place to every agent.
What each key does is its declaration in the fleet model (`fleet.reload_of`).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

from mcphost.supervisor.fleet import reload_of
from tests.supervisor.supervise_harness import REPO, STATE_DIRS, Supervised, standin
from tests.supervisor.test_supervise_metrics import UnixHTTP, sample, scrape
from tests.waiting import until


def short_dir(parent: str | None = None) -> Path:
    """A directory under /tmp (or `parent`; a Unix socket path must stay short), removed with
    the state directories."""
    path = Path(tempfile.mkdtemp(prefix="mcphost-rk-", dir=parent))
    STATE_DIRS.append(path)
    return path


def with_listeners(sv: Supervised, **listen: str) -> None:
    """The fleet file with `[page]` / `[metrics]` tables listening where `listen` says."""
    text = sv.fleet.read_text()
    for table, where in listen.items():
        text += f'\n[{table}]\nlisten = "unix:{where}"\n'
    sv.fleet.write_text(text)


def answers(path: Path, url: str) -> int:
    """The HTTP status of GET `url` over the Unix socket at `path`."""
    conn = UnixHTTP(str(path))
    try:
        conn.request("GET", url)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def keys_of(reply: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["key"]: entry for entry in reply["keys"]}


def test_metrics_and_page_move_live_and_the_reply_says_so(supervised: Supervised) -> None:
    sv, sockets = supervised, short_dir()
    old, new, page = sockets / "m1.sock", sockets / "m2.sock", sockets / "p.sock"
    agent = {"id": "agent-1", "command": standin("--hold")}
    sv.write_fleet([agent])
    with_listeners(sv, metrics=str(old))
    sv.start()
    before = sv.wait_running("agent-1")
    assert sample(scrape(str(old))[1], "mcphost_agent_generation", agent="agent-1") == 1
    sv.write_fleet([agent])
    with_listeners(sv, metrics=str(new), page=str(page))
    dry = sv.ctl("reload", "--dry-run").stdout.splitlines()
    assert dry == [
        f"[page] listen: would apply (now unix:{page})",
        f"[metrics] listen: would apply (now unix:{new})",
    ], dry
    assert old.exists() and not new.exists() and not page.exists()
    done = sv.ctl("reload").stdout.splitlines()
    assert done[1:] == [
        f"[page] listen: applied (now unix:{page})",
        f"[metrics] listen: applied (now unix:{new})",
    ], done
    assert not old.exists()
    assert sample(scrape(str(new))[1], "mcphost_agent_generation", agent="agent-1") == 1
    assert answers(page, "/") == 200
    # SIGHUP: the page closed, the metrics back at the first socket; the journal names both
    sv.write_fleet([agent])
    with_listeners(sv, metrics=str(old))
    assert sv.proc is not None
    os.kill(sv.proc.pid, signal.SIGHUP)
    (reloaded,) = until(
        lambda: [e for e in sv.events() if e.get("event") == "supervisor.reloaded"][1:],
        60,
        "the SIGHUP reload in the journal",
    )
    assert reloaded["level"] == "info" and reloaded["keys"] == [
        {"key": "[page] listen", "reload": "live", "listen": None, "applied": True},
        {"key": "[metrics] listen", "reload": "live", "listen": f"unix:{old}", "applied": True},
    ], reloaded
    assert old.exists() and not new.exists() and not page.exists()
    assert scrape(str(old))[0]
    row = sv.status()["agent-1"]
    assert (row["pid"], row["generation"]) == (before["pid"], before["generation"]), row
    assert reload_of("metrics", "listen") == reload_of("page", "listen") == "live"


def test_a_metrics_address_in_use_is_named_not_applied(supervised: Supervised) -> None:
    sv, sockets = supervised, short_dir()
    taken = sockets / "taken"
    taken.mkdir()  # a directory where the socket would be: the bind fails
    sv.write_fleet([{"id": "agent-1", "command": standin("--hold")}])
    sv.start()
    sv.wait_running("agent-1")
    with_listeners(sv, metrics=str(taken))
    done = sv.ctl("reload").stdout.splitlines()
    (line,) = done[1:]
    assert line.startswith("[metrics] listen: not applied: [metrics] listen = "), line
    assert line.endswith("(nothing is served there)"), line
    reply = json.loads(sv.ctl("reload", "--json").stdout)  # tried again, refused again
    (entry,) = reply["keys"]
    assert (entry["key"], entry["applied"]) == ("[metrics] listen", False), entry


def test_center_keys_say_what_applies_and_what_needs_a_restart(supervised: Supervised) -> None:
    sv = supervised
    agent = {"id": "agent-1", "command": standin("--hold")}
    sv.write_fleet([agent])
    sv.start()
    first = sv.wait_running("agent-1")
    # the same center, reached from a directory every agent sees (beside the project, as
    # test_fence.py's refence case): a fence planned before the reload would not hide it
    moved = short_dir(REPO) / "admin.sock"
    moved.symlink_to(sv.center.admin_url("unix").removeprefix("unix:"))
    runtime = short_dir() / "runtime.sock"
    center_keys = {"poll_seconds": 5.0, "runtime_socket": str(runtime)}
    sv.write_fleet([agent], center_keys)
    sv.fleet.write_text(
        sv.fleet.read_text().replace(sv.center.admin_url("unix"), f"unix:{moved}", 1)
    )
    dry = sv.ctl("reload", "--dry-run").stdout.splitlines()
    assert dry == [
        "[center] admin_url: would apply; would restart into the new fence: agent-1",
        "[center] runtime_socket: would not apply: restart the supervisor to apply it",
        "[center] poll_seconds: would apply",
    ], dry
    assert sv.status()["agent-1"]["generation"] == first["generation"]
    done = sv.ctl("reload").stdout.splitlines()
    assert done[1:] == [
        "[center] admin_url: applied; restarted into the new fence: agent-1",
        "[center] runtime_socket: not applied: restart the supervisor to apply it",
        "[center] poll_seconds: applied",
    ], done
    sv.wait_running("agent-1", first["generation"] + 1)
    until(lambda: sv.center_health()["state"] == "ok", 60, "the center reached at its new URL")
    # in force now: only what needs a restart is named again
    again = json.loads(sv.ctl("reload", "--json").stdout)
    assert keys_of(again) == {
        "[center] runtime_socket": {
            "key": "[center] runtime_socket",
            "reload": "restart_supervisor",
            "applied": False,
        }
    }, again
    # where the agents come from cannot change under a running supervisor
    sv.write_fleet([], {**center_keys, "fleet": "center"}, command=standin("--hold"))
    sv.fleet.write_text(
        sv.fleet.read_text().replace(sv.center.admin_url("unix"), f"unix:{moved}", 1)
    )
    dry = sv.ctl("reload", "--dry-run").stdout.splitlines()
    assert (
        "[center] fleet: the reload would be refused (nothing applied): restart the supervisor to change it"
        in dry
    ), dry
    refused = sv.ctl("reload", check=False)
    assert refused.returncode == 1 and "[center] fleet changed" in refused.stderr, refused.stderr


def test_agent_keys_restart_only_what_they_touch(supervised: Supervised) -> None:
    sv = supervised
    agents = [{"id": f"agent-{n}", "command": standin("--hold")} for n in (1, 2)]
    sv.write_fleet(agents)
    sv.start()
    rows = {a["id"]: sv.wait_running(a["id"]) for a in agents}
    sv.write_fleet([{**agents[0], "env": {"X": "1"}}, agents[1]], stop_grace=3)
    dry = sv.ctl("reload", "--dry-run").stdout.splitlines()
    assert dry == [
        "would restart: agent-1",
        "would update in place: agent-2",
        "[[agent]] env: would restart agent-1",
        "[defaults] stop_grace: would apply in place (agent-1, agent-2)",
    ], dry
    reply = json.loads(sv.ctl("reload", "--json").stdout)
    assert reply["keys"] == [
        {
            "key": "[[agent]] env",
            "reload": "restarts_agent",
            "agents": ["agent-1"],
            "applied": True,
        },
        {
            "key": "[defaults] stop_grace",
            "reload": "live",
            "agents": ["agent-1", "agent-2"],
            "applied": True,
        },
    ], reply
    sv.wait_running("agent-1", rows["agent-1"]["generation"] + 1)
    assert sv.status()["agent-2"]["pid"] == rows["agent-2"]["pid"]


def test_a_reload_of_a_center_fleet_plans_its_agents_from_the_files_defaults(
    supervised: Supervised,
) -> None:
    """With `[center] fleet = "center"`, a reload once planned the center's agents from the
    `[defaults]` in force, so a changed one was neither applied nor named."""
    sv = supervised
    sv.token_file.write_text(sv.center.worker_token("w-2") + "\n")  # the devcenter binds agent-x
    center_keys = {"fleet": "center", "poll_seconds": 3600}
    sv.write_fleet([], center_keys, command=standin("--hold"))
    sv.start()
    first = sv.wait_running("agent-x")
    sv.write_fleet([], center_keys, command=standin("--hold"), env={"X": "1"})
    dry = sv.ctl("reload", "--dry-run").stdout.splitlines()
    assert dry == ["would restart: agent-x", "[defaults] env: would restart agent-x"], dry
    done = sv.ctl("reload").stdout.splitlines()
    assert done[1:] == ["[defaults] env: applied, restarted agent-x"], done
    sv.wait_running("agent-x", first["generation"] + 1)
