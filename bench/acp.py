"""ACP member against tmux member, one real relay, one run: `send` -> turn start, and `look`.

The bundle `bench` has three members on one relay (`RelayBehaviour` + `RelayServer` on a real
Unix socket, the supervisor's timings: 750 ms quiet window, 50 ms polls), hosted by the real
`TmuxHost` of mcphost/testing/realrelay.py:
- `agent`: ACP, the stdlib stand-in ACP agent (mcphost/testing/acp_agent.py) as an `AcpProcess`
  (piped stdio, an `AcpSession`), run through bench/peers/acp_stamped.py, which stamps the moment
  each `session/prompt` line is read (before the stand-in parses it);
- `pane`: tmux, a stand-in that prints `> ` and echoes each line (bench/peers/stamped_prompt.py;
  the coder's `prompt-regex` matches its prompt, so the readiness gate is real) and stamps the
  moment it reads the relay's Enter after an envelope;
- `lead`: tmux, the sender: its requests go over the relay socket with our relay client
  (`RelayStream`, socket trust vouched by the kernel: the peer must be this very process).

1. `send` -> turn start, per target, N sends each, alternating ACP and tmux (each delivered and
   settled before the next): from just before the `send` request is written, (a) to the relay
   recording the outcome `delivered` (ACP: the `session/prompt` frame written; tmux: the gate
   passed, the paste and the Enter done), stamped by the outcomes map itself, and (b) to the
   target reading it (ACP: the stand-in reads the `session/prompt` line; tmux: the stand-in
   reads the Enter). Stamps are `time.monotonic()` (CLOCK_MONOTONIC, one clock for all
   processes), so polling only decides when the bench looks, not the figure.
2. `look` with `lines` 1000 and 50: the ACP member's buffer filled to its 1000-entry cap through
   the wire (one turn of `ACP-UPDATE:` lines: agent chunks, thoughts and tool calls completed by
   their updates, each entry one ~80-character line of text) against the tmux pane filled with
   lines of the same text (a `fill` line in a sent message), each line one row of its 80-column
   pane; M looks each, alternating. The response sizes are reported beside the times.

Alone: `python -m bench.acp` (~30 s). `BENCH_ACP_SENDS` (default 20) and `BENCH_ACP_LOOKS`
(default 200) set N and M.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from bench.harness import Stats
from bench.relay_real import percentile

SENDS = int(os.environ.get("BENCH_ACP_SENDS", "20"))
LOOKS = int(os.environ.get("BENCH_ACP_LOOKS", "200"))
WARMUP_SENDS = 2
WARMUP_LOOKS = 20
GUARD = 60.0  # only a hang reaches it
BUFFER_CAP = 1000
FILL = 1100  # more than the cap, so the prompt's own `user` entry is evicted too
# one line of an 80-column pane with its `line NNNN: ` prefix; each ACP entry's text is the same
TEXT = "the quick brown fox jumps over the lazy dog, then the dog sleeps on"

PEERS = Path(__file__).with_name("peers")
TARGETS = {"acp": "agent@bench", "tmux": "pane@bench"}


def config_tree(root: Path, stamps: Path) -> tuple[Path, Path]:
    """(configuration root, state root): the bundle `bench` (module doc)."""
    config, state, work = root / "config", root / "state", root / "work"
    for path in (config / "bundles", state, work):
        path.mkdir(parents=True, mode=0o700)
    python = shlex.quote(sys.executable)
    pane = f"{python} -u {shlex.quote(str(PEERS / 'stamped_prompt.py'))} {shlex.quote(str(stamps))}"
    acp = f"{sys.executable} {PEERS / 'acp_stamped.py'} {stamps}"  # split on whitespace
    if any(c.isspace() for c in acp.split(" ", 2)[0] + str(PEERS) + str(stamps)):
        raise RuntimeError(f"an ACP command cannot hold spaces in its paths: {acp!r}")
    (config / "coders.toml").write_text(
        'format-version = 1\n\n[[coders]]\nid = "pane"\n[coders.tmux]\n'
        f"initial-command = {pane!r}\n"
        "prompt-regex = '^>\\s*$'\nprompt-inspect-lines = 1\n"
        '\n[[coders]]\nid = "acp"\n[coders.acp]\nchannel = "stdio"\n'
        f"command = {acp!r}\n"
    )
    members = "".join(
        f'\n[[sessions]]\nid = "{member}"\ndirectory = "{work}"\ncoder = "{coder}"\n'
        for member, coder in (("lead", "pane"), ("pane", "pane"), ("agent", "acp"))
    )
    (config / "bundles" / "bench.toml").write_text("format-version = 1\n" + members)
    return config, state


class StampedOutcomes(OrderedDict[str, dict[str, Any]]):
    """The relay's outcomes map, noting when each outcome was recorded (`time.monotonic()`)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, float] = {}

    def __setitem__(self, key: str, value: dict[str, Any]) -> None:
        self.at.setdefault(key, time.monotonic())
        super().__setitem__(key, value)


class Stamps:
    """The stand-ins' receipt stamps: `<message id> <monotonic>` lines, read as they grow."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.at: dict[str, float] = {}
        self._read = 0

    def get(self, message_id: str) -> float | None:
        if message_id not in self.at and self.path.exists():
            with self.path.open("rb") as stamps:
                stamps.seek(self._read)
                data = stamps.read()
            complete = data[: data.rfind(b"\n") + 1]
            self._read += len(complete)
            for line in complete.decode().splitlines():
                key, value = line.split()
                self.at[key] = float(value)
        return self.at.get(message_id)


async def until(predicate: Any, what: str, poll: float = 0.002) -> None:
    deadline = time.monotonic() + GUARD
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {GUARD:g} s")
        await asyncio.sleep(poll)


def fill_message() -> str:
    """A message whose turn adds more than the cap of ~100-character entries to the buffer:
    an agent chunk, a thought, and a tool call completed by its update, in turn."""
    lines = []
    for i in range(FILL):
        text = {"type": "text", "text": f"entry {i:04d}: {TEXT}"}
        match i % 3:
            case 0:
                update: dict[str, Any] = {"sessionUpdate": "agent_message_chunk", "content": text}
            case 1:
                update = {"sessionUpdate": "agent_thought_chunk", "content": text}
            case _:
                call = f"call-{i}"
                update = {
                    "sessionUpdate": "tool_call",
                    "toolCallId": call,
                    "title": f"run step {i}",
                    "kind": "execute",
                    "status": "pending",
                    "rawInput": {"command": f"echo {i}"},
                }
                lines.append("ACP-UPDATE: " + json.dumps(update))
                update = {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call,
                    "status": "completed",
                    "content": [{"type": "content", "content": text}],
                }
        lines.append("ACP-UPDATE: " + json.dumps(update))
    return "\n".join(lines)


def fmt_ratio(acp: float, tmux: float) -> str:
    return f"{acp / tmux:.3g}×" if tmux else "n/a"


async def section(out: list[str]) -> None:
    if shutil.which("tmux") is None:
        out += ["## 6c. ACP member against tmux member: skipped (no tmux)", ""]
        return
    from mcphost.agentmux.bundlefile import require_bundle
    from mcphost.agentmux.wire import SOCKET_TRUST
    from mcphost.peer import PeerCred
    from mcphost.relay.behaviour import RelayBehaviour
    from mcphost.relay.server import RelayServer
    from mcphost.relaytools.stream import RelayStream
    from mcphost.testing.realrelay import TmuxHost

    root = Path(tempfile.mkdtemp(prefix="acpb-", dir="/tmp"))  # short: tmux.sock fits sun_path
    stamps_path = root / "stamps.log"
    config, state = config_tree(root, stamps_path)
    host = TmuxHost(state)

    def socket_trust(principal_id: str, cred: PeerCred | None) -> bool:
        # the kernel's word: the peer is this very process, as lead
        return (
            principal_id == "lead@bench"
            and cred is not None
            and cred.uid == os.geteuid()
            and cred.pid == os.getpid()
        )

    relay = RelayBehaviour([config], state, host, socket_trust=socket_trust)
    outcomes = StampedOutcomes()
    relay.state.outcomes = outcomes
    server = RelayServer(
        str(state / "relay.sock"),
        authenticate=relay.authenticate,
        handle=relay.handle,
        registry=relay.connections,
    )
    stream = RelayStream(
        str(state / "relay.sock"), "lead@bench", lambda: SOCKET_TRUST, request_timeout=GUARD
    )
    stamps = Stamps(stamps_path)
    load_before = os.getloadavg()
    quiet = contextlib.ExitStack()  # the relay's event records go to a file, off the report
    events_log = quiet.enter_context(open(root / "relay-events.log", "w"))  # noqa: SIM115
    quiet.enter_context(contextlib.redirect_stderr(events_log))
    try:
        bundle = require_bundle([config], "bench")
        await host.up(bundle)
        await server.start()
        tmux = host.servers["bench"]
        agent = host.acp[("bench", "agent")]

        def session() -> Any:
            assert agent.session is not None
            return agent.session

        for member in ("lead", "pane"):
            screen: list[str] = []

            async def prompted(member: str = member) -> bool:
                nonlocal screen
                screen = await tmux.capture(f"bench-{member}")
                return any(line.startswith(">") for line in screen)

            deadline = time.monotonic() + GUARD
            while not await prompted():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{member}'s stand-in never prompted: {screen[-5:]}")
                await asyncio.sleep(0.02)

        async def send(kind: str, message: str) -> str:
            reply = await stream.request(
                {
                    "operation": "send",
                    "requester_session": "lead",
                    "message": message,
                    "targets": [TARGETS[kind]],
                }
            )
            [result] = reply["results"]
            if result["outcome"] != "queued":
                raise RuntimeError(f"send to {kind}: {reply}")
            return str(result["message_id"])

        async def settled() -> None:
            await relay.drain()
            await asyncio.wait_for(session().turn_done.wait(), GUARD)

        # 1. send -> turn start
        handed: dict[str, list[float]] = {"acp": [], "tmux": []}
        read: dict[str, list[float]] = {"acp": [], "tmux": []}
        for i in range(WARMUP_SENDS + SENDS):
            for kind in ("acp", "tmux") if i % 2 == 0 else ("tmux", "acp"):
                started = time.monotonic()
                message_id = await send(kind, f"task {i} for {kind}")
                await until(lambda m=message_id: m in outcomes.at, f"send {i} to {kind}: outcome")
                if outcomes[message_id]["outcome"] != "delivered":
                    raise RuntimeError(f"send {i} to {kind}: {outcomes[message_id]}")
                try:
                    await until(lambda m=message_id: stamps.get(m) is not None, "the stamp")
                except RuntimeError:
                    screen = await tmux.capture("bench-pane", 60)
                    raise RuntimeError(
                        f"send {i} to {kind} ({message_id}): delivered, never read; "
                        f"stamps {stamps.at}; pane: {screen}"
                    ) from None
                if i >= WARMUP_SENDS:
                    handed[kind].append(outcomes.at[message_id] - started)
                    read[kind].append((stamps.get(message_id) or 0.0) - started)
                await settled()

        # 2. look: fill both, then M looks each at lines 1000 and 50
        filled = await send("acp", fill_message())
        await until(lambda: filled in outcomes.at, "the filling turn delivered")
        await settled()
        await send("tmux", f"fill {FILL} {TEXT}")
        await settled()
        await until(lambda: session().entries.total == BUFFER_CAP, "the ACP buffer full", poll=0.02)
        pane_lines = 0
        deadline = time.monotonic() + GUARD
        while pane_lines < BUFFER_CAP:
            pane_lines = len(await tmux.capture("bench-pane", BUFFER_CAP))
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pane holds {pane_lines} lines, not {BUFFER_CAP}")
            await asyncio.sleep(0.02)

        async def look(kind: str, lines: int) -> tuple[float, int, int]:
            body = {
                "operation": "look",
                "requester_session": "lead",
                "target_session": TARGETS[kind],
                "lines": lines,
            }
            started = time.perf_counter()
            reply = await stream.request(body)
            elapsed = time.perf_counter() - started
            count = len(reply.get("snapshot_entries") or reply.get("snapshot_lines") or [])
            if count != lines:
                raise RuntimeError(f"look {kind} lines={lines}: {count} returned: {reply}"[:500])
            return elapsed, count, len(json.dumps(reply))

        looks: dict[tuple[str, int], list[float]] = {}
        sizes: dict[tuple[str, int], int] = {}
        for lines in (BUFFER_CAP, 50):
            for i in range(WARMUP_LOOKS + LOOKS):
                for kind in ("acp", "tmux") if i % 2 == 0 else ("tmux", "acp"):
                    elapsed, _, size = await look(kind, lines)
                    if i >= WARMUP_LOOKS:
                        looks.setdefault((kind, lines), []).append(elapsed)
                        sizes[(kind, lines)] = size
        entries_total = session().entries.total
    finally:
        await stream.aclose()
        await relay.aclose()
        await server.aclose()
        for bundle_id in list(host.servers):
            await host.down(require_bundle([config], bundle_id))
        quiet.close()
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()

    def ms(stats: Stats) -> str:
        return stats.fmt()

    out += [
        "## 6c. ACP member against tmux member, one relay "
        "(`send` → turn start; `look` with 1000 entries / lines)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · load average (1 min) "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after · relay with the supervisor's "
        "timings (readiness gate: 750 ms quiet window, 50 ms polls) · stand-in agents · "
        f"{SENDS} sends per target after {WARMUP_SENDS} warm-up, alternating · "
        f"{LOOKS} looks per row after {WARMUP_LOOKS} warm-up, alternating",
        "",
        "| `send` (socket request) → | ACP `agent` | tmux `pane` | ACP ÷ tmux |",
        "|---|---|---|---|",
    ]
    for label, samples in (
        (
            "relay records `delivered` (ACP: `session/prompt` written; tmux: gate, paste, Enter)",
            handed,
        ),
        ("target reads it (ACP: the prompt frame; tmux: the Enter)", read),
    ):
        acp_stats, tmux_stats = Stats.of(samples["acp"]), Stats.of(samples["tmux"])
        out.append(
            f"| {label} | {ms(acp_stats)} | {ms(tmux_stats)} | "
            f"{fmt_ratio(acp_stats.median, tmux_stats.median)} |"
        )
    floor = Stats.of(handed["tmux"]).median - relay.state.quiet_ms / 1000
    out += [
        "",
        f"tmux's floor is the readiness gate's quiet window ({relay.state.quiet_ms} ms, the "
        f"pane idle before the send): `delivered` came {floor * 1000:.1f} ms (median) after it.",
        "",
        "| `look`, `lines` | ACP p50 (IQR) | ACP p90 | tmux p50 (IQR) | tmux p90 | "
        "ACP ÷ tmux p50 | ÷ p90 | response bytes ACP / tmux |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for lines in (BUFFER_CAP, 50):
        a, t = looks[("acp", lines)], looks[("tmux", lines)]
        sa, st = Stats.of(a), Stats.of(t)
        pa, pt = percentile(a, 0.90), percentile(t, 0.90)
        out.append(
            f"| {lines} | {ms(sa)} | {pa * 1000:.2f} ms | {ms(st)} | {pt * 1000:.2f} ms | "
            f"{fmt_ratio(sa.median, st.median)} | {fmt_ratio(pa, pt)} | "
            f"{sizes[('acp', lines)]} / {sizes[('tmux', lines)]} |"
        )
    out += [
        "",
        f"ACP buffer: {entries_total} entries (cap {BUFFER_CAP}; filled by one turn of "
        f"{FILL} `ACP-UPDATE` lines); tmux pane: its last {BUFFER_CAP} lines of {FILL}+ written.",
        "",
    ]


if __name__ == "__main__":
    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
