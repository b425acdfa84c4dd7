"""A cheap fuzz pass: odd values in every field of every tool never make the center answer 5xx,
and every refusal is the JSON error envelope. (schemathesis against /openapi.json goes further.)"""

from __future__ import annotations

from typing import Any

from mcphost.devcenter import specs
from mcphost.testing import DevCenter

ODD: tuple[Any, ...] = (
    None,
    "",
    0,
    -1,
    1 << 70,
    True,
    1.5,
    "x" * 2000,
    "\u0000",
    [],
    {},
    "ac://files/..",
)
BASE = {"task_id": "t-none", "project_id": "p-1", "title": "fuzz", "issue_id": "i-1"}


def test_odd_values_never_crash(devcenter: DevCenter) -> None:
    seen = 0
    for name, tool in specs.TOOLS.items():
        names = [f.name for f in tool.fields] + ["agent_id"]
        for field_name in names:
            for value in ODD:
                body = {f.name: BASE.get(f.name, "v") for f in tool.fields if f.required}
                body[field_name] = value
                reply = devcenter.call(name, body)
                seen += 1
                assert reply.status < 500, (name, field_name, value, reply.body)
                if reply.status >= 400:
                    data = reply.json()
                    assert set(data) == {"error", "message"}, data
                    assert data["error"].islower() and " " not in data["error"]
    assert seen > 500
