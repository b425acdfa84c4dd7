"""Black-box tests of the file transfer flow: upload session, streaming PUT, complete, download."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from mcphost.testing import DevCenter, Reply


def auth(center: DevCenter, token: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token or center.token}"}


def open_upload(
    center: DevCenter, data: bytes, agent_id: str = "agent-1", **extra: Any
) -> dict[str, Any]:
    body = {"filename": "notes.txt", "content_type": "text/plain", "size": len(data), **extra}
    token = center.worker_token("w-2") if agent_id == "agent-x" else None
    reply = center.call("upload_file", body, agent_id=agent_id, token=token)
    assert reply.status == 200, reply.body
    return dict(reply.json())


def put(
    center: DevCenter,
    transfer_id: str,
    data: bytes,
    agent_id: str = "agent-1",
    token: str | None = None,
) -> Reply:
    headers = {**auth(center, token), "Content-Type": "application/octet-stream"}
    return center.request(
        "PUT", f"/admin/files/transfer/{transfer_id}?agent_id={agent_id}", data, headers
    )


def complete(
    center: DevCenter, transfer_id: str, body: dict[str, Any], token: str | None = None
) -> Reply:
    return center.request(
        "POST",
        f"/admin/files/transfer/{transfer_id}/complete",
        {"agent_id": "agent-1", **body},
        auth(center, token),
    )


def download(
    center: DevCenter, file_uri: str, agent_id: str = "agent-1", token: str | None = None
) -> Reply:
    file_id = file_uri.removeprefix("ac://files/")
    return center.request(
        "GET", f"/admin/files/{file_id}?agent_id={agent_id}", None, auth(center, token)
    )


def upload(center: DevCenter, data: bytes, **extra: Any) -> dict[str, Any]:
    session = open_upload(center, data, **extra)
    assert put(center, session["transfer_id"], data).status == 200
    reply = complete(
        center,
        session["transfer_id"],
        {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)},
    )
    assert reply.status == 200, reply.body
    return {**session, **reply.json()}


def test_round_trip(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    data = os.urandom(300_000)
    session = open_upload(c, data, content_type="application/x-test")
    assert session["transfer_uri"] == f"ac://transfers/{session['transfer_id']}"
    assert session["file_uri"].startswith("ac://files/") and len(session["file_uri"]) == 11 + 26
    assert (session["scope"], session["scope_id"]) == (None, None)
    reply = put(c, session["transfer_id"], data)
    sha = hashlib.sha256(data).hexdigest()
    assert reply.json() == {"written": True, "size": len(data), "sha256": sha}
    assert (c.state_dir / "blobs" / sha).read_bytes() == data
    # write-once
    reply = put(c, session["transfer_id"], data)
    assert (reply.status, reply.error) == (409, "blob_exists")
    # completion must match what was received
    assert (
        complete(c, session["transfer_id"], {"sha256": "0" * 64, "size": len(data)}).error
        == "sha256_mismatch"
    )
    reply = complete(c, session["transfer_id"], {"sha256": sha, "size": len(data) + 1})
    assert (reply.status, reply.error) == (422, "size_mismatch")
    reply = complete(c, session["transfer_id"], {"sha256": sha, "size": len(data)})
    assert reply.json() == {"file_uri": session["file_uri"], "reference_id": None}
    got = download(c, session["file_uri"])
    assert got.status == 200 and got.body == data
    assert got.headers["content-type"] == "application/x-test"
    assert got.headers["content-length"] == str(len(data))


def test_size_mismatch_keeps_nothing(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    session = open_upload(c, b"12345")
    reply = put(c, session["transfer_id"], b"1234")
    assert (reply.status, reply.error) == (400, "size_mismatch")
    assert not list((c.state_dir / "blobs").glob(".tmp-*"))
    assert put(c, session["transfer_id"], b"12345").status == 200  # the session is still usable
    reply = complete(c, "01ARZ3NDEKTSV4RRFFQ69G5FAV", {"sha256": "0" * 64, "size": 1})
    assert (reply.status, reply.error) == (404, "not_found")


def test_session_ownership_and_gate(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    session = open_upload(c, b"abc")
    reply = put(c, session["transfer_id"], b"abc", agent_id="agent-2")
    assert (reply.status, reply.error) == (403, "session_not_owned")
    reply = put(c, session["transfer_id"], b"abc", agent_id="agent-x")
    assert (reply.status, reply.error) == (403, "agent_not_bound_to_worker")
    reply = c.request(
        "PUT", f"/admin/files/transfer/{session['transfer_id']}?agent_id=agent-1", b"abc"
    )
    assert (reply.status, reply.error) == (401, "auth_missing")
    reply = complete(c, session["transfer_id"], {"sha256": "0" * 64, "size": 3, "extra": 1})
    assert (reply.status, reply.error) == (400, "invalid_input")


def test_reachability_and_attach(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    x_token = c.worker_token("w-2")
    mine = upload(c, b"agent-1 private")
    # agent-2 (same worker) did not upload it and it is attached nowhere
    reply = download(c, mine["file_uri"], agent_id="agent-2")
    assert (reply.status, reply.error) == (403, "not_reachable")
    # attaching it to project p-1 makes it reachable to p-1 members
    reply = c.call(
        "attach_file", {"file_uri": mine["file_uri"], "scope": "project", "scope_id": "p-1"}
    )
    assert reply.status == 200 and reply.json()["reference_id"].startswith("r-")
    assert download(c, mine["file_uri"], agent_id="agent-2").body == b"agent-1 private"
    # scope checks on attach
    bad = {"file_uri": mine["file_uri"], "scope": "project", "scope_id": "p-2"}
    reply = c.call("attach_file", bad)
    assert (reply.status, reply.error) == (403, "scope_not_in_agent_domain")
    reply = c.call("attach_file", {**bad, "scope": "uploader"})
    assert (reply.status, reply.error) == (400, "invalid_scope")
    reply = c.call("attach_file", {**bad, "scope": "agent", "scope_id": "agent-2"})
    assert reply.error == "scope_not_in_agent_domain"
    reply = c.call(
        "attach_file", {"file_uri": "ac://files/nope", "scope": "agent", "scope_id": "agent-1"}
    )
    assert (reply.status, reply.error) == (400, "invalid_file_uri")
    reply = c.call(
        "attach_file",
        {
            "file_uri": "ac://files/01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "scope": "agent",
            "scope_id": "agent-1",
        },
    )
    assert (reply.status, reply.error) == (404, "not_found")
    # agent-x uploads into p-2; agent-1 cannot reach or attach it
    session = open_upload(c, b"secret", agent_id="agent-x", scope="project", scope_id="p-2")
    assert (
        put(c, session["transfer_id"], b"secret", agent_id="agent-x", token=x_token).status == 200
    )
    done = c.request(
        "POST",
        f"/admin/files/transfer/{session['transfer_id']}/complete",
        {"agent_id": "agent-x", "sha256": hashlib.sha256(b"secret").hexdigest(), "size": 6},
        auth(c, x_token),
    ).json()
    assert done["reference_id"].startswith("r-")  # the session's scope placed it
    reply = download(c, done["file_uri"])
    assert (reply.status, reply.error) == (403, "not_reachable")
    reply = c.call(
        "attach_file", {"file_uri": done["file_uri"], "scope": "agent", "scope_id": "agent-1"}
    )
    assert (reply.status, reply.error) == (403, "not_reachable")
    assert download(c, "ac://files/01ARZ3NDEKTSV4RRFFQ69G5FAV").error == "not_found"


def test_upload_scope_checks(devcenter_session: DevCenter) -> None:
    c = devcenter_session
    base = {"filename": "f", "content_type": "text/plain", "size": 1}
    assert (
        c.call("upload_file", {**base, "scope": "project", "scope_id": "p-2"}).error
        == "scope_not_in_agent_domain"
    )
    assert (
        c.call("upload_file", {**base, "scope": "bogus", "scope_id": "x"}).error == "invalid_scope"
    )
    assert c.call("upload_file", {**base, "scope": "project"}).error == "missing_scope_id"
    assert c.call("upload_file", {**base, "size": -1}).error == "invalid_input"
    assert (
        c.call("upload_file", {"content_type": "text/plain", "size": 1}).error == "missing_filename"
    )
    with_scope = c.call("upload_file", {**base, "scope": "agent", "scope_id": "agent-1"}).json()
    assert (with_scope["scope"], with_scope["scope_id"]) == ("agent", "agent-1")
