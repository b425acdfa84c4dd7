"""Black-box: the center's health and `[center]` changes without downtime, through a real `mcphost
supervise`, the real reference center (with TLS where a pin matters), `mcphost ctl`, and a
stand-in agent (`loop_agent.py`) calling `get_my_work` in a loop through its own sessions.

- A wrong pin, an unknown token or a wrong URL shows in `ctl status` first (`center: <code>`
  with a remedy naming the fleet key, never an `AC_MCP_*` variable; `--json` has
  `center.state`); fixing the fleet file (or the token file) and reloading makes it `center: ok`
  and the next call succeed, with the same agent PID and generation.
- `mcphost supervise --check`: 0 when all is well, 1 with one line per problem naming the fleet
  key, 2 for a bad fleet file.

Token rotation with calls in flight: test_supervise_rotation.py (deep).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcphost.testing.devcenter import DevCenter
from tests.supervisor.supervise_harness import Supervised, toml_value
from tests.waiting import until

LOOP = str(Path(__file__).with_name("loop_agent.py"))
WRONG_PIN = "sha256:" + ":".join(["AB"] * 32)
AGENT = "agent-1"  # seeded on the devcenter, bound to w-1


@pytest.fixture
def center(tmp_path: Path) -> Iterator[DevCenter]:
    with DevCenter.start(tmp_path / "center", unix=True, tcp=True) as running:
        yield running


@pytest.fixture
def sv(tmp_path: Path, center: DevCenter) -> Iterator[Supervised]:
    base = tmp_path / "sv"
    base.mkdir()
    supervised = Supervised(base, center)
    try:
        yield supervised
    finally:
        supervised.close()


def write_fleet(sv: Supervised, sessions: int = 1, **center_keys: Any) -> None:
    keys = {"admin_url": sv.center.admin_url("unix"), "token_file": str(sv.token_file)}
    keys.update(center_keys)
    lines = ["[center]", *(f"{k} = {toml_value(v)}" for k, v in keys.items())]
    lines += ["", "[defaults]", 'client = "command"', "stop_grace = 5", ""]
    lines += ["[[agent]]", f'id = "{AGENT}"']
    lines += [f"command = {toml_value([sys.executable, LOOP, '{mcp_config}', str(sessions)])}"]
    sv.fleet.write_text("\n".join(lines) + "\n")


def calls(sv: Supervised) -> list[dict[str, Any]]:
    path = sv.workspace(AGENT) / "loop.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def ok_after(sv: Supervised, moment: float, n: int = 1) -> bool:
    return sum(1 for c in calls(sv) if c["ok"] and c["at"] > moment) >= n


def stop_loop(sv: Supervised) -> list[dict[str, Any]]:
    (sv.workspace(AGENT) / "stop").write_text("stop")
    until(lambda: (sv.workspace(AGENT) / "stopped").exists(), 60, "the loop to stop")
    return calls(sv)


def events(sv: Supervised, name: str) -> list[dict[str, Any]]:
    return [e for e in sv.events(this_run=True) if e.get("event") == name]


# -- health: a bad [center] shows, a reload fixes it without restarts -----------------------------

BAD = {
    # case: (how to break it, the state, the fleet key, how to fix it)
    "pin": "pin_mismatch",
    "token": "admin_unauthorized",
    "url": "admin_unreachable",
}
KEY = {"pin": "fingerprint", "token": "token_file", "url": "admin_url"}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_center_shows_first_and_a_reload_fixes_it_without_restarts(
    sv: Supervised, center: DevCenter, case: str
) -> None:
    tcp = {"admin_url": center.admin_url("tcp"), "fingerprint": center.fingerprint}
    if case == "pin":
        write_fleet(sv, **{**tcp, "fingerprint": WRONG_PIN})
    elif case == "token":
        sv.token_file.write_text("acat_" + "x" * 40 + "\n")
        write_fleet(sv, **tcp)
    else:
        write_fleet(sv, admin_url=f"unix:{sv.base}/no-center.sock")
    sv.start()
    before = sv.wait_running(AGENT)
    until(lambda: sv.center_health()["state"] == BAD[case], 60, f"center: {BAD[case]}")
    until(lambda: calls(sv), 60, "the agent's first calls")
    assert not any(c["ok"] for c in calls(sv))

    text = sv.ctl("status").stdout
    first = text.splitlines()[0]
    assert first.startswith(f"center: {BAD[case]} ([center] {KEY[case]}): "), text
    assert f"[center] {KEY[case]}" in first.split(": ", 2)[2] and "ctl reload" in first
    shown = json.loads(sv.ctl("status", "--json").stdout)
    assert shown["center"]["state"] == BAD[case] and shown["center"]["checked_at"]
    assert shown["agents"][0]["agent_id"] == AGENT
    # what the operator (and the agent) read names fleet keys, never the host's variables
    assert "AC_MCP_" not in text + json.dumps(shown) + json.dumps(calls(sv))
    assert "AC_MCP_" not in json.dumps(events(sv, "supervisor.center_health"))

    if case == "token":
        sv.token_file.write_text(center.token + "\n")
    write_fleet(sv, **tcp) if case != "url" else write_fleet(sv)
    fixed_at = time.time()
    assert "reloaded" in sv.ctl("reload").stdout
    until(lambda: sv.center_health()["state"] == "ok", 60, "center: ok after the reload")
    until(lambda: ok_after(sv, fixed_at, 3), 60, "calls to succeed after the reload")
    assert sv.ctl("status").stdout.startswith("center: ok\n")
    after = sv.status()[AGENT]
    assert (after["pid"], after["generation"]) == (before["pid"], before["generation"])
    assert after["restarts"] == before["restarts"]


def test_a_reload_to_a_wrong_pin_applies_to_the_next_call(
    sv: Supervised, center: DevCenter
) -> None:
    """Good to bad: the new pin set is what the very next call is checked against."""
    write_fleet(sv, admin_url=center.admin_url("tcp"), fingerprint=center.fingerprint)
    sv.start()
    before = sv.wait_running(AGENT)
    until(lambda: ok_after(sv, 0, 3), 60, "calls through the pinned center")
    write_fleet(sv, admin_url=center.admin_url("tcp"), fingerprint=WRONG_PIN)
    sv.ctl("reload")
    until(lambda: sv.center_health()["state"] == "pin_mismatch", 60, "center: pin_mismatch")
    until(lambda: any("pin_mismatch" in c["text"] for c in calls(sv)), 60, "a call refused by pin")
    refused = next(c for c in calls(sv) if "pin_mismatch" in c["text"])
    assert "[center] fingerprint" in refused["text"] and "AC_MCP_" not in refused["text"]
    after = sv.status()[AGENT]
    assert (after["pid"], after["generation"]) == (before["pid"], before["generation"])


# -- the preflight --------------------------------------------------------------------------------


def check(sv: Supervised) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*sv.argv(), "--check"], capture_output=True, text=True, env=sv.env(), timeout=120
    )


def test_supervise_check_exit_codes_and_one_line_per_problem(
    sv: Supervised, center: DevCenter
) -> None:
    tcp = {"admin_url": center.admin_url("tcp"), "fingerprint": center.fingerprint}
    write_fleet(sv, **tcp)
    done = check(sv)
    assert done.returncode == 0, done.stderr
    assert "OK" in done.stderr and done.stdout == ""
    assert center.token not in done.stderr

    write_fleet(sv, **{**tcp, "fingerprint": WRONG_PIN})
    done = check(sv)
    assert done.returncode == 1, done.stderr
    problems = [line for line in done.stderr.splitlines() if "--check:" not in line]
    assert len(problems) == 1 and "[center] fingerprint: pin_mismatch: " in problems[0]
    assert "AC_MCP_" not in done.stderr

    write_fleet(sv, **tcp, token_file=str(sv.base / "missing.token"))
    done = check(sv)
    assert done.returncode == 1, done.stderr
    problems = [line for line in done.stderr.splitlines() if "--check:" not in line]
    assert len(problems) == 1 and "[center] token_file is " in problems[0], done.stderr

    write_fleet(sv, admin_url=f"unix:{sv.base}/no-center.sock")
    (sv.state / "state-is-a-file").write_text("")
    done = subprocess.run(
        [*sv.argv()[:-1], str(sv.state / "state-is-a-file"), "--check"],
        capture_output=True,
        text=True,
        env=sv.env(),
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    problems = [line for line in done.stderr.splitlines() if "--check:" not in line]
    assert len(problems) == 2, done.stderr
    assert "--state " in problems[0] and "[center] admin_url: admin_unreachable" in problems[1]

    sv.fleet.write_text(sv.fleet.read_text() + "\n[center.bogus]\n")
    assert check(sv).returncode == 2
    assert not (sv.state / "control.sock").exists()  # a check starts nothing


def test_supervise_check_lines_name_what_they_tried_once(sv: Supervised) -> None:
    """The token file's path once; the address that nothing answers at; a state directory
    whose parents are missing is one the supervisor creates (with them), not "not writable"."""
    write_fleet(sv, token_file=str(sv.base / "missing.token"))
    problems = [line for line in check(sv).stderr.splitlines() if "--check:" not in line]
    assert len(problems) == 1 and problems[0].count(str(sv.base / "missing.token")) == 1, problems

    url = f"unix:{sv.base}/no-center.sock"
    write_fleet(sv, admin_url=url)
    sv.state = sv.base / "no" / "st"
    done = check(sv)
    problems = [line for line in done.stderr.splitlines() if "--check:" not in line]
    assert len(problems) == 1, done.stderr  # the state directory is not one
    assert "[center] admin_url: admin_unreachable" in problems[0]
    assert f"[center] admin_url ({url})" in problems[0], problems

    (sv.base / "a-file").write_text("")
    sv.state = sv.base / "a-file" / "st"
    problems = [line for line in check(sv).stderr.splitlines() if "--check:" not in line]
    assert (
        f"--state {sv.state}: cannot be created: {sv.base / 'a-file'} is not a directory"
        in (problems[0])
    ), problems
