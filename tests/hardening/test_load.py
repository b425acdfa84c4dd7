"""Load: many sequential and concurrent calls, with nothing lost or mismatched and bounded RSS.

Each answer is checked against its request twice over: the JSON-RPC id must be one we sent and
not yet answered, and the payload must be the task that request asked for (`get_task` of a
distinct task per request), so a crossed wire would show even with correct ids.
RSS is read from /proc/<host pid>/status after a warm-up and at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from mcphost.testing import DevCenter
from tests.hardening.conftest import RawHost, host_env, rss_kib
from tests.thorough import depth

# deep (make test-slow): sequential and concurrent load with bounded memory.
pytestmark = [pytest.mark.deep, pytest.mark.timeout(600)]

TASKS = 200
RSS_GROWTH_BOUND_KIB = 16 * 1024  # after warm-up; measured growth is printed (`pytest -s`)


@pytest.fixture(scope="module")
def loaded(center: DevCenter) -> Iterator[tuple[RawHost, list[str]]]:
    with RawHost(host_env(center.binding_env("unix"))) as host:
        host.initialize()
        ids: list[str] = []
        for i in range(TASKS):
            is_error, created = host.call("create_task", {"project_id": "p-1", "title": f"L{i}"})
            assert not is_error, created
            ids.append(created["task_id"])
        yield host, ids
        assert host.close() == 0


def check_task_answer(answer: dict[str, Any], task_id: str) -> None:
    result = answer["result"]
    assert not result["isError"], result
    text = result["content"][0]["text"]
    assert f'"task_id": "{task_id}"' in text or f'"task_id":"{task_id}"' in text, (task_id, text)


def run_sequential(host: RawHost, ids: list[str], count: int) -> float:
    started = time.monotonic()
    for n in range(count):
        task_id = ids[n % len(ids)]
        request_id = host.request(
            "tools/call", {"name": "get_task", "arguments": {"task_id": task_id}}
        )
        check_task_answer(host.wait(request_id, timeout=30), task_id)
    return time.monotonic() - started


def run_concurrent(host: RawHost, ids: list[str], width: int) -> float:
    """`width` requests written back to back before any answer is read."""
    started = time.monotonic()
    sent = {
        host.request("tools/call", {"name": "get_task", "arguments": {"task_id": task_id}}): task_id
        for task_id in (ids[i % len(ids)] for i in range(width))
    }
    for request_id, task_id in sent.items():
        check_task_answer(host.wait(request_id, timeout=60), task_id)
    return time.monotonic() - started


def test_200_way_concurrent_calls_lose_and_cross_nothing(
    loaded: tuple[RawHost, list[str]],
) -> None:
    host, ids = loaded
    for _ in range(5):
        run_concurrent(host, ids, 200)
    assert not host.by_id, f"unrequested answers: {list(host.by_id)[:5]}"
    assert not host.bad_lines


@pytest.mark.thorough
def test_sequential_calls_with_bounded_rss(loaded: tuple[RawHost, list[str]]) -> None:
    """The always-on version: 600 sequential calls after a warm-up of 300 (`make test-slow`:
    2,000 after 500, and the 10,000-call test below)."""
    host, ids = loaded
    run_sequential(host, ids, depth(full=500, quick=300))  # warm-up: pools, caches, lazy imports
    before = rss_kib(host.proc.pid)
    calls = depth(full=2000, quick=600)
    took = run_sequential(host, ids, calls)
    growth = rss_kib(host.proc.pid) - before
    print(f"\nload: {calls:,} sequential in {took:.1f}s; RSS {before} KiB, growth {growth} KiB")
    assert growth < RSS_GROWTH_BOUND_KIB
    assert not host.by_id and not host.bad_lines


@pytest.mark.slow
def test_10000_sequential_and_2000_concurrent_calls(loaded: tuple[RawHost, list[str]]) -> None:
    host, ids = loaded
    run_sequential(host, ids, 300)
    before = rss_kib(host.proc.pid)
    took = run_sequential(host, ids, 10_000)
    middle = rss_kib(host.proc.pid)
    waves = [run_concurrent(host, ids, 200) for _ in range(10)]
    after = rss_kib(host.proc.pid)
    print(
        f"\nload: 10,000 sequential in {took:.1f}s ({10_000 / took:.0f}/s); "
        f"10x200 concurrent in {sum(waves):.1f}s; RSS {before} -> {middle} -> {after} KiB"
    )
    assert after - before < RSS_GROWTH_BOUND_KIB
    assert not host.by_id and not host.bad_lines
