"""File transfer routes: streaming PUT of upload bytes, completion, and download.

Owns: `PUT /admin/files/transfer/<id>`, `POST /admin/files/transfer/<id>/complete` and
`GET /admin/files/<ULID>`, and the content-addressed blob directory (`<state>/blobs/<sha256>`,
write-once). Bytes are streamed through a hash into a temp file in the blob directory, never
held whole in memory.
Must never: keep a blob whose size differs from the declared one, overwrite a blob, or serve
a file to an agent it is not reachable by.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from mcphost.devcenter import ids, specs
from mcphost.devcenter.center import CENTER_KEY, Center
from mcphost.devcenter.errors import ApiError
from mcphost.devcenter.tools import FILE_URI_PREFIX, add_reference, file_reachable, require_scope

CHUNK = 64 * 1024


def _owned_transfer(center: Center, transfer_id: str, agent_id: str) -> dict[str, Any]:
    transfer = center.store.transfer(transfer_id)
    if transfer is None:
        raise ApiError(
            404, "not_found", f"transfer {transfer_id!r} does not exist; call upload_file first"
        )
    if transfer["agent_id"] != agent_id:
        raise ApiError(403, "session_not_owned", "this upload session belongs to another agent")
    return transfer


async def put_transfer(request: web.Request) -> web.Response:
    center: Center = request.app[CENTER_KEY]
    worker = await center.admit(request, "transfer_put")
    agent_id = center.gate(request, worker, request.query.get("agent_id"))
    transfer = _owned_transfer(center, request.match_info["transfer_id"], agent_id)
    claimed = center.store.run(
        "UPDATE transfers SET received_size = -1 WHERE transfer_id = ? AND received_size IS NULL",
        transfer["transfer_id"],
    )
    if not claimed:
        raise ApiError(
            409, "blob_exists", "bytes were already sent for this transfer; blobs are write-once"
        )
    declared = int(transfer["size"])
    blobs: Path = center.blob_dir
    tmp = blobs / f".tmp-{transfer['transfer_id']}-{os.getpid()}"
    digest = hashlib.sha256()
    written = 0
    kept = False
    try:
        with tmp.open("xb") as out:
            async for chunk in request.content.iter_chunked(CHUNK):
                written += len(chunk)
                if written > declared:
                    break
                digest.update(chunk)
                out.write(chunk)
        if written != declared:
            raise ApiError(
                400,
                "size_mismatch",
                f"received {'more than ' if written > declared else ''}{written} bytes but upload_file declared "
                f"{declared}; start a new upload with the right size",
            )
        sha = digest.hexdigest()
        final = blobs / sha
        if final.exists():
            tmp.unlink()  # same content already stored: content addressing makes this a no-op
        else:
            tmp.chmod(0o400)
            os.replace(tmp, final)
        center.store.run(
            "UPDATE transfers SET received_size = ?, received_sha256 = ? WHERE transfer_id = ?",
            written,
            sha,
            transfer["transfer_id"],
        )
        kept = True
        return web.json_response({"written": True, "size": written, "sha256": sha})
    finally:
        if not kept:
            tmp.unlink(missing_ok=True)
            center.store.run(
                "UPDATE transfers SET received_size = NULL WHERE transfer_id = ?",
                transfer["transfer_id"],
            )


async def complete_transfer(request: web.Request) -> web.Response:
    center: Center = request.app[CENTER_KEY]
    worker = await center.admit(request, "transfer_complete")
    body = await center.json_body(request)
    specs.check_shape(body, specs.COMPLETE_ALLOWED, specs.COMPLETE_FIELDS)
    agent_id = center.gate(request, worker, body.get("agent_id"))
    args = specs.check_values(body, specs.COMPLETE_FIELDS)
    transfer = _owned_transfer(center, request.match_info["transfer_id"], agent_id)
    if transfer["completed"]:
        raise ApiError(409, "already_completed", "this transfer was already completed")
    if transfer["received_sha256"] is None:
        raise ApiError(
            409,
            "transfer_incomplete",
            "PUT the bytes to /admin/files/transfer/<id> before completing",
        )
    if args["sha256"].lower() != transfer["received_sha256"]:
        raise ApiError(
            422, "sha256_mismatch", "sha256 differs from the bytes received; re-upload the file"
        )
    if args["size"] != transfer["received_size"]:
        raise ApiError(
            422, "size_mismatch", "size differs from the bytes received; re-upload the file"
        )
    scope = args["scope"] if args["scope"] or args["scope_id"] else transfer["scope"]
    scope_id = args["scope_id"] if args["scope"] or args["scope_id"] else transfer["scope_id"]
    require_scope(center.store, agent_id, scope, scope_id)
    file_id = transfer["file_id"]
    with center.store.tx() as db:
        db.execute(
            "INSERT INTO files VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                file_id,
                transfer["received_sha256"],
                transfer["received_size"],
                transfer["content_type"],
                transfer["filename"],
                agent_id,
                ids.stamp(),
            ),
        )
        db.execute(
            "UPDATE transfers SET completed = 1 WHERE transfer_id = ?", (transfer["transfer_id"],)
        )
    reference_id = None
    if scope is not None and scope_id is not None:
        reference_id = add_reference(center.store, file_id, scope, scope_id, agent_id)
    return web.json_response(
        center.faults.pad(
            "transfer_complete",
            {"file_uri": FILE_URI_PREFIX + file_id, "reference_id": reference_id},
        )
    )


async def download(request: web.Request) -> web.StreamResponse:
    center: Center = request.app[CENTER_KEY]
    worker = await center.admit(request, "download")
    agent_id = center.gate(request, worker, request.query.get("agent_id"))
    file_id = request.match_info["file_id"]
    if not ids.is_ulid(file_id):
        raise ApiError(400, "invalid_file_uri", f"{file_id!r} is not a file ULID")
    file = center.store.file(file_id)
    if file is None:
        raise ApiError(404, "not_found", f"file {file_id!r} does not exist")
    if not file_reachable(center.store, agent_id, file):
        raise ApiError(
            403,
            "not_reachable",
            "you did not upload this file and it is not attached to a scope you belong to",
        )
    response = web.StreamResponse(headers={"Content-Type": file["mime_type"]})
    response.content_length = int(file["size"])
    await response.prepare(request)
    with (center.blob_dir / file["sha256"]).open("rb") as blob:
        while chunk := blob.read(CHUNK):
            await response.write(chunk)
    await response.write_eof()
    return response
