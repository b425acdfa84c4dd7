"""The attach pump: an agent's stdio MCP server that is only a byte pipe to `mcphost supervise`.

Run as `python3 -I -S /path/to/mcphost/attach.py <socket-path>` (configgen writes exactly that,
with the real interpreter). It connects to the supervisor's surface socket, reads one status line
(at most 1024 bytes) before it moves any byte, and then copies raw bytes both ways:

- `ok <agent_id> <generation>`: pump stdin -> socket and socket -> stdout until the socket ends.
- `refused <code> <message>`: print `mcphost attach: <message> (<code>)` on stderr, exit 3.
- cannot connect (or no status line): stderr names the socket, says to start `mcphost
  supervise`, exit 2. Bad arguments: usage on stderr, exit 2.
- stdin EOF: flush what is pending to the socket, `shutdown(SHUT_WR)`, keep delivering answers;
  socket EOF: flush stdout, exit 0. SIGTERM, SIGINT, SIGHUP: exit 0 at once. EPIPE on stdout
  (the client went away): exit 0.

What it owns: one `poll` loop over stdin, stdout and the socket, all non-blocking, with one
64 KiB buffer per direction. A source is read only when its direction's buffer is empty, so each
direction is backpressured on its own: a client that stops reading stdout stalls only socket ->
stdout (requests keep flowing), and a supervisor that stops reading stalls only stdin -> socket
(answers keep flowing). Memory stays at two buffers whatever either side does.

What it must never do: import anything of mcphost or outside the standard library (it runs
with `-S`, so there is no site-packages, and with `-I`, so neither the environment nor the
script's own directory, mcphost/, can put a module in front of the standard library); parse,
frame or buffer the JSON-RPC stream beyond those two buffers; hold or read any secret (identity
is the supervisor's business: it reads this process's peer credentials and ancestry); write
anything but the supervisor's bytes to stdout.

Why hand-written: no library gives a zero-dependency pump that starts with `-S`, and the pump is
the per-agent cost of the supervised path (one per surface per agent). For the same reason it
imports the C modules `_socket` and `_signal` instead of `socket` and `signal`: those two
wrappers pull in `enum`, `selectors` and friends, about 35 ms of imports (`-X importtime`),
more than the whole rest of the start-up. `posix` stands in for `os` for the same reason.
Plain read/write rather than `os.splice`: splice needs a pipe on one side, but Node clients
(Claude Code; libuv) give their MCP servers Unix socketpairs as stdio, so a read/write path
is needed anyway, and a message-sized hop costs the same two syscalls either way.

The alternative without Python is `socat STDIO UNIX-CONNECT:<socket>`, but it cannot follow the
handshake: it copies the status line to stdout like any other byte, so the client's first
stdout line is `ok <agent> <generation>` (not JSON-RPC), and a refusal arrives as one non-JSON
line on stdout, nothing on stderr, and exit status 0 (checked with socat 1.7.4). Use it only
with a supervisor socket that sends no status line; this pump is the supported entry.
"""

import _signal
import _socket
import errno
import posix
import select
import sys

BUFFER = 65536  # per direction
STATUS_MAX = 1024
STDIN, STDOUT = 0, 1
POLLIN = select.POLLIN
POLLOUT = select.POLLOUT
GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL
USAGE = "usage: python3 -I -S attach.py <socket-path>   (an mcphost supervise surface socket)\n"

_restore: list[tuple[int, bool]] = []  # (fd, was blocking): stdio flags put back on exit


def leave(code: int) -> None:
    """Put stdin/stdout back as found (they may be a shared terminal) and exit at once."""
    for fd, blocking in _restore:
        try:
            posix.set_blocking(fd, blocking)
        except OSError:
            pass
    posix._exit(code)


def say(text: str) -> None:
    try:
        sys.stderr.write(f"mcphost attach: {text}\n")
        sys.stderr.flush()
    except OSError:
        pass  # nowhere left to tell; the exit status still says it


def on_signal(signum: int, frame: object) -> None:
    leave(0)


def printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1] or argv[1].startswith("-"):
        sys.stderr.write(USAGE)
        return 2
    path = argv[1]
    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(signum, on_signal)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        say(
            f"cannot connect to {path}: {exc.strerror or exc}; "
            "is `mcphost supervise` running? (start it, or check the socket path)"
        )
        return 2
    head = b""
    try:
        while b"\n" not in head and len(head) < STATUS_MAX:
            chunk = sock.recv(STATUS_MAX - len(head))
            if not chunk:
                break
            head += chunk
    except OSError:
        pass
    line, newline, rest = head.partition(b"\n")
    words = line.decode("utf-8", "replace").rstrip("\r").split(" ", 2)
    if newline and words[0] == "ok":
        return pump(sock, rest)
    if newline and words[0] == "refused":
        code = printable(words[1]) if len(words) > 1 else "refused"
        message = printable(words[2]) if len(words) > 2 else "the supervisor refused to attach"
        say(f"{message} ({code})")
        return 3
    say(
        f"{path} did not answer with a status line; is it a socket of `mcphost supervise`? "
        "(start it, or check the socket path)"
    )
    return 2


def pump(sock: _socket.socket, pending: bytes) -> int:
    """Copy bytes both ways until the socket ends; `pending` came after the status line."""
    for fd in (STDIN, STDOUT):
        try:
            _restore.append((fd, posix.get_blocking(fd)))
            posix.set_blocking(fd, False)
        except OSError:
            pass  # a closed stdin or stdout: poll reports it (POLLNVAL) and the loop copes
    sock.setblocking(False)
    sfd = sock.fileno()
    up = memoryview(b"")  # stdin -> socket, unsent
    down = memoryview(pending)  # socket -> stdout, unwritten
    reading_stdin = True
    reading_sock = True
    shut = False  # SHUT_WR sent
    poller = select.poll()
    masks = {STDIN: 0, STDOUT: 0, sfd: 0}
    while reading_sock or down:
        want = {
            STDIN: POLLIN if reading_stdin and not up else 0,
            STDOUT: POLLOUT if down else 0,
            sfd: (POLLOUT if up else 0) | (POLLIN if reading_sock and not down else 0),
        }
        for fd, mask in want.items():
            if mask != masks[fd]:
                if mask:
                    poller.register(fd, mask)
                else:
                    poller.unregister(fd)
                masks[fd] = mask
        for fd, events in poller.poll():  # reads only; writes are tried after every round
            if fd == STDIN:
                try:
                    data = posix.read(STDIN, BUFFER)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    up = memoryview(data)
                else:
                    reading_stdin = False
            elif fd == sfd and masks[sfd] & POLLIN and events & (POLLIN | GONE):
                try:
                    data = sock.recv(BUFFER)
                except BlockingIOError:
                    continue
                except OSError:  # reset: as good as EOF
                    data = b""
                if data:
                    down = memoryview(data)
                else:  # the supervisor ended the session: deliver what is left, then exit
                    reading_sock = reading_stdin = False
                    up = memoryview(b"")
        if up:
            try:
                up = up[sock.send(up) :]
            except BlockingIOError:
                pass
            except OSError:  # the supervisor is gone: its EOF or reset ends the loop
                up = memoryview(b"")
                reading_stdin = False
        if not reading_stdin and not up and not shut:
            shut = True
            try:
                sock.shutdown(_socket.SHUT_WR)
            except OSError:
                pass
        if down:
            try:
                down = down[posix.write(STDOUT, down) :]
            except BlockingIOError:
                pass
            except OSError as exc:
                if exc.errno != errno.EPIPE:
                    say(f"cannot write to stdout: {exc.strerror or exc}")
                    return 1
                return 0  # the client closed its end: nobody is left to answer
    return 0


if __name__ == "__main__":
    leave(main(sys.argv))
