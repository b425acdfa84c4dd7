"""An echo stand-in for a pane: print the prompt `> `, echo every line read, until EOF."""

import sys

while True:
    sys.stdout.write("> ")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        break
    sys.stdout.write("echo: " + line)
    sys.stdout.flush()
