"""`AcpSession`: the relay's ACP client connection to one agent, over its pipes (acp.md §2-§7).

Owns: the connection (the PyPI `agent-client-protocol` 0.12.1 SDK's `ClientSideConnection`,
through `acp.connect_to_agent`) over an already-spawned agent's stdout (an asyncio StreamReader)
and stdin (a StreamWriter); bootstrap (`initialize`, the capabilities, `session/new` or
`session/load` with no fallback, 30 s per request, the codes of acp.md §2/§6); the member's state
(`initializing`, `available`, `busy`, `recovering`, `unavailable`), its reason code and the
`needs_respawn` signal; the turn (`prompt`: one at a time, "delivered" once its frame is written,
the rest runs as a task); the look buffer (`entries`, fed in frame order) and `last_frame_at`;
and the answer to `session/request_permission` (through `chooser`, or cancelled).

How it uses the SDK, and why (verified against 0.12.1's source):
- The connection runs over `transport.BoundedTransport` (the SDK's message-level `Transport`
  seam), not over the byte streams: the SDK starts a task per incoming message and queues every
  outgoing frame without a bound, so the bounds of SECURITY.md X10 (requests in flight, replies
  and bytes waiting for the agent's stdin, frames from the agent per second, one frame's
  size) are kept there, per agent. Past one the session is `unavailable` with
  `runtime_acp_flood` and its respawn signal, and the connection is dropped; the rate bound is
  metered from the end of bootstrap on (a `session/load` replay is a burst).
- Frames are read by a stream observer (`observers=` of the connection). The observer runs
  synchronously in the SDK's receive loop, in frame order, before each message's handler task
  is created: `session/update` is ingested there from the raw JSON, so order holds (the SDK runs
  every handler in its own task) and update kinds its models do not know are kept, not dropped.
  `Client.session_update` is therefore a no-op.
- `initialize`'s capabilities are read from the raw result (the observer keeps it): the SDK's
  model defaults `promptCapabilities` to an object when the agent omits it, and drops
  `promptSession`, so the model cannot tell the prompt capability (acp.md §2 step 4).
- "Written" is the outgoing observer's notice of the `session/prompt` frame: the SDK calls
  observers only after the frame was written and drained, while `conn.prompt` resolves only when
  the turn ends.
- A permission request's raw params and JSON-RPC id (the choices record's `raw` and
  `acp_request_id`) come from the observer too, handed to the handler task through a context
  variable: asyncio copies the context when the SDK creates that task, right after the observer.
- The SDK answers a permission request whose params fail its models with a JSON-RPC
  invalid-params error (the chooser never sees it), and `fs/*`/`terminal/*` calls with
  method-not-found (agentmux sent nothing); neither capability is advertised.
- After a stdin write error the SDK's sender task is dead and later sends would wait forever:
  the session closes the connection at once (state `unavailable`, `needs_respawn`).
- Its request ids start at 0 (agentmux's at 1).

States (acp.md §2): initializing -> available once bootstrapped, -> unavailable (with the code)
when bootstrap fails; available -> busy once a `session/prompt` frame is written; busy ->
available when the turn ends (any stopReason, a JSON-RPC error, a malformed reply); busy ->
unavailable + `needs_respawn` when the agent's stdout closes mid-turn; any -> unavailable +
`needs_respawn` on a stdin write error (or a closed connection found at the next prompt), or with
`runtime_acp_flood` once the agent exceeded a bound (whatever fails after that says so); `close`
-> unavailable, no respawn. A failed bootstrap raises the signal too, but for
`validation_missing_acp_capability` (permanent). `recovering` is the runner's to report (it makes
a new session per respawn). A cancelled permission choice does not end the turn here (agentmux
marked the member available at once): the agent's reply to the prompt does.

The SDK (`acp`, whose schema costs a supervisor start some 0.4 s of CPU to import) is imported
on first use, never at import: a supervisor without an ACP member never loads it.

Must never: start, signal or reap the agent's process (the supervisor's runner does), send
`session/cancel` (agentmux never does), answer `fs/*` or `terminal/*`, import
`mcphost.supervisor`, or persist the session id (the runner does).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from pydantic import ValidationError

from mcphost import __version__, events
from mcphost.agentmux.wire import RelayError
from mcphost.relay import reasons as R
from mcphost.relay.acp import states as S
from mcphost.relay.acp.entries import ENTRIES_MAX, EntryBuffer
from mcphost.relay.acp.transport import BoundedTransport, Bounds, Violation

if TYPE_CHECKING:
    from acp.connection import StreamEvent
    from acp.schema import McpServerStdio, RequestPermissionResponse

T = TypeVar("T")

PROTOCOL_VERSION = 1
BOOTSTRAP_TIMEOUT_SECONDS = 30.0
CLIENT_NAME = "mcphost-relay"

Chooser = Callable[[dict[str, Any], int | str | None], Awaitable[dict[str, Any]]]
"""`chooser(params, acp_request_id)`: a `session/request_permission`'s raw params and JSON-RPC id
-> the ACP outcome, `{"outcome": "selected", "optionId": ...}` or `{"outcome": "cancelled"}`
(`ChoicesQueue.ask` with the target and the turn's message id bound fits)."""
OnState = Callable[[str, str | None], None]

_PERMISSION_FRAME: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "mcphost_acp_permission_frame", default=None
)
_CANCELLED: dict[str, Any] = {"outcome": "cancelled"}


def stdio_server(
    name: str, command: str, args: Iterable[str] = (), env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """One MCP server as ACP passes it in `session/new`/`session/load`: `{name, command, args,
    env: [{name, value}]}`."""
    pairs = [{"name": key, "value": value} for key, value in (env or {}).items()]
    return {"name": name, "command": command, "args": list(args), "env": pairs}


class _Client:
    """The SDK's `Client` side of this session: permission requests go to the session; updates
    were already ingested from the raw frame; nothing else is implemented (fs, terminal)."""

    def __init__(self, session: AcpSession) -> None:
        self._session = session

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> RequestPermissionResponse:
        return await self._session._permission(session_id, tool_call, options)

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        return None


class AcpSession:
    """One ACP client connection over an agent's pipes; bootstrap it once, then prompt it."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        on_state: OnState | None = None,
        target_session: str | None = None,
        entries_cap: int = ENTRIES_MAX,
        request_timeout: float = BOOTSTRAP_TIMEOUT_SECONDS,
        bounds: Bounds | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.bounds = bounds or Bounds()
        self._transport: BoundedTransport | None = None
        self.on_state = on_state
        self.target_session = target_session
        self.request_timeout = request_timeout
        self.entries = EntryBuffer(entries_cap)
        self.chooser: Chooser | None = None
        self.state = S.INITIALIZING
        self.state_reason_code: str | None = None
        self.state_reason: str | None = None
        self.needs_respawn = False
        self.session_id: str | None = None
        self.can_load = False
        self.can_prompt = False
        self.last_frame_at: float | None = None  # time.monotonic() of the last frame read
        self.last_stop_reason: str | None = None
        self.turn_done = asyncio.Event()  # set while no turn runs
        self.turn_done.set()
        self._conn: Any = None  # acp ClientSideConnection, once bootstrap starts
        self._turn: asyncio.Task[Any] | None = None
        self._written: asyncio.Future[None] | None = None
        self._asking = False  # a permission request of this turn is with the chooser
        self._dropping: asyncio.Task[None] | None = None
        self._capture = False  # during initialize: keep request methods and raw results
        self._requests: dict[Any, str] = {}  # bootstrap: outgoing request id -> method
        self._results: dict[Any, Any] = {}  # bootstrap: incoming result by request id

    # -- bootstrap ----------------------------------------------------------------------------

    async def bootstrap(
        self,
        cwd: str,
        mcp_servers: Iterable[Mapping[str, Any]] = (),
        load_session_id: str | None = None,
        *,
        resume_session_id: str | None = None,
    ) -> str:
        """`initialize`, then `session/load` of `load_session_id` (no fallback) or `session/new`;
        the session id. `resume_session_id`: a session to load only when the agent offers
        `loadSession` (the id the runner persisted; an agent without it starts anew), where
        `load_session_id` (a configured `coder-session-id`) requires it. `mcp_servers`: ACP
        stdio entries (`stdio_server`). Raises `RelayError` with acp.md's codes; the state is
        then `unavailable` with that code."""
        if self._conn is not None:
            raise RuntimeError("an AcpSession is bootstrapped once; make a new one per process")
        import acp
        from acp.schema import McpServerStdio

        servers = [McpServerStdio.model_validate(dict(server)) for server in mcp_servers]
        self._transport = BoundedTransport(
            self._reader, self._writer, self.bounds, on_flood=self._flooded, where=self._where()
        )
        self._conn = acp.connect_to_agent(
            cast(acp.Client, _Client(self)), self._transport, observers=[self._observe]
        )
        self._capture = True
        try:
            await self._handshake()
            self._capture = False
            if load_session_id is None and self.can_load:
                load_session_id = resume_session_id
            if load_session_id is not None:
                await self._load(cwd, servers, load_session_id)
            else:
                await self._new(cwd, servers)
            if not self.can_prompt:
                raise self._missing("session/prompt", "promptCapabilities")
            if self.violation is not None:  # it flooded us right after its last reply
                raise self._flood("session/new" if load_session_id is None else "session/load")
        except RelayError as failure:
            permanent = failure.code == R.ACP_MISSING_CAPABILITY
            self._unavailable(failure.code, failure.message, respawn=not permanent)
            raise
        finally:
            self._capture = False
            self._requests.clear()
            self._results.clear()
        self._transport.metered = True
        self._set_state(S.AVAILABLE, None)
        assert self.session_id is not None
        return self.session_id

    async def _handshake(self) -> None:
        from acp.schema import ClientCapabilities, FileSystemCapabilities, Implementation

        capabilities = ClientCapabilities(
            fs=FileSystemCapabilities(read_text_file=False, write_text_file=False), terminal=False
        )
        await self._bounded(
            "initialize",
            R.ACP_INITIALIZE_FAILED,
            self._conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=capabilities,
                client_info=Implementation(name=CLIENT_NAME, version=__version__),
            ),
        )
        raw = next(
            (
                self._results.get(rid)
                for rid, method in self._requests.items()
                if method == "initialize"
            ),
            None,
        )
        agent = raw.get("agentCapabilities") if isinstance(raw, dict) else None
        agent = agent if isinstance(agent, dict) else {}
        self.can_load = agent.get("loadSession") is True
        prompt_session = agent.get("promptSession")
        self.can_prompt = (
            prompt_session
            if isinstance(prompt_session, bool)
            else isinstance(agent.get("promptCapabilities"), dict)
        )

    async def _load(self, cwd: str, servers: list[McpServerStdio], session_id: str) -> None:
        if not self.can_load:
            raise self._missing("session/load", "loadSession")
        self.session_id = session_id  # the replay's session/update frames carry it
        await self._bounded(
            "session/load",
            R.ACP_SESSION_LOAD_FAILED,
            self._conn.load_session(cwd=cwd, session_id=session_id, mcp_servers=servers),
        )

    async def _new(self, cwd: str, servers: list[McpServerStdio]) -> None:
        reply = await self._bounded(
            "session/new",
            R.ACP_SESSION_NEW_FAILED,
            self._conn.new_session(cwd=cwd, mcp_servers=servers),
        )
        session_id = getattr(reply, "session_id", None)
        if not isinstance(session_id, str) or not session_id:
            raise self._failure(
                R.ACP_SESSION_NEW_FAILED, "session/new", "the reply carries no sessionId"
            )
        self.session_id = session_id

    async def _bounded(self, method: str, code: str, call: Awaitable[T]) -> T:
        import acp

        try:
            return await asyncio.wait_for(call, self.request_timeout)
        except TimeoutError:
            why = f"no reply within {self.request_timeout:g} s"
            raise self._failure(
                code, method, why, timeout_ms=int(self.request_timeout * 1000)
            ) from None
        except acp.RequestError as err:
            raise self._failure(code, method, f"the agent answered an error: {err}") from err
        except ValidationError as err:
            raise self._failure(
                code, method, f"the reply is malformed: {err.error_count()} error(s)"
            ) from err
        except OSError as err:  # ConnectionError included: the agent's pipes closed
            if self.violation is not None:  # it flooded us during the handshake
                raise self._flood(method) from err
            raise self._failure(
                code, method, f"the connection failed: {err or type(err).__name__}"
            ) from err

    def _failure(self, code: str, method: str, why: str, **details: Any) -> RelayError:
        message = (
            f"ACP {method} failed ({why}); the agent is restarted with backoff: "
            "read its log (ctl logs) if this repeats"
        )
        return RelayError(
            code, message, {**self._where(), "method": method, "reason": why, **details}
        )

    def _flood(self, method: str) -> RelayError:
        violation = self.violation
        assert violation is not None
        details = {"method": method, "bound": violation.bound, "limit": violation.limit}
        return RelayError(R.ACP_FLOOD, violation.message, {**self._where(), **details})

    def _missing(self, capability: str, advertised: str) -> RelayError:
        why = f"the agent does not advertise {advertised} in initialize"
        return RelayError(
            R.ACP_MISSING_CAPABILITY,
            f"{why}, so it cannot serve {capability}: run an agent that supports it "
            + ("or drop the session to resume" if capability == "session/load" else "instead"),
            {**self._where(), "required_capability": capability, "reason": why},
        )

    def _where(self) -> dict[str, Any]:
        return {"target_session": self.target_session} if self.target_session else {}

    # -- frames -------------------------------------------------------------------------------

    def _observe(self, event: StreamEvent) -> None:
        """Every frame, synchronously, in order (the SDK's stream observer)."""
        from acp.connection import StreamDirection

        message = event.message
        method = message.get("method")
        if event.direction is StreamDirection.OUTGOING:
            if (
                method == "session/prompt"
                and self._written is not None
                and not self._written.done()
            ):
                self._written.set_result(None)
            elif method is not None and "id" in message and self._capture:
                self._requests[message["id"]] = method
            return
        self.last_frame_at = time.monotonic()
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if method == "session/update":
            if self.session_id is None or params.get("sessionId") == self.session_id:
                self.entries.ingest(params.get("update"))
        elif method == "session/request_permission" and "id" in message:
            _PERMISSION_FRAME.set(message)  # the handler task, created next, copies it
        elif method is None and "id" in message and self._capture:
            self._results[message["id"]] = message.get("result")

    async def _permission(
        self, session_id: str, tool_call: Any, options: list[Any]
    ) -> RequestPermissionResponse:
        from acp.schema import RequestPermissionResponse

        frame = _PERMISSION_FRAME.get()
        params: dict[str, Any] | None = frame.get("params") if frame is not None else None
        if not (
            isinstance(params, dict)
            and params.get("sessionId") == session_id
            and isinstance(params.get("toolCall"), dict)
            and params["toolCall"].get("toolCallId") == tool_call.tool_call_id
        ):  # not the frame this handler serves: rebuild the params from the SDK's models
            frame = None
            params = {
                "sessionId": session_id,
                "toolCall": tool_call.model_dump(by_alias=True, exclude_none=True),
                "options": [
                    option.model_dump(by_alias=True, exclude_none=True) for option in options
                ],
            }
        refusal = self._refusal(session_id)
        if refusal is not None:
            events.emit(
                "relay.acp.permission.refused", level="info", **self._where(), reason=refusal
            )
            return RequestPermissionResponse.model_validate({"outcome": _CANCELLED})
        assert self.chooser is not None  # _refusal
        self._asking = True
        try:
            outcome = await self.chooser(params, frame.get("id") if frame is not None else None)
            return RequestPermissionResponse.model_validate({"outcome": outcome})
        except Exception as exc:  # a chooser's bug or a malformed outcome: the agent is told no
            events.emit(
                "relay.acp.permission.chooser_failed",
                level="warning",
                **self._where(),
                error=f"{type(exc).__name__}: {exc}",
            )
            return RequestPermissionResponse.model_validate({"outcome": _CANCELLED})
        finally:
            self._asking = False

    def _refusal(self, session_id: str) -> str | None:
        """Why a permission request is answered cancelled at once (acp.md §4), or None."""
        if self._turn is None:
            return "no prompt is active"
        if session_id != self.session_id:
            return "its sessionId is not the active prompt's"
        if self._asking:
            return "another permission request of this prompt is in flight"
        if self.chooser is None:
            return "no chooser is installed"
        return None

    # -- turns --------------------------------------------------------------------------------

    async def prompt(self, text: str) -> bool:
        """Write one `session/prompt` with `text`: True once the frame is written (the turn then
        runs as a task; `turn_done` is set when it ends), False when not written because the
        session is not `available` or a turn runs. Raises `RelayError` `transport_unavailable`
        when the write failed (whether the agent got it is unknown); the session is then
        `unavailable` with `needs_respawn`."""
        import acp

        if self.state != S.AVAILABLE or self._turn is not None or self._conn is None:
            return False
        if self._reader.at_eof():  # the agent's stdout closed while idle
            self._unavailable(R.TRANSPORT_UNAVAILABLE, "the agent closed its stdout", respawn=True)
            return False
        loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()
        self._written = written
        turn = loop.create_task(
            self._conn.prompt(session_id=self.session_id, prompt=[acp.text_block(text)])
        )
        self._turn = turn
        self.turn_done.clear()
        try:
            await asyncio.wait({written, turn}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # also when our caller is cancelled: a written turn still runs and ends
            self._written = None
            if written.done():
                self._set_state(S.BUSY, None)
                self.entries.add_prompt(text)
            turn.add_done_callback(self._turn_ended)
        if written.done():
            return True
        self._turn = None
        self.turn_done.set()
        failure = turn.exception()
        if type(failure) is ConnectionError:  # the SDK's own "closed": nothing was written
            self._unavailable(
                R.TRANSPORT_UNAVAILABLE, "the connection to the agent is closed", True
            )
            return False
        why = f"writing session/prompt failed: {type(failure).__name__}: {failure}"
        self._unavailable(R.TRANSPORT_UNAVAILABLE, why, respawn=True)
        await self._drop_connection()
        raise RelayError(
            R.TRANSPORT_UNAVAILABLE,
            f"{why}; whether the agent got the prompt is unknown, and it is restarted",
            {**self._where(), "reason": why},
        )

    def _turn_ended(self, turn: asyncio.Task[Any]) -> None:
        if self._turn is not turn:  # never written: prompt() settled it
            return
        self._turn = None
        self.turn_done.set()
        if turn.cancelled() or self.state != S.BUSY:  # closed, or found unavailable already
            return
        failure = turn.exception()
        if failure is None:
            self.last_stop_reason = getattr(turn.result(), "stop_reason", None)
            if self.last_stop_reason not in (None, "end_turn"):  # a refusal, a cancel, a limit
                self.entries.add_turn_end(f"stopReason: {self.last_stop_reason}")
        elif isinstance(failure, ConnectionError):  # stdout closed (or a write failed) mid-turn
            self._unavailable(
                R.TRANSPORT_UNAVAILABLE, "the agent's connection closed mid-turn", True
            )
            # a permission request still with the chooser can never be answered: drop it
            self._dropping = asyncio.get_running_loop().create_task(self._drop_connection())
            return
        else:  # a JSON-RPC error or a malformed reply: the turn is over all the same
            self.last_stop_reason = None
            self.entries.add_turn_end(f"the turn failed: {type(failure).__name__}: {failure}")
        if self.state == S.BUSY:
            self._set_state(S.AVAILABLE, None)

    # -- bounds -------------------------------------------------------------------------------

    @property
    def violation(self) -> Violation | None:
        """The bound the agent exceeded (transport.py), or None."""
        return self._transport.violation if self._transport is not None else None

    def _flooded(self, violation: Violation) -> None:
        """The transport ended its side: `unavailable` with `ACP_FLOOD` and the respawn signal,
        and the connection dropped (its handler tasks and a running turn end)."""
        self._unavailable(R.ACP_FLOOD, violation.message, respawn=True)
        if self._dropping is None or self._dropping.done():
            loop = asyncio.get_running_loop()
            self._dropping = loop.create_task(self._drop_connection())

    # -- state --------------------------------------------------------------------------------

    def mark_unavailable(self, reason_code: str, reason: str, respawn: bool = True) -> None:
        """What the runner reports of the process (it exited while idle, say): `unavailable`."""
        self._unavailable(reason_code, reason, respawn)

    def _unavailable(self, reason_code: str, reason: str, respawn: bool) -> None:
        violation = self.violation
        if violation is not None:  # what fails after a flood fails because of it
            reason_code, reason, respawn = R.ACP_FLOOD, violation.message, True
        self.needs_respawn = self.needs_respawn or respawn
        self.state_reason = reason
        self._set_state(S.UNAVAILABLE, reason_code)

    def _set_state(self, state: str, reason_code: str | None) -> None:
        if state == self.state and reason_code == self.state_reason_code:
            return
        if state != S.UNAVAILABLE:
            self.state_reason = None
        self.state = state
        self.state_reason_code = reason_code
        if self.on_state is not None:
            self.on_state(state, reason_code)

    async def close(self) -> None:
        """Close the connection (its handler tasks and a running turn are cancelled) and the
        agent's stdin: `unavailable`, no respawn. The process is the runner's to stop."""
        if self.state != S.UNAVAILABLE:
            self._unavailable(R.ACP_WORKER_UNAVAILABLE, "the session was closed", respawn=False)
        await self._drop_connection()
        with contextlib.suppress(OSError, RuntimeError):
            self._writer.close()

    async def _drop_connection(self) -> None:
        turn, conn = self._turn, self._conn
        if turn is not None and not turn.done():
            turn.cancel()
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
        if turn is not None:
            await asyncio.wait({turn})  # its outcome is _turn_ended's
