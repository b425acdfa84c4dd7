"""The hand-written attack corpus, shared by the in-process and the end-to-end tests.

`build(root, outside)` lays out a workspace with files, in- and out-pointing symlinks, loops,
a FIFO and a socket; the tables map a path (a template: `{root}`, `{name}` = the root's base
name) to the code each tool must answer (`None` = allowed, and then it must stay inside).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

ESCAPE = "path_escapes_workspace"
SYMLINK = "path_through_symlink"
INVALID = "path_invalid"


def build(root: Path, outside: Path) -> None:
    (root / "a.txt").write_text("inside a\n")
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "sub" / "b.txt").write_text("inside b\n")
    (root / "sub" / "deeper" / "c.txt").write_text("inside c\n")
    (root / "...").write_text("three dots\n")
    (root / "données").mkdir()
    (root / "données" / "é.txt").write_text("accent\n")
    (root / "日本語.txt").write_text("unicode\n")
    (root / "with space.txt").write_text("space\n")
    os.symlink(str(outside), root / "link_out")
    os.symlink(f"../{outside.name}", root / "link_out_rel")
    os.symlink(str(outside / "secret.txt"), root / "link_file_out")
    os.symlink("sub", root / "link_in")
    os.symlink("a.txt", root / "link_file_in")
    os.symlink("loop2", root / "loop1")
    os.symlink("loop1", root / "loop2")
    os.symlink("self", root / "self")
    os.symlink("../..", root / "sub" / "up")
    os.symlink("/nonexistent/target", root / "dangling")
    os.symlink("/", root / "slash")
    os.mkfifo(root / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "sock"))
    except OSError:
        pass  # path too long for a socket on this machine: the FIFO covers special files
    finally:
        sock.close()


COMMON: dict[str, str | None] = {
    # `..` chains and absolute paths
    "../x": ESCAPE,
    "..": ESCAPE,
    "../../../../../../etc/passwd": ESCAPE,
    "sub/../../x": ESCAPE,
    "sub/../../{name}/a.txt": ESCAPE,
    "./../{name}Evil/secret.txt": ESCAPE,
    "/etc/passwd": ESCAPE,
    "//etc/passwd": ESCAPE,
    "/": ESCAPE,
    "{root}Evil/secret.txt": ESCAPE,
    "{root}/../{name}Evil/secret.txt": ESCAPE,
    "{root}/sub/../../{name}Evil/secret.txt": ESCAPE,
    # symlinks: out, in, loops, dangling, parents and leaves
    "link_out/secret.txt": ESCAPE,
    "link_out_rel/secret.txt": ESCAPE,
    "link_file_out": ESCAPE,
    "sub/up/etc/passwd": ESCAPE,
    "dangling": ESCAPE,
    "slash/etc/passwd": ESCAPE,
    "link_in/b.txt": SYMLINK,
    "link_file_in": SYMLINK,
    "loop1": SYMLINK,
    "loop1/x": SYMLINK,
    "self/x": SYMLINK,
    "{root}/link_out/secret.txt": ESCAPE,
    # malformed
    "a\x00.txt": INVALID,
    "sub/\x00/../a.txt": INVALID,
    "x" * 256: INVALID,
    "a/" * 2100 + "a": INVALID,
    "\ud800.txt": INVALID,
    "a.txt/x": "path_not_a_directory",
}

UPLOAD: dict[str, str | None] = {
    **COMMON,
    "a.txt": None,
    "./a.txt": None,
    "{root}/a.txt": None,
    "{root}//a.txt": None,
    "{root}/./sub/../a.txt": None,
    "sub//b.txt": None,
    "sub/./deeper/../b.txt": None,
    "sub/deeper/c.txt": None,
    "...": None,
    "données/é.txt": None,
    "日本語.txt": None,
    "with space.txt": None,
    "x" * 255: "path_not_found",
    "missing.txt": "path_not_found",
    "missing/dir/x.txt": "path_not_found",
    "pipe": "path_not_regular_file",
    "sock": "path_not_regular_file",
    "sub": "path_not_regular_file",
    ".": "path_not_regular_file",
    "{root}": "path_not_regular_file",
    "a.txt/..": "path_not_regular_file",
}

DOWNLOAD: dict[str, str | None] = {
    **COMMON,
    "new.bin": None,
    "{root}/new2.bin": None,
    "sub//deeper/./new.bin": None,
    "fresh/dirs/all/the/way/new.bin": None,
    "données/nouveau.bin": None,
    "x" * 255: None,
    "a.txt": "destination_exists",
    "sub": "destination_is_directory",
    ".": "destination_is_directory",
    "{root}/": "destination_is_directory",
    "pipe": "destination_not_regular_file",
    "link_in/new.bin": SYMLINK,
    "link_out/new.bin": ESCAPE,
    "fresh/../link_out/new.bin": ESCAPE,
}


def expand(template: str, root: Path) -> str:
    return template.replace("{root}", str(root)).replace("{name}", root.name)
