"""Files the center writes besides its database (env file, ready file, TLS key and certificate).

Owns: `write_atomic`: a temp sibling created `O_EXCL` at the final mode, written, renamed over
the target, so a reader (a test waiting for the ready file, a shell sourcing the env file)
never sees half a file and a secret is never briefly world-readable.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)
