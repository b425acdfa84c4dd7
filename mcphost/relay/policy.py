"""Policies and deny-by-default authorization (reference `agentmux-relay.md` §3.2): pure.

Owns: reading `policies.toml` (`format-version = 1`, `default = '<id>'`, `[[policies]]` with
`id`, `description` and `[policies.controls]`: `list`, `look`, `send`, `raww`, `choose`,
`updown`, older `find`, and the action maps `[policies.controls.new]` `peer`,
`[policies.controls.change]` `psk` / `scope`, `[policies.controls.drop]` `peer`, reserved
`[policies.controls.do]` `list` / `show` / `run`); the scope values `none` < `self` < `home` <
`all` with the older spellings `all:home` -> `home` and `all:all` -> `all`; the starter presets
`default` and `operator`; the conservative built-in; member policy resolution; `authorize`.

Scope errors: an unknown value for `raww`, `choose` or `updown` is
`validation_invalid_policy_scope`, for any other control or action `validation_invalid_arguments`;
either names the file and the key. A member or user naming a policy the set does not define is
`validation_unknown_policy`.

Which set applies: the first layer's `policies.toml`; when no layer has one, the starter presets
(what upstream hydrates as the starter file), with no file default. A member without `policy`
gets the file `default`, else the built-in (list/look/send `home`, the rest `none`).

The model (`authorize`), deny by default, every rule data-driven from the requester's scope for
the capability:
- every access needs at least `self`, so a scope of `none` never authorizes anything;
- `application` (`@EXTERNAL`) and `relay` (`@RELAY`) requesters are refused whatever the policy
  (fail-closed: this relay has no trusted hosts and no cross-relay ingress);
- `send.deliver` / `look.inspect` / `raww.write`: each target's tier is `self` (the requester
  itself), `home` (another principal of the requester's home namespace: its bundle, or `GLOBAL`
  for a user) or `all` (another namespace); a `@GLOBAL` target counts as `home` for `send.deliver`
  (anyone with `send = home` reaches the operator) and is refused for `look.inspect` and
  `raww.write`; the maximum tier across targets must be within the scope; no targets needs `self`;
- `list.read` of the requester's home namespace or of `GLOBAL` needs `home`, of a peer bundle
  `all`;
- `updown` and `choose` need `home` in the subject bundle when it is the requester's home, `all`
  for another bundle;
- relay-wide admin (`new.peer`, `change.psk`, `change.scope`, `drop.peer`) needs `all`;
- any other capability (the reserved `do.*`, `find.query`, `identity.introspect`) is refused.
Refusal: `RelayError("authorization_forbidden", "request denied by authorization policy",
{"capability", "requester_session", "bundle_name", "reason", "policy_rule_id", "target_session"
(one target) | "targets" (several)})`; `bundle_name` is "" for relay-wide admin. Validation and
existence errors are the caller's, before `authorize`.

Must never: do I/O other than `load_policies` reading the first `policies.toml` through
`mcphost.agentmux.tables.first_file`; allow anything its table does not name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from mcphost.agentmux.tables import Source, Table, first_file
from mcphost.agentmux.wire import Principal, RelayError

SCOPES = ("none", "self", "home", "all")
RANK = {scope: rank for rank, scope in enumerate(SCOPES)}
ALIASES = {"all:home": "home", "all:all": "all"}
CONTROLS = ("list", "look", "send", "raww", "choose", "updown")
OLDER_CONTROLS = ("find",)  # recognised in older files; nothing is authorized by it
ACTIONS = {"new": ("peer",), "change": ("psk", "scope"), "drop": ("peer",)}
RESERVED_ACTIONS = {"do": ("list", "show", "run")}
POLICY_SCOPE_CONTROLS = frozenset({"raww", "choose", "updown"})
GLOBAL = "GLOBAL"

# capability label -> (control or action key, shape)
TARGETED = {"send.deliver": "send", "look.inspect": "look", "raww.write": "raww"}
SUBJECT = {"list.read": "list", "updown": "updown", "choose": "choose"}
ADMIN = ("new.peer", "change.psk", "change.scope", "drop.peer")
CAPABILITIES = (*TARGETED, *SUBJECT, *ADMIN)

DENIED = "request denied by authorization policy"
REASON_CROSS = "policy scope does not permit cross-bundle access (requires all)"
REASON_SCOPE = "policy scope does not permit this access"
REASON_UPDOWN = "updown policy scope does not allow bundle up/down transitions"
REASON_ADMIN = "relay-wide operator action requires the all scope for this control"


def _frozen(mapping: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Policy:
    """One policy: every control and action key mapped to its canonical scope."""

    id: str
    controls: Mapping[str, str]  # list, look, send, raww, choose, updown (missing = none)
    actions: Mapping[str, str] = field(default_factory=dict)  # new.peer, change.psk, ...
    description: str | None = None

    def scope(self, key: str) -> str:
        """The scope for a control (`send`) or action (`new.peer`); `none` when unset."""
        if key in self.controls:
            return self.controls[key]
        return self.actions.get(key, "none")


def make_policy(
    policy_id: str,
    controls: Mapping[str, str] | None = None,
    actions: Mapping[str, str] | None = None,
    description: str | None = None,
) -> Policy:
    """A policy with every control and action present (`none` where not given)."""
    controls = controls or {}
    actions = actions or {}
    for key, value in (*controls.items(), *actions.items()):
        if value not in RANK:
            raise ValueError(f"{key}: {value!r} is not a scope")
    full_controls = {c: controls.get(c, "none") for c in CONTROLS}
    full_actions = {a: actions.get(a, "none") for a in ADMIN}
    unknown = (set(controls) - set(CONTROLS)) | (set(actions) - set(ADMIN))
    if unknown:
        raise ValueError(f"unknown controls or actions: {sorted(unknown)}")
    return Policy(policy_id, _frozen(full_controls), _frozen(full_actions), description)


BUILTIN = make_policy("builtin", {"list": "home", "look": "home", "send": "home"})
STARTER_DEFAULT = make_policy(
    "default",
    {"list": "home", "look": "home", "send": "home"},
    description="Starter preset: list, look and send within the home bundle.",
)
STARTER_OPERATOR = make_policy(
    "operator",
    {c: "all" for c in CONTROLS},
    {"new.peer": "all", "change.psk": "all", "drop.peer": "all"},
    description="Starter preset: every control across bundles, and credential administration.",
)
STARTERS: Mapping[str, Policy] = MappingProxyType(
    {STARTER_DEFAULT.id: STARTER_DEFAULT, STARTER_OPERATOR.id: STARTER_OPERATOR}
)


@dataclass(frozen=True)
class PolicySet:
    """The policies in force: by id, the file `default` (if any) and where they came from."""

    policies: Mapping[str, Policy]
    default: str | None = None
    path: Path | None = None  # None: no layer has policies.toml (the starter presets apply)

    def get(self, policy_id: str) -> Policy | None:
        return self.policies.get(policy_id)


STARTER_SET = PolicySet(STARTERS)


# -- reading ---------------------------------------------------------------------------------


def canonical_scope(value: str) -> str | None:
    """`none` / `self` / `home` / `all`, the older `all:home` / `all:all` folded; None if unknown."""
    if value in RANK:
        return value
    return ALIASES.get(value)


def _scope(table: Table, key: str, control: str) -> str | None:
    value = table.raw(key)
    if value is None:
        return None
    code = (
        "validation_invalid_policy_scope"
        if control in POLICY_SCOPE_CONTROLS
        else "validation_invalid_arguments"
    )
    scope = canonical_scope(value) if isinstance(value, str) else None
    if scope is None:
        shown = value if isinstance(value, str) else type(value).__name__
        raise table.error(
            key, f"{shown!r} is not a policy scope (none, self, home, all, all:home, all:all)", code
        )
    return scope


def _policy(entry: Table) -> Policy:
    policy_id = entry.string("id", required=True)
    assert policy_id is not None
    description = entry.string("description", empty=True)
    controls: dict[str, str] = {}
    actions: dict[str, str] = {}
    table = entry.table("controls")
    if table is not None:
        for control in (*CONTROLS, *OLDER_CONTROLS):
            scope = _scope(table, control, control)
            if scope is not None and control in CONTROLS:
                controls[control] = scope
        for group, keys in (*ACTIONS.items(), *RESERVED_ACTIONS.items()):
            sub = table.table(group)
            if sub is None:
                continue
            for key in keys:
                scope = _scope(sub, key, f"{group}.{key}")
                if scope is not None and group in ACTIONS:
                    actions[f"{group}.{key}"] = scope
            sub.done()
        table.done()
    entry.done()
    return make_policy(policy_id, controls, actions, description)


def parse_policies(doc: Mapping[str, Any], path: Path) -> PolicySet:
    """A parsed `policies.toml` document as a PolicySet; RelayError naming file and key."""
    top = Table(Source(path, "policy configuration"), doc)
    top.format_version()
    default = top.string("default")
    policies: dict[str, Policy] = {}
    for entry in top.tables("policies"):
        policy = _policy(entry)
        if policy.id in policies:
            raise entry.error("id", f"policy id {policy.id!r} is defined twice")
        policies[policy.id] = policy
    top.done()
    if default is not None and default not in policies:
        raise top.error("default", f"default policy {default!r} is not defined in this file")
    return PolicySet(MappingProxyType(policies), default, path)


def load_policies(roots: Sequence[Path]) -> PolicySet:
    """The first layer's `policies.toml`, or the starter presets when no layer has one."""
    found = first_file(roots, "policies.toml")
    if found is None:
        return STARTER_SET
    path, doc = found
    return parse_policies(doc, path)


class HasPolicy(Protocol):
    @property
    def policy(self) -> str | None: ...


def member_policy(policies: PolicySet, member: HasPolicy | None) -> Policy:
    """The member's `policy`, else the file `default`, else the conservative built-in.

    A named policy the set does not define is `validation_unknown_policy` (never a fallback).
    Users (`users.toml`) pass through here too: their `policy` is required there.
    """
    name = member.policy if member is not None else None
    if name is not None:
        policy = policies.get(name)
        if policy is None:
            raise RelayError(
                "validation_unknown_policy",
                f"policy {name!r} is not defined",
                {"policy": name},
            )
        return policy
    if policies.default is not None:
        policy = policies.get(policies.default)
        if policy is not None:
            return policy
    return BUILTIN


# -- authorization ---------------------------------------------------------------------------


def _deny(
    policy: Policy,
    capability: str,
    requester: Principal,
    targets: Sequence[Principal],
    bundle_name: str,
    reason: str,
) -> RelayError:
    details: dict[str, Any] = {
        "capability": capability,
        "requester_session": requester.id,
        "bundle_name": bundle_name,
        "reason": reason,
        "policy_rule_id": policy.id,
    }
    if len(targets) == 1:
        details["target_session"] = targets[0].id
    elif targets:
        details["targets"] = [t.id for t in targets]
    return RelayError("authorization_forbidden", DENIED, details)


def _target_tier(capability: str, requester: Principal, target: Principal) -> str | None:
    """The tier a target needs, or None when the capability can never reach it."""
    if target.id == requester.id:
        return "self"
    if target.namespace == GLOBAL:
        return "home" if capability == "send.deliver" else None
    if target.namespace == requester.namespace:
        return "home"
    return "all"


def authorize(
    policy: Policy,
    capability: str,
    requester: Principal,
    targets: Sequence[Principal] = (),
    *,
    subject_bundle: str | None = None,
) -> None:
    """Allow (return) or refuse (`authorization_forbidden`) one request; see the module doc.

    `targets` are the resolved targets of send / look / raww; `subject_bundle` is the listed
    namespace for `list.read` and the bundle acted on for `updown` / `choose` (defaults to the
    requester's home namespace).
    """
    targets = tuple(targets)
    home = requester.namespace
    subject = subject_bundle if subject_bundle is not None else home
    if capability in ADMIN:
        if requester.kind in ("application", "relay") or policy.scope(capability) != "all":
            raise _deny(policy, capability, requester, targets, "", REASON_ADMIN)
        return
    if capability in TARGETED:
        bundle_name = home
    elif capability in SUBJECT:
        bundle_name = subject
    else:
        raise _deny(policy, capability, requester, targets, subject, REASON_SCOPE)
    if requester.kind in ("application", "relay"):
        raise _deny(policy, capability, requester, targets, bundle_name, REASON_SCOPE)

    if capability in TARGETED:
        control = TARGETED[capability]
        needed = "self"
        for target in targets:
            tier = _target_tier(capability, requester, target)
            if tier is None:
                raise _deny(policy, capability, requester, targets, bundle_name, REASON_SCOPE)
            if RANK[tier] > RANK[needed]:
                needed = tier
    else:
        control = SUBJECT[capability]
        local = subject == home or (capability == "list.read" and subject == GLOBAL)
        needed = "home" if local else "all"

    if RANK[policy.scope(control)] >= RANK[needed]:
        return
    if capability == "updown":
        reason = REASON_UPDOWN
    elif needed == "all":
        reason = REASON_CROSS
    else:
        reason = REASON_SCOPE
    raise _deny(policy, capability, requester, targets, bundle_name, reason)
