"""The pane envelope (reference §3.4): exact bytes, header rules, the token estimate, batching."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.relay.envelope import (
    DEFAULT_MAX_TOKENS,
    Address,
    Envelope,
    boundary,
    count_lines,
    estimate_tokens,
    join_batch,
    neutralise,
    receipt,
    receipt_body,
    render,
    render_receipt,
    rfc3339,
    take_batch,
)


def batches(pending: list[str], *, max_tokens: int = DEFAULT_MAX_TOKENS) -> list[str]:
    """All of `pending` as injected prompts, as the delivery worker takes them (delivery.py:
    `take_batch` from the head, `join_batch` of what it took, again until none is left)."""
    out: list[str] = []
    rest = list(pending)
    while rest:
        n = take_batch(rest, max_tokens=max_tokens)
        out.append(join_batch(rest[:n]))
        rest = rest[n:]
    return out


MID = uuid.UUID("0f8b6c3e-2a41-4d7e-9c55-6b1e2f3a4b5c")
AT = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
ALICE = Address("alpha@party", "Alice")
BRAVO = Address("bravo@party", "Bravo")
CAROL = Address("carol@party", "Carol")
B = "--agentmux-0f8b6c3e2a414d7e9c556b1e2f3a4b5c"


def test_the_minimal_envelope_byte_for_byte() -> None:
    text = render(Envelope(MID, AT, ALICE, BRAVO, "Hello\nWorld"))
    assert text == (
        f"{B}\n"
        "Message-Id: 0f8b6c3e-2a41-4d7e-9c55-6b1e2f3a4b5c\n"
        "Date: 2025-03-04T05:06:07.890Z\n"
        "From: Alice <session:alpha@party>\n"
        "To: Bravo <session:bravo@party>\n"
        "\n"
        f"{B}\n"
        "Content-Type: text/plain; charset=utf-8\n"
        "\n"
        "Hello\n"
        "World\n"
        f"{B}--\n"
    )
    assert text.encode() == text.encode("ascii") and "\r" not in text


def test_cc_and_subject_only_when_present() -> None:
    text = render(Envelope(MID, AT, ALICE, BRAVO, "hi", cc=(CAROL, ALICE), subject="Plans"))
    assert text == (
        f"{B}\n"
        "Message-Id: 0f8b6c3e-2a41-4d7e-9c55-6b1e2f3a4b5c\n"
        "Date: 2025-03-04T05:06:07.890Z\n"
        "From: Alice <session:alpha@party>\n"
        "To: Bravo <session:bravo@party>\n"
        "Cc: Carol <session:carol@party>, Alice <session:alpha@party>\n"
        "Subject: Plans\n"
        "\n"
        f"{B}\n"
        "Content-Type: text/plain; charset=utf-8\n"
        "\n"
        "hi\n"
        f"{B}--\n"
    )
    for subject in (None, ""):
        plain = render(Envelope(MID, AT, ALICE, BRAVO, "hi", cc=(), subject=subject))
        assert "Cc:" not in plain and "Subject:" not in plain


def test_display_names_fall_back_and_never_quote() -> None:
    anonymous = Address("zeta@party")
    assert anonymous.render() == "zeta@party <session:zeta@party>"
    assert Address("zeta@party", "").render() == "zeta@party <session:zeta@party>"
    assert Address("a@p", 'The "Boss"').render() == "The 'Boss' <session:a@p>"
    assert Address("a@p", "two\nlines\r\nhere").render() == "two lines here <session:a@p>"
    text = render(Envelope(MID, AT, anonymous, BRAVO, "x", subject="a\nb"))
    assert "From: zeta@party <session:zeta@party>\n" in text
    assert "Subject: a b\n" in text


def test_body_line_endings() -> None:
    def body_of(body: str) -> str:
        text = render(Envelope(MID, AT, ALICE, BRAVO, body))
        return text.split("charset=utf-8\n\n", 1)[1].rsplit(f"{B}--\n", 1)[0]

    assert body_of("a\r\nb\rc") == "a\nb\nc\n"
    assert body_of("ends\n") == "ends\n"  # not doubled
    assert body_of("blank last\n\n") == "blank last\n\n"
    assert body_of("") == "\n"
    assert body_of("ünïcødé ✓") == "ünïcødé ✓\n"


# -- text, never keys ---------------------------------------------------------------------------

PASTE_END = b"\x1b[201~"
CONTROLS = "".join(map(chr, [*range(0x20), 0x7F, *range(0x80, 0xA0)]))


def _pane_bytes(text: str) -> bytes:
    """What tmux pastes: the rendered text as UTF-8 (`TmuxServer.paste`'s own encoding)."""
    return text.encode("utf-8", "surrogatepass")


def _assert_text_only(text: str) -> None:
    data = _pane_bytes(text)
    assert not [b for b in data if (b < 0x20 and b not in b"\n\t") or b == 0x7F], data
    assert not [c for c in text if 0x80 <= ord(c) <= 0x9F], text
    assert PASTE_END not in data and "\x9b201~" not in text
    data.decode("utf-8")  # no lone surrogate: well-formed UTF-8


def test_controls_are_shown_in_caret_notation_and_c1_visibly() -> None:
    assert neutralise("a\x1b[201~!rm -rf ~\r") == "a^[[201~!rm -rf ~^M"
    assert neutralise("\x00\x03\x1c\x1f\x7f") == "^@^C^\\^_^?"
    assert neutralise("\x9b201~ \x80 \x9f") == "<U+009B>201~ <U+0080> <U+009F>"
    assert neutralise("tab\tnew\nline ünï ✓ \xa0") == "tab\tnew\nline ünï ✓ \xa0"
    assert neutralise("lone \ud800 surrogate") == "lone \ufffd surrogate"
    every = neutralise(CONTROLS)
    assert every == neutralise(every)  # idempotent
    _assert_text_only(every)


def test_an_embedded_paste_end_and_keys_stay_text_in_every_field() -> None:
    attack = "hi\x1b[201~\x03!touch /tmp/x\r\x1c\x1a"
    text = render(
        Envelope(
            MID, AT, Address("alpha@party", attack), Address("b\x1b@party", attack),
            attack, cc=(Address("c@party", attack),), subject=attack,
        )
    )  # fmt: skip
    _assert_text_only(text)
    assert "From: hi^[[201~^C!touch /tmp/x ^\\^Z <session:alpha@party>\n" in text
    assert "To: hi^[[201~^C!touch /tmp/x ^\\^Z <session:b^[@party>\n" in text
    assert "Subject: hi^[[201~^C!touch /tmp/x ^\\^Z\n" in text
    assert "\n\nhi^[[201~^C!touch /tmp/x\n^\\^Z\n--agentmux-" in text  # CR is a line break


@given(
    body=st.text(),
    name=st.text(),
    subject=st.text(),
    ids=st.lists(st.text(min_size=1), min_size=2, max_size=4),
)
def test_any_input_renders_to_text_a_paste_cannot_escape(
    body: str, name: str, subject: str, ids: list[str]
) -> None:
    """For any input, the pane bytes hold no byte < 0x20 but LF and TAB, no DEL, no C1 code
    point, and never the end-of-paste marker; the body's printable text is kept in order."""
    cc = tuple(Address(i, name) for i in ids[2:])
    text = render(
        Envelope(uuid.uuid4(), AT, Address(ids[0], name), Address(ids[1], name), body, cc, subject)
    )
    _assert_text_only(text)
    _assert_text_only(batches([text, text])[0])
    kept = "".join(c for c in body if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF)
    shown = "".join(c for c in text if c.isprintable())
    assert _is_subsequence(kept, shown)


def _shown(c: str) -> str:
    """The per-character reference of `neutralise`."""
    code = ord(c)
    if c in "\n\t":
        return c
    if code < 0x20:
        return "^" + chr(code + 0x40)
    if code == 0x7F:
        return "^?"
    if 0x80 <= code <= 0x9F:
        return f"<U+{code:04X}>"
    return "\ufffd" if 0xD800 <= code <= 0xDFFF else c


@given(st.text() | st.text(alphabet=st.sampled_from([*CONTROLS, "a", "\ud800", "é"])))
def test_neutralise_maps_each_character_and_is_idempotent(text: str) -> None:
    out = neutralise(text)
    assert out == "".join(map(_shown, text))
    assert neutralise(out) == out
    _assert_text_only(out)


def _is_subsequence(needle: str, haystack: str) -> bool:
    it = iter(haystack)
    return all(c in it for c in needle)


def test_date_is_utc_milliseconds_and_naive_is_refused() -> None:
    plus_two = timezone(timedelta(hours=2))
    assert rfc3339(datetime(2025, 1, 1, 2, 0, 0, tzinfo=plus_two)) == "2025-01-01T00:00:00.000Z"
    assert rfc3339(datetime(2025, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)) == (
        "2025-12-31T23:59:59.999Z"
    )
    with pytest.raises(ValueError):
        rfc3339(datetime(2025, 1, 1))
    with pytest.raises(ValueError):
        render(Envelope(MID, datetime(2025, 1, 1), ALICE, BRAVO, "x"))


def test_boundary_is_the_id_without_hyphens() -> None:
    some = uuid.uuid4()
    assert boundary(some) == "agentmux-" + some.hex
    text = render(Envelope(some, AT, ALICE, BRAVO, "x"))
    assert text.startswith(f"--agentmux-{some.hex}\nMessage-Id: {some}\n")
    assert text.endswith(f"\n--agentmux-{some.hex}--\n")
    assert text.count(f"--agentmux-{some.hex}\n") == 2


def test_token_estimate() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("a" * 10) == 3 + 0  # exactly 3.0, not IEEE 3.0000000000000004 -> 4
    assert estimate_tokens("a" * 11) == 4 + 0  # ceil(3.3)
    assert estimate_tokens("x\n" * 12) == 8 + 1  # 24 chars -> ceil(7.2); 12 lines -> 1
    assert estimate_tokens("x\n" * 11 + "x") == 7 + 1  # a last line without newline counts
    assert estimate_tokens("x\n" * 23) == 14 + 1  # 23 // 12
    assert estimate_tokens("é" * 10) == 3  # code points, not bytes
    assert estimate_tokens("one two  three\nfour", "whitespace") == 4
    with pytest.raises(ValueError):
        estimate_tokens("x", "gpt")
    assert count_lines("") == 0 and count_lines("a") == 1 and count_lines("a\n") == 1
    assert count_lines("a\n\n") == 2


def _envelope_of(chars: int) -> str:
    """A fake rendered envelope of exactly `chars` characters on one line (ending "\\n")."""
    return "e" * (chars - 1) + "\n"


def test_batching_stops_exactly_at_the_limit() -> None:
    # Two one-line envelopes joined: 2a + 1 chars, 3 lines (two + the blank separator).
    # 6825 chars -> ceil(2047.5) = 2048 tokens; 3 lines // 12 = 0.
    a = _envelope_of(3412)
    joined = join_batch([a, a])
    assert joined == a + "\n" + a and len(joined) == 6825
    assert estimate_tokens(joined) == 2048
    assert take_batch([a, a], max_tokens=2048) == 2
    assert take_batch([a, a], max_tokens=2047) == 1
    # At the default limit: 13653 chars -> ceil(4095.9) = 4096, in; one more char is 4097, out.
    big = _envelope_of(6826)
    assert estimate_tokens(join_batch([big, big])) == 4096
    assert take_batch([big, big, "x\n"]) == 2
    bigger = _envelope_of(6827)
    assert estimate_tokens(join_batch([bigger, big])) == 4097
    assert take_batch([bigger, big]) == 1


def test_an_oversized_envelope_goes_alone_and_order_is_kept() -> None:
    huge = _envelope_of(20_000)
    small = [f"m{i}\n" for i in range(3)]
    assert take_batch([]) == 0
    assert take_batch([huge, *small]) == 1
    assert batches([*small, huge, *small]) == [join_batch(small), huge, join_batch(small)]


def test_real_envelopes_batch_with_one_blank_line_between() -> None:
    first = render(Envelope(MID, AT, ALICE, BRAVO, "one"))
    second = render(Envelope(uuid.uuid4(), AT, CAROL, BRAVO, "two"))
    [prompt] = batches([first, second])
    assert prompt == first + "\n" + second
    assert f"{B}--\n\n--agentmux-" in prompt


@given(
    sizes=st.lists(st.integers(min_value=1, max_value=400), max_size=25),
    limit=st.integers(min_value=1, max_value=300),
)
def test_batches_are_greedy_ordered_and_bounded(sizes: list[int], limit: int) -> None:
    pending = [_envelope_of(n) for n in sizes]
    out = batches(pending, max_tokens=limit)
    assert "\n".join(out) == join_batch(pending)  # nothing lost, reordered or split
    rest = list(pending)
    for prompt in out:
        n = take_batch(rest, max_tokens=limit)
        assert prompt == join_batch(rest[:n])
        assert n == 1 or estimate_tokens(prompt) <= limit
        if n < len(rest):  # greedy: one more would exceed the limit
            assert estimate_tokens(join_batch(rest[: n + 1])) > limit
        rest = rest[n:]
    assert not rest


def test_the_receipt_body_is_agentmuxs_sentence() -> None:
    lost = "6f1c2d3e-0000-4000-8000-000000000001"
    assert receipt_body(lost, "bravo@party", "not_submitted", "delivery_target_unreachable") == (
        f"Your message {lost} to bravo@party was not delivered (failed). "
        "reason_code=delivery_target_unreachable"
    )
    assert receipt_body(lost, "bravo@party", "timeout", "target_never_settled", "gave up") == (
        f"Your message {lost} to bravo@party was not delivered (failed). "
        "reason_code=target_never_settled: gave up"
    )
    assert receipt_body(lost, "b@p", "failed", "dropped_on_shutdown", "relay shut down") == (
        f"Your message {lost} to b@p was not delivered (dropped on relay shutdown). "
        "reason_code=dropped_on_shutdown: relay shut down"
    )
    assert receipt_body(lost, "b@p", "submission_unknown") == (
        f"Your message {lost} to b@p was not delivered (failed)."
    )


def test_the_receipt_is_an_envelope_from_the_relay_after_a_marker_line() -> None:
    body = receipt_body("m-1", "bravo@party", "timeout", "target_never_settled", "x\x1b[201~y")
    text = render_receipt(receipt(MID, AT, ALICE, body))
    assert text == (
        "--- agentmux terminal-outcome receipt ---\n"
        f"{B}\n"
        "Message-Id: 0f8b6c3e-2a41-4d7e-9c55-6b1e2f3a4b5c\n"
        "Date: 2025-03-04T05:06:07.890Z\n"
        "From: relay <session:relay@RELAY>\n"
        "To: Alice <session:alpha@party>\n"
        "\n"
        f"{B}\n"
        "Content-Type: text/plain; charset=utf-8\n"
        "\n"
        "Your message m-1 to bravo@party was not delivered (failed). "
        "reason_code=target_never_settled: x^[[201~y\n"
        f"{B}--\n"
    )
