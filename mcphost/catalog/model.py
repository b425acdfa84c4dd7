"""The shape of a tool declaration, and the input-model conventions every tool follows.

Owns: `ToolDecl` (name, description, input model, tier, hints, where it goes), `StrictInput`
(the base of every input model: unknown fields are refused, so a smuggled `agent_id` never gets
past validation), shared field types, and `input_schema()` (the compact JSON Schema a client
sees). Pure: no I/O.
Must never: declare an `agent_id` field (identity comes from the binding only).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

Tier = Literal["core", "deferred"]
Destination = Literal["center", "runtime", "local"]

TaskId = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=256),
    Field(description="The task's id, e.g. from get_my_work or create_task."),
]
Text = Annotated[str, StringConstraints(min_length=1, max_length=1_000_000)]


class StrictInput(BaseModel):
    """Base of every tool input: unknown fields are an error, never silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_max_length=1_000_000)


@dataclass(frozen=True)
class ToolDecl:
    """One tool: everything the generic passthrough needs to serve it."""

    name: str
    summary: str
    description: str
    input: type[StrictInput]
    tier: Tier = "core"
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    destination: Destination = "center"
    # JSON Schema of `structuredContent`, for tools that return one (MCP `outputSchema`)
    output_schema: Mapping[str, Any] | None = None

    @property
    def route(self) -> str:
        if self.destination == "runtime":
            return f"/runtime/{self.name}"
        return f"/admin/agent-tools/{self.name}"

    @cached_property
    def input_schema(self) -> dict[str, Any]:
        return compact_schema(self.input.model_json_schema())

    @property
    def annotations(self) -> dict[str, Any]:
        hints: dict[str, Any] = {"readOnlyHint": self.read_only}
        if not self.read_only:
            hints["destructiveHint"] = self.destructive
            hints["idempotentHint"] = self.idempotent
        hints["openWorldHint"] = False
        return hints


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop pydantic's titles and null defaults, and `X | None` unions of optional fields.

    Optional fields are simply not required; a client sees `{"type": "string"}` rather than an
    `anyOf` with `null`. `additionalProperties: false` stays on every object.
    """

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "title" and isinstance(value, str):
                continue  # the schema keyword, not a property named "title"
            if key in ("properties", "$defs") and isinstance(value, dict):
                out[key] = {name: walk(sub) for name, sub in value.items()}
            else:
                out[key] = walk(value)
        variants = out.get("anyOf")
        if isinstance(variants, list):
            non_null = [v for v in variants if v != {"type": "null"}]
            if len(non_null) == 1 and len(non_null) < len(variants):
                del out["anyOf"]
                out = {**non_null[0], **out}
        if "default" in out and out["default"] is None:
            del out["default"]
        return out

    compact: dict[str, Any] = walk(schema)
    compact.setdefault("properties", {})
    compact["additionalProperties"] = False
    return compact
