"""The center's error envelope: `{"error": "<snake_code>", "message": "<what to do>"}`.

Owns: `ApiError` (raised anywhere in a handler, turned into a JSON reply by the app's
middleware). Must never: put a token or a stack trace in a message.
"""

from __future__ import annotations

from typing import Any

from mcphost.errors import CodedFailure


class ApiError(CodedFailure):
    """A refusal with an HTTP status, a stable snake_case code and an actionable message; its
    `details` (the `extra` keywords) are spread into the envelope beside them."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(code, message, extra)
        self.args = (f"{status} {code}: {message}",)
        self.status = status
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.extra}
