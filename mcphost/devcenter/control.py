"""Test and benchmark controls: the fault table and the log of received requests.

Owns: `Faults` (per-route delay, forced error, padded success) and `RequestLog` (the last
requests received, with their query parameters and the bearer redacted). The `/_devcenter/*` routes that change them are
mounted only with `--control`; the table itself is always consulted (empty by default).
Must never: keep a bearer token (Authorization is stored as `Bearer ***`) or a PUT body.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mcphost.devcenter.errors import ApiError

REDACTED_HEADERS = {"authorization": "Bearer ***"}


@dataclass
class Faults:
    delay_ms: dict[str, int] = field(default_factory=dict)
    status: dict[str, tuple[int, str]] = field(default_factory=dict)
    big_result_bytes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Any) -> Faults:
        """The `POST /_devcenter/faults` body -> a table; 400 `invalid_input` on a bad shape."""
        if not isinstance(raw, dict):
            raise ApiError(400, "invalid_input", "faults must be a JSON object")
        unknown = set(raw) - {"delay_ms", "status", "big_result_bytes"}
        if unknown:
            raise ApiError(
                400, "invalid_input", f"unknown fault kind(s): {', '.join(sorted(unknown))}"
            )
        out = cls()
        for kind in ("delay_ms", "big_result_bytes"):
            table = raw.get(kind) or {}
            if not isinstance(table, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in table.values()
            ):
                raise ApiError(
                    400, "invalid_input", f"{kind} must map route names to integers >= 0"
                )
            setattr(out, kind, {str(k): int(v) for k, v in table.items()})
        for route, spec in (raw.get("status") or {}).items():
            if (
                not isinstance(spec, list)
                or len(spec) != 2
                or not isinstance(spec[0], int)
                or not 400 <= spec[0] <= 599
                or not isinstance(spec[1], str)
            ):
                raise ApiError(
                    400, "invalid_input", "status must map route names to [STATUS 400-599, 'code']"
                )
            out.status[str(route)] = (spec[0], spec[1])
        return out

    @staticmethod
    def _pick(table: dict[str, Any], key: str) -> Any:
        return table.get(key, table.get("*"))

    async def before(self, key: str) -> None:
        """Delay, then raise a forced error if one is configured for `key` (or `*`)."""
        delay = self._pick(self.delay_ms, key)
        if delay:
            await asyncio.sleep(delay / 1000)
        forced = self._pick(self.status, key)
        if forced:
            raise ApiError(forced[0], forced[1], f"fault injected by the devcenter for {key}")

    def pad(self, key: str, body: dict[str, Any]) -> dict[str, Any]:
        size = self._pick(self.big_result_bytes, key)
        return {**body, "padding": "x" * size} if size else body

    def as_json(self) -> dict[str, Any]:
        return {
            "delay_ms": self.delay_ms,
            "status": {k: list(v) for k, v in self.status.items()},
            "big_result_bytes": self.big_result_bytes,
        }


class RequestLog:
    def __init__(self, limit: int = 1000) -> None:
        self.entries: deque[dict[str, Any]] = deque(maxlen=limit)

    def record(
        self, method: str, route: str, query: dict[str, str], headers: dict[str, str]
    ) -> dict[str, Any]:
        clean = {k: REDACTED_HEADERS.get(k.lower(), v) for k, v in headers.items()}
        entry: dict[str, Any] = {
            "method": method,
            "route": route,
            "query": query,
            "headers": clean,
            "body": None,
        }
        self.entries.append(entry)
        return entry

    def last(self, limit: int) -> list[dict[str, Any]]:
        items = list(self.entries)
        return items[-limit:] if limit > 0 else []
