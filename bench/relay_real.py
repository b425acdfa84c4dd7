"""Relay-tools benchmark through the real relay: `RelayServer` + `RelayBehaviour` over real tmux.

The bundle `party` has three members (alpha, bravo, charlie), each a small echo stand-in (prints
the prompt `> `, echoes every line it reads) in its own session of one real tmux server, hosted
by the real `BundleHost` the relay tests use (`mcphost.testing.realrelay.TmuxHost`). The relay runs in
this process with the supervisor's settings (readiness gate: 750 ms quiet window, 50 ms polls;
the generated coder has no `prompt-regex`, as the supervisor writes it) and listens on a real
Unix socket. The real `mcphost relay-tools` process (alpha@party, over stdio, as in
bench/relay.py) connects to it with socket trust, vouched by the kernel (`SO_PEERCRED`: the
peer must be that very process).

Measured, sequentially after a warm-up: `help` (answered by the tools locally: the baseline),
`look` at bravo (a `capture-pane` in the relay), `send` to charlie (answered once `queued`;
delivery runs behind). Then 64 concurrent `send`s to bravo from the one tools process: wall
until all 64 tool calls answered `queued`, and wall until the relay recorded all 64 outcomes
`delivered` (paste + submit done: polled every 5 ms, 120 s guard), confirmed by a capture of
bravo's pane holding each of the 64 markers.

Alone: `python -m bench.relay_real` (~1 min).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import RawMcp, Stats, call_samples
from mcphost.relay.admission import MAX_QUEUED_PER_TARGET

CALLS = int(os.environ.get("BENCH_RELAY_CALLS", "300"))
ROUNDS = int(os.environ.get("BENCH_RELAY_ROUNDS", "5"))
CONCURRENT = 64
ALONE = 5
DELIVERY_GUARD = 120.0

STAND_IN = Path(__file__).with_name("peers") / "echo_prompt.py"


def config_tree(root: Path) -> tuple[Path, Path, Path]:
    """(configuration root, state root, workspace): bundle party, one tmux coder per member."""
    config, state, work = root / "config", root / "state", root / "work"
    for path in (config / "bundles", state, work):
        path.mkdir(parents=True, mode=0o700)
    command = f"{shlex.quote(sys.executable)} -u {shlex.quote(str(STAND_IN))}"
    (config / "coders.toml").write_text(
        f'format-version = 1\n\n[[coders]]\nid = "standin"\n[coders.tmux]\n'
        f"initial-command = {command!r}\n"
    )
    members = "".join(
        f'\n[[sessions]]\nid = "{m}"\ndirectory = "{work}"\ncoder = "standin"\n'
        for m in ("alpha", "bravo", "charlie")
    )
    (config / "bundles" / "party.toml").write_text("format-version = 1\n" + members)
    return config, state, work


def parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def timed(call: Any, count: int, warmup: int = 20) -> tuple[Stats, float]:
    """(Stats, p90) of `count` sequential calls after a warm-up."""
    samples = await call_samples(call, count, warmup)
    return Stats.of(samples), percentile(samples, 0.90)


async def wait_until(predicate: Any, guard: float, poll: float = 0.005) -> bool:
    deadline = time.perf_counter() + guard
    while not predicate():
        if time.perf_counter() > deadline:
            return False
        await asyncio.sleep(poll)
    return True


async def section(out: list[str]) -> None:
    if shutil.which("tmux") is None:
        out += ["## 6b. Relay tools through the real relay: skipped (no tmux)", ""]
        return
    from mcphost.agentmux.bundlefile import require_bundle
    from mcphost.peer import PeerCred
    from mcphost.relay.behaviour import RelayBehaviour
    from mcphost.relay.server import RelayServer
    from mcphost.testing.realrelay import TmuxHost

    root = Path(tempfile.mkdtemp(prefix="rrb-", dir="/tmp"))  # short: tmux.sock fits sun_path
    config, state, _ = config_tree(root)
    host = TmuxHost(state)

    def socket_trust(principal_id: str, cred: PeerCred | None) -> bool:
        # the kernel's word: the peer is a relay tools process this bench started, as alpha
        return (
            principal_id == "alpha@party"
            and cred is not None
            and cred.uid == os.geteuid()
            and parent_of(cred.pid) == os.getpid()
        )

    relay = RelayBehaviour([config], state, host, socket_trust=socket_trust)
    server = RelayServer(
        str(state / "relay.sock"),
        authenticate=relay.authenticate,
        handle=relay.handle,
        registry=relay.connections,
    )
    tools: RawMcp | None = None
    load_before = os.getloadavg()
    quiet = contextlib.ExitStack()  # the relay's event records go to a file, off the report
    events_log = quiet.enter_context(open(root / "relay-events.log", "w"))  # noqa: SIM115
    quiet.enter_context(contextlib.redirect_stderr(events_log))
    try:
        await host.up(require_bundle([config], "party"))
        await server.start()
        tools = RawMcp(
            [
                sys.executable,
                "-m",
                "mcphost.cli",
                "relay-tools",
                "--configuration-directory",
                str(config),
                "--state-directory",
                str(state),
                "--bundle",
                "party",
                "--session-name",
                "alpha",
            ],
            {"HOME": str(root), "MCPHOST_LOG_LEVEL": "warning"},
        )
        await tools.start()
        t = tools
        for _ in range(200):  # the panes' stand-ins print their prompt before we look
            listed = await t.call_json("list", {"command": "principals"})
            if all(p["ready"] for p in listed["bundles"][0]["principals"]):
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError(f"the bundle never became ready: {listed}")
        tmux = host.servers["party"]
        for member in ("alpha", "bravo", "charlie"):  # each stand-in has printed its prompt

            async def prompted(member: str = member) -> bool:
                return any(line.startswith(">") for line in await tmux.capture(f"party-{member}"))

            for _ in range(600):
                if await prompted():
                    break
                await asyncio.sleep(0.05)
            else:
                raise RuntimeError(f"{member}'s stand-in never prompted")

        async def help_call() -> None:
            await t.call("help", {})

        async def look_call() -> None:
            await t.call("look", {"target_session": "bravo@party"})

        counter = iter(range(1 << 30))

        async def send_call() -> None:
            reply = await t.call_json(
                "send", {"message": f"seq {next(counter)}", "targets": ["charlie"]}
            )
            assert reply["results"][0]["outcome"] == "queued", reply

        local, local_p90 = await timed(help_call, CALLS)
        look, look_p90 = await timed(look_call, CALLS)
        # Sequential sends in batches the relay's per-target queue bound admits (admission.py),
        # each batch's deliveries drained, untimed, before the next.
        samples: list[float] = []
        await call_samples(send_call, 0, warmup=20)
        await relay.drain()
        while len(samples) < CALLS:
            batch = min(MAX_QUEUED_PER_TARGET // 2, CALLS - len(samples))
            samples += await call_samples(send_call, batch, warmup=0)
            await relay.drain()
        send, send_p90 = Stats.of(samples), percentile(samples, 0.90)

        alone = []  # one send to an idle pane, until delivered: the readiness gate's floor
        for i in range(ALONE):
            started = time.perf_counter()
            reply = await t.call_json("send", {"message": f"alone {i}", "targets": ["bravo"]})
            message_id = reply["results"][0]["message_id"]
            if not await wait_until(lambda m=message_id: m in relay.outcomes, DELIVERY_GUARD):
                raise RuntimeError("a single send was not delivered in time")
            alone.append(time.perf_counter() - started)
            await asyncio.sleep(0.2)

        queued_walls, delivered_walls, visible = [], [], []
        for round_ in range(ROUNDS):

            async def one(i: int, round_: int = round_) -> str:
                reply = await t.call_json(
                    "send", {"message": f"burst r{round_} m{i} end", "targets": ["bravo"]}
                )
                [result] = reply["results"]
                assert result["outcome"] == "queued", reply
                return str(result["message_id"])

            started = time.perf_counter()
            ids = await asyncio.gather(*(one(i) for i in range(CONCURRENT)))
            queued_walls.append(time.perf_counter() - started)

            def delivered(ids: list[str] = ids) -> bool:
                return all(relay.outcomes.get(m, {}).get("outcome") for m in ids)

            if not await wait_until(delivered, DELIVERY_GUARD):
                raise RuntimeError(f"round {round_}: not all {CONCURRENT} delivered in time")
            delivered_walls.append(time.perf_counter() - started)
            outcomes = {relay.outcomes[m]["outcome"] for m in ids}
            if outcomes != {"delivered"}:
                raise RuntimeError(f"round {round_}: outcomes {outcomes}")
            await asyncio.sleep(0.3)  # the stand-in's echo reaches the screen
            pane = "\n".join(await tmux.capture("party-bravo", 5000))
            visible.append(
                sum(f"echo: burst r{round_} m{i} end" in pane for i in range(CONCURRENT))
            )
    finally:
        if tools is not None:
            await tools.close()
        await relay.aclose()
        await server.aclose()
        for bundle_id in list(host.servers):
            await host.down(require_bundle([config], bundle_id))
        quiet.close()
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()
    queued, deliv = Stats.of(queued_walls), Stats.of(delivered_walls)
    single = Stats.of(alone)

    def row(label: str, stats: Stats, p90: float) -> str:
        return (
            f"| {label} | {stats.median * 1000:.2f} ms | {p90 * 1000:.2f} ms | "
            f"{stats.median / local.median:.2f}× | {p90 / local_p90:.2f}× |"
        )

    out += [
        "## 6b. Relay tools through the real relay "
        "(`mcphost relay-tools` over stdio → RelayServer + RelayBehaviour → tmux panes)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · load average (1 min) "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after · {CALLS} sequential calls each "
        f"after 20 warm-up · {ROUNDS} rounds of {CONCURRENT} concurrent sends",
        "",
        "| call | p50 | p90 | p50 vs `help` | p90 vs `help` |",
        "|---|---|---|---|---|",
        row("`help` (answered locally, no relay)", local, local_p90),
        row("`look` bravo (capture-pane, 120 lines)", look, look_p90),
        row("`send` charlie (answered `queued`)", send, send_p90),
        "",
        f"| {CONCURRENT} concurrent `send` to bravo | wall (median, IQR) | baseline | ratio |",
        "|---|---|---|---|",
        f"| until all {CONCURRENT} answered `queued` | {queued.fmt()} | one `send` p50 "
        f"{send.median * 1000:.2f} ms | {queued.median / send.median:.1f}× |",
        f"| until all {CONCURRENT} `delivered` into the pane (relay outcomes) | "
        f"{deliv.fmt('s', 1.0)} | one `send` to an idle pane until `delivered` "
        f"{single.fmt('s', 1.0)} | {deliv.median / single.median:.2f}× |",
        f"| markers echoed in bravo's pane afterwards (per round) | "
        f"{', '.join(f'{v}/{CONCURRENT}' for v in visible)} | | |",
        "",
    ]


if __name__ == "__main__":
    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
