"""The principal store and credential files (reference `agentmux-relay.md` §3.3, §1.10-§1.11).

Owns: `<state>/identity/principals.json` (directory 0700, file 0600):

    {"format_version": 1, "principals": [{"principal_id", "principal_type",
     "credential_hash" (SHA-256 lowercase hex of the PSK), "scope"?, "expires_at"? (RFC 3339),
     "metadata"? {}}]}

- PSKs: 32 bytes from `secrets`, unpadded standard base64 (43 characters); only the hash is kept.
- `mint` registers a principal (refused with `validation_principal_exists` when it is already
  registered: that is `rotate`); `rotate` replaces the hash and keeps type, scope, expiry and
  metadata (`validation_unknown_principal` when unregistered); `drop` removes one.
- `lookup(token)` hashes the token and compares the digest with `hmac.compare_digest` against
  every record, never stopping at the first match: the time taken does not depend on where (or
  whether) the token matches. `check_expiry` gives `runtime_identity_expired`.
- Records that do not parse (bad id, type disagreeing with the namespace, bad hash, bad
  `expires_at`, a repeated id) or whose `expires_at` has passed are pruned when the file is read
  (at construction, `reload`, and before each mutation); the pruned list is what the next
  mutation writes. A file that is not a format-1 store at all (not JSON, another version, a
  symlink, another owner's) is `internal_principal_store`: refused, never overwritten.
- Writes are crash-safe: a unique temp sibling opened `O_CREAT|O_EXCL|O_NOFOLLOW` (0600),
  written, fsynced, renamed over the target, then the directory fsynced. A failure before the
  rename leaves the old file and the in-memory records unchanged (`internal_principal_store`); a
  failed directory fsync after it is `internal_store_durability_uncertain`.
- Mutations are serialized (one lock per store). `mint` / `rotate` take an optional `deliver`
  callback, run after the store is durable with the PSK; when it raises, the store is rolled back
  to its state before the mutation and the delivery error re-raised (or
  `internal_credential_rollback_failed` `{write_error, rollback_error}` when the rollback fails).
- Credential files: `check_destination` (a `path` destination: absolute, a file name, an existing
  parent directory, not a symlink or a directory: `validation_invalid_output_path` `{path}`; a
  symlinked parent directory: `validation_invalid_credential_path` `{component}`),
  `write_credential` (same atomic write, 0600, `internal_credential_write` on I/O failure) and the
  session credential `<state>/bundles/<b>/sessions/<s>/identity.psk` (`agentmux.layers.session_psk_path`, whose
  directories are made 0700 and must not be symlinks: `validation_invalid_credential_path`
  `{component}`).

Must never: log, print or repr a PSK (this module logs nothing), put a PSK or a token into an
exception's message or details, follow a symlink when writing, or keep anything but the hash.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

from mcphost.agentmux.layers import session_psk_path
from mcphost.agentmux.wire import RelayError, parse_principal
from mcphost.names import is_bundle_name, is_session_id

FORMAT_VERSION = 1
PSK_BYTES = 32
PSK_CHARS = 43
PRINCIPAL_TYPES = ("session", "user", "application", "relay")
MAX_STORE_BYTES = 16 << 20
HASH = re.compile(r"[0-9a-f]{64}")
RFC3339 = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:[Zz]|[+-]\d{2}:\d{2})"
)

STORE = "internal_principal_store"
DURABILITY = "internal_store_durability_uncertain"


def new_psk() -> str:
    """32 CSPRNG bytes as unpadded standard base64: 43 characters."""
    return base64.b64encode(secrets.token_bytes(PSK_BYTES)).rstrip(b"=").decode("ascii")


def credential_hash(token: str) -> str:
    """SHA-256 of the token's UTF-8 bytes, lowercase hex (what the store keeps)."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def parse_rfc3339(text: str) -> datetime | None:
    """An RFC 3339 timestamp with its offset as an aware datetime; None if it is not one."""
    if not isinstance(text, str) or not RFC3339.fullmatch(text):
        return None
    iso = text.upper().replace(" ", "T").replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(iso)  # 3.11: any number of fractional digits
    except ValueError:
        return None


@dataclass(frozen=True)
class StoredPrincipal:
    principal_id: str
    principal_type: str
    credential_hash: str = field(repr=False)
    scope: str | None = None
    expires_at: str | None = None  # RFC 3339, as stored
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def expired(self, now: datetime | None = None) -> bool:
        if self.expires_at is None:
            return False
        when = parse_rfc3339(self.expires_at)
        return when is None or when <= (now or datetime.now(UTC))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "principal_id": self.principal_id,
            "principal_type": self.principal_type,
            "credential_hash": self.credential_hash,
        }
        if self.scope is not None:
            out["scope"] = self.scope
        if self.expires_at is not None:
            out["expires_at"] = self.expires_at
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        return out


def check_expiry(record: StoredPrincipal, now: datetime | None = None) -> None:
    """`runtime_identity_expired` `{principal_id, expires_at}` when the record has expired."""
    if record.expired(now):
        raise RelayError(
            "runtime_identity_expired",
            "identity credential has expired",
            {"principal_id": record.principal_id, "expires_at": record.expires_at},
        )


def principal_type(principal_id: str) -> str:
    """The type the namespace gives a principal id; `validation_invalid_principal_id` when the id
    is malformed or its name (or bundle) is outside the grammar its credential path needs."""
    principal = parse_principal(principal_id)
    if principal.kind in ("session", "user"):
        ok = is_session_id(principal.name)
        if principal.kind == "session":
            ok = ok and is_bundle_name(principal.namespace)
    else:
        ok = is_bundle_name(principal.name)
    if not ok:
        raise RelayError(
            "validation_invalid_principal_id",
            "principal_id names a session, user or peer outside the id grammar",
            {"principal_id": principal_id},
        )
    return principal.kind


def _record(raw: Any) -> StoredPrincipal | None:
    """One stored record, or None when it does not parse (pruned)."""
    if not isinstance(raw, dict):
        return None
    pid, kind, digest = (
        raw.get("principal_id"),
        raw.get("principal_type"),
        raw.get("credential_hash"),
    )
    scope, expires, metadata = raw.get("scope"), raw.get("expires_at"), raw.get("metadata")
    if not isinstance(pid, str) or kind not in PRINCIPAL_TYPES:
        return None
    try:
        if principal_type(pid) != kind:
            return None
    except RelayError:
        return None
    if not isinstance(digest, str) or not HASH.fullmatch(digest):
        return None
    if scope is not None and not isinstance(scope, str):
        return None
    if expires is not None and parse_rfc3339(expires) is None:
        return None
    if metadata is not None and not isinstance(metadata, dict):
        return None
    return StoredPrincipal(pid, kind, digest, scope, expires, MappingProxyType(metadata or {}))


class _Durability(Exception):
    """The rename happened but the directory fsync failed."""


def _atomic_replace(directory: str, name: str, data: bytes) -> None:
    """Write `data` to `directory/name` via a unique O_EXCL|O_NOFOLLOW temp sibling (0600),
    fsync, rename, directory fsync. OSError before the rename (the target untouched),
    `_Durability` after it."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        temp = f".{name}.{secrets.token_hex(8)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
        try:
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise
        try:
            os.fsync(dir_fd)
        except OSError as exc:
            raise _Durability(exc.strerror or type(exc).__name__) from None
    finally:
        os.close(dir_fd)


def _private_dir(path: Path, code: str, details_key: str) -> None:
    """Make `path` (one level) 0700 if missing; refuse a symlink, a non-directory or another
    owner's directory; narrow a wider mode to 0700."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise RelayError(
            code,
            "refusing a credential directory that is a symlink, not a directory, or not ours",
            {details_key: str(path)},
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700, follow_symlinks=False)


class PrincipalStore:
    """The relay's PSK store over `<state>/identity/principals.json` (see the module doc)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(os.path.abspath(path))
        self._lock = threading.Lock()
        self._records: tuple[StoredPrincipal, ...] = self._read()

    # -- reading --

    def _fail(self, message: str, cause: str) -> RelayError:
        return RelayError(STORE, message, {"path": str(self.path), "cause": cause})

    def _read(self) -> tuple[StoredPrincipal, ...]:
        """The file's records, unparseable and expired ones pruned; () when there is no file."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return ()
        except OSError as exc:
            raise self._fail("principal store is unreadable", exc.strerror or "error") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise self._fail("principal store is unreadable", "not a regular file of ours")
            if info.st_size > MAX_STORE_BYTES:
                raise self._fail("principal store is unreadable", "file too large")
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(MAX_STORE_BYTES + 1)
        except OSError as exc:
            raise self._fail("principal store is unreadable", exc.strerror or "error") from None
        finally:
            os.close(fd)
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise self._fail("principal store is unreadable", "not JSON") from None
        if (
            not isinstance(doc, dict)
            or doc.get("format_version") != FORMAT_VERSION
            or isinstance(doc.get("format_version"), bool)
            or not isinstance(doc.get("principals", []), list)
        ):
            raise self._fail("principal store is unreadable", "not a format_version 1 store")
        now = datetime.now(UTC)
        out: list[StoredPrincipal] = []
        seen: set[str] = set()
        for raw in doc.get("principals", []):
            record = _record(raw)
            if record is None or record.principal_id in seen or record.expired(now):
                continue
            seen.add(record.principal_id)
            out.append(record)
        return tuple(out)

    def reload(self) -> None:
        """Re-read the file (pruning) into memory."""
        with self._lock:
            self._records = self._read()

    def records(self) -> tuple[StoredPrincipal, ...]:
        return self._records

    def get(self, principal_id: str) -> StoredPrincipal | None:
        for record in self._records:
            if record.principal_id == principal_id:
                return record
        return None

    def lookup(self, token: str) -> StoredPrincipal | None:
        """The record whose hash is SHA-256(token), compared in constant time against every
        record (no early exit); None for no match or an empty token. Expiry is the caller's
        (`check_expiry`)."""
        if not isinstance(token, str) or not token:
            return None
        digest = credential_hash(token).encode("ascii")
        found: StoredPrincipal | None = None
        for record in self._records:
            match = hmac.compare_digest(digest, record.credential_hash.encode("ascii"))
            if match and found is None:
                found = record
        return found

    # -- writing --

    def _commit(self, records: tuple[StoredPrincipal, ...]) -> None:
        """Persist `records` and make them current; RelayError on failure (memory unchanged
        unless the rename happened)."""
        doc = {"format_version": FORMAT_VERSION, "principals": [r.to_json() for r in records]}
        data = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
        try:
            _private_dir(self.path.parent, STORE, "path")
            _atomic_replace(str(self.path.parent), self.path.name, data)
        except _Durability as exc:
            self._records = records
            raise RelayError(
                DURABILITY,
                "principal store was written but its durability is uncertain",
                {"path": str(self.path), "cause": str(exc)},
            ) from None
        except OSError as exc:
            raise self._fail(
                "failed to persist the principal store", exc.strerror or "error"
            ) from None
        self._records = records

    def _deliver(
        self,
        deliver: Callable[[str], object] | None,
        psk: str,
        previous: tuple[StoredPrincipal, ...],
    ) -> None:
        if deliver is None:
            return
        try:
            deliver(psk)
        except (RelayError, OSError) as exc:
            write_error = exc.message if isinstance(exc, RelayError) else (exc.strerror or "error")
            try:
                self._commit(previous)
            except RelayError as rollback:
                raise RelayError(
                    "internal_credential_rollback_failed",
                    "credential delivery failed and the principal store could not be rolled back",
                    {"write_error": write_error, "rollback_error": rollback.message},
                ) from None
            raise

    def mint(
        self,
        principal_id: str,
        kind: str,
        *,
        scope: str | None = None,
        expires_at: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        deliver: Callable[[str], object] | None = None,
    ) -> str:
        """Register `principal_id` (of type `kind`, which must be the one its namespace gives)
        with a new PSK and return the PSK. `validation_principal_exists` when registered."""
        actual = principal_type(principal_id)
        if kind != actual:
            raise RelayError(
                "validation_invalid_principal_id",
                f"principal type {kind!r} does not match the namespace (a {actual} principal)",
                {"principal_id": principal_id, "principal_type": kind},
            )
        if expires_at is not None and parse_rfc3339(expires_at) is None:
            raise RelayError(
                "validation_invalid_arguments",
                "expires_at must be an RFC 3339 timestamp",
                {"expires_at": expires_at},
            )
        with self._lock:
            previous = self._read()
            if any(r.principal_id == principal_id for r in previous):
                raise RelayError(
                    "validation_principal_exists",
                    "principal_id is already registered; rotate with change psk instead",
                    {"principal_id": principal_id},
                )
            psk = new_psk()
            record = StoredPrincipal(
                principal_id,
                kind,
                credential_hash(psk),
                scope,
                expires_at,
                MappingProxyType(dict(metadata or {})),
            )
            self._commit((*previous, record))
            self._deliver(deliver, psk, previous)
            return psk

    def rotate(self, principal_id: str, *, deliver: Callable[[str], object] | None = None) -> str:
        """Replace the principal's PSK (type, scope, expiry and metadata kept) and return the new
        one. `validation_unknown_principal` when it is not registered."""
        with self._lock:
            previous = self._read()
            index = next(
                (i for i, r in enumerate(previous) if r.principal_id == principal_id), None
            )
            if index is None:
                raise unknown_principal(principal_id)
            psk = new_psk()
            rotated = replace(previous[index], credential_hash=credential_hash(psk))
            self._commit((*previous[:index], rotated, *previous[index + 1 :]))
            self._deliver(deliver, psk, previous)
            return psk

    def drop(self, principal_id: str) -> bool:
        """Remove the principal; False when it was not registered (nothing written)."""
        with self._lock:
            previous = self._read()
            kept = tuple(r for r in previous if r.principal_id != principal_id)
            if len(kept) == len(previous):
                self._records = previous
                return False
            self._commit(kept)
            return True


def unknown_principal(principal_id: str) -> RelayError:
    return RelayError(
        "validation_unknown_principal",
        "principal_id is not registered; create it with new peer first",
        {"principal_id": principal_id},
    )


# -- credential files ------------------------------------------------------------------------


def _bad_output(path: str, message: str) -> RelayError:
    return RelayError("validation_invalid_output_path", message, {"path": path})


def check_destination(path: str) -> Path:
    """A `path` destination checked before any store mutation: absolute, naming a file, whose
    parent directory exists, and that is not a symlink or a directory."""
    if not isinstance(path, str) or not os.path.isabs(path) or "\x00" in path:
        raise _bad_output(str(path), "output_path must be an absolute path")
    name = os.path.basename(path)
    if not name or name in (".", ".."):
        raise _bad_output(path, "output_path must name a file")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise _bad_output(path, "output_path parent directory does not exist")
    if os.path.islink(parent):  # the write opens the parent O_NOFOLLOW: say so up front
        raise RelayError(
            "validation_invalid_credential_path",
            "output_path parent directory is a symlink",
            {"component": parent},
        )
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return Path(path)
    except OSError as exc:
        raise _bad_output(path, f"output_path cannot be checked: {exc.strerror}") from None
    if stat.S_ISLNK(info.st_mode):
        raise _bad_output(path, "output_path must not be a symlink")
    if not stat.S_ISREG(info.st_mode):
        raise _bad_output(path, "output_path must name a regular file")
    return Path(path)


def write_credential(path: str | os.PathLike[str], psk: str) -> Path:
    """Write the PSK (and a newline) to `path`, 0600, atomically and without following a symlink
    at the target (`check_destination` first). `internal_credential_write` on I/O failure."""
    target = check_destination(os.fspath(path))
    try:
        _atomic_replace(str(target.parent), target.name, (psk + "\n").encode("ascii"))
    except (OSError, _Durability) as exc:
        cause = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise RelayError(
            "internal_credential_write",
            "failed to write the credential file",
            {"path": str(target), "cause": cause or type(exc).__name__},
        ) from None
    return target


def session_credential_path(state_root: str | os.PathLike[str], bundle: str, session: str) -> Path:
    """`<state>/bundles/<b>/sessions/<s>/identity.psk` (agentmux's `layers.session_psk_path`, the
    relay tools' too). `validation_invalid_principal_id` when either name is outside its grammar."""
    path = session_psk_path(Path(os.path.abspath(state_root)), bundle, session)
    if path is None:
        raise RelayError(
            "validation_invalid_principal_id",
            "session principal is outside the bundle or session id grammar",
            {"principal_id": f"{session}@{bundle}"},
        )
    return path


def write_session_credential(
    state_root: str | os.PathLike[str], bundle: str, session: str, psk: str
) -> Path:
    """The `config` destination for a session principal: make `bundles/<b>/sessions/<s>/` (each
    0700, none a symlink: `validation_invalid_credential_path` `{component}`) under the state
    root, then write `identity.psk` as `write_credential` does."""
    path = session_credential_path(state_root, bundle, session)
    root = Path(os.path.abspath(state_root))
    current = root
    for part in path.parent.relative_to(root).parts:
        current = current / part
        try:
            _private_dir(current, "validation_invalid_credential_path", "component")
        except OSError as exc:
            raise RelayError(
                "internal_credential_write",
                "failed to prepare the credential directory",
                {"path": str(current), "cause": exc.strerror or type(exc).__name__},
            ) from None
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise RelayError(
                "validation_invalid_credential_path",
                "refusing to write a credential through a symlink",
                {"component": str(path)},
            )
    return write_credential(path, psk)
