"""Identity: whatever a model passes, the center only ever hears the binding's agent id.

A hypothesis property over every catalog tool (center, runtime and local file tools): valid
arguments plus arbitrary extra keys — `agent_id`, `agentId`, case and separator variants,
zero-width and fullwidth look-alikes, Cyrillic homoglyphs, nested objects carrying `agent_id`,
and values that are themselves JSON with an `agent_id`. The proof is on the center's side:
every body it recorded (and every fork the runtime socket recorded) names `agent-1` only, and
no body carries any other identity-like key at any depth. File transfers (the `PUT` of upload
bytes and the download `GET`) carry the agent in the query string instead: every one the
center logged has `query["agent_id"] == "agent-1"`, and no query has another identity-like key.
Ids the *center* supplies are data too: a stub center answers `upload_file` with hostile
`transfer_id`s (`T1?agent_id=agent-2`, `..`, slashes, fragments, arbitrary text), and every
request the host then sends carries exactly one `agent_id=agent-1` and the id as one quoted path
segment, or the call is refused (`admin_protocol_error`) before anything else is sent.
The generation is identity too: the host runs as generation 3, and every request the center
logged, every fork the runtime socket recorded (`fork_executor` goes there, not to the center)
and `mcphost check`'s probe carry `X-AC-MCP-Generation: 3`. `mcphost check` is covered as its
own route: its one request names `agent-1` in the body and nothing else.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mcphost.catalog import CATALOG
from mcphost.catalog.model import ToolDecl
from mcphost.testing import DevCenter
from tests import thorough
from tests.hardening.conftest import ROOT, RawHost, host_env, walk_keys
from tests.host.files.stub_center import StubCenter

pytestmark = pytest.mark.timeout(300)

OTHER = "agent-2"
GENERATION = "3"  # the host's AC_MCP_GENERATION: every request must carry it
IDENTITY_KEYS = [
    "agent_id",
    "agentId",
    "AgentId",
    "AGENT_ID",
    "agent-id",
    "agentid",
    "agent",
    "agent_root",
    "worker_id",
    " agent_id",
    "agent_id ",
    "agent_id\x00",
    "agent\u200bid",
    "agent\u200b_id",
    "agent_\u200bid",
    "\ufeffagent_id",
    "\uff41\uff47\uff45\uff4e\uff54\uff3f\uff49\uff44",  # fullwidth
    "agent_\u0456d",  # Cyrillic i (U+0456)
    "\u0430gent_id",  # Cyrillic a (U+0430)
    "agent_\u0131d",  # dotless i
    "AGENT_\u0130D",  # dotted capital I
    "agent_id\u0301",
    "$agent_id",
    "agent_id.",
    "params",
    "arguments",
    "__proto__",
]
FIGURES: dict[str, int] = {
    "calls": 0,
    "refused": 0,
    "reached_center": 0,
    "bodies_checked": 0,
    "transfer_queries_checked": 0,
}

smuggled_values = st.recursive(
    st.sampled_from([OTHER, "agent-1 ", "AGENT-2", "agent\u200b-1", "*", "", "../agent-2"])
    | st.text(max_size=6),
    lambda inner: (
        st.dictionaries(st.sampled_from(IDENTITY_KEYS), inner, max_size=2)
        | st.lists(inner, max_size=2)
    ),
    max_leaves=5,
)
extras = st.dictionaries(
    st.sampled_from(IDENTITY_KEYS) | st.text(min_size=1, max_size=10), smuggled_values, max_size=3
)
tricky_strings = st.sampled_from(
    [
        OTHER,
        json.dumps({"agent_id": OTHER}),
        "agent_id=agent-2",
        "t-1",
        "p-1",
        "ident.txt",
        "a\u200bb",
    ]
) | st.text(min_size=1, max_size=12).filter(lambda s: s.strip() != "")


def normal(key: str) -> str:
    """Fold a key the way a careless server might: NFKC, casefold, drop separators/zero-widths."""
    folded = unicodedata.normalize("NFKC", key).casefold()
    return "".join(ch for ch in folded if ch.isalnum())


def identity_like(key: str) -> bool:
    folded = normal(key)
    return folded.startswith("agent") or folded.startswith("worker") or "gentid" in folded


def valid_arguments(decl: ToolDecl) -> st.SearchStrategy[dict[str, Any]]:
    schema = decl.input_schema
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for name, prop in schema["properties"].items():
        kind = prop.get("type")
        if name == "path":
            fields[name] = st.just("ident.txt")
        elif kind == "boolean":
            fields[name] = st.booleans()
        elif kind == "array":
            fields[name] = st.lists(tricky_strings, max_size=2)
        elif "enum" in prop:
            fields[name] = st.sampled_from(prop["enum"])
        else:
            fields[name] = tricky_strings
    required = set(schema.get("required", ()))
    return st.fixed_dictionaries(
        {k: v for k, v in fields.items() if k in required},
        optional={k: v for k, v in fields.items() if k not in required},
    )


calls = st.sampled_from(list(CATALOG)).flatmap(
    lambda decl: st.tuples(st.just(decl.name), valid_arguments(decl), extras)
)


def is_transfer(entry: dict[str, Any]) -> bool:
    """The file routes whose agent is in the query: `PUT .../transfer/<id>`, `GET .../<ulid>`."""
    return entry["method"] in ("PUT", "GET") and entry["route"].startswith("/admin/files/")


def generation_header(entry: dict[str, Any]) -> str | None:
    headers = {key.lower(): value for key, value in entry["headers"].items()}
    return headers.get("x-ac-mcp-generation")


def assert_center_heard_only_agent_1(center: DevCenter) -> None:
    for entry in center.requests(1000):
        assert generation_header(entry) == GENERATION, entry
        query = entry["query"]
        if is_transfer(entry):
            FIGURES["transfer_queries_checked"] += 1
            assert query.get("agent_id") == "agent-1", entry
        for key, value in query.items():
            if identity_like(key):
                assert key == "agent_id" and value == "agent-1", entry
        body = entry.get("body")
        if not isinstance(body, dict):
            continue  # a file PUT (bytes) or a request that never parsed
        FIGURES["bodies_checked"] += 1
        assert body.get("agent_id") == "agent-1", entry
        for depth, key, item in walk_keys(body):
            if identity_like(key):
                assert depth == 0 and key == "agent_id" and item == "agent-1", entry
    for fork in center.forks():
        assert fork.get("agent_id") == "agent-1", fork
        assert fork.get("generation") == GENERATION, fork


@pytest.fixture(scope="module")
def host(center: DevCenter) -> Iterator[RawHost]:
    center.agent_root.mkdir(parents=True, exist_ok=True)
    (center.agent_root / "ident.txt").write_text("identity probe\n")
    env = center.binding_env("unix", AC_MCP_TIER_TOOLS="false", AC_MCP_GENERATION=GENERATION)
    with RawHost(host_env(env)) as running:
        running.initialize()
        yield running
        print(f"\nidentity figures: {FIGURES}")


CALLS = thorough.depth(full=300, quick=60)


@pytest.mark.thorough
def test_no_argument_changes_the_identity_the_center_hears(
    center: DevCenter, host: RawHost
) -> None:
    @settings(
        max_examples=CALLS,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(calls)
    def run(case: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
        tool, arguments, extra = case
        merged = {**arguments, **extra}
        is_error, result = host.call(tool, merged)
        FIGURES["calls"] += 1
        unknown = set(merged) - set(arguments)
        if unknown:
            assert is_error and result["error"] == "invalid_arguments", (tool, merged, result)
            FIGURES["refused"] += 1
        elif not (is_error and result.get("error") == "invalid_arguments"):
            FIGURES["reached_center"] += 1
        assert "rpc_error" not in result, result
        if FIGURES["calls"] % 50 == 0:
            assert_center_heard_only_agent_1(center)

    run()
    assert_center_heard_only_agent_1(center)
    # both kinds of call are well represented: a sixth of the calls each at least
    assert FIGURES["refused"] > CALLS // 6 and FIGURES["reached_center"] > CALLS // 6, FIGURES


def test_identity_smuggling_is_refused_before_any_io(center: DevCenter, host: RawHost) -> None:
    """A refused call sends nothing: the center's log does not move."""
    before = center.requests(1000)
    for key in IDENTITY_KEYS:
        for tool in ("get_my_work", "get_task", "fork_executor", "upload_file", "search_tools"):
            args: dict[str, Any] = (
                {"task_id": "t-1"} if tool in ("get_task", "fork_executor") else {}
            )
            if tool == "upload_file":
                args = {"path": "ident.txt"}
            args[key] = {"agent_id": OTHER} if key == "params" else OTHER
            is_error, result = host.call(tool, args)
            FIGURES["calls"] += 1
            FIGURES["refused"] += 1
            assert is_error and result["error"] == "invalid_arguments", (tool, key, result)
    assert center.requests(1000) == before


def test_file_transfers_name_the_binding_agent_in_the_query(
    center: DevCenter, host: RawHost
) -> None:
    """An upload's PUT and a download's GET (found, and not found) all carry agent-1."""
    is_error, uploaded = host.call("upload_file", {"path": "ident.txt"})
    assert not is_error, uploaded
    for file in (uploaded["file_uri"], "ac://files/01" + "A" * 24):
        is_error, result = host.call(
            "download_file", {"file": file, "dest_path": "ident.copy", "overwrite": True}
        )
        assert is_error == (file != uploaded["file_uri"]), result
    transfers = [e for e in center.requests(1000) if is_transfer(e)]
    assert {e["method"] for e in transfers[-3:]} == {"PUT", "GET"}, transfers[-3:]
    assert_center_heard_only_agent_1(center)


def test_fork_executor_reaches_the_runtime_socket_as_the_binding(
    center: DevCenter, host: RawHost
) -> None:
    """The runtime socket hears the binding's agent and generation, whatever the arguments."""
    is_error, result = host.call("fork_executor", {"task_id": "t-gen", "model": "agent-2"})
    assert not is_error, result
    fork = [f for f in center.forks() if f["task_id"] == "t-gen"][-1]
    assert (fork["agent_id"], fork["generation"]) == ("agent-1", GENERATION), fork
    assert_center_heard_only_agent_1(center)


def test_mcphost_check_probes_as_the_binding(center: DevCenter) -> None:
    """`mcphost check`: its one request is the binding's agent and generation, nothing else."""
    before = center.requests(1)  # the log keeps 1,000 entries: compare its tail, not its length
    env = host_env(center.binding_env("unix", AC_MCP_GENERATION=GENERATION))
    proc = subprocess.run(
        [sys.executable, "-m", "mcphost.cli", "check", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    tail = center.requests(len(before) + 1)
    assert tail[: len(before)] == before, "check sent more than one request"
    sent = tail[len(before) :]
    assert [(e["method"], e["route"]) for e in sent] == [
        ("POST", "/admin/agent-tools/get_my_work")
    ], sent
    assert sent[0]["body"] == {"agent_id": "agent-1"} and sent[0]["query"] == {}, sent
    assert_center_heard_only_agent_1(center)


HOSTILE_TRANSFER_IDS = [
    "T1?agent_id=agent-2",
    "T1&agent_id=agent-2",
    "T1;agent_id=agent-2",
    "T1#agent_id=agent-2",
    "..",
    ".",
    "T1/../../agent-tools/delete_task",
    "T1/complete",
    "%2e%2e",
    "T1%3Fagent_id%3Dagent-2",
    "T1 agent_id=agent-2",
    "T1\r\nX-Agent: agent-2",
    "\u0000",
    "T1.ok:2~x-y_z",
]


def split_raw(entry: dict[str, Any]) -> tuple[str, list[str], str]:
    """(method, path segments each percent-decoded, raw query) of a request as it arrived."""
    path, _, query = entry["raw_path"].partition("?")
    return entry["method"], [unquote(segment) for segment in path.split("/")], query


@pytest.mark.thorough
def test_center_supplied_transfer_ids_stay_one_path_segment() -> None:
    """The PUT and complete URLs the host builds from a center-given `transfer_id`."""
    short = Path(tempfile.mkdtemp(prefix="ident-", dir="/tmp"))  # short Unix socket path
    (short / "root").mkdir()
    (short / "root" / "ident.txt").write_text("identity probe\n")
    outcomes = {"refused": 0, "sent": 0}
    try:
        with (
            StubCenter.start(short / "center.sock") as stub,
            RawHost(host_env(stub.binding_env(short / "root"))) as host,
        ):
            host.initialize()

            def check(transfer_id: str) -> None:
                stub.transfer_id = transfer_id
                seen = len(stub.seen())
                is_error, result = host.call("upload_file", {"path": "ident.txt"})
                sent = stub.seen()[seen:]
                assert sent[0]["raw_path"] == "/admin/agent-tools/upload_file", sent
                route = ["", "admin", "files", "transfer", transfer_id]
                expected = [
                    ("PUT", route, "agent_id=agent-1"),
                    ("POST", [*route, "complete"], ""),
                ]
                later = [split_raw(entry) for entry in sent[1:]]
                if later:
                    assert later == expected, (transfer_id, later)
                    assert sent[1]["query"] == [("agent_id", "agent-1")], sent[1]
                    assert not is_error, result
                    outcomes["sent"] += 1
                else:
                    assert is_error and result["error"] == "admin_protocol_error", result
                    assert result["details"]["transfer_id"] == transfer_id[:200], result
                    outcomes["refused"] += 1

            run = given(st.sampled_from(HOSTILE_TRANSFER_IDS) | st.text(min_size=1, max_size=16))(
                check
            )
            for hostile in HOSTILE_TRANSFER_IDS:
                run = example(hostile)(run)
            settings(max_examples=thorough.depth(full=200, quick=40), deadline=None)(run)()
            host.alive()
    finally:
        shutil.rmtree(short, ignore_errors=True)
    print(f"\ntransfer id figures: {outcomes}")
    assert outcomes["refused"] >= len(HOSTILE_TRANSFER_IDS) - 1 and outcomes["sent"] > 0
