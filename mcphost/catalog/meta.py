"""Meta tools served by the host itself (no center route): `search_tools`.

Owns: declarations only. Pure data.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from mcphost.catalog.model import StrictInput, ToolDecl

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=128)]


class SearchTools(StrictInput):
    query: Annotated[str, StringConstraints(max_length=500)] | None = Field(
        None,
        description=(
            "Words describing what you need (all must match a tool's name or description); "
            "omit to list every deferred tool."
        ),
    )
    names: list[Name] | None = Field(None, max_length=64, description="Exact tool names to load.")


SEARCH_TOOLS = ToolDecl(
    name="search_tools",
    summary="find and load more tools by keyword or exact name",
    description=(
        "Find tools that are not in your tool list yet and load them. Returns each match's "
        "name, description and input schema. Loaded tools join your tool list once your client "
        "has refreshed it, which can take until a later turn: if a call to a loaded tool is "
        "refused because no such tool exists, call it again on your next turn. Loading is "
        "additive. Call this before concluding a tool does not exist."
    ),
    input=SearchTools,
    read_only=True,
    destination="local",
)
