"""The admin target grammar: `unix:/abs/path`, a bare `/abs/path`, or `tcp://host:port`.

Owns: turning `AC_MCP_ADMIN_URL` into a typed target. TCP always means TLS (pinned by the
caller); there is no plaintext TCP. Pure: no I/O.
Must never: accept a relative socket path, a URL with a path/query, or an unknown scheme.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

EXPECTED = "unix:/absolute/path.sock, /absolute/path.sock, or tcp://host:port"

_HOSTPORT = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+)):(?P<port>\d{1,5})"
)


class TargetError(ValueError):
    """An admin URL that is not one of the accepted forms."""


@dataclass(frozen=True, slots=True)
class AdminTarget:
    kind: Literal["unix", "tcp"]
    path: str = ""
    host: str = ""
    port: int = 0

    @property
    def base_url(self) -> str:
        if self.kind == "unix":
            return "http://localhost"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.kind == "unix" else f"tcp://{self.base_url[8:]}"


def parse_target(raw: str) -> AdminTarget:
    text = raw.strip()
    if not text:
        raise TargetError(f"empty admin URL; expected {EXPECTED}")
    if text.startswith("unix:") or text.startswith("/"):
        path = text[5:] if text.startswith("unix:") else text
        if path.startswith("//"):
            path = "/" + path.lstrip("/")
        if not path.startswith("/"):
            raise TargetError(f"unix socket path {path!r} must be absolute; expected {EXPECTED}")
        if "\0" in path:
            raise TargetError("unix socket path contains a NUL byte")
        return AdminTarget(kind="unix", path=path)
    if text.startswith("tcp://"):
        match = _HOSTPORT.fullmatch(text[6:])
        if not match:
            raise TargetError(f"{text!r} is not tcp://host:port; expected {EXPECTED}")
        port = int(match.group("port"))
        if not 1 <= port <= 65535:
            raise TargetError(f"port {port} is out of range 1-65535")
        return AdminTarget(kind="tcp", host=match.group("v6") or match.group("host"), port=port)
    raise TargetError(f"unrecognised admin URL {text!r}; expected {EXPECTED}")
