"""Task tools: create, read, edit, assign, discuss and follow tasks.

Owns: declarations only. Fields match the center's admin routes verbatim (seed 003). Pure data.
Must never: declare `agent_id`; the host injects it from the binding.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from mcphost.catalog.model import StrictInput, TaskId, Text, ToolDecl

Id = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256)]
Title = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=500)]


class GetTask(StrictInput):
    task_id: TaskId


class CreateTask(StrictInput):
    project_id: Id = Field(description="The project the task belongs to.")
    title: Title = Field(description="A short imperative title.")
    description: Text | None = Field(None, description="What done looks like, in detail.")
    derived_from_issue: Id | None = Field(
        None, description="The issue this task addresses (same project)."
    )
    assignee: Id | None = Field(
        None, description="Agent id to assign the task to; omit to leave it unassigned."
    )
    dispatch: bool | None = Field(None, description="Dispatch the task to its assignee now.")
    dispatch_mode: Literal["executor_fork", "supervisor_inline"] | None = Field(
        None, description="How the assignee runs it: fork an executor, or work inline."
    )


class UpdateTask(StrictInput):
    task_id: TaskId
    title: Title | None = Field(None, description="New title.")
    description: Text | None = Field(None, description="New description (replaces the old one).")
    clear_description: bool | None = Field(
        None, description="Set true to remove the description (not with `description`)."
    )

    @model_validator(mode="after")
    def _one_description_change(self) -> UpdateTask:
        if self.description is not None and self.clear_description:
            raise ValueError("give either description or clear_description, not both")
        return self


class AssignTask(StrictInput):
    task_id: TaskId
    assignee: Id = Field(description="The agent id that should own the task.")


class Subscription(StrictInput):
    task_id: TaskId
    identity: Id | None = Field(
        None, description="Who to (un)subscribe, e.g. agent:<id>; omit for yourself."
    )


class PostTaskMessage(StrictInput):
    task_id: TaskId
    content: Text = Field(description="The message, in Markdown.")


TOOLS = (
    ToolDecl(
        name="get_task",
        summary="read one task: state, assignee, description, messages",
        description=(
            "Read a task: its state, assignee, creator, description, subscribers and recent "
            "messages. Use it before acting on a task you did not just create."
        ),
        input=GetTask,
        read_only=True,
    ),
    ToolDecl(
        name="create_task",
        summary="create a task in a project, optionally assigned and dispatched",
        description=(
            "Create a task in a project you belong to, optionally derived from an issue, "
            "assigned to an agent and dispatched. Returns the new task_id."
        ),
        input=CreateTask,
    ),
    ToolDecl(
        name="update_task",
        summary="change a task's title or description",
        description="Change the title and/or description of an unfinished task.",
        input=UpdateTask,
        idempotent=True,
    ),
    ToolDecl(
        name="assign_task",
        summary="assign a task to an agent",
        description="Assign an unfinished task to an agent who is a member of its project.",
        input=AssignTask,
        idempotent=True,
    ),
    ToolDecl(
        name="reassign_task",
        summary="move a task to a different agent",
        description="Move an unfinished task from its current assignee to another agent.",
        input=AssignTask,
        tier="deferred",
        idempotent=True,
    ),
    ToolDecl(
        name="post_task_message",
        summary="post a message on a task's thread",
        description=(
            "Post a message on a task's thread, visible to its assignee, creator and "
            "subscribers. Use it to report progress, ask a question or hand over context."
        ),
        input=PostTaskMessage,
    ),
    ToolDecl(
        name="subscribe",
        summary="follow a task's updates",
        description="Subscribe yourself (or the given identity) to a task's updates.",
        input=Subscription,
        tier="deferred",
        idempotent=True,
    ),
    ToolDecl(
        name="unsubscribe",
        summary="stop following a task's updates",
        description="Unsubscribe yourself (or the given identity) from a task's updates.",
        input=Subscription,
        tier="deferred",
        idempotent=True,
    ),
)
