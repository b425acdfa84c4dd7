"""The principal store and credential files (§3.3): PSK shape, hash-only storage, constant-time
lookup, pruning, crash-safe writes, rollback, and credential files that never follow a symlink."""

from __future__ import annotations

import base64
import json
import os
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.agentmux.wire import RelayError
from mcphost.relay import principals as PR
from mcphost.relay.principals import PrincipalStore, StoredPrincipal
from mcphost.relaytools.layout import Layout
from tests.thorough import examples

HEX = "ab" * 32


@pytest.fixture
def state(tmp_path: Path) -> Path:
    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    return root


@pytest.fixture
def store(state: Path) -> PrincipalStore:
    return PrincipalStore(state / "identity" / "principals.json")


def raises(code: str, call: Any, *args: Any, **kwargs: Any) -> RelayError:
    with pytest.raises(RelayError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value
    return caught.value


def stored(store: PrincipalStore) -> dict[str, Any]:
    return json.loads(store.path.read_text())  # type: ignore[no-any-return]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def no_secret(err: BaseException, *secrets: str) -> None:
    text = f"{err} {err!r} {getattr(err, 'details', '')}"
    for secret in secrets:
        assert secret not in text


# -- PSKs and the file -----------------------------------------------------------------------


def test_mint_returns_43_chars_of_unpadded_base64_over_32_bytes(store: PrincipalStore) -> None:
    psk = store.mint("worker@party", "session")
    assert len(psk) == PR.PSK_CHARS == 43
    assert "=" not in psk
    assert len(base64.b64decode(psk + "=")) == 32
    assert set(psk) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")


def test_psks_differ() -> None:
    assert len({PR.new_psk() for _ in range(200)}) == 200


def test_only_the_hash_is_stored_in_the_documented_format(store: PrincipalStore) -> None:
    psk = store.mint("ops@EXTERNAL", "application", scope="party")
    text = store.path.read_text()
    assert psk not in text
    assert stored(store) == {
        "format_version": 1,
        "principals": [
            {
                "principal_id": "ops@EXTERNAL",
                "principal_type": "application",
                "credential_hash": PR.credential_hash(psk),
                "scope": "party",
            }
        ],
    }
    assert PR.credential_hash(psk) == __import__("hashlib").sha256(psk.encode()).hexdigest()


def test_file_0600_and_directory_0700_whatever_the_umask(state: Path) -> None:
    old = os.umask(0)
    try:
        store = PrincipalStore(state / "identity" / "principals.json")
        store.mint("a@party", "session")
    finally:
        os.umask(old)
    assert mode(store.path) == 0o600
    assert mode(store.path.parent) == 0o700
    assert os.listdir(store.path.parent) == ["principals.json"]  # no temp left behind


def test_a_wide_identity_directory_is_narrowed(state: Path) -> None:
    (state / "identity").mkdir(mode=0o755)
    os.chmod(state / "identity", 0o755)
    PrincipalStore(state / "identity" / "principals.json").mint("a@party", "session")
    assert mode(state / "identity") == 0o700


def test_no_file_is_an_empty_store_and_nothing_is_written_by_reading(state: Path) -> None:
    store = PrincipalStore(state / "identity" / "principals.json")
    assert store.records() == ()
    assert store.lookup("anything") is None
    assert not (state / "identity").exists()


# -- mint / rotate / drop --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("principal_id", "kind"),
    [
        ("alpha@party", "session"),
        ("op@GLOBAL", "user"),
        ("hook@EXTERNAL", "application"),
        ("west@RELAY", "relay"),
    ],
)
def test_mint_each_type_and_look_it_up(store: PrincipalStore, principal_id: str, kind: str) -> None:
    psk = store.mint(principal_id, kind)
    record = store.lookup(psk)
    assert record is not None
    assert (record.principal_id, record.principal_type) == (principal_id, kind)
    assert PrincipalStore(store.path).lookup(psk) == record  # persisted


def test_minting_twice_is_refused_rotate_instead(store: PrincipalStore) -> None:
    psk = store.mint("alpha@party", "session")
    err = raises("validation_principal_exists", store.mint, "alpha@party", "session")
    assert err.message == "principal_id is already registered; rotate with change psk instead"
    assert err.details == {"principal_id": "alpha@party"}
    assert store.lookup(psk) is not None


@pytest.mark.parametrize(
    ("principal_id", "kind"),
    [
        ("alpha", "session"),
        ("@party", "session"),
        ("alpha@", "session"),
        ("alpha@party", "user"),  # the namespace decides the type
        ("op@GLOBAL", "session"),
        ("hook@EXTERNAL", "relay"),
        ("../x@party", "session"),  # outside the session-id grammar: a credential path
        ("alpha@..", "session"),
        ("al pha@party", "session"),
        ("alpha@party", "admin"),
    ],
)
def test_mint_refuses_bad_ids(store: PrincipalStore, principal_id: str, kind: str) -> None:
    raises("validation_invalid_principal_id", store.mint, principal_id, kind)
    assert not store.path.exists()


def test_rotate_replaces_the_hash_and_keeps_the_rest(store: PrincipalStore) -> None:
    old = store.mint(
        "west@RELAY",
        "relay",
        scope="party,other",
        expires_at="2999-01-01T00:00:00Z",
        metadata={"note": "x"},
    )
    before = store.lookup(old)
    new = store.rotate("west@RELAY")
    assert new != old
    assert store.lookup(old) is None
    after = store.lookup(new)
    assert after is not None and before is not None
    assert (after.principal_type, after.scope, after.expires_at, dict(after.metadata)) == (
        "relay",
        "party,other",
        "2999-01-01T00:00:00Z",
        {"note": "x"},
    )
    assert after.credential_hash != before.credential_hash
    assert PrincipalStore(store.path).lookup(new) == after


def test_rotate_unknown(store: PrincipalStore) -> None:
    err = raises("validation_unknown_principal", store.rotate, "ghost@party")
    assert err.message == "principal_id is not registered; create it with new peer first"
    assert err.details == {"principal_id": "ghost@party"}


def test_drop(store: PrincipalStore) -> None:
    psk = store.mint("alpha@party", "session")
    other = store.mint("bravo@party", "session")
    assert store.drop("alpha@party") is True
    assert store.drop("alpha@party") is False
    assert store.lookup(psk) is None
    assert store.lookup(other) is not None
    assert [p["principal_id"] for p in stored(store)["principals"]] == ["bravo@party"]


def test_mint_refuses_a_bad_expiry(store: PrincipalStore) -> None:
    raises("validation_invalid_arguments", store.mint, "a@party", "session", expires_at="soon")


# -- lookup ----------------------------------------------------------------------------------


def test_lookup_misses(store: PrincipalStore) -> None:
    psk = store.mint("alpha@party", "session")
    assert store.lookup("") is None
    assert store.lookup(psk[:-1]) is None
    assert store.lookup(psk + "A") is None
    assert store.lookup("socket-trust") is None
    assert store.lookup(PR.credential_hash(psk)) is None  # the hash is not a credential


def test_lookup_compares_against_every_record_without_early_exit(
    store: PrincipalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    psks = [store.mint(f"s{i}@party", "session") for i in range(5)]
    calls: list[tuple[bytes, bytes]] = []
    real = PR.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(PR.hmac, "compare_digest", counting)
    for token in (psks[0], psks[4], "wrong"):
        calls.clear()
        store.lookup(token)
        assert len(calls) == 5  # the first record matching does not stop the loop
        assert all(isinstance(a, bytes) and len(a) == len(b) == 64 for a, b in calls)


# -- pruning and a broken file ---------------------------------------------------------------


def write_raw(store: PrincipalStore, doc: Any) -> None:
    store.path.parent.mkdir(mode=0o700, exist_ok=True)
    store.path.write_text(json.dumps(doc))
    os.chmod(store.path, 0o600)


def test_unparseable_and_expired_records_are_pruned_at_load_and_on_the_next_write(
    store: PrincipalStore,
) -> None:
    past = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    good = {"principal_id": "ok@party", "principal_type": "session", "credential_hash": HEX}
    write_raw(
        store,
        {
            "format_version": 1,
            "principals": [
                good,
                {**good, "principal_id": "late@party", "expires_at": past},
                {**good, "principal_id": "ok@party"},  # repeated id
                {**good, "principal_id": "bad"},
                {**good, "principal_id": "x@GLOBAL"},  # type disagrees with namespace
                {**good, "principal_id": "h@party", "credential_hash": "AB" * 32},
                {**good, "principal_id": "t@party", "expires_at": "tomorrow"},
                {**good, "principal_id": "m@party", "metadata": []},
                {**good, "principal_id": "s@party", "scope": 3},
                {**good, "principal_id": "u@party", "principal_type": "root"},
                "not a record",
                {**good, "principal_id": "future@party", "expires_at": "2999-01-01T00:00:00+02:00"},
            ],
        },
    )
    fresh = PrincipalStore(store.path)
    assert [r.principal_id for r in fresh.records()] == ["ok@party", "future@party"]
    assert len(stored(fresh)["principals"]) == 12  # reading writes nothing
    fresh.mint("new@party", "session")
    assert [p["principal_id"] for p in stored(fresh)["principals"]] == [
        "ok@party",
        "future@party",
        "new@party",
    ]


def test_a_record_expiring_after_load_is_found_and_reported_expired(store: PrincipalStore) -> None:
    soon = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    psk = store.mint("a@party", "session", expires_at=soon)
    record = store.lookup(psk)
    assert record is not None
    PR.check_expiry(record)
    later = datetime.now(UTC) + timedelta(hours=2)
    err = raises("runtime_identity_expired", PR.check_expiry, record, later)
    assert err.details == {"principal_id": "a@party", "expires_at": soon}
    assert "expire" in err.message
    PR.check_expiry(StoredPrincipal("b@party", "session", HEX), later)  # no expiry: never


@pytest.mark.parametrize(
    "content",
    [
        b"not json",
        b"[]",
        b'{"format_version": 2, "principals": []}',
        b'{"format_version": true, "principals": []}',
        b'{"principals": []}',
        b'{"format_version": 1, "principals": {}}',
        b"\xff\xfe",
    ],
)
def test_a_store_that_is_not_a_format_1_store_is_refused_and_never_overwritten(
    store: PrincipalStore, content: bytes
) -> None:
    store.path.parent.mkdir(mode=0o700)
    store.path.write_bytes(content)
    err = raises("internal_principal_store", PrincipalStore, store.path)
    assert err.details is not None and err.details["path"] == str(store.path)
    raises("internal_principal_store", store.mint, "a@party", "session")
    assert store.path.read_bytes() == content


def test_a_symlinked_store_file_is_refused(store: PrincipalStore, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text('{"format_version": 1, "principals": []}')
    store.path.parent.mkdir(mode=0o700)
    store.path.symlink_to(elsewhere)
    raises("internal_principal_store", PrincipalStore, store.path)


def test_a_symlinked_identity_directory_is_refused(state: Path, tmp_path: Path) -> None:
    (tmp_path / "other").mkdir()
    (state / "identity").symlink_to(tmp_path / "other")
    store = PrincipalStore(state / "identity" / "principals.json")
    raises("internal_principal_store", store.mint, "a@party", "session")
    assert os.listdir(tmp_path / "other") == []


# -- crash safety ----------------------------------------------------------------------------


def test_a_failed_rename_leaves_file_and_memory_unchanged(
    store: PrincipalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    psk = store.mint("a@party", "session")
    before = store.path.read_bytes()

    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PR.os, "rename", broken)
    err = raises("internal_principal_store", store.mint, "b@party", "session")
    assert err.details is not None and "No space" in err.details["cause"]
    raises("internal_principal_store", store.rotate, "a@party")
    assert store.path.read_bytes() == before
    assert store.lookup(psk) is not None
    assert [r.principal_id for r in store.records()] == ["a@party"]
    assert os.listdir(store.path.parent) == ["principals.json"]  # temp removed


def test_a_failed_directory_fsync_after_the_rename_is_durability_uncertain(
    store: PrincipalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(PR.os, "fsync", fsync)
    raises("internal_store_durability_uncertain", store.mint, "a@party", "session")
    assert [r.principal_id for r in store.records()] == ["a@party"]  # the rename happened


def test_the_temp_sibling_is_exclusive_and_never_followed(
    store: PrincipalStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store.mint("a@party", "session")
    before = store.path.read_bytes()
    victim = tmp_path / "victim"
    victim.write_text("keep")
    monkeypatch.setattr(PR.secrets, "token_hex", lambda n: "fixed")
    (store.path.parent / ".principals.json.fixed.tmp").symlink_to(victim)
    raises("internal_principal_store", store.mint, "b@party", "session")
    assert victim.read_text() == "keep"
    assert store.path.read_bytes() == before


# -- delivery and rollback -------------------------------------------------------------------


def failing(code: str = "internal_credential_write") -> Any:
    def deliver(psk: str) -> None:
        raise RelayError(code, "failed to write the credential file", {"path": "/x"})

    return deliver


def test_a_failed_delivery_rolls_a_mint_back(store: PrincipalStore) -> None:
    keep = store.mint("a@party", "session")
    raises("internal_credential_write", store.mint, "b@party", "session", deliver=failing())
    assert [r.principal_id for r in store.records()] == ["a@party"]
    assert [p["principal_id"] for p in stored(store)["principals"]] == ["a@party"]
    assert store.lookup(keep) is not None


def test_a_failed_delivery_rolls_a_rotation_back(store: PrincipalStore) -> None:
    old = store.mint("a@party", "session")
    raises("internal_credential_write", store.rotate, "a@party", deliver=failing())
    assert store.lookup(old) is not None
    assert PrincipalStore(store.path).lookup(old) is not None


def test_delivery_sees_the_psk_after_the_store_is_durable(store: PrincipalStore) -> None:
    seen: list[str] = []

    def deliver(psk: str) -> None:
        assert PrincipalStore(store.path).lookup(psk) is not None
        seen.append(psk)

    assert store.mint("a@party", "session", deliver=deliver) == seen[0]
    assert store.rotate("a@party", deliver=deliver) == seen[1]


def test_a_failed_rollback_is_reported_with_both_errors(
    store: PrincipalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    captured: list[str] = []

    def deliver(psk: str) -> None:
        captured.append(psk)

        def broken(*args: Any, **kwargs: Any) -> None:
            raise OSError(30, "Read-only file system")

        monkeypatch.setattr(PR.os, "rename", broken)
        raise RelayError("internal_credential_write", "failed to write the credential file")

    err = raises(
        "internal_credential_rollback_failed", store.mint, "a@party", "session", deliver=deliver
    )
    assert err.details == {
        "write_error": "failed to write the credential file",
        "rollback_error": "failed to persist the principal store",
    }
    no_secret(err, captured[0])


# -- credential files ------------------------------------------------------------------------


def test_write_credential_writes_0600_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "peer.psk"
    old = os.umask(0)
    try:
        assert PR.write_credential(str(target), "first") == target
    finally:
        os.umask(old)
    assert target.read_text() == "first\n"
    assert mode(target) == 0o600
    os.chmod(target, 0o644)
    PR.write_credential(target, "second")
    assert target.read_text() == "second\n"
    assert mode(target) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["peer.psk"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("relative/peer.psk", "absolute"),
        ("", "absolute"),
        ("/", "name a file"),
        ("{tmp}/", "name a file"),
        ("{tmp}/..", "name a file"),
        ("{tmp}/missing/peer.psk", "parent directory does not exist"),
        ("{tmp}/file/peer.psk", "parent directory does not exist"),
        ("{tmp}/link", "symlink"),
        ("{tmp}/dangling", "symlink"),
        ("{tmp}/dir", "regular file"),
    ],
)
def test_bad_destinations_are_refused_before_anything(
    tmp_path: Path, path: str, message: str
) -> None:
    (tmp_path / "file").write_text("")
    (tmp_path / "dir").mkdir()
    (tmp_path / "target").write_text("keep")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    path = path.format(tmp=tmp_path)
    err = raises("validation_invalid_output_path", PR.check_destination, path)
    assert message in err.message
    assert err.details == {"path": path}
    raises("validation_invalid_output_path", PR.write_credential, path, "secret-psk")
    assert (tmp_path / "target").read_text() == "keep"
    assert not (tmp_path / "nowhere").exists()


def test_a_symlinked_parent_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    err = raises(
        "validation_invalid_credential_path", PR.write_credential, tmp_path / "alias" / "x", "k"
    )
    assert err.details == {"component": str(tmp_path / "alias")}
    assert os.listdir(tmp_path / "real") == []


def test_a_failed_credential_write_never_shows_the_psk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PR.os, "rename", broken)
    psk = PR.new_psk()
    err = raises("internal_credential_write", PR.write_credential, tmp_path / "x.psk", psk)
    assert err.details == {"path": str(tmp_path / "x.psk"), "cause": "No space left on device"}
    no_secret(err, psk)
    assert os.listdir(tmp_path) == []


def test_session_credential_path_is_the_relay_tools_path(state: Path) -> None:
    layout = Layout(
        configuration_roots=(),
        state_root=state,
        inscriptions_root=state,
        bundle="party",
        session="alpha",
    )
    assert PR.session_credential_path(state, "party", "alpha") == layout.psk_path()
    assert PR.session_credential_path(state, "party", "alpha") == (
        state / "bundles" / "party" / "sessions" / "alpha" / "identity.psk"
    )
    for bundle, session in (("..", "alpha"), ("party", "../x"), ("a/b", "alpha"), ("p", "")):
        raises(
            "validation_invalid_principal_id", PR.session_credential_path, state, bundle, session
        )


def test_the_session_credential_is_what_the_relay_tools_present(state: Path) -> None:
    store = PrincipalStore(state / "identity" / "principals.json")
    psk = store.mint(
        "alpha@party",
        "session",
        deliver=lambda p: PR.write_session_credential(state, "party", "alpha", p),
    )
    path = state / "bundles" / "party" / "sessions" / "alpha" / "identity.psk"
    assert mode(path) == 0o600
    for directory in (path.parent, path.parent.parent, path.parent.parent.parent):
        assert mode(directory) == 0o700
    layout = Layout(
        configuration_roots=(),
        state_root=state,
        inscriptions_root=state,
        bundle="party",
        session="alpha",
    )
    token = layout.identity_token()
    assert token == psk
    assert store.lookup(token) is not None


def test_a_symlinked_component_of_the_session_credential_path_is_refused(
    state: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (state / "bundles").mkdir(mode=0o700)
    (state / "bundles" / "party").symlink_to(outside)
    err = raises(
        "validation_invalid_credential_path",
        PR.write_session_credential,
        state,
        "party",
        "alpha",
        "psk",
    )
    assert err.details == {"component": str(state / "bundles" / "party")}
    assert os.listdir(outside) == []


def test_a_symlinked_session_credential_file_is_refused(state: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    directory = state / "bundles" / "party" / "sessions" / "alpha"
    directory.mkdir(parents=True, mode=0o700)
    (directory / "identity.psk").symlink_to(victim)
    raises(
        "validation_invalid_credential_path",
        PR.write_session_credential,
        state,
        "party",
        "alpha",
        "x",
    )
    assert victim.read_text() == "keep"


# -- no PSK anywhere it should not be --------------------------------------------------------


def test_records_do_not_show_their_hash_in_repr(store: PrincipalStore) -> None:
    psk = store.mint("a@party", "session")
    record = store.lookup(psk)
    assert record is not None
    assert record.credential_hash not in repr(record)
    assert psk not in repr(record) and psk not in repr(store.records())


def every_error(store: PrincipalStore, psk: str, tmp: Path) -> Iterator[RelayError]:
    calls: list[Any] = [
        lambda: store.mint("a@party", "session"),
        lambda: store.rotate("ghost@party"),
        lambda: PR.write_credential("relative", psk),
        lambda: PR.write_credential(str(tmp / "missing" / "x"), psk),
        lambda: PR.write_session_credential(tmp, "..", "alpha", psk),
    ]
    for call in calls:
        with pytest.raises(RelayError) as caught:
            call()
        yield caught.value


def test_no_error_carries_the_psk(store: PrincipalStore, tmp_path: Path) -> None:
    psk = store.mint("a@party", "session")
    for err in every_error(store, psk, tmp_path):
        no_secret(err, psk)


@examples(full=300, quick=40)
@given(st.text(max_size=80))
def test_lookup_never_raises_and_only_the_right_token_matches(token: str) -> None:
    record = StoredPrincipal("a@party", "session", PR.credential_hash("the-token"))
    store = PrincipalStore.__new__(PrincipalStore)
    store._records = (record,)
    assert (store.lookup(token) is record) == (token == "the-token")


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("2026-05-01T10:00:00Z", True),
        ("2026-05-01t10:00:00z", True),
        ("2026-05-01T10:00:00.123456789+02:00", True),
        ("2026-05-01 10:00:00-05:30", True),
        ("2026-05-01T10:00:00", False),  # no offset
        ("2026-05-01", False),
        ("2026-13-01T10:00:00Z", False),
        ("yesterday", False),
    ],
)
def test_rfc3339(text: str, ok: bool) -> None:
    assert (PR.parse_rfc3339(text) is not None) == ok
