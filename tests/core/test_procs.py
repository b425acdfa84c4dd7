"""The spawn rule's descriptor limit (procs.py): the supervisor raises its own soft
`RLIMIT_NOFILE`, and every child it spawns gets the limit back that it was given."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

CHILD = r"""
import asyncio, json, resource, sys
from mcphost import procs

async def main():
    soft, hard, before = procs.raise_nofile()
    child = procs.spawn(
        [sys.executable, "-c", "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"],
        cwd=None, env={}, stdin=None, stdout=-1, stderr=None,
    )
    await child.exit
    print(json.dumps({"soft": soft, "hard": hard, "before": before,
                      "own": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                      "child": int(child.proc.stdout.read())}))

asyncio.run(main())
"""


def test_the_supervisor_raises_its_own_limit_and_its_children_get_theirs_back() -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    given = 256  # as systemd gives a service 1024: lower than the hard limit

    def lowered() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (given, hard))

    done = subprocess.run(
        [sys.executable, "-c", CHILD], preexec_fn=lowered, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    seen = json.loads(done.stdout)
    assert seen["before"] == given and seen["own"] == seen["soft"] > given
    assert seen["child"] == given, seen  # the child's tree is bounded as it was given
