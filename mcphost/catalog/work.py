"""Work-loop tools: find my work, keep it alive, finish it, fail it, fork an executor for it.

Owns: declarations only (one `ToolDecl` per tool). Fields match the center's admin routes
verbatim (seed 003). Pure data.
Must never: declare `agent_id`; the host injects it from the binding.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StringConstraints

from mcphost.catalog.model import StrictInput, TaskId, Text, ToolDecl

Reason = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=10_000),
    Field(description="Why, in a sentence or two; recorded on the task for humans and peers."),
]


class NoInput(StrictInput):
    pass


class TaskRef(StrictInput):
    task_id: TaskId


class CompleteTask(StrictInput):
    task_id: TaskId
    summary: Text | None = Field(
        None, description="What was delivered; stored as the task's closing message."
    )


class TaskWithReason(StrictInput):
    task_id: TaskId
    reason: Reason


class ForkExecutor(StrictInput):
    task_id: TaskId
    model: Annotated[str, StringConstraints(strip_whitespace=True, max_length=200)] | None = Field(
        None, description="Model for the executor; omit to use the runtime's default."
    )
    context: Text | None = Field(
        None, description="Extra instructions handed to the executor with the task."
    )


TOOLS = (
    ToolDecl(
        name="get_my_work",
        summary="list the open and running tasks assigned to me",
        description=(
            "List the tasks assigned to you that are open or running, oldest first. Call it "
            "when you start, after finishing a task, or when woken, to decide what to do next."
        ),
        input=NoInput,
        read_only=True,
    ),
    ToolDecl(
        name="heartbeat",
        summary="start or keep alive a task I am working on (renews its lease)",
        description=(
            "Mark your task as running and renew its lease. Call it when you begin work on an "
            "open task and then every few minutes while working, so the task is not reclaimed."
        ),
        input=TaskRef,
        idempotent=True,
    ),
    ToolDecl(
        name="complete_task",
        summary="finish a task of mine, with an optional summary",
        description=(
            "Complete a task assigned to you, optionally with a summary of what was delivered. "
            "Use it only when the work is actually done; it cannot be undone."
        ),
        input=CompleteTask,
        destructive=True,
    ),
    ToolDecl(
        name="fail_task",
        summary="give up on a task of mine, saying why",
        description=(
            "Mark a task assigned to you as failed, with the reason. Use it when the task cannot "
            "be done as specified; a human or peer can then retry it with retry_failed_task."
        ),
        input=TaskWithReason,
        destructive=True,
    ),
    ToolDecl(
        name="retry_failed_task",
        summary="reopen a failed task so it can be worked again",
        description="Move a failed task back to open so it can be picked up and worked again.",
        input=TaskRef,
        tier="deferred",
    ),
    ToolDecl(
        name="discard_task",
        summary="discard a task that should not be done, saying why",
        description=(
            "Discard a task that should not be done at all (duplicate, obsolete, mistaken), "
            "with the reason. Terminal: prefer fail_task when the work was attempted."
        ),
        input=TaskWithReason,
        destructive=True,
    ),
    ToolDecl(
        name="verify_task",
        summary="mark a completed task as verified",
        description=(
            "Record that a completed task's delivery was checked and is accepted. Use it after "
            "reviewing another agent's completed work."
        ),
        input=TaskRef,
        tier="deferred",
        idempotent=True,
    ),
    ToolDecl(
        name="fork_executor",
        summary="start an executor process on this worker for one of my tasks",
        description=(
            "Ask this worker's agent runtime to fork an executor for a task assigned to you, "
            "optionally with a model and extra context. The runtime performs admission; check "
            "progress with get_task."
        ),
        input=ForkExecutor,
        destination="runtime",
    ),
)
