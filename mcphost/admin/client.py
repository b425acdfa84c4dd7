"""AdminClient: one pooled aiohttp session to the center (or the runtime socket).

Owns: the transport (Unix socket, or TCP+TLS pinned to a certificate set), the headers every
call carries (`Authorization: Bearer`, `X-AC-MCP-Generation`), timeouts, the response-size cap,
keep-alive reuse, and the classification of every transport failure into a `ToolFailure` with
a stable code (`admin_unavailable`, `admin_timeout`, `admin_pin_mismatch`, `admin_tls_error`,
`admin_response_too_large`, `admin_protocol_error`).

The pin is checked by the connector right after the TLS handshake and before the connection is
handed to a request, so no request byte (and so no token) ever reaches an unpinned peer. Pins
are SHA-256 over the leaf certificate's DER; a pinned certificate that has expired is refused.

aiohttp is imported on first use, not at module import: the host answers `initialize` first.
Must never: log or echo the token; send a request over TCP without a pin set.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mcphost import __version__
from mcphost.admin.pinning import format_pin
from mcphost.admin.target import AdminTarget
from mcphost.errors import ToolFailure

if TYPE_CHECKING:
    import aiohttp

CONNECT_TIMEOUT = 5.0
CALL_TIMEOUT = 30.0
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
GENERATION_HEADER = "X-AC-MCP-Generation"


@dataclass(frozen=True, slots=True)
class Reply:
    """A 2xx reply from the center, fully read (within the cap)."""

    status: int
    body: bytes
    content_type: str


def _pin_set_class() -> type:
    """Build the aiohttp Fingerprint subclass lazily (aiohttp is imported on first use)."""
    import aiohttp

    class PinnedCertificateExpired(aiohttp.ServerFingerprintMismatch):
        """The certificate matches a pin but is past its notAfter date."""

    class PinSet(aiohttp.Fingerprint):
        """A set of SHA-256 leaf pins; any one matching admits the connection."""

        Expired = PinnedCertificateExpired

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

            not_after = x509.load_der_x509_certificate(der).not_valid_after_utc
            if not_after < datetime.now(UTC):
                raise PinnedCertificateExpired(self.pins[0], got, host, port)

    return PinSet


class AdminClient:
    """Talks HTTP to one target. Create once per process; `aclose()` at shutdown."""

    def __init__(
        self,
        target: AdminTarget,
        *,
        token: str = "",
        pins: tuple[bytes, ...] = (),
        generation: int = 0,
        connect_timeout: float = CONNECT_TIMEOUT,
        call_timeout: float = CALL_TIMEOUT,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        if target.kind == "tcp" and not pins:
            raise ValueError("a tcp:// target needs at least one certificate pin")
        self.target = target
        self._token = token
        self._pins = pins
        self._generation = generation
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self.max_response_bytes = max_response_bytes
        self._session: aiohttp.ClientSession | None = None
        self._session_lock = asyncio.Lock()

    # -- session --------------------------------------------------------------------------
    async def _get_session(self) -> aiohttp.ClientSession:
        if self._session is not None and not self._session.closed:
            return self._session
        async with self._session_lock:
            if self._session is None or self._session.closed:
                self._session = self._new_session()
        return self._session

    def _new_session(self) -> aiohttp.ClientSession:
        import aiohttp

        connector: aiohttp.BaseConnector
        if self.target.kind == "unix":
            connector = aiohttp.UnixConnector(path=self.target.path, keepalive_timeout=30)
        else:
            connector = aiohttp.TCPConnector(
                ssl=_pin_set_class()(self._pins), keepalive_timeout=30, limit=64
            )
        headers = {"Accept": "application/json", "User-Agent": f"mcphost/{__version__}"}
        headers[GENERATION_HEADER] = str(self._generation)
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return aiohttp.ClientSession(
            base_url=self.target.base_url,
            connector=connector,
            headers=headers,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=self.connect_timeout, sock_connect=self.connect_timeout
            ),
            auto_decompress=False,
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- calls ----------------------------------------------------------------------------
    async def call(self, path: str, body: Mapping[str, Any], *, retry_safe: bool = False) -> Reply:
        """POST a JSON body, read the whole (capped) reply. Non-2xx raises `ToolFailure`."""
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        attempts = 2 if retry_safe else 1
        for attempt in range(attempts):
            try:
                async with self.stream(
                    "POST",
                    path,
                    data=data,
                    headers={"Content-Type": "application/json"},
                    timeout=self.call_timeout,
                ) as response:
                    payload = await read_capped(response, self.max_response_bytes, self.target)
                    return Reply(response.status, payload, response.content_type)
            except ToolFailure as failure:
                if failure.code != "admin_unavailable" or attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.05)
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Open a request and yield the response with a 2xx status; errors are classified.

        `timeout` bounds the whole exchange; `None` means connect/read timeouts only (for
        streaming transfers whose length is not bounded in time).
        """
        import aiohttp

        session = await self._get_session()
        client_timeout = aiohttp.ClientTimeout(
            total=timeout,
            connect=self.connect_timeout,
            sock_connect=self.connect_timeout,
            sock_read=None if timeout else self.call_timeout,
        )
        try:
            async with session.request(
                method, path, data=data, headers=headers, params=params, timeout=client_timeout
            ) as response:
                if response.status >= 300:
                    body = await read_capped(response, 64 * 1024, self.target, truncate=True)
                    raise http_failure(response.status, body)
                yield response
        except ToolFailure:
            raise
        except Exception as exc:
            raise classify(exc, self.target, timeout) from None


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
            raise ToolFailure(
                "admin_response_too_large",
                f"the center's reply exceeded {cap} bytes and was dropped; ask for less "
                "(narrower query, smaller page) and try again",
                {"target": str(target), "limit_bytes": cap},
            )
        chunks.append(chunk)
    return b"".join(chunks)


def http_failure(status: int, body: bytes) -> ToolFailure:
    """A non-2xx center reply -> its own `{error, message}` intact, with the status."""
    envelope: Any = None
    try:
        envelope = json.loads(body)
    except ValueError:
        pass
    if isinstance(envelope, dict) and isinstance(envelope.get("error"), str):
        details = {k: v for k, v in envelope.items() if k not in ("error", "message")}
        return ToolFailure(
            envelope["error"], str(envelope.get("message") or ""), details, status=status
        )
    excerpt = body[:2048].decode("utf-8", "replace")
    return ToolFailure(
        "admin_http_error",
        f"the center answered HTTP {status} without an error envelope; the call did not "
        "succeed — check the arguments, or report this reply to the center's operators",
        {"body": excerpt},
        status=status,
    )


def classify(exc: BaseException, target: AdminTarget, timeout: float | None) -> ToolFailure:
    """A transport exception -> a `ToolFailure` with a stable code and a remedy."""
    import aiohttp

    where = str(target)
    if isinstance(exc, aiohttp.ServerFingerprintMismatch):
        if type(exc).__name__ == "PinnedCertificateExpired":
            return ToolFailure(
                "admin_tls_error",
                f"the center at {where} presented a pinned certificate that has expired; the "
                "center must rotate its certificate and operators must update the pin",
                {"target": where, "reason": "certificate_expired"},
            )
        return ToolFailure(
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
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        phase = "connect" if isinstance(exc, aiohttp.ConnectionTimeoutError) else "reply"
        return ToolFailure(
            "admin_timeout",
            f"the center at {where} did not {'accept the connection' if phase == 'connect' else 'answer'} "
            "in time; it may be overloaded. The call may or may not have taken effect: check "
            "with a read (e.g. get_task) before retrying a write",
            {"target": where, "phase": phase, "timeout_seconds": timeout},
        )
    if isinstance(exc, aiohttp.ClientSSLError):
        return ToolFailure(
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
        return ToolFailure(
            "admin_unavailable",
            f"the center at {where} is not reachable ({reason.replace('_', ' ')}); it may be "
            "down or restarting. Retry in a moment; if it persists, the operator should check "
            "that the center is running and AC_MCP_ADMIN_URL is right",
            {"target": where, "reason": reason},
        )
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return ToolFailure(
            "admin_unavailable",
            f"the center at {where} closed the connection before answering; the call may or "
            "may not have taken effect: check with a read before retrying a write",
            {"target": where, "reason": "disconnected"},
        )
    if isinstance(exc, aiohttp.ClientError):
        return ToolFailure(
            "admin_protocol_error",
            f"the exchange with {where} failed ({type(exc).__name__}); retry once, then report it",
            {"target": where, "reason": type(exc).__name__},
        )
    raise exc
