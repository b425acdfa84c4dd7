"""Relay-tools benchmark: per-call latency to a relay answering immediately, and 32 concurrent
calls to a relay that answers each after 50 ms (multiplexed on one connection).

Baselines from the same run: `help` (answered locally, no relay) for the per-call figure, and
one delayed call for the concurrent wall time. Uses the fake relay of the relay tools' harness
(`mcphost.testing.relayharness`: a real Unix socket speaking the relay's newline-delimited JSON
protocol).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.harness import RawMcp, Stats, time_calls

CALLS = 300
SEND = {"message": "hi", "targets": ["bravo"]}
SENT = {
    "kind": "send",
    "schema_version": "1",
    "requester_session": "alpha@party",
    "results": [{"target_session": "bravo@party", "message_id": "m1", "outcome": "queued"}],
}


async def section(out: list[str]) -> None:
    from mcphost.testing.relayharness import FakeRelay, cleanup, make_env, server_command

    env = make_env()
    relay = await FakeRelay(env.socket).start()
    relay.respond("send", SENT)
    try:
        command, argv = server_command(env.args())
        server = RawMcp([command, *argv], env.process_env())
        await server.start()

        async def help_call() -> None:
            await server.call("help", {})

        async def send_call() -> None:
            await server.call("send", SEND)

        local = await time_calls(help_call, CALLS)
        relayed = await time_calls(send_call, CALLS)

        async def slow_send(frame: dict[str, Any]) -> Any:
            await asyncio.sleep(0.05)
            return SENT

        relay.handler = slow_send
        single = await time_calls(send_call, 10, warmup=2)
        walls = []
        for _ in range(5):
            started = time.perf_counter()
            await asyncio.gather(*(send_call() for _ in range(32)))
            walls.append(time.perf_counter() - started)
        wall = Stats.of(walls)
        await server.close()
    finally:
        await relay.stop()
        cleanup(env)
    out += [
        "## 6. Relay tools (`mcphost relay-tools` over stdio, fake relay on a Unix socket)",
        "",
        "| measure | value | baseline | ratio |",
        "|---|---|---|---|",
        f"| `send` p50 (relay answers at once) | {relayed.median * 1000:.2f} ms | "
        f"`help` (no relay) {local.median * 1000:.2f} ms | {relayed.median / local.median:.2f}× |",
        f"| `send` p99 | {relayed.p99 * 1000:.2f} ms | `help` p99 {local.p99 * 1000:.2f} ms | "
        f"{relayed.p99 / local.p99:.2f}× |",
        f"| 32 concurrent `send`, relay delays 50 ms (wall) | {wall.fmt()} | one call "
        f"{single.median * 1000:.1f} ms | {wall.median / single.median:.2f}× |",
        "",
    ]


if __name__ == "__main__":
    report: list[str] = []
    asyncio.run(section(report))
    print("\n".join(report))
