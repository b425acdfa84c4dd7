"""Certificate pins: the fingerprint grammar, its canonical form, and the leaf-certificate digest.

Owns: parsing what operators paste (our canonical `sha256:AB:..`, `SHA256:` in any case, 64
plain hex digits, `openssl x509 -noout -fingerprint -sha256` output) into raw 32-byte SHA-256
digests, and formatting digests back. A comma-separated list is a pin set, for rotation overlap.
The pin is SHA-256 over the leaf certificate's DER, as the center prints it.
Must never: accept a short, long or non-SHA-256 digest; this module is pure (no I/O).
"""

from __future__ import annotations

import hashlib
import re

ACCEPTED_FORMS = (
    "sha256:AB:CD:...  (32 colon-separated hex pairs, any case; the prefix may be SHA256:)",
    "64 plain hex digits",
    "SHA256 Fingerprint=AB:CD:...  (output of `openssl x509 -noout -fingerprint -sha256`)",
)

_PAIRS = r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){31}"
_FORMS = (
    re.compile(rf"sha256:({_PAIRS})", re.IGNORECASE),
    re.compile(r"([0-9A-Fa-f]{64})"),
    re.compile(rf"(?:sha256\s+)?fingerprint\s*=\s*({_PAIRS})", re.IGNORECASE),
)


class PinError(ValueError):
    """A fingerprint that matches none of the accepted forms."""


def parse_pin(text: str) -> bytes:
    """One fingerprint in any accepted form -> its 32 raw digest bytes."""
    candidate = text.strip()
    for form in _FORMS:
        match = form.fullmatch(candidate)
        if match:
            return bytes.fromhex(match.group(1).replace(":", ""))
    raise PinError(
        f"{candidate!r} is not a SHA-256 certificate fingerprint; accepted forms: "
        + "; ".join(ACCEPTED_FORMS)
    )


def parse_pins(text: str) -> tuple[bytes, ...]:
    """A comma-separated pin set -> distinct digests in the order given (at least one)."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise PinError("no fingerprint given; accepted forms: " + "; ".join(ACCEPTED_FORMS))
    pins: list[bytes] = []
    for part in parts:
        pin = parse_pin(part)
        if pin not in pins:
            pins.append(pin)
    return tuple(pins)


def format_pin(digest: bytes) -> str:
    """32 digest bytes -> the canonical `sha256:AB:CD:...` form (uppercase)."""
    if len(digest) != 32:
        raise PinError(f"a SHA-256 digest has 32 bytes, got {len(digest)}")
    return "sha256:" + ":".join(f"{b:02X}" for b in digest)


def leaf_digest(der: bytes) -> bytes:
    """SHA-256 over a certificate's DER encoding: what a pin names."""
    return hashlib.sha256(der).digest()
