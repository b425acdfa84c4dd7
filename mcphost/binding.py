"""AgentBinding: the `AC_MCP_*` environment, parsed once into a frozen value.

Owns: the binding grammar shared by the host, `mcphost check` and configgen. Every error names
the environment variable (never a Python field), shows the bad value (never a token), and says
what is expected. Pure apart from reading the token file named by `AC_MCP_WORKER_TOKEN_FILE`.

The token grammar (`check_token`): 1-8192 characters of printable ASCII without spaces, the
characters an `Authorization: Bearer` header can carry. A token file holds the token on one line;
one trailing line ending (`\n` or `\r\n`) is removed and anything else (a second line, a space,
a control or non-ASCII character) is refused at start with the variable named, the position of
the first bad character given, and the token not shown. A `AC_MCP_WORKER_TOKEN_FILE` value that
is not an absolute path is not shown either: it is most likely the token itself.

Why not pydantic-settings: its errors name fields rather than variables and it costs ~140 ms of
start-up per agent; ten variables do not need it.

Must never: take identity from anywhere but the environment given, or put the token in a
message, repr or log record.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

from mcphost.admin.pinning import PinError, parse_pins
from mcphost.admin.target import AdminTarget, TargetError, parse_target

PREFIX = "AC_MCP_"
AGENT_ID = "AC_MCP_AGENT_ID"
ADMIN_URL = "AC_MCP_ADMIN_URL"
WORKER_TOKEN = "AC_MCP_WORKER_TOKEN"
WORKER_TOKEN_FILE = "AC_MCP_WORKER_TOKEN_FILE"
SERVER_FINGERPRINT = "AC_MCP_SERVER_FINGERPRINT"
AGENT_ROOT = "AC_MCP_AGENT_ROOT"
RUNTIME_SOCKET = "AC_MCP_RUNTIME_SOCKET"
TIER_TOOLS = "AC_MCP_TIER_TOOLS"
GENERATION = "AC_MCP_GENERATION"

_TRUE = {"1", "true", "t", "yes", "y", "on"}
_FALSE = {"0", "false", "f", "no", "n", "off"}
_AGENT_ID = re.compile(r"[^\s\x00-\x1f\x7f]{1,256}")
_GENERATION = re.compile(r"\+?[0-9]{1,18}")
TOKEN_MAX = 8192
_TOKEN = re.compile(rf"[!-~]{{1,{TOKEN_MAX}}}")
TOKEN_EXPECTED = (
    "a bearer token on one line: printable ASCII letters, digits and punctuation, "
    f"no spaces, line breaks or control characters, at most {TOKEN_MAX} characters"
)


class BindingError(ValueError):
    """A bad `AC_MCP_*` value. `str()` is the one-line operator message."""

    code = "bad_binding"

    def __init__(
        self, variable: str, shown_value: str | None, expected: str, *, problem: str | None = None
    ) -> None:
        """`problem` replaces "is <shown_value>" when the value must not be shown."""
        self.variable = variable
        self.shown_value = shown_value
        self.expected = expected
        if problem is not None:
            got = problem
        else:
            got = "is not set" if shown_value is None else f"is {shown_value}"
        self.problem = got
        super().__init__(f"{variable} {got}: expected {expected}")

    def details(self) -> dict[str, str]:
        """Structured details for machine-readable reports (never the token)."""
        return {"variable": self.variable, "problem": self.problem, "expected": self.expected}


class Secret:
    """A string that never shows itself: repr/str give `***`; `reveal()` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True, slots=True)
class AgentBinding:
    """One agent's identity and where its center lives. Built once; never mutated."""

    agent_id: str
    target: AdminTarget
    token: Secret = field(default_factory=lambda: Secret(""))
    pins: tuple[bytes, ...] = ()
    agent_root: str | None = None
    runtime_socket: str | None = None
    tier_tools: bool = True
    generation: int = 0
    token_file: str | None = None

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, read_token_file: bool = True
    ) -> AgentBinding:
        """Parse the `AC_MCP_*` variables of `env` (default: the process environment).

        `read_token_file=False` checks `AC_MCP_WORKER_TOKEN_FILE` for shape only (configgen
        validates bindings for another process and must not read the secret).
        """
        env = os.environ if env is None else env

        def get(name: str) -> str:
            return env.get(name, "").strip()

        agent_id = get(AGENT_ID)
        if not agent_id:
            raise BindingError(AGENT_ID, None, "the agent's id (a non-empty string)")
        if not _AGENT_ID.fullmatch(agent_id):
            raise BindingError(
                AGENT_ID, repr(agent_id), "an id without whitespace or control characters"
            )

        raw_url = get(ADMIN_URL)
        if not raw_url:
            raise BindingError(
                ADMIN_URL, None, "unix:/abs/path.sock, /abs/path.sock or tcp://host:port"
            )
        try:
            target = parse_target(raw_url)
        except TargetError as exc:
            raise BindingError(ADMIN_URL, repr(raw_url), str(exc)) from None

        raw_pins = get(SERVER_FINGERPRINT)
        pins: tuple[bytes, ...] = ()
        if raw_pins:
            try:
                pins = parse_pins(raw_pins)
            except PinError as exc:
                raise BindingError(SERVER_FINGERPRINT, repr(raw_pins), str(exc)) from None
        elif target.kind == "tcp":
            raise BindingError(
                SERVER_FINGERPRINT,
                None,
                "the center's certificate fingerprint (sha256:AB:CD:...); tcp:// targets are "
                "pinned so the token never reaches an unverified peer",
            )

        token, token_file = _read_token(
            get(WORKER_TOKEN), get(WORKER_TOKEN_FILE), read_file=read_token_file
        )

        return cls(
            agent_id=agent_id,
            target=target,
            token=Secret(token),
            pins=pins,
            agent_root=_absolute_or_none(AGENT_ROOT, get(AGENT_ROOT)),
            runtime_socket=_absolute_or_none(RUNTIME_SOCKET, get(RUNTIME_SOCKET)),
            tier_tools=parse_bool(TIER_TOOLS, get(TIER_TOOLS), default=True),
            generation=parse_generation(get(GENERATION)),
            token_file=token_file,
        )


def parse_bool(variable: str, raw: str, *, default: bool) -> bool:
    if not raw:
        return default
    lowered = raw.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise BindingError(variable, repr(raw), "true or false (also 1/0, yes/no, on/off)")


def parse_generation(raw: str) -> int:
    if not raw:
        return 0
    if not _GENERATION.fullmatch(raw):
        raise BindingError(GENERATION, repr(raw), "a non-negative integer (0, 1, 2, ...)")
    return int(raw)


def _absolute_or_none(variable: str, raw: str) -> str | None:
    if not raw:
        return None
    if not raw.startswith("/") or "\0" in raw:
        raise BindingError(variable, repr(raw), "an absolute path")
    return os.path.normpath(raw)


def _describe(char: str) -> str:
    if char in "\r\n":
        return "a line break"
    if char == " ":
        return "a space"
    if char == "\t":
        return "a tab"
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"a control character (U+{ord(char):04X})"
    return f"a non-ASCII character (U+{ord(char):04X})"


def token_problem(token: str) -> str | None:
    """What is wrong with `token` as a bearer token, without showing it; None when it is fine."""
    if _TOKEN.fullmatch(token):
        return None
    if not token:
        return "is empty"
    if len(token) > TOKEN_MAX:
        return f"is longer than {TOKEN_MAX} characters"
    index, char = next((i, c) for i, c in enumerate(token) if not "!" <= c <= "~")
    return f"holds {_describe(char)} at character {index + 1}"


def check_token(variable: str, token: str, *, source: str = "") -> str:
    """`token` if an `Authorization: Bearer` header can carry it, else a `BindingError` naming
    `variable` that never shows the token. `source` prefixes the problem (e.g. the file path)."""
    problem = token_problem(token)
    if problem is None:
        return token
    raise BindingError(
        variable, None, TOKEN_EXPECTED, problem=f"{source}{problem} (the token is not shown)"
    )


def _token_file_shown(path: str) -> str | None:
    """How a token-file setting may be shown: an absolute path is, anything else is not."""
    return repr(path) if path.startswith("/") else None


_NOT_A_PATH = "is not an absolute path (its value is not shown: it may be the token itself)"


def _read_token(inline: str, path: str, *, read_file: bool = True) -> tuple[str, str | None]:
    """The bearer token, from `AC_MCP_WORKER_TOKEN` or a private file; never both."""
    if inline and path:
        shown = _token_file_shown(path)
        raise BindingError(
            WORKER_TOKEN_FILE,
            shown,
            f"either {WORKER_TOKEN} or {WORKER_TOKEN_FILE} (an absolute path), not both",
            problem=None if shown else f"is set along with {WORKER_TOKEN} and {_NOT_A_PATH}",
        )
    if not path:
        return (check_token(WORKER_TOKEN, inline) if inline else ""), None
    if not path.startswith("/"):
        raise BindingError(
            WORKER_TOKEN_FILE, None, "an absolute path to the token file", problem=_NOT_A_PATH
        )
    if not read_file:
        return "", path
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise BindingError(
            WORKER_TOKEN_FILE,
            repr(path),
            f"a readable regular file holding the token ({exc.strerror})",
        ) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise BindingError(WORKER_TOKEN_FILE, repr(path), "a regular file")
        if info.st_mode & 0o077:
            raise BindingError(
                WORKER_TOKEN_FILE,
                f"{path!r} (mode {stat.S_IMODE(info.st_mode):04o})",
                "a file readable by its owner only: chmod 600 it",
            )
        raw = handle.read(TOKEN_MAX + 3)
    token = raw.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")
    if not token:
        raise BindingError(WORKER_TOKEN_FILE, repr(path), "a file containing the token")
    check_token(WORKER_TOKEN_FILE, token, source=f"is {path!r}, whose content ")
    return token, path
