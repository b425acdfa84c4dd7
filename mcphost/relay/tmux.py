"""One tmux server per bundle (reference §3.4, §3.7).

Owns: the tmux CLI, run as `tmux -u -f /dev/null -S <socket> ...` with an argv (no shell),
from the bundle runtime directory (0700, owned by us); the sessions it hosts (one per agent, one
window, one pane; the pane's process *is* the agent); capture; bracketed paste and submit (the
mechanics below; the readiness gate and a delivery's outcome are `panes.py`'s); watching a pane's
process exit with a pidfd.

Paste: the text goes through `load-buffer -` (stdin, a unique buffer name) and
`paste-buffer -p -d` (bracketed: tmux adds the markers only when the application enabled
bracketed paste, as a terminal does; LF becomes CR, as a terminal pastes), then the submit is a
separate unbracketed `paste-buffer` of "\\r". Never `send-keys` (copy mode would eat it).

The server, as chosen (`tmux -u`: UTF-8 output whatever the client's environment):
- `start()` starts it with an *empty* environment and sets `exit-empty off`, `remain-on-exit
  on` and `status off` globally. The empty environment is the server's global environment,
  which every pane inherits: no variable of the supervisor (or of another agent) leaks into a
  pane. `exit-empty off` keeps that server when the last session goes, so a later session is
  never started by a client carrying some agent's environment; `kill_server` ends it.
  `remain-on-exit on` keeps a dead pane so `#{pane_dead_status}` can be read. tmux 3.3a may
  leave an exited pane process unreaped until its next SIGCHLD; `watch_exit` sends one
  (`nudge`) when the status is slow to appear.
- `new_session` gives the pane exactly the `env` it is given (plus what tmux itself sets:
  TERM, TERM_PROGRAM, TERM_PROGRAM_VERSION, TMUX, TMUX_PANE, PWD, SHELL, and PATH when `env` has
  none): the tmux client runs with that environment and `update-environment` names its keys for
  that one command list. Values never appear in an argv (`/proc/<pid>/cmdline` is readable by
  every user; `environ` only by the owner). tmux drops a variable longer than its message size
  (about 16 KiB).
- The pane command is exec'd directly (no shell): tmux runs a one-word command through the
  default shell, so a one-element argv becomes `env -- <argv0>` (env execs it: same pid).
- The socket is `<runtime_dir>/tmux.sock`, passed absolute when it fits `sun_path` (`unixsock.fits`)
  and as the bare `tmux.sock` otherwise (the CLI runs from the runtime directory and the server
  keeps that cwd). With the bare form, `$TMUX` in the panes is relative.
- Every argument we pass that ends with ";" is escaped as tmux wants ("\\;"), so an agent
  argument like `a;` is not a command separator; `#` in the working directory is doubled (tmux
  expands formats in `-c`).
- Session names are `[A-Za-z0-9][A-Za-z0-9_-]{0,127}` (tmux would rewrite `.` and `:`); every
  target is exact (`=name`). Pane formats are read with `list-panes -F`, not `display-message`
  (which tmux 3.3 expands to empty strings, status 0, for a missing target). Owned sessions carry the option `@agentmux_owned 1`; `kill_session`
  kills only those, and `kill_server` refuses while one remains.

Capture: `capture-pane -p` (no escapes, wrapped lines not joined) of the visible screen plus up
to N history lines; trailing lines that are empty or blank (the unused bottom of the screen) are
trimmed, then the last N lines are returned, oldest first. Blank lines between text are kept.

Must never: run a shell, use `send-keys`, put an environment value in an argv, wait for a child
other than through the pidfd or the `watch` given (see below), kill a session it does not own,
or import the relay's server or behaviour modules (import-linter).

The supervisor reaps every child with `waitpid(-1)` (kernel.py), which steals the exit status
of `asyncio.create_subprocess_*` children; so tmux CLI processes are started by `procs.spawn`
(mcphost/procs.py, the one spawn-and-watch rule) and their status comes from `watch(pid)` (pass
the supervisor's `Reaper.watch`) or, without one, from a pidfd and `waitpid` of that pid alone.
Unlike an agent's process, a CLI client stays in the caller's session and gets no pre-exec step.
Pipes are read on the event loop.

Why hand-written: libtmux runs tmux synchronously through subprocess (blocking the loop), takes
its status from `Popen.wait` (racing the supervisor's reaper), passes environments with `-e`
(values in argv) and has no bracketed paste-and-submit or readiness gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mcphost import fsutil, procs, unixsock
from mcphost.errors import CodedFailure
from mcphost.procs import open_pidfd, wait_pidfd

TMUX_SOCKET = "tmux.sock"
NO_TMUX = "/tmux-not-found-on-PATH/tmux"  # the program named when PATH has no tmux (`program`)
OWNED_OPTION = "@agentmux_owned"
DEFAULT_LOOK_LINES = 120

SESSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MISSING = (
    "can't find session",
    "can't find pane",
    "can't find window",
    "no server running",
    "error connecting to",
    "no current target",
    "no current session",
)

Watch = procs.Watch  # pid -> its raw wait status (`Reaper.watch`), right after Popen


def program(env: Mapping[str, str]) -> str:
    """The tmux program on `env`'s PATH, else `NO_TMUX`: a server built with it still exists,
    and each of its commands fails naming the missing program (so the supervisor starts without
    tmux, and each tmux agent's spawn fails saying why: ctl status shows it)."""
    return shutil.which("tmux", path=env.get("PATH", os.defpath)) or NO_TMUX


class TmuxError(CodedFailure):
    """A tmux operation failed; `code` is stable (`tmux_failed`, `tmux_timeout`, ...)."""


class NoSuchSession(TmuxError):
    """The target session (or the whole server) does not exist."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__("tmux_no_session", message, details)


@dataclass(frozen=True, slots=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


@dataclass(frozen=True, slots=True)
class PaneState:
    """A pane's process: its pid, whether it ended, and how (once tmux recorded it).

    `exit` is the exit code, -N when killed by signal N, None while it runs or until tmux has
    reaped it: tmux can show `#{pane_dead}` (the pty closed) before `#{pane_dead_status}`.
    """

    pid: int
    dead: bool
    exit: int | None


_PANE_STATE = "#{pane_pid}\t#{pane_dead}\t#{pane_dead_status}\t#{pane_dead_signal}"


def _pane_state(info: str) -> PaneState:
    pid, dead, status, sig = info.split("\t")
    code: int | None = None
    if status.strip().lstrip("-").isdigit():
        code = int(status)
    elif sig.strip().isdigit():
        code = -int(sig)
    return PaneState(int(pid), dead == "1" or code is not None, code)


def check_session_name(name: str) -> str:
    if not SESSION_NAME.fullmatch(name):
        raise ValueError(f"tmux session name {name!r}: expected {SESSION_NAME.pattern}")
    return name


def _escape(arg: str) -> str:
    """An argument tmux must not read as a command separator (a trailing ';' ends a command)."""
    return arg[:-1] + "\\;" if arg.endswith(";") else arg


def _session(name: str) -> str:
    return "=" + check_session_name(name)


def _pane(name: str) -> str:
    return "=" + check_session_name(name) + ":"


def _buffer_name() -> str:
    return "agentmux-" + uuid.uuid4().hex


def _trim(lines: list[str]) -> list[str]:
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return lines[:end]


def _split_output(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


class TmuxServer:
    """The tmux server of one bundle, on `<runtime_dir>/tmux.sock`. Use from one event loop."""

    def __init__(
        self,
        runtime_dir: str | os.PathLike[str],
        *,
        tmux: str | None = None,
        watch: Watch | None = None,
        command_timeout: float = 10.0,
    ) -> None:
        self.runtime_dir = os.path.abspath(os.fspath(runtime_dir))
        program = tmux if tmux is not None else shutil.which("tmux")
        if program is None:
            raise TmuxError("tmux_unavailable", "tmux is not installed (not found on PATH)")
        self.tmux = os.path.abspath(program)
        env_program = shutil.which("env") or "/usr/bin/env"
        self._env_program = os.path.abspath(env_program)
        self.socket_path = os.path.join(self.runtime_dir, TMUX_SOCKET)
        self._socket_arg = self.socket_path if unixsock.fits(self.socket_path) else TMUX_SOCKET
        self._watch = watch
        self._timeout = command_timeout
        self._lock = asyncio.Lock()

    # -- the CLI ----------------------------------------------------------------------------
    async def run(
        self,
        *args: str,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Completed:
        """Run `tmux -u -f /dev/null -S <socket> *args` (args as given) and collect it.

        `-u`: the client says it speaks UTF-8 even with an empty environment (no locale), or
        tmux would print non-ASCII and control characters (tabs) as `_`.
        """
        argv = [self.tmux, "-u", "-f", os.devnull, "-S", self._socket_arg, *args]
        loop = asyncio.get_running_loop()
        if not os.path.isdir(self.runtime_dir):  # never prepared: no server can run there
            return Completed(1, "", f"no server running on {self.socket_path}")
        try:
            child = procs.spawn(
                argv,
                cwd=self.runtime_dir,
                env=env or {},
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                watch=self._watch,
            )
        except OSError as exc:
            raise TmuxError(
                "tmux_unavailable", f"cannot run {self.tmux}: {exc.strerror or exc}"
            ) from exc
        proc, status = child.proc, child.exit
        try:
            out, err, raw = await asyncio.wait_for(
                self._collect(loop, proc, stdin, status), self._timeout
            )
        except BaseException as exc:
            if not status.done():  # its returncode is set once it is reaped (procs.spawn)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)  # unreaped: the pid is still this one
            if isinstance(exc, TimeoutError):
                raise TmuxError(
                    "tmux_timeout",
                    f"tmux {args[0] if args else ''} did not finish within {self._timeout:g} s",
                ) from None
            raise
        finally:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        code = os.waitstatus_to_exitcode(raw)
        return Completed(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))

    async def _collect(
        self,
        loop: asyncio.AbstractEventLoop,
        proc: subprocess.Popen[bytes],
        stdin: bytes | None,
        status: asyncio.Future[int],
    ) -> tuple[bytes, bytes, int]:
        assert proc.stdout is not None and proc.stderr is not None
        jobs: list[Awaitable[Any]] = [_drain(loop, proc.stdout), _drain(loop, proc.stderr)]
        if stdin is not None:
            assert proc.stdin is not None
            jobs.append(_feed(loop, proc.stdin, stdin))
        out, err, *_ = await asyncio.gather(*jobs)
        raw = await asyncio.shield(status)
        return out, err, raw

    async def _ok(self, *args: str, stdin: bytes | None = None) -> str:
        """`run`, raising NoSuchSession / TmuxError("tmux_failed") on a non-zero exit."""
        result = await self.run(*args, stdin=stdin)
        if result.returncode != 0:
            raise _failure(args, result)
        return result.stdout

    async def _display(self, name: str, fmt: str) -> str:
        """`fmt` expanded for the session's active pane. Not `display-message`: tmux 3.3 expands
        it to empty strings, with status 0, for a target that does not exist."""
        out = await self._ok("list-panes", "-t", _pane(name), "-F", "#{pane_active}" + fmt)
        lines = _split_output(out)
        for line in lines:
            if line.startswith("1"):
                return line[1:]
        if not lines:
            raise NoSuchSession(f"tmux session {name!r} has no pane")
        return lines[0][1:]

    # -- the server -------------------------------------------------------------------------
    def prepare_runtime_dir(self) -> None:
        """Create the runtime directory 0700; refuse one that is not ours or not a directory."""
        try:
            fsutil.private_dir(self.runtime_dir, parents=True)
        except fsutil.NotPrivate as exc:
            raise TmuxError("security_foreign_owned", str(exc)) from None

    async def start(self) -> None:
        """Start the server (empty environment, global options; see the module doc). Idempotent."""
        self.prepare_runtime_dir()
        await self._ok(
            "start-server",
            ";",
            "set-option", "-s", "exit-empty", "off",
            ";",
            "set-option", "-g", "remain-on-exit", "on",
            ";",
            "set-option", "-g", "status", "off",
        )  # fmt: skip

    async def server_pid(self) -> int | None:
        """The tmux server's pid, or None when no server runs on the socket."""
        result = await self.run("display-message", "-p", "#{pid}")
        if result.returncode != 0:
            if _is_missing(result.stderr):
                return None
            raise _failure(("display-message",), result)
        return int(result.stdout.strip())

    async def nudge(self) -> None:
        """Send SIGCHLD to the tmux server, so it reaps (and records) exited pane processes.

        tmux 3.3a sometimes leaves a pane process that exited as a zombie, its status
        unrecorded, until the server gets another SIGCHLD (seen here: about one quick exit in
        four). A spurious SIGCHLD only makes it run `waitpid(WNOHANG)` once more.
        """
        pid = await self.server_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCHLD)

    async def sessions(self) -> dict[str, bool]:
        """Every session on the server -> whether it is ours (`@agentmux_owned` is 1)."""
        result = await self.run("list-sessions", "-F", "#{session_name}\t#{" + OWNED_OPTION + "}")
        if result.returncode != 0:
            if _is_missing(result.stderr):
                return {}
            raise _failure(("list-sessions",), result)
        found: dict[str, bool] = {}
        for line in _split_output(result.stdout):
            session, _, owned = line.partition("\t")
            found[session] = owned == "1"
        return found

    async def kill_server(self, *, timeout: float = 5.0) -> bool:
        """End the server and wait for its process to exit; remove the socket file.

        False (nothing done) while an owned session remains; True when no server runs now.
        """
        async with self._lock:
            if any((await self.sessions()).values()):
                return False
            pid = await self.server_pid()
            if pid is not None:
                fd = open_pidfd(pid)
                try:
                    await self.run("kill-server")
                    if fd is not None and not await wait_pidfd(fd, timeout):
                        raise TmuxError(
                            "tmux_timeout", f"tmux server {pid} still runs {timeout:g} s after kill"
                        )
                finally:
                    if fd is not None:
                        os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket_path)
            return True

    # -- sessions ---------------------------------------------------------------------------
    async def new_session(
        self,
        name: str,
        argv: Sequence[str],
        cwd: str | os.PathLike[str],
        env: Mapping[str, str],
        *,
        width: int | None = None,
        height: int | None = None,
    ) -> int:
        """Start `argv` detached in a new owned session `name`; return the pane's pid."""
        target = _session(name)
        command = [os.fspath(arg) for arg in argv]
        if not command:
            raise ValueError("argv is empty")
        if len(command) == 1:
            if "=" in command[0]:
                raise ValueError(f"a one-word command cannot contain '=': {command[0]!r}")
            command = [self._env_program, "--", command[0]]
        for key in env:
            if not ENV_NAME.fullmatch(key):
                raise ValueError(f"environment variable name {key!r}: expected {ENV_NAME.pattern}")
        size: list[str] = []
        if width is not None:
            size += ["-x", str(int(width))]
        if height is not None:
            size += ["-y", str(int(height))]
        directory = _escape(os.fspath(cwd).replace("#", "##"))
        new = ["new-session", "-d", "-P", "-F", "#{pane_pid}", "-s", name, "-c", directory, *size]
        if env:
            args = ["set-option", "-g", "update-environment", " ".join(env), ";", *new]
        else:
            args = [*new[:1], "-E", *new[1:]]
        args += ["--", *map(_escape, command)]
        args += [";", "set-option", "-t", _pane(name), OWNED_OPTION, "1"]
        if env:
            args += [";", "set-option", "-gu", "update-environment"]
        async with self._lock:
            await self.start()
            if await self.has_session(name):
                raise TmuxError("tmux_session_exists", f"tmux session {name!r} already exists")
            result = await self.run(*args, env=dict(env))
            lines = _split_output(result.stdout)
            if result.returncode != 0 or not lines or not lines[0].strip().isdigit():
                with contextlib.suppress(TmuxError):
                    await self.run("kill-session", "-t", target)
                raise _failure(("new-session",), result)
            return int(lines[0].strip())

    async def has_session(self, name: str) -> bool:
        result = await self.run("has-session", "-t", _session(name))
        if result.returncode == 0:
            return True
        if _is_missing(result.stderr):
            return False
        raise _failure(("has-session",), result)

    async def kill_session(self, name: str, *, grace: float = 5.0) -> bool:
        """Kill an owned session and wait (up to `grace` s, then SIGKILL) for its pane process.

        False when there is no such session or it is not ours (left alone). The wait for the
        pane process happens outside the server lock: other sessions start and stop meanwhile.
        """
        fd: int | None = None
        try:
            async with self._lock:
                try:
                    info = await self._display(name, "#{" + OWNED_OPTION + "}\t" + _PANE_STATE)
                except NoSuchSession:
                    return False
                owned, _, rest = info.partition("\t")
                if owned != "1":
                    return False
                pane = _pane_state(rest)
                fd = None if pane.dead else open_pidfd(pane.pid)
                if fd is not None and (await self.pane_state(name)).dead:
                    os.close(fd)  # it ended meanwhile: the pid may be someone else's already
                    fd = None
                with contextlib.suppress(NoSuchSession):
                    await self._ok("kill-session", "-t", _session(name))
            if fd is not None and not await wait_pidfd(fd, grace):
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                await wait_pidfd(fd, 30.0)
            return True
        finally:
            if fd is not None:
                os.close(fd)

    # -- panes ------------------------------------------------------------------------------
    async def capture(
        self, name: str, lines: int = DEFAULT_LOOK_LINES, *, joined: bool = False
    ) -> list[str]:
        """The last `lines` lines of the pane, oldest first (see the module doc); `joined`: a
        line the pane wrapped at its width is one line (`-J`), without trailing blanks."""
        if lines < 1:
            raise ValueError("lines must be >= 1")
        flags = ["-J"] if joined else []
        out = await self._ok("capture-pane", "-p", *flags, "-t", _pane(name), "-S", f"-{lines}")
        split = _split_output(out)
        if joined:
            split = [line.rstrip() for line in split]
        return _trim(split)[-lines:]

    async def cursor_x(self, name: str) -> int:
        return int(await self._display(name, "#{cursor_x}"))

    async def pane_pid(self, name: str) -> int:
        return int(await self._display(name, "#{pane_pid}"))

    async def pane_state(self, name: str) -> PaneState:
        return _pane_state(await self._display(name, _PANE_STATE))

    async def paste(self, name: str, text: str, *, bracketed: bool, submit: bool = False) -> None:
        """Paste `text` (bracketed or not); with `submit`, then a separate paste of "\\r"."""
        if text:
            buffer = _buffer_name()
            paste = ["paste-buffer", *(["-p"] if bracketed else []), "-d", "-b", buffer]
            result = await self.run(
                "load-buffer", "-b", buffer, "-", ";", *paste, "-t", _pane(name),
                stdin=text.encode("utf-8", "surrogatepass"),
            )  # fmt: skip
            if result.returncode != 0:
                with contextlib.suppress(TmuxError):
                    await self.run("delete-buffer", "-b", buffer)
                raise _failure(("paste-buffer",), result)
        if submit:
            await self.submit(name)

    async def submit(self, name: str) -> None:
        """An unbracketed paste of one "\\r": Enter, even in copy mode."""
        buffer = _buffer_name()
        result = await self.run(
            "set-buffer", "-b", buffer, "\r", ";", "paste-buffer", "-d", "-b", buffer,
            "-t", _pane(name),
        )  # fmt: skip
        if result.returncode != 0:
            with contextlib.suppress(TmuxError):
                await self.run("delete-buffer", "-b", buffer)
            raise _failure(("paste-buffer",), result)

    async def snapshot(self, name: str, history: int = 0) -> tuple[list[str], int, int, bool]:
        """(screen lines plus up to `history` lines above, cursor x, cursor y, dead), one call."""
        out = await self._ok(
            "capture-pane", "-p", "-t", _pane(name), "-S", f"-{max(0, history)}",
            ";",
            "display-message", "-p", "-t", _pane(name), "#{cursor_x} #{cursor_y} #{pane_dead}#{pane_dead_status}#{pane_dead_signal}",
        )  # fmt: skip
        lines = _split_output(out)
        if not lines:
            raise TmuxError("tmux_failed", "tmux returned no pane state")
        x, y, dead = lines.pop().split(" ")
        return lines, int(x), int(y), dead != "0"  # "0" alone: running, not yet reaped


async def watch_exit(server: TmuxServer, name: str, pane_pid: int) -> int | None:
    """Wait for the pane's process to exit; its exit code (-N: signal N) as tmux recorded it.

    The pidfd says when (any process, not only our children); tmux, its parent, reaps it and
    records the status, which `#{pane_dead_status}` / `#{pane_dead_signal}` read (remain-on-exit
    keeps the pane); when the status is slow to come, the server is nudged (`TmuxServer.nudge`). None when the session is gone, the pane now runs another pid, or tmux has
    not recorded a status within 5 s of the exit.
    """
    fd = open_pidfd(pane_pid)
    try:
        if fd is not None:
            try:
                pane = await server.pane_state(name)
            except NoSuchSession:
                return None
            if pane.pid == pane_pid and not pane.dead:
                await wait_pidfd(fd, None)
    finally:
        if fd is not None:
            os.close(fd)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    delay = 0.005
    while True:
        try:
            pane = await server.pane_state(name)
        except NoSuchSession:
            return None
        if pane.pid != pane_pid:
            return None
        if pane.exit is not None:
            return pane.exit
        if loop.time() >= deadline:
            return None
        await asyncio.sleep(delay)  # tmux reaps on its own SIGCHLD: a short lag, no event
        if delay >= 0.02:
            await server.nudge()
        delay = min(delay * 2, 0.1)


# -- processes and pipes --------------------------------------------------------------------


def _is_missing(stderr: str) -> bool:
    return any(marker in stderr for marker in _MISSING)


def _failure(args: Sequence[str], result: Completed) -> TmuxError:
    what = args[0] if args else "tmux"
    text = result.stderr.strip() or f"exit status {result.returncode}"
    details = {"command": what, "exit_status": result.returncode}
    if _is_missing(result.stderr):
        return NoSuchSession(f"tmux {what}: {text}", details)
    return TmuxError("tmux_failed", f"tmux {what}: {text}", details)


class _Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def _feed(loop: asyncio.AbstractEventLoop, pipe: Any, data: bytes) -> None:
    transport, protocol = await loop.connect_write_pipe(_Sink, pipe)
    transport.write(data)
    transport.close()  # after the buffer is flushed (or the reader is gone: EPIPE)
    await protocol.closed


async def _drain(loop: asyncio.AbstractEventLoop, pipe: Any) -> bytes:
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    try:
        return await reader.read()
    finally:
        transport.close()
