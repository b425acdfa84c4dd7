"""AdminClient: one pooled aiohttp session to the center (or the runtime socket).

Owns: the transport (Unix socket, or TCP+TLS pinned to a certificate set), sending an
`AdminRequest` exactly as it was built (route, JSON body, query, headers) plus the transport's own
headers (`Authorization: Bearer`, `User-Agent`), timeouts, the response-size cap, keep-alive
reuse, and the classification of every transport failure into an `AdminFailure` with a stable
code (`admin_unavailable`, `admin_timeout`, `admin_pin_mismatch`, `admin_tls_error`,
`admin_redirect_refused`, `admin_response_too_large`, `admin_protocol_error`), of every center
error envelope into a `CenterRefusal` (the one place the center's codes become classes), and
the failure for center JSON nested deeper than Python's recursion limit (`nesting_failure`,
raised by the reply parsers in `mcphost.host.results`): an `admin_protocol_error`, never a
`RecursionError`.

What the client talks to is one `AdminAccess` (target, pins, token), read when each exchange
starts: `rebind` swaps it for every later call (a new target or pin set gets a new connection
pool; the old one is closed once its exchanges end), so a holder such as the supervisor changes
the center, the pins or the token without rebuilding anything that uses the client. A 401 is
handed to `on_unauthorized` (when given) with the token that was refused: if it answers True (a
fresh token is in place), the exchange is sent once more with it, and a body that cannot be sent
again (a stream) is not retried. `on_failure` (when given) sees every classified failure and
returns the one to raise (the supervisor names its fleet keys there).

The client knows no agent: who is speaking (`agent_id`, `X-AC-MCP-Generation`) is in the
request, written by `mcphost.host.requests.RequestBuilder` alone, so one pooled client can carry
the requests of many bindings.

The pin is checked by the connector right after the TLS handshake and before the connection is
handed to a request, so no request byte (and so no token) ever reaches an unpinned peer. Pins
are SHA-256 over the leaf certificate's DER; a pinned certificate outside its validity window
(expired, or notBefore in the future) is refused. Redirects are never followed (on any route:
JSON tools, the runtime socket, transfers): a 3xx is `admin_redirect_refused` and nothing is sent
to its Location, which would otherwise be reached without the pin.

Concurrency: at most `POOL_SIZE` exchanges are in flight per client, and at most `per_lane` of
them for one lane (`AdminRequest.lane`, the agent whose share the exchange spends; unset, a lane
may use the whole pool); further calls wait before any connection is taken, served round-robin
between lanes and in arrival order within one (`mcphost.admin.slots`), bounded by
`queue_timeout` (default: four call timeouts, since waiting sends nothing and a healthy center
drains a burst steadily; the exchange then has its own budget). A standalone host has one lane:
a plain FIFO. The supervisor's shared client caps each agent, so one agent's slow calls never
hold the slots another agent's calls need. aiohttp's own connector limit is off, so waiting for a slot
never counts against the connect timeout. `admin_timeout` phase `queue`: nothing was sent;
phase `connect`: the connection (TCP, TLS, pin) was not established within `connect_timeout`,
so nothing was sent; phase `reply`: the request may have taken effect.

aiohttp is imported on first use, not at module import: the host answers `initialize` first.
Must never: log or echo the token; send a request over TCP without a pin set; follow a redirect;
add or change identity (body, query or headers of a request).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from mcphost import __version__
from mcphost.admin.pinning import format_pin
from mcphost.admin.slots import Slots
from mcphost.admin.target import AdminTarget
from mcphost.errors import (
    AdminFailure,
    AdminUnavailable,
    AdmissionRefused,
    CenterRefusal,
    StaleGeneration,
    ToolFailure,
)

if TYPE_CHECKING:
    import aiohttp

CONNECT_TIMEOUT = 5.0
CALL_TIMEOUT = 30.0
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
POOL_SIZE = 64  # exchanges in flight per client; the rest wait, round-robin between lanes
QUEUE_TIMEOUTS = 4  # a call may wait this many call timeouts for a slot before giving up


@dataclass(frozen=True, slots=True)
class AdminAccess:
    """Where the center is, the pins that admit its certificate, and the bearer token."""

    target: AdminTarget
    pins: tuple[bytes, ...] = ()
    token: str = ""

    def __post_init__(self) -> None:
        if self.target.kind == "tcp" and not self.pins:
            raise ValueError("a tcp:// target needs at least one certificate pin")

    def __repr__(self) -> str:  # never the token
        return f"AdminAccess({self.target}, {len(self.pins)} pin(s))"


@dataclass(frozen=True, slots=True)
class AdminRequest:
    """One request to the center (or the runtime socket), complete: the client sends exactly
    this. `body` is a JSON object, or None (a GET, or a byte stream handed to `stream`).
    `lane` is whose share of the client's slots it spends (never sent)."""

    method: str
    route: str
    body: Mapping[str, Any] | None = None
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    lane: str = ""

    def __post_init__(self) -> None:
        for name in ("query", "headers"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        if self.body is not None:
            object.__setattr__(self, "body", MappingProxyType(dict(self.body)))


@dataclass(frozen=True, slots=True)
class Reply:
    """A 2xx reply from the center, fully read (within the cap)."""

    status: int
    body: bytes
    content_type: str


class _PinClasses(NamedTuple):
    pin_set: type
    not_valid: type


@cache
def _pin_classes() -> _PinClasses:
    """Build the aiohttp Fingerprint subclass once, lazily (aiohttp is imported on first use).

    Cached so `classify` can test `isinstance` against the very class `check` raises.
    """
    import aiohttp

    class PinnedCertificateNotValid(aiohttp.ServerFingerprintMismatch):
        """The certificate matches a pin but is outside its validity window."""

        def __init__(self, expected: bytes, got: bytes, host: str, port: int, *, reason: str):
            super().__init__(expected, got, host, port)
            self.reason = reason  # "certificate_expired" | "certificate_not_yet_valid"

    class PinSet(aiohttp.Fingerprint):
        """A set of SHA-256 leaf pins; any one matching admits the connection."""

        def __init__(self, pins: tuple[bytes, ...]) -> None:
            super().__init__(pins[0])
            self.pins = pins

        def check(self, transport: asyncio.Transport) -> None:
            if not transport.get_extra_info("sslcontext"):
                return
            import hashlib

            der = transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
            got = hashlib.sha256(der).digest()
            host, port, *_ = transport.get_extra_info("peername")
            if got not in self.pins:
                raise aiohttp.ServerFingerprintMismatch(self.pins[0], got, host, port)
            from datetime import UTC, datetime

            from cryptography import x509

            cert = x509.load_der_x509_certificate(der)
            now = datetime.now(UTC)
            if cert.not_valid_after_utc < now:
                raise PinnedCertificateNotValid(
                    self.pins[0], got, host, port, reason="certificate_expired"
                )
            if cert.not_valid_before_utc > now:
                raise PinnedCertificateNotValid(
                    self.pins[0], got, host, port, reason="certificate_not_yet_valid"
                )

    return _PinClasses(PinSet, PinnedCertificateNotValid)


class AdminClient:
    """Talks HTTP to one target. Create once per process; `aclose()` at shutdown."""

    def __init__(
        self,
        target: AdminTarget,
        *,
        token: str = "",
        pins: tuple[bytes, ...] = (),
        connect_timeout: float = CONNECT_TIMEOUT,
        call_timeout: float = CALL_TIMEOUT,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        pool_size: int = POOL_SIZE,
        per_lane: int | None = None,
        queue_timeout: float | None = None,
        on_unauthorized: Callable[[str], Awaitable[bool]] | None = None,
        on_failure: Callable[[ToolFailure], ToolFailure] | None = None,
    ) -> None:
        self._access = AdminAccess(target, pins, token)
        self.on_unauthorized = on_unauthorized
        self.on_failure = on_failure
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self.max_response_bytes = max_response_bytes
        self.queue_timeout = (
            QUEUE_TIMEOUTS * call_timeout if queue_timeout is None else queue_timeout
        )
        self._slots = Slots(pool_size, per_lane)
        self._session: aiohttp.ClientSession | None = None
        self._session_access: AdminAccess | None = None  # the target and pins it was built for
        self._in_use: dict[aiohttp.ClientSession, int] = {}  # exchanges per pool
        self._retired: set[aiohttp.ClientSession] = set()  # closed once their exchanges end
        self._closing: set[asyncio.Future[None]] = set()

    # -- what the client talks to ---------------------------------------------------------
    @property
    def access(self) -> AdminAccess:
        return self._access

    @property
    def target(self) -> AdminTarget:
        return self._access.target

    def rebind(self, access: AdminAccess) -> None:
        """Every exchange that starts from now on uses `access`; those in flight finish on what
        they started with. A new target or pin set gets a new pool (the old one is closed when
        its last exchange ends); a new token alone keeps the pooled connections."""
        self._access = access
        old = self._session
        if old is not None and not _same_pool(self._session_access, access):
            self._session = None
            self._retire(old)

    # -- session --------------------------------------------------------------------------
    def _get_session(self, access: AdminAccess) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._new_session(access)
            self._session_access = access
        return self._session

    def _retire(self, session: aiohttp.ClientSession) -> None:
        if self._in_use.get(session, 0) == 0:
            self._in_use.pop(session, None)
            closing = asyncio.ensure_future(session.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        else:
            self._retired.add(session)

    def _new_session(self, access: AdminAccess) -> aiohttp.ClientSession:
        import aiohttp

        connector: aiohttp.BaseConnector
        # limit=0: `_Slots` bounds concurrency, so aiohttp never makes a request wait for a
        # pooled connection inside its connect timeout
        target = access.target
        if target.kind == "unix":
            connector = aiohttp.UnixConnector(path=target.path, keepalive_timeout=30, limit=0)
        else:
            connector = aiohttp.TCPConnector(
                ssl=_pin_classes().pin_set(access.pins), keepalive_timeout=30, limit=0
            )
        # the bearer is added per exchange (`stream`), from the access it started with
        headers = {"Accept": "application/json", "User-Agent": f"mcphost/{__version__}"}
        return aiohttp.ClientSession(
            base_url=target.base_url,
            connector=connector,
            headers=headers,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=self.connect_timeout, sock_connect=self.connect_timeout
            ),
            auto_decompress=False,
        )

    async def aclose(self) -> None:
        for session in (self._session, *self._retired):
            if session is not None:
                await session.close()
        self._session = None
        self._retired.clear()

    # -- calls ----------------------------------------------------------------------------
    async def call(self, request: AdminRequest, *, retry_safe: bool = False) -> Reply:
        """Send a JSON request, read the whole (capped) reply. Non-2xx raises `ToolFailure`.

        With `retry_safe` (reads), a call that found the center unavailable is tried once more.
        """
        attempts = 2 if retry_safe else 1
        for attempt in range(attempts):
            try:
                async with self.stream(request, timeout=self.call_timeout) as response:
                    payload = await read_capped(response, self.max_response_bytes, self.target)
                    return Reply(response.status, payload, response.content_type)
            except AdminUnavailable:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.05)
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def stream(
        self, request: AdminRequest, *, data: Any = None, timeout: float | None = None
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send `request` and yield the response with a 2xx status; errors are classified.

        The body is `data` (bytes or an async iterator of bytes, for uploads) when given, else
        the request's JSON body, if any.

        `timeout` bounds the whole exchange once a slot is held; `None` means connect/read
        timeouts only (for streaming transfers whose length is not bounded in time). Waiting for
        a slot is bounded separately by `queue_timeout`. A 3xx is refused, never followed.
        """
        import aiohttp

        client_timeout = aiohttp.ClientTimeout(
            total=timeout,
            connect=self.connect_timeout,
            sock_connect=self.connect_timeout,
            sock_read=None if timeout else self.call_timeout,
        )
        try:
            await self._slots.acquire(request.lane, self.queue_timeout)
        except TimeoutError:
            raise self._seen(
                queue_failure(self.target, self.queue_timeout, self._slots, request.lane)
            ) from None
        headers = dict(request.headers)
        if data is None and request.body is not None:
            data = json.dumps(dict(request.body), ensure_ascii=False, separators=(",", ":"))
            data = data.encode()
            headers.setdefault("Content-Type", "application/json")
        resendable = data is None or isinstance(data, bytes)
        access = self._access  # this exchange's target, pins and token, whatever a rebind does
        try:
            for attempt in range(2):
                session = self._get_session(access)
                self._in_use[session] = self._in_use.get(session, 0) + 1
                try:
                    async with session.request(
                        request.method,
                        request.route,
                        data=data,
                        headers=_with_bearer(headers, access.token),
                        params=dict(request.query) or None,
                        timeout=client_timeout,
                        allow_redirects=False,
                    ) as response:
                        if 300 <= response.status < 400:
                            raise redirect_failure(
                                response.status,
                                response.headers.get("Location"),
                                request.method,
                                access.target,
                            )
                        if (
                            response.status == 401
                            and attempt == 0
                            and resendable
                            and await self._fresh_token(access)
                        ):
                            access = self._access  # refused for its token: once more, anew
                            continue
                        if response.status >= 300:
                            body = await read_capped(
                                response, 64 * 1024, access.target, truncate=True
                            )
                            raise http_failure(response.status, body)
                        yield response
                        return
                finally:
                    self._done_with(session)
        except ToolFailure as failure:
            raise self._seen(failure) from None
        except Exception as exc:
            raise self._seen(
                classify(
                    exc,
                    access.target,
                    timeout or self.call_timeout,
                    connect_timeout=self.connect_timeout,
                )
            ) from None
        finally:
            self._slots.release(request.lane)

    async def _fresh_token(self, refused: AdminAccess) -> bool:
        """After a 401: whether `on_unauthorized` put a token other than `refused`'s in place."""
        if self.on_unauthorized is None:
            return False
        return await self.on_unauthorized(refused.token) and self._access.token != refused.token

    def _seen(self, failure: ToolFailure) -> ToolFailure:
        return failure if self.on_failure is None else self.on_failure(failure)

    def _done_with(self, session: aiohttp.ClientSession) -> None:
        self._in_use[session] -= 1
        if session in self._retired and self._in_use[session] == 0:
            self._retired.discard(session)
            self._retire(session)


def _same_pool(built: AdminAccess | None, access: AdminAccess) -> bool:
    """Whether a pool built for `built` may carry exchanges for `access` (the token is sent
    per exchange; the target and the pins are the pool's)."""
    return built is not None and (built.target, built.pins) == (access.target, access.pins)


def _with_bearer(headers: Mapping[str, str], token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", **headers} if token else dict(headers)


async def read_capped(
    response: aiohttp.ClientResponse, cap: int, target: AdminTarget, *, truncate: bool = False
) -> bytes:
    """Read a body up to `cap` bytes; beyond it, truncate or fail with a clear error."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > cap:
            if truncate:
                chunks.append(chunk[: len(chunk) - (size - cap)])
                break
            raise AdminFailure(
                "admin_response_too_large",
                f"the center's reply exceeded {cap} bytes and was dropped; ask for less "
                "(narrower query, smaller page) and try again",
                {"target": str(target), "limit_bytes": cap},
            )
        chunks.append(chunk)
    return b"".join(chunks)


def http_failure(status: int, body: bytes) -> AdminFailure:
    """A non-2xx center reply -> its own `{error, message}` intact, with the status."""
    envelope: Any = None
    try:
        envelope = json.loads(body)
    except (ValueError, RecursionError):
        pass
    if isinstance(envelope, dict) and isinstance(envelope.get("error"), str):
        code = envelope["error"]
        details = {k: v for k, v in envelope.items() if k not in ("error", "message")}
        return refusal_class(code)(code, str(envelope.get("message") or ""), details, status=status)
    excerpt = body[:2048].decode("utf-8", "replace")
    return CenterRefusal(
        "admin_http_error",
        f"the center answered HTTP {status} without an error envelope; the call did not "
        "succeed — check the arguments, or report this reply to the center's operators",
        {"body": excerpt},
        status=status,
    )


_ADMISSION_CODES = frozenset({"agent_not_bound_to_worker"})


def refusal_class(code: str) -> type[CenterRefusal]:
    """The class of a center error code: the only place the center's codes are read.

    Admission codes say the center refused *this host* (its token, its worker, its generation),
    whatever was asked; every other code refuses the request itself."""
    if code == "stale_generation":
        return StaleGeneration
    if code.startswith("auth_") or code in _ADMISSION_CODES:
        return AdmissionRefused
    return CenterRefusal


_MAX_LOCATION_CHARS = 2048


def redirect_failure(
    status: int, location: str | None, method: str, target: AdminTarget
) -> AdminFailure:
    """A 3xx from the center: refused, never followed (it would leave the pinned connection)."""
    where = str(target)
    return AdminFailure(
        "admin_redirect_refused",
        f"the center at {where} answered HTTP {status} redirecting to "
        f"{location or '(no Location)'}; redirects are not followed (the new address would not "
        "be covered by the pin or the socket binding), so nothing was sent there and the call "
        "did not complete. Do not retry: the operator should point AC_MCP_ADMIN_URL (or "
        "AC_MCP_RUNTIME_SOCKET) at the address that answers directly, or stop the center or "
        "proxy from redirecting",
        {
            "target": where,
            "status": status,
            "location": location[:_MAX_LOCATION_CHARS] if location else None,
            "method": method,
        },
        status=status,
    )


def queue_failure(
    target: AdminTarget, waited: float | None, slots: Slots, lane: str = ""
) -> AdminFailure:
    """Gave up waiting for a free request slot: nothing was sent."""
    where = str(target)
    mine = slots.held(lane)
    return AdminFailure(
        "admin_timeout",
        f"no connection to the center at {where} became free within {waited} s ({mine} of "
        f"this caller's calls were in flight, at most {slots.per_lane} at once, and more were "
        "waiting); nothing was sent, so the call did not take effect. Retry it, ideally with "
        "fewer calls at once",
        {
            "target": where,
            "phase": "queue",
            "timeout_seconds": waited,
            "in_flight": mine,
            "per_caller": slots.per_lane,
            "waiting": slots.waiting,
        },
    )


def nesting_failure(size: int, step: str = "reply") -> AdminFailure:
    """A 2xx center body whose JSON nests deeper than this process can parse (RecursionError)."""
    import sys

    return AdminFailure(
        "admin_protocol_error",
        f"the center's {step} ({size} bytes) is JSON nested too deeply to read (over about "
        f"{sys.getrecursionlimit()} levels), so it was dropped. The center reported success, so "
        "a write did take effect: check with a read (a narrower one) before repeating it, and "
        "report this reply to the center's operators",
        {"reason": "json_nesting_too_deep", "step": step, "reply_bytes": size},
    )


def classify(
    exc: BaseException,
    target: AdminTarget,
    timeout: float | None,
    *,
    connect_timeout: float = CONNECT_TIMEOUT,
) -> AdminFailure:
    """A transport exception -> a `ToolFailure` with a stable code and a remedy.

    `timeout` is the reply budget of the exchange, `connect_timeout` the connection budget:
    each is reported with the phase it bounded.
    """
    import aiohttp

    where = str(target)
    if isinstance(exc, _pin_classes().not_valid):
        reason = str(getattr(exc, "reason", "certificate_expired"))
        return AdminFailure(
            "admin_tls_error",
            f"the center at {where} presented a pinned certificate that "
            + (
                "has expired"
                if reason == "certificate_expired"
                else "is not valid yet (its notBefore is in the future)"
            )
            + "; nothing was sent. Check this worker's clock; otherwise the center must "
            "present a currently valid certificate and operators must update the pin",
            {"target": where, "reason": reason},
        )
    if isinstance(exc, aiohttp.ServerFingerprintMismatch):
        return AdminFailure(
            "admin_pin_mismatch",
            f"the certificate presented by {where} matches none of the pinned fingerprints: "
            "the center's certificate rotated, or the connection is being intercepted. Nothing "
            "was sent. Verify the new fingerprint out of band, then update "
            "AC_MCP_SERVER_FINGERPRINT (a comma-separated list allows a rotation overlap)",
            {
                "target": where,
                "expected": [format_pin(exc.expected)],
                "received": format_pin(exc.got),
            },
        )
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return AdminFailure(
            "admin_timeout",
            f"the center at {where} did not accept the connection within {connect_timeout} s "
            "(TCP, TLS and pin check); nothing was sent, so the call did not take effect. The "
            "center may be down or overloaded: retry in a moment",
            {"target": where, "phase": "connect", "timeout_seconds": connect_timeout},
        )
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return AdminFailure(
            "admin_timeout",
            f"the center at {where} did not answer within {timeout} s; it may be overloaded. "
            "The call may or may not have taken effect: check with a read (e.g. get_task) "
            "before retrying a write",
            {"target": where, "phase": "reply", "timeout_seconds": timeout},
        )
    if isinstance(exc, aiohttp.ClientSSLError):
        return AdminFailure(
            "admin_tls_error",
            f"the TLS handshake with {where} failed; check that AC_MCP_ADMIN_URL points at the "
            "center's TLS port",
            {"target": where, "reason": type(getattr(exc, "os_error", exc)).__name__},
        )
    if isinstance(exc, aiohttp.ClientConnectorError | FileNotFoundError | ConnectionError):
        os_error = getattr(exc, "os_error", exc)
        reason = {
            FileNotFoundError: "socket_missing",
            ConnectionRefusedError: "connection_refused",
        }.get(type(os_error), type(os_error).__name__)
        return AdminUnavailable(
            "admin_unavailable",
            f"the center at {where} is not reachable ({reason.replace('_', ' ')}); it may be "
            "down or restarting. Retry in a moment; if it persists, the operator should check "
            "that the center is running and AC_MCP_ADMIN_URL is right",
            {"target": where, "reason": reason},
        )
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return AdminUnavailable(
            "admin_unavailable",
            f"the center at {where} closed the connection before answering; the call may or "
            "may not have taken effect: check with a read before retrying a write",
            {"target": where, "reason": "disconnected"},
        )
    if isinstance(exc, aiohttp.ClientError):
        return AdminFailure(
            "admin_protocol_error",
            f"the exchange with {where} failed ({type(exc).__name__}); retry once, then report it",
            {"target": where, "reason": type(exc).__name__},
        )
    raise exc
