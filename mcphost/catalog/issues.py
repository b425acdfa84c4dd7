"""Issue and attachment tools (JSON passthroughs; byte-moving file tools live elsewhere).

Owns: declarations only. Pure data.
Must never: declare `agent_id`; the host injects it from the binding.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from mcphost.catalog.model import StrictInput, ToolDecl

Id = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256)]
FileUri = Annotated[
    str,
    StringConstraints(strip_whitespace=True, pattern=r"^ac://files/[0-9A-HJKMNP-TV-Z]{26}$"),
]


class GetIssue(StrictInput):
    issue_id: Id = Field(description="The issue's id.")


class AttachFile(StrictInput):
    file_uri: FileUri = Field(description="An uploaded file, ac://files/<ULID>.")
    scope: Literal["task", "issue", "project", "conversation", "agent", "tmp"] = Field(
        description="What to attach the file to."
    )
    scope_id: Id = Field(description="The id of the task, issue, project, ... named by scope.")


TOOLS = (
    ToolDecl(
        name="get_issue",
        summary="read one issue and the tasks derived from it",
        description="Read an issue in one of your projects, with the tasks derived from it.",
        input=GetIssue,
        read_only=True,
    ),
    ToolDecl(
        name="attach_file",
        summary="attach an uploaded file to a task, issue, project or conversation",
        description=(
            "Attach a file you uploaded (ac://files/<ULID>) to a task, issue, project, "
            "conversation or agent so others in that scope can download it. No bytes move."
        ),
        input=AttachFile,
        tier="deferred",
        idempotent=True,
    ),
)
