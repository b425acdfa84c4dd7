"""File tools that move bytes between the agent's workspace and the center.

Owns: the `upload_file` / `download_file` declarations (core tier, served locally by
`mcphost.host.files`; containment is `mcphost.host.workspace`, the byte movers
`mcphost.host.transfer`). Pure data. `UPLOAD_FILE.route` is also the center route of an
upload's first step (`mcphost.host.requests`).
Must never: declare `agent_id` or a workspace root; both come from the binding.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from mcphost.catalog.model import StrictInput, ToolDecl

Scope = Literal["task", "issue", "project", "conversation", "agent", "tmp"]
PathText = Annotated[str, StringConstraints(min_length=1, max_length=16384)]
ScopeId = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=256)]


class _Scoped(StrictInput):
    @model_validator(mode="after")
    def _scope_pair(self) -> _Scoped:
        scope = getattr(self, "scope", None)
        scope_id = getattr(self, "scope_id", None)
        if (scope is None) != (scope_id is None):
            raise ValueError("give scope and scope_id together, or neither")
        return self


class UploadFile(_Scoped):
    path: PathText = Field(
        description=(
            "The file to upload: a path relative to your workspace root, or an absolute path "
            "inside it. Symlinks are not followed."
        )
    )
    scope: Scope | None = Field(
        default=None,
        description="Optionally attach the upload to a task, issue, project, ... at once.",
    )
    scope_id: ScopeId | None = Field(
        default=None, description="The id of the task, issue, project, ... named by scope."
    )


class DownloadFile(StrictInput):
    file: Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)] = (
        Field(
            description="The file to fetch: ac://files/<ULID> (as listed or attached) or the bare ULID."
        )
    )
    dest_path: PathText = Field(
        description=(
            "Where to write it: a file path relative to your workspace root, or an absolute "
            "path inside it. Missing parent directories are created."
        )
    )
    overwrite: bool = Field(
        default=False, description="Replace an existing file at dest_path (default: refuse)."
    )


_SHA256 = {"type": "string", "pattern": "^[0-9a-f]{64}$"}
_SIZE = {"type": "integer", "minimum": 0}

UPLOADED = {
    "type": "object",
    "properties": {
        "file_uri": {"type": ["string", "null"]},
        "filename": {"type": "string"},
        "mime_type": {"type": "string"},
        "size": _SIZE,
        "sha256": _SHA256,
        "reference_id": {},
        "scope": {"type": "string"},
        "scope_id": {"type": "string"},
    },
    "required": ["file_uri", "filename", "mime_type", "size", "sha256"],
}

DOWNLOADED = {
    "type": "object",
    "properties": {
        "dest_path": {"type": "string"},
        "size": _SIZE,
        "sha256": _SHA256,
        "mime_type": {"type": "string"},
    },
    "required": ["dest_path", "size", "sha256", "mime_type"],
}

UPLOAD_FILE = ToolDecl(
    name="upload_file",
    summary="upload a workspace file to the center and get its ac://files URI",
    description=(
        "Upload one regular file from your workspace to the center, streamed and verified "
        "(SHA-256). Returns {file_uri, filename, mime_type, size, sha256}: use these values "
        "as-is for message attachments or attach_file. Give scope and scope_id to attach it "
        "in the same call. Paths outside the workspace, symlinks, directories and special "
        "files are refused; a file that changes while it is being sent is refused rather "
        "than sent torn."
    ),
    input=UploadFile,
    destination="local",
    output_schema=UPLOADED,
)

DOWNLOAD_FILE = ToolDecl(
    name="download_file",
    summary="download an ac://files file into the workspace",
    description=(
        "Download a file you uploaded or that is attached to a scope you belong to "
        "(ac://files/<ULID> or the bare ULID) to dest_path inside your workspace. Written "
        "atomically: the file appears complete or not at all. An existing file is kept "
        "unless overwrite is true; missing parent directories are created. Returns "
        "{dest_path, size, sha256, mime_type}."
    ),
    input=DownloadFile,
    destructive=True,
    idempotent=True,
    destination="local",
    output_schema=DOWNLOADED,
)

TOOLS = (UPLOAD_FILE, DOWNLOAD_FILE)
