"""The two file tools, `upload_file` and `download_file`: each call's flow, start to end.

Owns: the tools' flows and results (upload: open the leaf, open a center session, stream the
bytes, complete; download: check the destination, stream into a `.part`, place it), parsing
`ac://files/<ULID>` references, the upload's MIME type, the center's replies read as JSON
objects, and turning the center's 403/404 on a download into `file_not_reachable` /
`file_not_found`. Containment is `mcphost.host.workspace`, the byte movers are
`mcphost.host.transfer`, and every request is built by `mcphost.host.requests`.

`FileTools` is built by the host surface with what the tools need (the request builder, the
admin client, the held root), and hands the surface its handlers (`handlers()`), so this
module never imports the server.
Must never: build a request itself (no route, no `agent_id` here), open a model-given path
other than through the workspace walk, or complete an upload whose bytes changed.
"""

from __future__ import annotations

import json
import mimetypes
import os
import re
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from mcphost.admin.client import AdminClient, nesting_failure
from mcphost.catalog.files import DownloadFile, UploadFile
from mcphost.catalog.model import StrictInput
from mcphost.errors import AdminFailure, AdmissionRefused, CenterRefusal, FileFailure, ToolFailure
from mcphost.host.requests import RequestBuilder
from mcphost.host.transfer import (
    Changed,
    FileReader,
    Jobs,
    Progress,
    create_temp,
    max_download_bytes,
    place,
    receive,
    sweep_stale_parts,
    too_large,
    write_failed,
)
from mcphost.host.workspace import HeldRoot, Walker, check_destination, open_for_upload, walker
from mcphost.surface import CallContext, ToolResult

FILE_URI_PREFIX = "ac://files/"
_ULID = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")

LocalHandler = Callable[[StrictInput, CallContext], Awaitable[ToolResult]]


def parse_file_ref(value: str) -> str:
    """`ac://files/<ULID>` or a bare ULID -> the ULID, or `invalid_file_uri`. Pure."""
    text = value.strip()
    ulid = text[len(FILE_URI_PREFIX) :] if text.startswith(FILE_URI_PREFIX) else text
    if text.startswith("ac://") and not text.startswith(FILE_URI_PREFIX):
        ulid = ""
    if not _ULID.fullmatch(ulid.upper()):
        raise FileFailure(
            "invalid_file_uri",
            f"{value!r} is not a file reference; give ac://files/<ULID> (26 characters, as "
            "upload_file, list_files or an attachment gave it) or the bare ULID",
            {"file": value},
        )
    return ulid.upper()


def guess_mime(filename: str, head: bytes) -> str:
    """MIME type from the name, else a small content sniff, else application/octet-stream."""
    guessed, _ = mimetypes.guess_type(filename, strict=False)
    if guessed:
        return guessed
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    if head and b"\0" not in head:
        try:
            head.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.start < len(head) - 3:  # a cut multi-byte char at the end is still text
                return "application/octet-stream"
        return "text/plain"
    return "application/octet-stream"


_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
    (b"\x7fELF", "application/x-executable"),
)


# -- upload -------------------------------------------------------------------------------


class FileTools:
    """`upload_file` and `download_file` for one host."""

    def __init__(self, requests: RequestBuilder, admin: AdminClient, workspace: HeldRoot) -> None:
        self.requests = requests
        self.admin = admin
        self.workspace = workspace

    def handlers(self) -> dict[str, LocalHandler]:
        """The local handlers, by tool name, for the host surface to serve."""
        return {"upload_file": self.upload_file, "download_file": self.download_file}

    async def upload_file(self, params: StrictInput, ctx: CallContext) -> ToolResult:
        assert isinstance(params, UploadFile)
        with walker(self.workspace.binding, params.path, self.workspace) as w:
            resolved, fd, info = open_for_upload(w)
            size = info.st_size
            filename = resolved.leaf
            mime = guess_mime(filename, os.pread(fd, 512, 0))
            scope = {"scope": params.scope, "scope_id": params.scope_id} if params.scope else {}
            opened = await self.admin.call(self.requests.upload_open(filename, mime, size, scope))
            session = _json_object(opened.body, "upload_file")
            transfer = session.get("transfer_id")
            put = self.requests.upload_bytes(transfer, size)  # refuses an unusable id, unsent
            report = Progress(ctx, size, "uploaded")
            reader = FileReader(fd, size, report)
            try:
                async with self.admin.stream(put, data=reader.chunks()) as response:
                    await response.read()
            except (ToolFailure, Changed):
                if reader.changed:
                    raise _changed(w, resolved.display, reader.changed) from None
                raise
            finally:
                await reader.drain()  # the descriptor closes after this, never under a read
            after = os.fstat(fd)
            if after.st_size != size or after.st_mtime_ns != info.st_mtime_ns:
                raise _changed(w, resolved.display, "it was modified")
            sha256 = reader.digest.hexdigest()
            done = await self.admin.call(
                self.requests.upload_complete(transfer, sha256, size, scope)
            )
            await report(reader.sent, final=True)
            completed = _json_object(done.body, "complete")
            result: dict[str, Any] = {
                "file_uri": completed.get("file_uri") or session.get("file_uri"),
                "filename": filename,
                "mime_type": mime,
                "size": size,
                "sha256": sha256,
            }
            if completed.get("reference_id"):
                result["reference_id"] = completed["reference_id"]
            if params.scope:
                result["scope"], result["scope_id"] = params.scope, params.scope_id
            return _ok(result)

    async def download_file(self, params: StrictInput, ctx: CallContext) -> ToolResult:
        assert isinstance(params, DownloadFile)
        file_id = parse_file_ref(params.file)
        cap = max_download_bytes()
        with walker(self.workspace.binding, params.dest_path, self.workspace) as w:
            resolved = w.parent(create_missing=True)
            check_destination(w, resolved, overwrite=params.overwrite)
            temp: str | None = None
            temp_fd = -1
            jobs = Jobs()
            kept = False
            report = Progress(ctx, None, "downloaded")
            try:
                try:
                    async with self.admin.stream(self.requests.download(file_id)) as response:
                        mime = response.headers.get("Content-Type", "application/octet-stream")
                        announced = report.total = response.content_length
                        if announced is not None and announced > cap:
                            raise too_large(params.file, cap, announced)
                        w.make_missing(resolved)
                        if resolved.made:
                            check_destination(w, resolved, overwrite=params.overwrite)
                        await jobs.submit(sweep_stale_parts, resolved.parent_fd, w.root)
                        temp, temp_fd = create_temp(resolved.parent_fd)
                        size, sha256 = await receive(
                            response, temp_fd, cap, params.file, report, jobs
                        )
                except CenterRefusal as refusal:
                    raise _download_failure(refusal, file_id) from None
                await jobs.submit(os.fsync, temp_fd)
                w.give_away(temp_fd)  # the agent's, before its name appears
                place(w, resolved, temp, overwrite=params.overwrite)  # still locked: create_temp
                kept = True
                with suppress(OSError):
                    os.fsync(resolved.parent_fd)
            except OSError as exc:
                raise write_failed(w, exc) from None
            finally:
                try:
                    await jobs.drain()  # no write may still run when the temp file goes
                finally:  # also when drain re-raises a cancel that came while it waited
                    if not kept and temp is not None:
                        with suppress(OSError):  # removed while still locked, then closed
                            os.unlink(temp, dir_fd=resolved.parent_fd)
                    if temp_fd >= 0:
                        os.close(temp_fd)
                    if not kept:
                        w.undo_made(resolved)
            report.total = size
            await report(size, final=True)
            return _ok(
                {
                    "dest_path": resolved.display,
                    "size": size,
                    "sha256": sha256,
                    "mime_type": mime.split(";")[0].strip() or "application/octet-stream",
                }
            )


def _changed(w: Walker, shown: str, why: str) -> FileFailure:
    return FileFailure(
        "file_changed_during_upload",
        f"{w.given!r} ({shown}) changed while it was being uploaded ({why}); nothing was "
        "stored. Wait until whatever writes it has finished, then upload again",
        {"path": w.given, "reason": why},
    )


def _download_failure(refusal: CenterRefusal, file_id: str) -> AdminFailure:
    """The center's 403/404 on a download, said in the file tools' terms; an admission
    refusal (the center refused this host, not the file) and any other answer unchanged."""
    if isinstance(refusal, AdmissionRefused):
        return refusal
    center = {"center_error": refusal.code, "file": FILE_URI_PREFIX + file_id}
    if refusal.status == 403:
        return CenterRefusal(
            "file_not_reachable",
            f"{refusal.message or 'the center refused this file'} — you can download files "
            "you uploaded or that are attached to a scope you belong to",
            {**refusal.details, **center},
            status=403,
        )
    if refusal.status == 404:
        return CenterRefusal(
            "file_not_found",
            f"{refusal.message or 'no such file'} — check the ac://files URI (list_files shows "
            "a scope's files)",
            {**refusal.details, **center},
            status=404,
        )
    return refusal


def _json_object(body: bytes, step: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except RecursionError:  # nested deeper than this process can read: the shared classifier
        raise nesting_failure(len(body), f"{step} reply") from None
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise AdminFailure(
            "admin_protocol_error",
            f"the center's {step} reply was not a JSON object; retry once, then report it",
        )
    return value


def _ok(result: dict[str, Any]) -> ToolResult:
    return ToolResult(text=json.dumps(result, ensure_ascii=False), structured=result)
