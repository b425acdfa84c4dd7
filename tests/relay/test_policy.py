"""policies.toml reading, member policy resolution and deny-by-default `authorize` (§3.2)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcphost.agentmux.bundlefile import Session
from mcphost.agentmux.wire import Principal, RelayError, parse_principal
from mcphost.relay import policy as P
from tests.thorough import examples

FILE = Path("/cfg/policies.toml")


def parse(text: str) -> P.PolicySet:
    return P.parse_policies(tomllib.loads(text), FILE)


def parse_error(text: str) -> RelayError:
    with pytest.raises(RelayError) as caught:
        parse(text)
    return caught.value


def pid(text: str) -> Principal:
    return parse_principal(text)


ALPHA = pid("alpha@party")
BRAVO = pid("bravo@party")
ZULU = pid("zulu@other")
OPERATOR = pid("op@GLOBAL")
OTHER_USER = pid("eve@GLOBAL")
APP = pid("hook@EXTERNAL")
PEER = pid("west@RELAY")


# -- reading ---------------------------------------------------------------------------------

FULL_FILE = """\
format-version = 1
default = "worker"

[[policies]]
id = "worker"
description = "agents"
[policies.controls]
list = "home"
look = "self"
send = "all:home"
raww = "none"
choose = "home"
updown = "all:all"
find = "home"

[[policies]]
id = "admin"
[policies.controls]
send = "all"
[policies.controls.new]
peer = "all"
[policies.controls.change]
psk = "all"
scope = "home"
[policies.controls.drop]
peer = "self"
[policies.controls.do]
run = "all"
"""


def test_a_full_file_reads_with_older_spellings_folded() -> None:
    policies = parse(FULL_FILE)
    assert policies.default == "worker"
    assert policies.path == FILE
    worker = policies.get("worker")
    assert worker is not None
    assert dict(worker.controls) == {
        "list": "home",
        "look": "self",
        "send": "home",
        "raww": "none",
        "choose": "home",
        "updown": "all",
    }
    assert set(worker.actions.values()) == {"none"}
    assert worker.description == "agents"
    admin = policies.get("admin")
    assert admin is not None
    assert admin.scope("send") == "all" and admin.scope("list") == "none"
    assert dict(admin.actions) == {
        "new.peer": "all",
        "change.psk": "all",
        "change.scope": "home",
        "drop.peer": "self",
    }
    assert admin.scope("do.run") == "none"  # reserved: read, never granted


def test_an_empty_file_and_a_policy_without_controls_read() -> None:
    assert dict(parse("").policies) == {}
    policy = parse('[[policies]]\nid = "bare"\n').get("bare")
    assert policy is not None
    assert set(policy.controls.values()) == {"none"}


@pytest.mark.parametrize(
    ("text", "code", "key"),
    [
        # unknown scope values: raww / choose / updown have their own code
        ("[policies.controls]\nraww = 'sometimes'", "validation_invalid_policy_scope", "raww"),
        ("[policies.controls]\nchoose = 'everyone'", "validation_invalid_policy_scope", "choose"),
        ("[policies.controls]\nupdown = 'all:none'", "validation_invalid_policy_scope", "updown"),
        ("[policies.controls]\nlist = 'everything'", "validation_invalid_arguments", "list"),
        ("[policies.controls]\nlook = 'Home'", "validation_invalid_arguments", "look"),
        ("[policies.controls]\nsend = 3", "validation_invalid_arguments", "send"),
        ("[policies.controls]\nfind = 'x'", "validation_invalid_arguments", "find"),
        ("[policies.controls.new]\npeer = 'root'", "validation_invalid_arguments", "peer"),
        ("[policies.controls.change]\npsk = ''", "validation_invalid_arguments", "psk"),
        ("[policies.controls.drop]\npeer = 'ALL'", "validation_invalid_arguments", "peer"),
        # deny_unknown_fields, at every level
        ("[policies.controls]\nsudo = 'all'", "validation_invalid_arguments", "sudo"),
        ("[policies.controls.new]\nuser = 'all'", "validation_invalid_arguments", "user"),
        ("[policies.controls.change]\nkey = 'all'", "validation_invalid_arguments", "key"),
        ("[policies.controls.do]\nexec = 'all'", "validation_invalid_arguments", "exec"),
        ("rules = 1", "validation_invalid_arguments", "rules"),
    ],
)
def test_bad_values_and_unknown_keys_name_the_file_and_key(text: str, code: str, key: str) -> None:
    if not text.startswith("rules"):
        text = f'[[policies]]\nid = "p"\n{text}\n'
    err = parse_error(text)
    assert err.code == code
    assert str(FILE) in err.message
    assert key in err.message
    assert err.details == {"path": str(FILE), "cause": err.message.split(f"{FILE}: ", 1)[1]}


def test_key_paths_in_errors_point_at_the_entry() -> None:
    err = parse_error('[[policies]]\nid = "a"\n[[policies]]\nid = "b"\n[policies.controls]\nx = 1')
    assert "policies[1].controls.x: unknown field" in err.message


def test_snake_case_spelling_of_a_kebab_key_is_unknown_with_a_hint() -> None:
    err = parse_error("format_version = 1\nformat-version = 1\n")
    assert "format_version: unknown field (keys are kebab-case: 'format-version')" in err.message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("format-version = 2", "format-version: unsupported format version 2"),
        ('format-version = "1"', "format-version: unsupported format version '1'"),
        ('default = "ghost"\n[[policies]]\nid = "p"', "default: default policy 'ghost'"),
        ('[[policies]]\nid = "p"\n[[policies]]\nid = "p"', "policies[1].id: policy id 'p'"),
        ("[[policies]]\ndescription = 'no id'", "policies[0].id: missing required field"),
        ("policies = 3", "policies: expected an array of tables"),
        ("[[policies]]\nid = 'p'\ncontrols = 'all'", "policies[0].controls: expected a table"),
    ],
)
def test_structural_errors(text: str, fragment: str) -> None:
    err = parse_error(text)
    assert err.code == "validation_invalid_arguments"
    assert fragment in err.message


def test_canonical_scope() -> None:
    assert [P.canonical_scope(v) for v in ("none", "self", "home", "all")] == list(P.SCOPES)
    assert P.canonical_scope("all:home") == "home"
    assert P.canonical_scope("all:all") == "all"
    assert P.canonical_scope("all:self") is None
    assert P.canonical_scope("") is None


def test_load_policies_first_layer_wins_and_starters_without_a_file(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    assert P.load_policies([first, second]) is P.STARTER_SET
    (second / "policies.toml").write_text('[[policies]]\nid = "second"\n')
    assert set(P.load_policies([first, second]).policies) == {"second"}
    (first / "policies.toml").write_text('[[policies]]\nid = "first"\n')
    loaded = P.load_policies([first, second])
    assert set(loaded.policies) == {"first"}
    assert loaded.path == first / "policies.toml"


def test_load_policies_reports_broken_toml_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "policies.toml").write_text("[[policies]\n")
    with pytest.raises(RelayError) as caught:
        P.load_policies([tmp_path])
    assert caught.value.code == "validation_invalid_arguments"
    assert caught.value.details is not None
    assert caught.value.details["path"] == str(tmp_path / "policies.toml")


# -- presets and resolution ------------------------------------------------------------------


def test_builtin_and_starter_presets() -> None:
    conservative = {
        "list": "home",
        "look": "home",
        "send": "home",
        "raww": "none",
        "choose": "none",
        "updown": "none",
    }
    assert dict(P.BUILTIN.controls) == conservative
    assert set(P.BUILTIN.actions.values()) == {"none"}
    assert dict(P.STARTER_DEFAULT.controls) == conservative
    assert set(P.STARTER_DEFAULT.actions.values()) == {"none"}
    assert set(P.STARTER_OPERATOR.controls.values()) == {"all"}
    assert dict(P.STARTER_OPERATOR.actions) == {
        "new.peer": "all",
        "change.psk": "all",
        "change.scope": "none",
        "drop.peer": "all",
    }
    assert set(P.STARTER_SET.policies) == {"default", "operator"}
    assert P.STARTER_SET.default is None


def member(policy: str | None) -> Session:
    return Session(id="alpha", directory="/w", kind="coder", transport="tmux", policy=policy)


def test_member_policy_resolution() -> None:
    with_default = parse(FULL_FILE)
    without_default = parse('[[policies]]\nid = "worker"\n')
    assert P.member_policy(with_default, member("admin")).id == "admin"
    assert P.member_policy(with_default, member(None)).id == "worker"
    assert P.member_policy(with_default, None).id == "worker"
    assert P.member_policy(without_default, member(None)) is P.BUILTIN
    assert P.member_policy(P.STARTER_SET, member("operator")) is P.STARTER_OPERATOR
    assert P.member_policy(P.STARTER_SET, member(None)) is P.BUILTIN
    with pytest.raises(RelayError) as caught:
        P.member_policy(without_default, member("operator"))  # a file replaces the starters
    assert caught.value.code == "validation_unknown_policy"
    assert caught.value.details == {"policy": "operator"}


# -- authorize: the table --------------------------------------------------------------------


def pol(**scopes: str) -> P.Policy:
    controls = {k: v for k, v in scopes.items() if k in P.CONTROLS}
    actions = {k.replace("_", "."): v for k, v in scopes.items() if k not in P.CONTROLS}
    return P.make_policy("t", controls, actions)


ALLOW = None
CROSS = P.REASON_CROSS
SCOPE = P.REASON_SCOPE
UPDOWN = P.REASON_UPDOWN
ADMIN = P.REASON_ADMIN

# (policy scopes, capability, requester, targets, subject_bundle, expected reason or ALLOW)
TABLE: list[tuple[dict[str, str], str, Principal, list[Principal], str | None, str | None]] = [
    # send: self / home / other bundle / GLOBAL
    ({"send": "self"}, "send.deliver", ALPHA, [ALPHA], None, ALLOW),
    ({"send": "self"}, "send.deliver", ALPHA, [BRAVO], None, SCOPE),
    ({"send": "none"}, "send.deliver", ALPHA, [ALPHA], None, SCOPE),
    ({"send": "home"}, "send.deliver", ALPHA, [BRAVO], None, ALLOW),
    ({"send": "home"}, "send.deliver", ALPHA, [ALPHA, BRAVO], None, ALLOW),
    ({"send": "home"}, "send.deliver", ALPHA, [ZULU], None, CROSS),
    ({"send": "home"}, "send.deliver", ALPHA, [BRAVO, ZULU], None, CROSS),
    ({"send": "all"}, "send.deliver", ALPHA, [BRAVO, ZULU], None, ALLOW),
    ({"send": "home"}, "send.deliver", ALPHA, [OPERATOR], None, ALLOW),  # GLOBAL counts as home
    ({"send": "self"}, "send.deliver", ALPHA, [OPERATOR], None, SCOPE),
    ({"send": "home"}, "send.deliver", ALPHA, [pid("bravo@party!west")], None, CROSS),
    ({"send": "self"}, "send.deliver", ALPHA, [], None, ALLOW),  # no targets: needs self
    ({"send": "none"}, "send.deliver", ALPHA, [], None, SCOPE),
    # a user's home is GLOBAL
    ({"send": "home"}, "send.deliver", OPERATOR, [OTHER_USER], None, ALLOW),
    ({"send": "home"}, "send.deliver", OPERATOR, [ALPHA], None, CROSS),
    ({"send": "all"}, "send.deliver", OPERATOR, [ALPHA, ZULU], None, ALLOW),
    # look and raww: GLOBAL targets never, whatever the scope
    ({"look": "self"}, "look.inspect", ALPHA, [ALPHA], None, ALLOW),
    ({"look": "self"}, "look.inspect", ALPHA, [BRAVO], None, SCOPE),
    ({"look": "home"}, "look.inspect", ALPHA, [BRAVO], None, ALLOW),
    ({"look": "home"}, "look.inspect", ALPHA, [ZULU], None, CROSS),
    ({"look": "all"}, "look.inspect", ALPHA, [ZULU], None, ALLOW),
    ({"look": "all"}, "look.inspect", ALPHA, [OPERATOR], None, SCOPE),
    ({"look": "all"}, "look.inspect", OPERATOR, [OPERATOR], None, ALLOW),  # self is self
    ({"look": "all"}, "look.inspect", OPERATOR, [OTHER_USER], None, SCOPE),
    ({"raww": "home"}, "raww.write", ALPHA, [BRAVO], None, ALLOW),
    ({"raww": "self"}, "raww.write", ALPHA, [BRAVO], None, SCOPE),
    ({"raww": "home"}, "raww.write", ALPHA, [ZULU], None, CROSS),
    ({"raww": "all"}, "raww.write", ALPHA, [OPERATOR], None, SCOPE),
    ({"send": "all", "look": "all"}, "raww.write", ALPHA, [ALPHA], None, SCOPE),  # raww none
    # list: home bundle and GLOBAL need home, a peer bundle all
    ({"list": "home"}, "list.read", ALPHA, [], "party", ALLOW),
    ({"list": "home"}, "list.read", ALPHA, [], None, ALLOW),
    ({"list": "self"}, "list.read", ALPHA, [], "party", SCOPE),
    ({"list": "home"}, "list.read", ALPHA, [], "GLOBAL", ALLOW),
    ({"list": "self"}, "list.read", ALPHA, [], "GLOBAL", SCOPE),
    ({"list": "home"}, "list.read", ALPHA, [], "other", CROSS),
    ({"list": "all"}, "list.read", ALPHA, [], "other", ALLOW),
    ({"list": "home"}, "list.read", OPERATOR, [], "GLOBAL", ALLOW),
    ({"list": "home"}, "list.read", OPERATOR, [], "party", CROSS),
    ({"list": "all"}, "list.read", OPERATOR, [], "party", ALLOW),
    # updown and choose: at least home in the subject bundle
    ({"updown": "home"}, "updown", ALPHA, [], "party", ALLOW),
    ({"updown": "self"}, "updown", ALPHA, [], "party", UPDOWN),
    ({"updown": "none"}, "updown", ALPHA, [], None, UPDOWN),
    ({"updown": "home"}, "updown", ALPHA, [], "other", UPDOWN),
    ({"updown": "all"}, "updown", ALPHA, [], "other", ALLOW),
    ({"updown": "all"}, "updown", OPERATOR, [], "party", ALLOW),
    ({"updown": "home"}, "updown", OPERATOR, [], "party", UPDOWN),
    ({"choose": "home"}, "choose", ALPHA, [], "party", ALLOW),
    ({"choose": "self"}, "choose", ALPHA, [], "party", SCOPE),
    ({"choose": "home"}, "choose", ALPHA, [], "other", CROSS),
    ({"choose": "all"}, "choose", OPERATOR, [], "party", ALLOW),
    # relay-wide admin: all, and never for application / relay principals
    ({"new_peer": "all"}, "new.peer", ALPHA, [], None, ALLOW),
    ({"new_peer": "home"}, "new.peer", ALPHA, [], None, ADMIN),
    ({"new_peer": "all"}, "change.psk", ALPHA, [], None, ADMIN),
    ({"change_psk": "all"}, "change.psk", OPERATOR, [], None, ALLOW),
    ({"change_scope": "all"}, "change.scope", OPERATOR, [], None, ALLOW),
    ({"change_scope": "self"}, "change.scope", OPERATOR, [], None, ADMIN),
    ({"drop_peer": "all"}, "drop.peer", OPERATOR, [], None, ALLOW),
    ({"drop_peer": "all"}, "drop.peer", APP, [], None, ADMIN),
    ({"new_peer": "all"}, "new.peer", PEER, [], None, ADMIN),
    # application and relay principals: refused everything
    ({"send": "all"}, "send.deliver", APP, [APP], None, SCOPE),
    ({"list": "all"}, "list.read", PEER, [], "party", SCOPE),
    ({"look": "all"}, "look.inspect", PEER, [ALPHA], None, SCOPE),
    # capabilities outside the table: refused
    ({"send": "all", "list": "all"}, "do.run", ALPHA, [], None, SCOPE),
    ({"send": "all"}, "send", ALPHA, [BRAVO], None, SCOPE),
    ({"list": "all"}, "identity.introspect", ALPHA, [BRAVO], None, SCOPE),
    ({"list": "all"}, "find.query", ALPHA, [], None, SCOPE),
]


@pytest.mark.parametrize(
    ("scopes", "capability", "requester", "targets", "subject", "expected"),
    TABLE,
    ids=[f"{i}-{row[1]}-{row[2].id}" for i, row in enumerate(TABLE)],
)
def test_authorize_table(
    scopes: dict[str, str],
    capability: str,
    requester: Principal,
    targets: list[Principal],
    subject: str | None,
    expected: str | None,
) -> None:
    policy = pol(**scopes)
    if expected is ALLOW:
        P.authorize(policy, capability, requester, targets, subject_bundle=subject)
        return
    with pytest.raises(RelayError) as caught:
        P.authorize(policy, capability, requester, targets, subject_bundle=subject)
    err = caught.value
    assert err.code == "authorization_forbidden"
    assert err.message == "request denied by authorization policy"
    assert err.details is not None
    assert err.details["capability"] == capability
    assert err.details["requester_session"] == requester.id
    assert err.details["reason"] == expected
    assert err.details["policy_rule_id"] == "t"


def deny(*args: Any, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(RelayError) as caught:
        P.authorize(*args, **kwargs)
    assert caught.value.details is not None
    return caught.value.details


def test_denial_details_exactly() -> None:
    policy = pol(send="home")
    assert deny(policy, "send.deliver", ALPHA, [ZULU]) == {
        "capability": "send.deliver",
        "requester_session": "alpha@party",
        "bundle_name": "party",
        "reason": CROSS,
        "policy_rule_id": "t",
        "target_session": "zulu@other",
    }
    assert deny(policy, "send.deliver", ALPHA, [BRAVO, ZULU])["targets"] == [
        "bravo@party",
        "zulu@other",
    ]
    assert "target_session" not in deny(policy, "send.deliver", ALPHA, [BRAVO, ZULU])
    admin = deny(policy, "new.peer", ALPHA, [])
    assert admin["bundle_name"] == "" and admin["reason"] == ADMIN
    assert "targets" not in admin and "target_session" not in admin
    assert deny(policy, "list.read", ALPHA, [], subject_bundle="other")["bundle_name"] == "other"
    assert deny(policy, "updown", OPERATOR, [], subject_bundle="party")["bundle_name"] == "party"


def test_the_starter_presets_in_practice() -> None:
    default, operator = P.STARTER_DEFAULT, P.STARTER_OPERATOR
    P.authorize(default, "send.deliver", ALPHA, [BRAVO, OPERATOR])
    P.authorize(default, "list.read", ALPHA, [], subject_bundle="GLOBAL")
    for capability in ("raww.write", "new.peer", "change.psk", "drop.peer"):
        deny(default, capability, ALPHA, [BRAVO])
    deny(default, "updown", ALPHA, [])
    P.authorize(operator, "send.deliver", OPERATOR, [ALPHA, ZULU])
    P.authorize(operator, "raww.write", OPERATOR, [ALPHA])
    P.authorize(operator, "updown", OPERATOR, [], subject_bundle="party")
    for capability in ("new.peer", "change.psk", "drop.peer"):
        P.authorize(operator, capability, OPERATOR, [])
    deny(operator, "change.scope", OPERATOR, [])


# -- authorize: properties -------------------------------------------------------------------

NAMES = st.sampled_from(["alpha", "bravo", "zulu", "op", "eve"])
NAMESPACES = st.sampled_from(["party", "other", "GLOBAL", "EXTERNAL", "RELAY", "party!west"])
PRINCIPALS = st.builds(lambda n, ns: pid(f"{n}@{ns}"), NAMES, NAMESPACES)
SCOPE_VALUES = st.sampled_from(P.SCOPES)
POLICIES = st.builds(
    lambda c, a: P.make_policy("h", c, a),
    st.fixed_dictionaries({c: SCOPE_VALUES for c in P.CONTROLS}),
    st.fixed_dictionaries({a: SCOPE_VALUES for a in P.ADMIN}),
)
CAPS = st.sampled_from([*P.CAPABILITIES, "do.run", "send"])
SUBJECTS = st.one_of(st.none(), st.sampled_from(["party", "other", "GLOBAL"]))
TARGETS = st.lists(PRINCIPALS, max_size=4)


def allowed(
    policy: P.Policy, cap: str, who: Principal, targets: list[Principal], subject: Any
) -> bool:
    try:
        P.authorize(policy, cap, who, targets, subject_bundle=subject)
    except RelayError as err:
        assert err.code == "authorization_forbidden"
        return False
    return True


def key_for(capability: str) -> str | None:
    return (
        P.TARGETED.get(capability)
        or P.SUBJECT.get(capability)
        or (capability if capability in P.ADMIN else None)
    )


def with_scope(policy: P.Policy, key: str, scope: str) -> P.Policy:
    controls = dict(policy.controls)
    actions = dict(policy.actions)
    (controls if key in controls else actions)[key] = scope
    return P.make_policy(policy.id, controls, actions)


@examples(full=3000, quick=300)
@given(POLICIES, CAPS, PRINCIPALS, TARGETS, SUBJECTS)
def test_a_scope_of_none_never_authorizes(
    policy: P.Policy, cap: str, who: Principal, targets: list[Principal], subject: Any
) -> None:
    key = key_for(cap)
    if key is not None:
        policy = with_scope(policy, key, "none")
    assert not allowed(policy, cap, who, targets, subject)


@examples(full=3000, quick=300)
@given(POLICIES, CAPS, PRINCIPALS, TARGETS, SUBJECTS, st.sampled_from([*P.CONTROLS, *P.ADMIN]))
def test_raising_a_scope_never_turns_an_allow_into_a_deny(
    policy: P.Policy,
    cap: str,
    who: Principal,
    targets: list[Principal],
    subject: Any,
    key: str,
) -> None:
    before = allowed(policy, cap, who, targets, subject)
    for higher in P.SCOPES[P.RANK[policy.scope(key)] :]:
        after = allowed(with_scope(policy, key, higher), cap, who, targets, subject)
        assert after or not before


@examples(full=2000, quick=200)
@given(POLICIES, CAPS, PRINCIPALS, TARGETS, SUBJECTS, PRINCIPALS)
def test_more_targets_never_turn_a_deny_into_an_allow_and_order_does_not_matter(
    policy: P.Policy,
    cap: str,
    who: Principal,
    targets: list[Principal],
    subject: Any,
    extra: Principal,
) -> None:
    base = allowed(policy, cap, who, targets, subject)
    assert allowed(policy, cap, who, list(reversed(targets)), subject) == base
    if not base:
        assert not allowed(policy, cap, who, [*targets, extra], subject)


@examples(full=2000, quick=200)
@given(POLICIES, CAPS, PRINCIPALS, TARGETS, SUBJECTS)
def test_application_and_relay_principals_are_always_refused(
    policy: P.Policy, cap: str, who: Principal, targets: list[Principal], subject: Any
) -> None:
    if who.kind in ("application", "relay"):
        assert not allowed(policy, cap, who, targets, subject)
