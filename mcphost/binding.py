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

Built on the settings base (`mcphost.settings`): `AgentBinding` is a frozen pydantic-settings
model with the `AC_MCP_` prefix; the grammar functions here stay pure (configgen imports them)
and each field validator calls one, so pydantic's field names never reach an operator. All
problems are collected (`BindingError.problems`), the first is `str()`.

Must never: take identity from anywhere but the environment given, or put the token in a
message, repr or log record.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from mcphost.admin.pinning import PinError, parse_pins
from mcphost.admin.target import AdminTarget, TargetError, parse_target
from mcphost.settings import SettingError, Settings

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
_TARGET_EXPECTED = "unix:/abs/path.sock, /abs/path.sock or tcp://host:port"


class BindingError(SettingError):
    """A bad `AC_MCP_*` value. `str()` is the one-line operator message; `.variable` names it."""

    code = "bad_binding"


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


class AgentBinding(Settings):
    """One agent's identity and where its center lives. Built once; never mutated.

    A pydantic-settings model over the `AC_MCP_*` variables (`from_env`); each field's
    validator calls the pure grammar below, so every error is a `BindingError` that names the
    variable. Built directly (`AgentBinding(agent_id=..., target=...)`) it reads no environment.
    """

    model_config = SettingsConfigDict(env_prefix=PREFIX)
    error_class = BindingError

    # Field order is the order problems are reported in.
    agent_id: str = Field(description="the agent's id (a non-empty string)")
    target: AdminTarget = Field(validation_alias=ADMIN_URL, description=_TARGET_EXPECTED)
    pins: tuple[bytes, ...] = Field((), validation_alias=SERVER_FINGERPRINT)
    token: Secret = Field(
        default_factory=lambda: Secret(""),
        validation_alias=WORKER_TOKEN,
        json_schema_extra={"secret": True},
    )
    token_file: str | None = Field(
        None, validation_alias=WORKER_TOKEN_FILE, json_schema_extra={"secret": True}
    )
    agent_root: str | None = None
    runtime_socket: str | None = None
    tier_tools: bool = True
    generation: int = 0

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, *, read_token_file: bool = True
    ) -> AgentBinding:
        """Parse the `AC_MCP_*` variables of `env` (default: the process environment).

        Values are trimmed; an empty one is unset. `read_token_file=False` checks
        `AC_MCP_WORKER_TOKEN_FILE` for shape only (configgen validates bindings for another
        process and must not read the secret).
        """
        return cls.load(env=os.environ if env is None else env, read_token_file=read_token_file)

    @field_validator("agent_id", mode="before")
    @classmethod
    def _agent_id(cls, raw: object) -> object:
        if isinstance(raw, str) and not _AGENT_ID.fullmatch(raw):
            if not raw.strip():
                raise BindingError(AGENT_ID, None, "the agent's id (a non-empty string)")
            raise BindingError(
                AGENT_ID, repr(raw), "an id without whitespace or control characters"
            )
        return raw

    @field_validator("target", mode="before")
    @classmethod
    def _target(cls, raw: object) -> object:
        if not isinstance(raw, str):
            return raw
        try:
            return parse_target(raw)
        except TargetError as exc:
            raise BindingError(ADMIN_URL, repr(raw), str(exc)) from None

    @field_validator("pins", mode="before")
    @classmethod
    def _pins(cls, raw: object, info: ValidationInfo) -> object:
        if isinstance(raw, str):
            try:
                raw = parse_pins(raw) if raw.strip() else ()
            except PinError as exc:
                raise BindingError(SERVER_FINGERPRINT, repr(raw), str(exc)) from None
        target = info.data.get("target")
        if not raw and isinstance(target, AdminTarget) and target.kind == "tcp":
            raise BindingError(
                SERVER_FINGERPRINT,
                None,
                "the center's certificate fingerprint (sha256:AB:CD:...); tcp:// targets are "
                "pinned so the token never reaches an unverified peer",
            )
        return raw

    @field_validator("token", mode="before")
    @classmethod
    def _token(cls, raw: object) -> object:
        if isinstance(raw, str):
            return Secret(check_token(WORKER_TOKEN, raw) if raw else "")
        return raw

    @field_validator("token_file", mode="before")
    @classmethod
    def _token_file(cls, raw: object, info: ValidationInfo) -> object:
        if not isinstance(raw, str) or not raw:
            return raw or None
        inline = info.data.get("token")
        if isinstance(inline, Secret) and inline:
            shown = _token_file_shown(raw)
            raise BindingError(
                WORKER_TOKEN_FILE,
                shown,
                f"either {WORKER_TOKEN} or {WORKER_TOKEN_FILE} (an absolute path), not both",
                problem=None if shown else f"is set along with {WORKER_TOKEN} and {_NOT_A_PATH}",
            )
        if not raw.startswith("/"):
            raise BindingError(
                WORKER_TOKEN_FILE, None, "an absolute path to the token file", problem=_NOT_A_PATH
            )
        return raw

    @field_validator("agent_root", "runtime_socket", mode="before")
    @classmethod
    def _absolute(cls, raw: object, info: ValidationInfo) -> object:
        if isinstance(raw, str):
            return _absolute_or_none(cls.env_name(info.field_name or ""), raw)
        return raw

    @field_validator("tier_tools", mode="before")
    @classmethod
    def _tier_tools(cls, raw: object) -> object:
        return parse_bool(TIER_TOOLS, raw, default=True) if isinstance(raw, str) else raw

    @field_validator("generation", mode="before")
    @classmethod
    def _generation(cls, raw: object) -> object:
        return parse_generation(raw) if isinstance(raw, str) else raw

    @model_validator(mode="after")
    def _read_token(self) -> AgentBinding:
        """Read the token file (when `from_env` was asked to) once every field is valid."""
        if self.token_file and self.load_option("read_token_file", False):
            token = Secret(_read_token_file(self.token_file))
            object.__setattr__(self, "token", token)
        return self


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


def _file_kind(mode: int) -> str:
    """What a non-regular file is, as an operator names it."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _unreadable_token_file(path: str, exc: OSError) -> BindingError:
    return BindingError(
        WORKER_TOKEN_FILE, repr(path), f"a readable regular file holding the token ({exc.strerror})"
    )


def _read_token_file(path: str) -> str:
    """The bearer token from a private file: regular, not a symlink, 0600, one line.

    The one place a token file is read (the host, `mcphost check`, the supervisor's
    `[center] token_file`). It is opened non-blocking and without following a symlink, and its
    type is checked on the open descriptor before any read: a FIFO would block the open (and a
    read) for ever, a directory cannot be read; both are refused as `BindingError`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise _unreadable_token_file(path, exc) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BindingError(
                WORKER_TOKEN_FILE,
                f"{path!r} ({_file_kind(info.st_mode)})",
                "a regular file holding the token",
            )
        if info.st_mode & 0o077:
            raise BindingError(
                WORKER_TOKEN_FILE,
                f"{path!r} (mode {stat.S_IMODE(info.st_mode):04o})",
                "a file readable by its owner only: chmod 600 it",
            )
        raw = b""
        while len(raw) < TOKEN_MAX + 3:  # a regular file: O_NONBLOCK changes nothing
            chunk = os.read(fd, TOKEN_MAX + 3 - len(raw))
            if not chunk:
                break
            raw += chunk
    except OSError as exc:
        raise _unreadable_token_file(path, exc) from None
    finally:
        os.close(fd)
    token = raw.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")
    if not token:
        raise BindingError(WORKER_TOKEN_FILE, repr(path), "a file containing the token")
    check_token(WORKER_TOKEN_FILE, token, source=f"is {path!r}, whose content ")
    return token
