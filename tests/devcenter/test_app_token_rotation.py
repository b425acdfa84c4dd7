"""`POST /_devcenter/workers/<worker>/token`: a worker's token rotates, the new one lands in its
token file (atomically, 0600), and the old one is accepted only for the overlap asked for; on
the real `mcphost devcenter` process."""

from __future__ import annotations

import stat
from pathlib import Path

from mcphost.testing import DevCenter
from tests.waiting import until

ROUTE = "/admin/worker/agents"


def status_with(center: DevCenter, token: str) -> int:
    reply = center.request("GET", ROUTE, headers={"Authorization": f"Bearer {token}"})
    return reply.status


def test_rotation_writes_the_new_token_and_keeps_the_old_for_the_overlap(tmp_path: Path) -> None:
    with DevCenter.start(tmp_path, unix=True) as center:
        old, other = center.token, center.worker_token("w-2")
        new = center.rotate_token("w-1", overlap_seconds=1)
        assert new != old and new.startswith("acat_")
        info = center.token_path("w-1").stat()
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert status_with(center, new) == 200
        assert status_with(center, other) == 200  # another worker's token is untouched
        # the old one is refused once the overlap is over (polled: never a fixed sleep)
        until(lambda: status_with(center, old) == 401, 30, "the old token to be refused")
        assert status_with(center, new) == 200
        # no overlap: refused at once
        newer = center.rotate_token("w-1")
        assert status_with(center, new) == 401 and status_with(center, newer) == 200


def test_rotation_refuses_bad_requests(tmp_path: Path) -> None:
    with DevCenter.start(tmp_path, unix=True) as center:
        route = "/_devcenter/workers/{}/token"
        for worker, body, code in (
            ("w-9", {}, "not_found"),
            ("w-1", {"overlap_seconds": -1}, "invalid_input"),
            ("w-1", {"overlap_seconds": "5"}, "invalid_input"),
            ("w-1", {"overlap": 5}, "invalid_input"),
        ):
            reply = center.request("POST", route.format(worker), body)
            assert reply.error == code, (worker, body, reply.body)
        assert status_with(center, center.token) == 200  # nothing rotated
