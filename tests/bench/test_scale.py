"""bench/scale.py: its pure parts (the extrapolation, the ratios, the targets table), its agent's
HTTP client against the SDK's own streamable-HTTP server, and a tiny end-to-end run (slow).

Nothing here is timed: the bench measures, these check that it computes and runs.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bench import scale
from mcphost.supervisor import fleet
from mcphost.supervisor.confine import probe as machine
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[2]


def test_the_baseline_is_extrapolated_linearly_from_its_n() -> None:
    assert scale.extrapolate(5.4, 100, 1000) == pytest.approx(54.0)
    baseline = {"n": 100.0, "wall": 30.0, "pss": 5400.0}
    at_1000 = scale.baseline_at(baseline, 1000)
    assert at_1000["wall"] == pytest.approx(300.0) and at_1000["pss"] == pytest.approx(54000.0)
    assert at_1000["extrapolated"] == 1.0
    assert scale.baseline_at(baseline, 100) == {**baseline, "extrapolated": 0.0}
    with pytest.raises(ValueError, match="N = 0"):
        scale.extrapolate(1.0, 0, 10)


RESULTS = {
    "pumps": {
        100: {"wall": 6.0, "serving_pss": 400.0, "supervisor_pss": 85.0, "per_agent": 0.85}
        | {"idle_cpu": 30.0},
        1000: {"wall": 70.5, "serving_pss": 3300.0, "supervisor_pss": 134.0, "per_agent": 0.9}
        | {"idle_cpu": 300.0},
    },
    "bare": {100: {"rate": 37.0, "idle_cpu": 30.0}, 1000: {"rate": 51.0, "idle_cpu": 33.0}},
}
BASELINE = {"n": 100.0, "wall": 60.0, "pss": 5400.0}


def row(rows: list[str], text: str, arm: str) -> list[str]:
    [found] = [r for r in rows if r.startswith(f"| {text}") and f"| {arm} |" in r]
    return [cell.strip() for cell in found.strip("|").split("|")]


def test_each_target_is_printed_beside_its_figure_with_pass_or_fail() -> None:
    rows = scale.target_rows(RESULTS, BASELINE)
    # N = 100, against the measured baseline: 400 / 5400 and 6 / 60
    assert row(rows, "serving memory ≤ 0.02×", "pumps")[3:] == ["0.0741×", "≤ 0.02×", "**fail**"]
    assert row(rows, "wall to every first answer", "pumps")[3:] == ["0.1×", "≤ 0.05×", "**fail**"]
    # N = 1000, against the baseline extrapolated tenfold: 3300 / 54000
    assert row(rows, "serving memory ≤ 0.01×", "pumps")[3] == "0.0611×"
    assert row(rows, "every agent answered within 20 s", "pumps")[3:] == [
        "70.5",
        "≤ 20",
        "**fail**",
    ]
    # growth against the same arm at N = 100
    assert row(rows, "supervisor PSS per agent", "pumps")[3:5] == ["1.06×", "≤ 1.1×"]
    assert row(rows, "supervisor PSS per agent", "pumps")[5] == "**pass**"
    assert row(rows, "idle supervisor CPU", "pumps")[3:] == ["10×", "≤ 1.2×", "**fail**"]
    assert row(rows, "idle supervisor CPU", "bare")[3:] == ["1.1×", "≤ 1.2×", "**pass**"]
    # an at-least target, and an arm the run did not measure
    assert row(rows, "bare fenced agents spawn", "bare")[3:] == ["51", "≥ 50", "**pass**"]
    assert row(rows, "every agent answered within 20 s", "http")[3:] == [
        "–",
        "≤ 20",
        "not measured",
    ]
    # without a baseline, the ratios to it are not measured
    assert row(scale.target_rows(RESULTS, None), "serving memory ≤ 0.02×", "pumps")[5] == (
        "not measured"
    )


def test_growth_is_the_largest_n_over_the_smallest() -> None:
    rows = scale.growth_rows(RESULTS)
    pumps = next(r for r in rows if r.startswith("| pumps |"))
    assert "| 100 | 1000 | 11.75× |" in pumps and pumps.endswith("| 10.00× | 56 KiB |")
    assert scale.growth_rows({"bare": {100: {"rate": 1.0}}}) == ["(One N only: no growth to show.)"]


def test_the_http_arm_runs_only_where_mcphost_knows_its_key() -> None:
    known = list(fleet.SECTIONS["agent"].model_fields)
    assert scale.http_key('sandbox = "auto"', known) == {"sandbox": "auto"}
    assert scale.http_key('no_such_key_here = "http"', known) is None


SDK_SERVER = """
import socket, sys, uvicorn
from mcp.server import MCPServer
server = MCPServer("center-standin")
@server.tool()
def get_my_work() -> str:
    return "nothing to do"
app = server.streamable_http_app(json_response=sys.argv[2] == "json")
config = uvicorn.Config(app, log_level="warning")
uvicorn.Server(config).run(sockets=[socket.socket(fileno=int(sys.argv[1]))])
"""


@pytest.mark.parametrize("reply", ["json", "sse"])
def test_the_agent_gets_its_answer_over_the_sdks_streamable_http(
    tmp_path: Path, reply: str
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-c", SDK_SERVER, str(listener.fileno()), reply],
        pass_fds=[listener.fileno()],
    )
    listener.close()
    entry = {"type": "http", "url": f"http://127.0.0.1:{port}/mcp", "headers": {"X-Bench": "1"}}
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"agent-center": entry}}))
    agent = subprocess.Popen([sys.executable, "-I", "-S", scale.AGENT, str(config)], cwd=tmp_path)
    try:
        answer = until(lambda: (tmp_path / "answer").exists(), 60, "the agent's answer")
        assert answer
        record = json.loads((tmp_path / "answer").read_text())
        assert record["ok"] is True, record
        assert agent.poll() is None  # it holds the session, as an agent between turns
    finally:
        for process in (agent, server):
            process.terminate()
            process.wait(30)


@pytest.mark.slow
@pytest.mark.skipif(
    machine.probe().missing() is not None, reason=f"no fence here: {machine.probe().missing()}"
)
def test_a_tiny_run_goes_end_to_end() -> None:
    """N = 3, each arm and the baseline: a report with every row, and the http arm skipped with
    its line where the installed mcphost has no HTTP sessions."""
    argv = ["--sizes", "3", "--baseline", "3", "--idle", "0.2", "--arms", "bare,pumps,http"]
    done = subprocess.run(
        [sys.executable, "-m", "bench.scale", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = done.stdout
    assert "| per-process hosts (baseline) | 3 |" in report
    assert "| bare | 3 |" in report and "| pumps | 3 |" in report
    pumps = next(line for line in report.splitlines() if line.startswith("| pumps | 3 |"))
    assert "3 pumps" in pumps
    if scale.http_key('mcp_transport = "http"', list(fleet.SECTIONS["agent"].model_fields)):
        assert "| http | 3 |" in report
    else:
        assert "Arm `http` skipped" in report
    assert "| target (issue 35) |" in report


def test_each_arm_is_printed_against_the_hosts_at_its_n() -> None:
    fleet_of = {"wall": 6.0, "rate": 20.0, "rate_spawning": 25.0, "serving_pss": 400.0}
    fleet_of |= {"supervisor_pss": 80.0, "pumps": 100.0, "per_agent": 0.8, "idle_cpu": 2.0}
    results = {"pumps": {100: fleet_of, 1000: fleet_of}, "bare": {100: fleet_of}}
    rows = scale.arm_rows(results, BASELINE)
    assert rows[2].startswith("| per-process hosts (baseline) | 100 | 60.00 s |")
    assert rows[3].startswith("| pumps | 100 | 6.00 s | 20.0/s (25.0/s) | 400 MB (80 + 100 pumps")
    assert rows[3].endswith("| 0.100× | 0.074× |")
    assert rows[4].endswith("| 0.010× (extrap.) | 0.007× (extrap.) |")
    assert rows[5].endswith("| – | – |")  # bare agents have no session to compare
