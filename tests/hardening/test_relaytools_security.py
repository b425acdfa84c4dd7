"""Relay tools: identity, PSK hygiene and stdout purity of the real `mcphost relay-tools` process.

One long-lived server per test, driven over raw JSON-RPC (`RawHost`, which records every stdout
line and all of stderr) against the relay harness's fake relay, run on an event loop in a
background thread so the synchronous driver and hypothesis can share it.

- Identity (hypothesis): for every one of the nine tools, valid arguments plus identity-like
  extra fields (`requester_session`, `sender`, `principal_id` where it is not declared, `session`,
  `bundle`, `agent_id`, separator/case/zero-width/fullwidth/Cyrillic look-alikes), at the top
  level or nested under `args`, are refused with a `validation_*` -32602 error and send no frame
  (no request, no Hello). Every frame the relay did receive carries `requester_session` "alpha"
  (when it has one) on a connection whose Hello named `alpha@party`; no other identity-like key
  reaches the relay.
- Secrets: with `<state>/bundles/party/sessions/alpha/identity.psk` present and debug logging,
  every error path (relay down, stale socket, Hello never acknowledged, Hello rejected, relay
  errors for every operation, request timeouts, unexpected response kinds, a revocation frame, a
  dropped connection, bad arguments) leaves the PSK (and its last 16 characters) out of stdout,
  stderr, every inscriptions file and every tool result. It reaches the relay in Hello frames only.
- stdout purity: under those paths every stdout line is strict JSON-RPC 2.0.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import threading
import unicodedata
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcphost.testing.relayharness import Env, FakeRelay, cleanup, make_env, relay_error
from tests import thorough
from tests.hardening.conftest import ROOT, RawHost, walk_keys

# deep (make test-slow): the relay tools' identity and PSK handling.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(120)]

T = TypeVar("T")
TOOLS = ("list", "help", "send", "look", "raww", "choose", "updown", "new", "change")
META_ARGS = {  # meta-tool -> the fields its `args` declares
    "list": {"namespace"},
    "updown": set(),
    "new": {"principal_id", "scope", "output_path", "write_to_config"},
    "change": {"principal_id", "output_path", "write_to_config"},
}
IDENTITY_KEYS = [
    "requester_session",
    "requesterSession",
    "RequesterSession",
    "REQUESTER_SESSION",
    "requester-session",
    "requester",
    "sender",
    "Sender",
    "sender_session",
    "from",
    "principal_id",
    "principal",
    "principalId",
    "session",
    "session_name",
    "session_id",
    "bundle",
    "bundle_name",
    "namespace",
    "agent_id",
    "identity",
    "identity_token",
    "decided_by",
    " requester_session",
    "requester_session ",
    "requester\u200b_session",
    "requester_\u200bsession",
    "\ufeffsender",
    "send\u200ber",
    "principal\u200d_id",
    "\uff53\uff45\uff4e\uff44\uff45\uff52",  # fullwidth "sender"
    "\uff52\uff45\uff51\uff55\uff45\uff53\uff54\uff45\uff52_session",  # fullwidth "requester"
    "s\u0435nder",  # Cyrillic e (U+0435)
    "requ\u0435ster_session",
    "sess\u0456on",  # Cyrillic i (U+0456)
    "bundl\u0435",
    "requester_session\u0301",
]
STOLEN = ["mallory", "mallory@party", "bravo", "bravo@party", "user@GLOBAL", "alpha@zeta", ""]
FIGURES: dict[str, int] = {
    "inputs": 0,
    "refused": 0,
    "refused_under_args": 0,
    "reached_relay": 0,
    "frames_checked": 0,
    "hellos_checked": 0,
}

# -- the fake relay on a background loop ---------------------------------------------------


class RelayLoop:
    """An asyncio loop in a daemon thread: the fake relay lives there, tests stay synchronous."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


SUCCESS: dict[str, dict[str, Any]] = {
    "send": {"kind": "send", "schema_version": "1", "results": []},
    "look": {"kind": "look", "schema_version": "1", "snapshot_lines": []},
    "raww": {"kind": "raww", "schema_version": "1", "status": "accepted"},
    "choices_list": {"kind": "choices_list", "schema_version": "1", "pending_requests": []},
    "choices_pick": {"kind": "choices_pick", "schema_version": "1", "status": "resolved"},
    "up": {"kind": "bundle_transition", "schema_version": "1", "action": "up"},
    "down": {"kind": "bundle_transition", "schema_version": "1", "action": "down"},
    "new_peer": {"kind": "new_peer", "schema_version": "1", "principal_type": "peer"},
    "change_psk": {"kind": "change_psk", "schema_version": "1"},
}


def succeed(frame: dict[str, Any]) -> Any:
    """Every operation succeeds (`list` falls through to the harness's default answer)."""
    return SUCCESS.get(frame["request"]["operation"], ...)


def server(env: Env, **extra: str) -> RawHost:
    args = ["-m", "mcphost.cli", "relay-tools", *env.args()]
    return RawHost(env.process_env(PYTHONPATH=str(ROOT), **extra), args=args)


# -- identity ------------------------------------------------------------------------------

tricky = st.sampled_from(
    ["mallory", "mallory@party", '{"requester_session": "mallory"}', "sender=mallory", "a\u200bb"]
) | st.text(min_size=1, max_size=12).filter(lambda s: s.strip() != "")
destinations: st.SearchStrategy[dict[str, Any]] = st.sampled_from(
    [{}, {"output_path": "/tmp/w.psk"}, {"write_to_config": True}, {"write_to_config": False}]
)


def valid_calls(tool: str) -> st.SearchStrategy[dict[str, Any]]:
    """Arguments the tool accepts, with caller-chosen values that look like identities."""
    if tool == "list":
        namespaces = st.sampled_from([None, "party", "GLOBAL", "*", "zeta"])
        return st.one_of(
            namespaces.map(
                lambda ns: {
                    "command": "principals",
                    "args": {} if ns is None else {"namespace": ns},
                }
            ),
            st.just({"command": "decisions"}),
        )
    if tool == "help":
        return st.sampled_from([{}, {"query": "send"}, {"query": "list.principals"}])
    if tool == "send":
        return st.fixed_dictionaries(
            {"message": tricky},
            optional={"request_id": tricky},
        ).flatmap(
            lambda a: st.one_of(
                st.lists(tricky, min_size=1, max_size=2).map(lambda t: {**a, "targets": t}),
                st.just({**a, "broadcast": True}),
            )
        )
    if tool == "look":
        return st.fixed_dictionaries(
            {"target_session": st.sampled_from(["bravo@party", "mallory@party"])},
            optional={"lines": st.integers(1, 1000)},
        )
    if tool == "raww":
        return st.fixed_dictionaries(
            {"target_session": st.just("bravo@party"), "text": tricky},
            optional={"no_enter": st.booleans(), "request_id": tricky},
        )
    if tool == "choose":
        return st.one_of(
            st.fixed_dictionaries({"choice_request_id": tricky, "outcome": st.just("cancelled")}),
            st.fixed_dictionaries(
                {"choice_request_id": tricky, "outcome": st.just("selected"), "option_id": tricky}
            ),
        )
    if tool == "updown":
        return st.sampled_from([{"command": "up"}, {"command": "down", "args": {}}])
    command = "peer" if tool == "new" else "psk"
    return st.tuples(tricky, destinations).map(
        lambda pd: {"command": command, "args": {"principal_id": pd[0], **pd[1]}}
    )


smuggled: st.SearchStrategy[Any] = st.sampled_from(STOLEN) | st.sampled_from(
    [None, {"requester_session": "mallory"}, ["mallory@party"], 7, True]
)
extras = st.dictionaries(st.sampled_from(IDENTITY_KEYS), smuggled, min_size=1, max_size=3)


@st.composite
def calls(draw: st.DrawFn) -> tuple[str, dict[str, Any], dict[str, Any] | None, bool]:
    """(tool, arguments, the smuggled extras or None, whether they went under `args`)."""
    tool = draw(st.sampled_from(TOOLS))
    arguments = draw(valid_calls(tool))
    if draw(st.integers(0, 3)) == 0:
        return tool, arguments, None, False
    extra = draw(extras)
    if tool in META_ARGS and draw(st.booleans()):
        extra = {k: v for k, v in extra.items() if k not in META_ARGS[tool]}
        if extra:
            arguments = {**arguments, "args": {**(arguments.get("args") or {}), **extra}}
            return tool, arguments, extra, True
        extra = {"sender": "mallory"}
    if tool not in META_ARGS and draw(st.booleans()):
        extra = {"args": dict(extra)}  # non-meta tools take no `args` at all
    return tool, {**arguments, **extra}, extra, False


def normal(key: str) -> str:
    folded = unicodedata.normalize("NFKC", key).casefold()
    return "".join(ch for ch in folded if ch.isalnum())


def identity_like(key: str) -> bool:
    folded = normal(key)
    return any(
        word in folded
        for word in ("session", "sender", "principal", "bundle", "agent", "requester", "identity")
    )


def check_frames(relay: FakeRelay, start: int) -> None:
    """Frames from `start` on speak for alpha only; every Hello so far named alpha@party."""
    for hello in relay.hellos:
        assert hello["principal_id"] == "alpha@party", hello
    FIGURES["hellos_checked"] = len(relay.hellos)
    for frame in relay.requests[start:]:
        FIGURES["frames_checked"] += 1
        assert set(frame) <= {"frame", "request_id", "namespace", "request"}, frame
        request = frame["request"]
        operation = request["operation"]
        if operation == "list":
            assert frame["namespace"] in ("party", "GLOBAL", "alpha", "zeta"), frame
        else:
            assert frame.get("namespace") in (None, "party"), frame
        for depth, key, item in walk_keys(request):
            if not identity_like(key):
                continue
            declared = depth == 0 and (
                (key == "requester_session" and item == "alpha")
                or (key == "principal_id" and operation in ("new_peer", "change_psk"))
                or (key == "target_session" and operation in ("look", "raww"))
            )
            assert declared, (key, frame)
        if operation in ("list", "send", "look", "raww"):
            assert request["requester_session"] == "alpha", frame


@pytest.fixture(scope="module")
def relay_loop() -> Iterator[RelayLoop]:
    loop = RelayLoop()
    yield loop
    loop.close()


CALLS = thorough.depth(full=500, quick=100)


@pytest.mark.thorough
def test_no_argument_changes_the_identity_the_relay_hears(relay_loop: RelayLoop) -> None:
    env = make_env()
    relay = relay_loop.run(FakeRelay(env.socket, handler=succeed).start())
    try:
        with server(env) as host:
            host.initialize()

            @settings(
                max_examples=CALLS,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            )
            @given(calls())
            def run(case: tuple[str, dict[str, Any], dict[str, Any] | None, bool]) -> None:
                tool, arguments, extra, nested = case
                FIGURES["inputs"] += 1
                frames, hellos = len(relay.requests), len(relay.hellos)
                answer = host.rpc("tools/call", {"name": tool, "arguments": arguments})
                if extra is not None:
                    error = answer.get("error")
                    assert error is not None, (tool, arguments, answer)
                    assert error["code"] == -32602, (tool, arguments, error)
                    assert error["data"]["code"].startswith("validation_"), error
                    assert (len(relay.requests), len(relay.hellos)) == (frames, hellos)
                    FIGURES["refused"] += 1
                    FIGURES["refused_under_args"] += nested or "args" in extra
                    return
                assert "result" in answer, (tool, arguments, answer)
                if len(relay.requests) > frames:
                    FIGURES["reached_relay"] += 1
                check_frames(relay, frames)

            run()
            for tool in TOOLS:  # every tool, every key, deterministically, on top of the search
                for key in IDENTITY_KEYS:
                    base = {"list": {"command": "principals"}, "updown": {"command": "up"}}
                    arguments = {**base.get(tool, {}), key: "mallory"}
                    frames, hellos = len(relay.requests), len(relay.hellos)
                    error = host.rpc("tools/call", {"name": tool, "arguments": arguments})["error"]
                    assert (error["code"], error["data"]["code"]) == (
                        -32602,
                        "validation_invalid_params",
                    ), (tool, key, error)
                    assert (len(relay.requests), len(relay.hellos)) == (frames, hellos)
                    FIGURES["inputs"] += 1
                    FIGURES["refused"] += 1
            check_frames(relay, 0)
            assert host.bad_lines == []
            assert host.close() == 0
        print(f"\nrelay identity figures: {FIGURES}")
        # both kinds of call are well represented (500 calls: over 300 refused, 50 relayed)
        assert FIGURES["refused"] > CALLS * 3 // 5 and FIGURES["reached_relay"] > CALLS // 10, (
            FIGURES
        )
        assert relay.hellos, "no valid call reached the relay"
    finally:
        relay_loop.run(relay.stop())
        cleanup(env)


# -- secrets and stdout purity -------------------------------------------------------------

RELAY_BACKED: list[tuple[str, dict[str, Any]]] = [
    ("list", {"command": "principals"}),
    ("list", {"command": "principals", "args": {"namespace": "zeta"}}),
    ("list", {"command": "decisions"}),
    ("send", {"message": "hi", "targets": ["bravo"]}),
    ("look", {"target_session": "bravo@party"}),
    ("raww", {"target_session": "bravo@party", "text": "y"}),
    ("choose", {"choice_request_id": "c-1", "outcome": "cancelled"}),
    ("updown", {"command": "up"}),
    ("new", {"command": "peer", "args": {"principal_id": "w@party"}}),
    ("change", {"command": "psk", "args": {"principal_id": "w@party", "write_to_config": True}}),
]
BAD_ARGS: list[tuple[str, dict[str, Any]]] = [
    ("send", {"message": " ", "targets": ["bravo"]}),
    ("send", {"message": "x", "requester_session": "mallory"}),
    ("look", {"target_session": "bravo@party", "lines": 0}),
    ("raww", {"target_session": "bravo@party", "text": 5}),
    ("choose", {"choice_request_id": "c", "outcome": "selected"}),
    (
        "new",
        {
            "command": "peer",
            "args": {"principal_id": "w", "output_path": "", "write_to_config": True},
        },
    ),
    ("change", {"command": "psk", "args": "identity.psk"}),
    ("list", {"command": "principals", "args": {"namespace": "../bundles/party/sessions"}}),
    ("help", {"query": "identity.psk"}),
    ("nosuchtool", {}),
]


async def silent_server(path: Path) -> asyncio.AbstractServer:
    """Accepts connections and reads, never answering (not even the Hello)."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.read(4096):
            pass
        writer.close()

    return await asyncio.start_unix_server(hold, path=str(path))


async def stop_server(server: asyncio.AbstractServer, path: Path) -> None:
    server.close()
    path.unlink(missing_ok=True)


def test_the_psk_never_leaves_the_hello(relay_loop: RelayLoop) -> None:
    env = make_env()
    psk = "psk-" + secrets.token_urlsafe(32)
    psk_file = env.state / "bundles/party/sessions/alpha/identity.psk"
    psk_file.parent.mkdir(parents=True)
    psk_file.write_text(psk + "\n")
    psk_file.chmod(0o600)
    answers: list[dict[str, Any]] = []
    relays: list[FakeRelay] = []
    try:
        with server(
            env,
            MCPHOST_LOG_LEVEL="debug",
            MCPHOST_RELAY_REQUEST_TIMEOUT_MS="300",
            MCPHOST_RELAY_HELLO_TIMEOUT_MS="300",
        ) as host:
            host.initialize()

            def drive(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
                out = [host.rpc("tools/call", {"name": n, "arguments": a}) for n, a in calls]
                answers.extend(out)
                return out

            def codes(out: list[dict[str, Any]]) -> set[str]:
                return {a["error"]["data"]["code"] for a in out if "error" in a}

            # bad arguments, before any relay exists
            assert codes(drive(BAD_ARGS)) <= {
                "validation_invalid_params",
                "validation_invalid_arguments",
                "validation_invalid_lines",
            }
            # relay down: no socket, then a stale socket nobody listens on
            assert "relay_unavailable" in codes(drive(RELAY_BACKED))
            stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            stale.bind(str(env.socket))
            assert "relay_unavailable" in codes(drive(RELAY_BACKED))
            stale.close()
            env.socket.unlink()
            # a relay that never acknowledges the Hello
            silent = relay_loop.run(silent_server(env.socket))
            assert codes(drive(RELAY_BACKED[:3])) == {"relay_timeout"}
            relay_loop.run(stop_server(silent, env.socket))
            # a relay that rejects the Hello
            relay = relay_loop.run(FakeRelay(env.socket).start())
            relays.append(relay)
            relay.hello_reply = {
                "frame": "response",
                "response": relay_error(
                    "runtime_identity_rejected", "identity token rejected for alpha@party"
                ),
            }
            assert codes(drive(RELAY_BACKED)) == {"runtime_identity_rejected"}
            relay.hello_reply = None
            # relay errors for every operation, with details
            relay.handler = lambda frame: relay_error(
                "authorization_forbidden",
                "request denied by authorization policy",
                {"capability": frame["request"]["operation"], "requester_session": "alpha@party"},
            )
            assert codes(drive(RELAY_BACKED)) == {"authorization_forbidden"}
            # unexpected response kinds (echoed back in details.response)
            relay.handler = lambda frame: {"kind": "mystery", "request": frame["request"]}
            assert codes(drive(RELAY_BACKED)) == {"internal_unexpected_failure"}
            # request timeouts: the relay never answers
            relay.handler = lambda frame: None
            assert codes(drive(RELAY_BACKED[2:5])) == {"relay_timeout"}
            # a connection-level revocation frame (no request_id) fails the waiters
            revoked = relay_error("runtime_identity_revoked", "identity revoked")

            async def revoke(frame: dict[str, Any]) -> Any:
                for writer in relay._writers:
                    frame_out = {"frame": "response", "response": revoked}
                    writer.write(json.dumps(frame_out).encode() + b"\n")
                return None

            relay.handler = revoke
            assert codes(drive(RELAY_BACKED[3:4])) == {"runtime_identity_revoked"}

            # a connection dropped mid-call
            async def drop(frame: dict[str, Any]) -> Any:
                await relay.drop_connections()
                return None

            relay.handler = drop
            assert "relay_unavailable" in codes(drive(RELAY_BACKED[3:6]))
            # and a healthy relay again, so success results are checked too
            relay.handler = succeed
            assert codes(drive(RELAY_BACKED)) == set()
            drive(BAD_ARGS)
            assert host.close() == 0

            hellos = [h for r in relays for h in r.hellos]
            assert hellos and {h["identity_token"] for h in hellos} == {psk}
            frames = [f for r in relays for f in r.requests]
            assert frames and not any(psk in str(f) for f in frames)
            inscriptions = [p for p in env.state.rglob("*") if p.is_file() and p != psk_file]
            assert inscriptions, "nothing was inscribed"
            outputs = {"stdout+stderr": host.all_output(), "answers": str(answers).encode()}
            outputs.update({str(p): p.read_bytes() for p in inscriptions})
            for name, data in outputs.items():
                for needle in (psk, psk[-16:]):
                    assert needle.encode() not in data, f"PSK in {name}"
            assert host.bad_lines == []
            assert all(m.get("jsonrpc") == "2.0" for m in host.messages)
            assert b"Traceback" not in bytes(host.stderr)
            print(
                f"\nrelay secret figures: {len(answers)} calls, {len(hellos)} hellos, "
                f"{len(frames)} frames, {len(outputs)} outputs scanned, "
                f"{len(host.messages)} stdout lines, {len(host.stderr)} stderr bytes, 0 leaks"
            )
    finally:
        for relay in relays:
            relay_loop.run(relay.stop())
        cleanup(env)
