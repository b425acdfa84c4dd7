"""The stand-in ACP agent (mcphost/testing/acp_agent.py) for bench/acp.py, stamping receipts.

`python acp_stamped.py STAMPS [acp_agent flags]`: runs the stand-in in this process, its stdin
wrapped so that each `session/prompt` frame is stamped the moment its line is read, before the
stand-in parses it: `<message id> <time.monotonic()>` appended to STAMPS (the relay envelope's
`Message-Id`; CLOCK_MONOTONIC: the same clock as the bench's, across processes).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from typing import IO

from mcphost.testing import acp_agent

MESSAGE_ID = re.compile(r"^Message-Id: (\S+)$", re.MULTILINE)


class StampedStdin:
    """`sys.stdin` for the stand-in: its `buffer` yields the real stdin's lines, stamping each
    `session/prompt`."""

    def __init__(self, lines: IO[bytes], stamps: IO[str]) -> None:
        self._lines = lines
        self._stamps = stamps
        self.buffer = self

    def __iter__(self) -> Iterator[bytes]:
        for line in self._lines:
            if b'"session/prompt"' in line:
                at = time.monotonic()
                prompt = json.loads(line).get("params", {}).get("prompt") or [{}]
                found = MESSAGE_ID.search(str(prompt[0].get("text", "")))
                if found is not None:
                    self._stamps.write(f"{found.group(1)} {at!r}\n")
            yield line


def main() -> int:
    stamps = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 (open for the process's life)
    sys.stdin = StampedStdin(sys.stdin.buffer, stamps)
    return acp_agent.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
