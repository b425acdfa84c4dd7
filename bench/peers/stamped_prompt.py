"""A pane stand-in for bench/acp.py: the echo stand-in (prompt `> `, echo every line read) that
also stamps when a relay envelope's submit arrives, and fills its pane on request.

`python stamped_prompt.py STAMPS`. A relay envelope arrives as lines (the paste) and then one
empty line (the relay's separate Enter): on that empty line, right after an envelope's closing
boundary, it appends `<message id> <time.monotonic()>` to STAMPS (CLOCK_MONOTONIC: the same
clock as the bench's, across processes). A line `fill N TEXT` prints N numbered lines of TEXT.
"""

import sys
import time

stamps = open(sys.argv[1], "a", buffering=1)  # noqa: SIM115 (open for the process's life)
message_id = None
closed = False
while True:
    sys.stdout.write("> ")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        break
    text = line.rstrip("\n")
    if text == "" and closed and message_id is not None:
        stamps.write(f"{message_id} {time.monotonic()!r}\n")
        message_id = None  # then echoed as any line: the prompt always starts a line
    if text.startswith("Message-Id: "):
        message_id = text.removeprefix("Message-Id: ").strip()
    closed = text.startswith("--agentmux-") and text.endswith("--")
    if text.startswith("fill "):
        _, count_text, filler = text.split(" ", 2)
        count = int(count_text)
        sys.stdout.write("".join(f"line {i:04d}: {filler}\n" for i in range(count)))
    else:
        sys.stdout.write("echo: " + line)
    sys.stdout.flush()
