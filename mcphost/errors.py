"""Typed failures that reach a model or an operator: a stable snake_case code, a message that says
what to do next, structured details, and (for center replies) the HTTP status.

Owns: `ToolFailure` and its JSON shape `{"error", "message", "details", "status"?}`, which is the
text of every `isError` result the host returns. Pure.
Must never: carry a token, a raw traceback or an unbounded body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class ToolFailure(Exception):
    """A failure with a stable code. `payload()` is what the model sees."""

    def __init__(
        self,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        *,
        status: int | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = dict(details or {})
        self.status = status

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.status is not None:
            out["status"] = self.status
        out["details"] = self.details
        return out

    def text(self) -> str:
        return json.dumps(self.payload(), ensure_ascii=False, sort_keys=False)
