"""The fingerprint grammar: every accepted form, every rejection, pin sets."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.admin.pinning import PinError, format_pin, leaf_digest, parse_pin, parse_pins

DIGEST = hashlib.sha256(b"certificate").digest()
PAIRS = ":".join(f"{b:02X}" for b in DIGEST)


@pytest.mark.parametrize(
    "text",
    [
        f"sha256:{PAIRS}",
        f"SHA256:{PAIRS}",
        f"sha256:{PAIRS.lower()}",
        f"  Sha256:{PAIRS}\n",
        DIGEST.hex(),
        DIGEST.hex().upper(),
        f"SHA256 Fingerprint={PAIRS}",
        f"sha256 Fingerprint={PAIRS}\n",
        f"Fingerprint={PAIRS}",
    ],
)
def test_accepted_forms_give_the_digest(text: str) -> None:
    assert parse_pin(text) == DIGEST


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sha256:foo",
        "deadbeef",
        DIGEST.hex()[:-2],
        DIGEST.hex() + "00",
        "sha256:" + PAIRS[:-3],
        "sha256:" + PAIRS + ":00",
        "sha1:" + PAIRS,
        "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU",  # OpenSSH base64
        "sha256:" + PAIRS.replace(":", ""),  # prefix without colons is not a form
        "sha256:" + PAIRS.replace("A", "G", 1) if "A" in PAIRS else "sha256:GG" + PAIRS[2:],
    ],
)
def test_rejections_list_the_accepted_forms(text: str) -> None:
    with pytest.raises(PinError) as info:
        parse_pin(text)
    assert "accepted forms" in str(info.value)
    assert "64 plain hex digits" in str(info.value)


def test_pin_set_keeps_order_and_drops_duplicates() -> None:
    other = hashlib.sha256(b"rotated").digest()
    pins = parse_pins(f"sha256:{PAIRS}, {other.hex()},{DIGEST.hex()}")
    assert pins == (DIGEST, other)


def test_empty_pin_set_is_rejected() -> None:
    with pytest.raises(PinError):
        parse_pins(" , ")


@given(st.binary(min_size=32, max_size=32))
def test_format_round_trips(digest: bytes) -> None:
    text = format_pin(digest)
    assert len(text) == 102 and text.startswith("sha256:")
    assert parse_pin(text) == digest


def test_leaf_digest_is_sha256_of_der() -> None:
    assert leaf_digest(b"der") == hashlib.sha256(b"der").digest()
