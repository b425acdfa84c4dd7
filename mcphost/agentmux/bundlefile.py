"""The bundle file: `bundles/<id>.toml` and the `coders.toml` its members name, read and written.

Owns: the model of a bundle (`Bundle`, its `Session`s, their `Coder`s), the ONE reader of the
bundle file, which both the relay (`mcphost.relay`) and the relay tools (`mcphost.relaytools`)
read it with, and its writer (`layer_toml`: a model as the files this reader reads back to the
same model), with which the supervisor writes the fleet's bundles from the model it hands the
relay in memory. The format is agentmux's (reference `agentmux-relay.md` §3.1): kebab-case,
`deny_unknown_fields`, `format-version = 1`; a member is `coder = "<id>"` or a marker
`[sessions.ui]` / `[sessions.pubsub]`; a coder is exactly one of `[coders.tmux]`, `[coders.acp]`
or `[coders.pty]` (newer), and nothing else: agentmux's CLI reads these files too.

The side file (`MEMBERS_FILE`, `<layer>/mcphost/members.toml`, mcphost's; agentmux never reads
it, and it is not under `bundles/`, whose files are bundle ids): the members agentmux cannot
express, which the reader merges into the bundle of the same layer in both readings. Today
those are the members the supervisor runs as a plain process (`runner = "process"`): they speak
through their relay tools and nothing can be delivered to them (no pane, no ACP), so their
transport is `process`, which no member kind of the relay hosts. Its format is agentmux's own
shapes: `[[coders]]` of exactly one of `[coders.process]` (body: one `command`, for
information), and `[[sessions]]` as in a bundle file, each with its `bundle` and its `index`
among that bundle's members (where it is inserted; the members of `bundles/<id>.toml` keep
their order around it), naming a coder of the side file. The writer splits the model so:
`coders.toml` and `bundles/<id>.toml` hold exactly what agentmux reads, the side file the rest;
a `[coders.process]` in `coders.toml` is an unknown key there, as it is for agentmux.

Two readings (`mcphost.agentmux.tables.Reading`):

- `STRICT` (the relay's): every flaw is a `RelayError` naming the file and the key; the relay
  refuses a file it would half-read (the side file included: a member at an index beyond the
  bundle's members, an id used in both files, a coder of another shape). A member no registered
  kind hosts loads (ACP, pty and process coders are validated) and is refused when it is a
  target.
- `LENIENT` (the relay tools'): they read a bundle only for its membership (which session they
  are, from `--session-name` or the working directory) and to list a bundle whose relay is down;
  the relay, on the next request, reports whatever flaw the file has. So a relay-tools server
  starts and associates with a file the relay would refuse. It forgives: every flaw of a key the
  tools do not need (unknown keys, `format-version`, groups, environment, policies, an
  undeclared group, `coder-session-id` on a marker), which then reads as absent; a member entry
  that is not a table or has no string id (left out), a later member with an id already used
  (the first stands), a name used twice or a relative `directory` (read as absent); a member with
  no shape or several (the first of ui, pubsub, coder), a coder that is not defined (a coder of
  `coders.toml` whose only shape is `[coders.process]`, an unknown key there, is left out), and
  a `coders.toml` that is missing, unreadable or invalid: such a member is listed as `tmux`
  (agentmux's pane coder, `UNKNOWN_CODER`); a side file that is unreadable or invalid (it adds
  no member) and a side member without an `index` (appended). A coder's body (its commands,
  prompt rules, timeouts) is not read: the tools never start a coder. It never forgives what
  would make it build a path from a name: a bundle id or a member id outside the grammars of
  `mcphost.names` (the member id is a path segment of the session's PSK) fails the reading as a
  whole, as does an unreadable or invalid bundle file (its members are unknown).

Codes: a malformed file is `validation_invalid_arguments`; an unreadable layer
`validation_unreadable_configuration_layer`; a bad group name `validation_invalid_group_name` /
`validation_reserved_group_name`; a bundle id outside the grammar `validation_invalid_params`; a
bundle no layer configures `validation_unknown_bundle`.

Must never: write a file (the writer renders text; the supervisor writes it), import
`mcphost.relay` or `mcphost.relaytools`, or import tomli_w before a file is written.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mcphost.agentmux import layers
from mcphost.agentmux.tables import FORMAT_VERSION, Table, open_table
from mcphost.agentmux.tables import LENIENT as LENIENT  # the readings, for this file's readers
from mcphost.agentmux.tables import STRICT as STRICT
from mcphost.agentmux.tables import Reading as Reading
from mcphost.agentmux.wire import RelayError
from mcphost.names import SESSION_ID_EXPECTED, is_bundle_name, is_session_id

READINESS_TIMEOUT_DEFAULT_MS = 900_000
READINESS_TIMEOUT_RANGE_MS = (30_000, 3_600_000)
PROMPT_INSPECT_LINES_DEFAULT = 1
GROUP_NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
RESERVED_GROUP = "ALL"
COMMAND_PLACEHOLDER = "{coder-session-id}"
AGENTMUX_SHAPES = ("tmux", "acp", "pty")  # a coder of coders.toml: its one subtable
MCPHOST_SHAPES = ("process",)  # a coder of the side file (`MEMBERS_FILE`): agentmux has none
CODER_SHAPES = AGENTMUX_SHAPES + MCPHOST_SHAPES  # a coder's transport
MEMBERS_FILE = "mcphost/members.toml"  # the side file, beside a layer's coders.toml and bundles/
MARKERS = ("ui", "pubsub")  # a member that is no coder: its marker subtable, its transport
UNKNOWN_CODER = "tmux"  # the transport the lenient reading gives a member whose coder it lacks

# -- the model -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TmuxCoder:
    """`[coders.tmux]`: how a tmux session is started and when its pane is ready for input."""

    initial_command: str
    resume_command: str | None = None
    prompt_regex: str | None = None
    prompt_inspect_lines: int = PROMPT_INSPECT_LINES_DEFAULT
    prompt_idle_column: int | None = None
    prime_timeout_ms: int | None = None
    readiness_timeout_ms: int = READINESS_TIMEOUT_DEFAULT_MS

    def command(self, coder_session_id: str | None) -> str:
        """`resume-command` (placeholder filled, shell-quoted) when a coder session id is set and
        a resume command exists, else `initial-command`."""
        if coder_session_id and self.resume_command:
            return self.resume_command.replace(COMMAND_PLACEHOLDER, shlex.quote(coder_session_id))
        return self.initial_command


@dataclass(frozen=True, slots=True)
class AcpCoder:
    """`[coders.acp]`: how an ACP agent is reached. `stdio`: its `command` (split on whitespace,
    no shell, as agentmux splits it) speaks ACP on its stdin and stdout; `http` loads but no
    relay hosts it (agentmux: "not implemented")."""

    channel: str  # "stdio" | "http"
    command: str | None = None
    url: str | None = None

    def argv(self) -> list[str]:
        return (self.command or "").split()


@dataclass(frozen=True, slots=True)
class ProcessCoder:
    """`[coders.process]` (mcphost's, in the side file only): a member run as a plain process;
    its `command` is for information (the supervisor starts it from the fleet, the relay never
    does)."""

    command: str


@dataclass(frozen=True, slots=True)
class Coder:
    """One `[[coders]]` entry. Its body (`tmux` for tmux and pty coders, `acp`, `process`) is
    None when the reading was lenient."""

    id: str
    transport: str  # one of CODER_SHAPES
    environment: tuple[tuple[str, str], ...] = ()
    tmux: TmuxCoder | None = None
    acp: AcpCoder | None = None
    process: ProcessCoder | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """One `[[sessions]]` member of a bundle."""

    id: str
    directory: str | None
    kind: str  # "coder" | "ui" | "pubsub"
    transport: str  # "tmux" | "acp" | "pty" | "process" | "ui" | "pubsub"
    name: str | None = None
    policy: str | None = None
    coder: str | None = None
    coder_session_id: str | None = None
    environment: tuple[tuple[str, str], ...] = ()
    groups: tuple[str, ...] = ()

    def principal_id(self, bundle: str) -> str:
        return f"{self.id}@{bundle}"


@dataclass(frozen=True, slots=True)
class Bundle:
    id: str
    path: Path
    sessions: tuple[Session, ...]
    autostart: bool = False
    groups: tuple[str, ...] = ()
    environment: tuple[tuple[str, str], ...] = ()
    coders: Mapping[str, Coder] = field(default_factory=dict, repr=False, compare=False)

    def member(self, session_id: str) -> Session | None:
        for session in self.sessions:
            if session.id == session_id:
                return session
        return None

    def coder_for(self, session: Session) -> Coder | None:
        return self.coders.get(session.coder) if session.coder is not None else None


# -- coders.toml -----------------------------------------------------------------------------


def _tmux_keys(table: Table, *, pty: bool) -> TmuxCoder:
    initial = table.string("initial-command", required=True)
    assert initial is not None  # strict: a coder's body is read only then
    regex = table.string("prompt-regex")
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise table.error("prompt-regex", f"not a valid regular expression: {exc}") from None
    inspect = table.integer("prompt-inspect-lines", low=1, high=1000)
    low, high = READINESS_TIMEOUT_RANGE_MS
    readiness = table.integer("readiness-timeout-ms", low=low, high=high)
    tmux = TmuxCoder(
        initial_command=initial,
        resume_command=table.string("resume-command"),
        prompt_regex=regex,
        prompt_inspect_lines=inspect if inspect is not None else PROMPT_INSPECT_LINES_DEFAULT,
        prompt_idle_column=table.integer("prompt-idle-column", low=0, high=10_000),
        prime_timeout_ms=table.integer("prime-timeout-ms", low=1),
        readiness_timeout_ms=readiness if readiness is not None else READINESS_TIMEOUT_DEFAULT_MS,
    )
    table.boolean("wedge-detection", False)  # recognised (older files), not acted on
    if pty:
        table.integer("cols", low=1, high=10_000)
        table.integer("rows", low=1, high=10_000)
        table.string("term-protocol")
    table.done()
    return tmux


def _acp_keys(table: Table) -> AcpCoder:
    """`[coders.acp]` (acp.md §1): `channel` stdio (with a non-empty `command`, no `url`) or
    http (with a `url`, no `command`); `headers` only for http. `prime-timeout-ms` was retired
    with the ACP turn timeout (agentmux refuses it), so it is an unknown key here too."""
    channel = table.string("channel", required=True)
    if channel not in ("stdio", "http"):
        raise table.error("channel", f'must be "stdio" or "http", got {channel!r}')
    command = table.string("command")
    url = table.string("url")
    headers = table.environment("headers")
    if channel == "stdio":
        if command is None or not command.split():
            raise table.error("command", "required (and not blank) when channel is stdio")
        if url is not None:
            raise table.error("url", "only for channel http")
        if headers:
            raise table.error("headers", "only for channel http")
    else:
        if url is None:
            raise table.error("url", "required when channel is http")
        if command is not None:
            raise table.error("command", "only for channel stdio")
    table.done()
    return AcpCoder(channel, command, url)


def _process_keys(table: Table) -> ProcessCoder:
    command = table.string("command", required=True)
    assert command is not None  # strict: a coder's body is read only then
    table.done()
    return ProcessCoder(command)


def load_coders(roots: Sequence[Path], reading: Reading = STRICT) -> dict[str, Coder]:
    """coder id -> Coder from the first layer's `coders.toml` (agentmux's shapes only; {} when
    no layer has one; when lenient, also when it cannot be read)."""
    try:
        top = open_table(roots, "coders.toml", "coders configuration", reading)
    except RelayError:
        if reading is STRICT:
            raise
        return {}
    if top is None:
        return {}
    coders = _coders(top, AGENTMUX_SHAPES, {})
    top.done()
    return coders


def _coders(top: Table, shapes: tuple[str, ...], known: Mapping[str, Coder]) -> dict[str, Coder]:
    """The `[[coders]]` of `top`, each of exactly one of `shapes` (any other shape is an unknown
    key), none with an id in `known` or used twice."""
    coders: dict[str, Coder] = {}
    for entry in top.tables("coders"):
        coder_id = entry.string("id", required=True)
        if coder_id is None:
            continue  # forgiven (lenient): a coder without an id is left out
        if coder_id in coders or coder_id in known:
            entry.flaw("id", f"coder id {coder_id!r} is defined twice")
            continue
        environment = entry.environment()
        present = [name for name in shapes if entry.has(name)]
        if len(present) != 1:
            entry.flaw(shapes[0], f"exactly one of {_one_of(shapes)} must be set")
            if not present:
                continue
        transport = present[0]
        tmux = acp = process = None
        if entry.strict:  # a coder's body is read only then (module doc)
            section = entry.table(transport)
            assert section is not None
            if transport == "acp":
                acp = _acp_keys(section)
            elif transport == "process":
                process = _process_keys(section)
            else:
                tmux = _tmux_keys(section, pty=transport == "pty")
        entry.done()
        coders[coder_id] = Coder(coder_id, transport, environment, tmux, acp, process)
    return coders


def _one_of(shapes: tuple[str, ...]) -> str:
    return shapes[0] if len(shapes) == 1 else f"{', '.join(shapes[:-1])} or {shapes[-1]}"


# -- bundles/<id>.toml -----------------------------------------------------------------------


def _group(table: Table, key: str, name: str) -> str | None:
    """`name` when it is a custom group's name; None (forgiven, lenient) when not."""
    if name.isupper() or name == RESERVED_GROUP:
        cause = f"group {name!r} is reserved (uppercase names)"
        table.flaw(key, cause, "validation_reserved_group_name")
        return None
    if not GROUP_NAME.fullmatch(name):
        cause = f"group {name!r} must be lowercase: a letter, then letters, digits, '-' or '_'"
        table.flaw(key, cause, "validation_invalid_group_name")
        return None
    return name


def _directory(table: Table, required: bool) -> str | None:
    directory = table.string("directory", required=required)
    if directory is not None and not os.path.isabs(os.path.expanduser(directory)):
        table.flaw("directory", f"must be an absolute path, got {directory!r}")
        return None
    return directory


def _session(
    entry: Table, coders: Mapping[str, Coder], declared: tuple[str, ...]
) -> Session | None:
    """The member `entry` describes; None (forgiven, lenient) when it has no id."""
    session_id = entry.string("id", required=True)
    if session_id is None:
        return None
    if not is_session_id(session_id):  # a path segment: refused whatever the reading
        raise entry.error(
            "id", f"{session_id!r} is not a session id: expected {SESSION_ID_EXPECTED}"
        )
    markers = [name for name in MARKERS if entry.has(name)]
    shapes = markers + (["coder"] if entry.has("coder") else [])
    if len(shapes) != 1:
        entry.flaw("coder", "exactly one of coder, [sessions.ui] or [sessions.pubsub]")
    shape = shapes[0] if shapes else "coder"
    coder_id = entry.string("coder") if shape == "coder" else None
    coder_session_id = entry.string("coder-session-id")
    if coder_session_id is not None and coder_id is None:
        entry.flaw("coder-session-id", "only a coder session has a coder session id")
        coder_session_id = None
    for marker in markers:
        body = entry.table(marker)
        if body is not None:
            body.done()  # marker subtables have an empty body
    kind = transport = shape
    if shape == "coder":
        coder = coders.get(coder_id) if coder_id is not None else None
        if coder is None and coder_id is not None:
            entry.flaw("coder", f"coder {coder_id!r} is not defined in coders.toml")
        transport = coder.transport if coder is not None else UNKNOWN_CODER
    groups = []
    for i, name in enumerate(entry.strings("groups")):
        if _group(entry, f"groups[{i}]", name) is None:
            continue
        if name not in declared:
            entry.flaw(
                f"groups[{i}]",
                f"group {name!r} is not declared in the bundle's groups",
                "validation_invalid_group_name",
            )
            continue
        groups.append(name)
    session = Session(
        id=session_id,
        directory=_directory(entry, required=kind == "coder"),
        kind=kind,
        transport=transport,
        name=entry.string("name"),
        policy=entry.string("policy"),
        coder=coder_id,
        coder_session_id=coder_session_id,
        environment=entry.environment(),
        groups=tuple(groups),
    )
    entry.done()
    return session


def _check_bundle_id(bundle_id: str) -> None:
    if not is_bundle_name(bundle_id):
        raise RelayError(
            "validation_invalid_params",
            "bundle_name contains unsupported characters",
            {"bundle_name": bundle_id},
        )


def load_bundle(
    roots: Sequence[Path],
    bundle_id: str,
    *,
    coders: Mapping[str, Coder] | None = None,
    reading: Reading = STRICT,
) -> Bundle | None:
    """The bundle from the first layer holding `bundles/<id>.toml`, None when none does.

    `coders` defaults to `load_coders(roots, reading)`; strictly, every member's coder must be
    defined there. `reading`: the relay's `STRICT`, the relay tools' `LENIENT` (module doc).
    """
    _check_bundle_id(bundle_id)
    top = open_table(roots, f"bundles/{bundle_id}.toml", "bundle configuration", reading)
    if top is None:
        return None
    if coders is None:
        coders = load_coders(roots, reading)
    autostart = top.boolean("autostart", False)
    groups = top.strings("groups")
    declared = tuple(g for i, g in enumerate(groups) if _group(top, f"groups[{i}]", g))
    if len(set(declared)) != len(declared):
        top.flaw("groups", "a group is declared twice", "validation_invalid_group_name")
        declared = tuple(dict.fromkeys(declared))
    environment = top.environment()
    sessions: list[Session] = []
    for entry in top.tables("sessions"):
        session = _member(entry, coders, declared, sessions)
        if session is not None:
            sessions.append(session)
    top.done()
    root = top.source.path.parent.parent  # the layer: <root>/bundles/<id>.toml
    side = _side_members(root, bundle_id, coders, declared, sessions, reading)
    return Bundle(
        id=bundle_id,
        path=top.source.path,
        sessions=tuple(sessions),
        autostart=autostart,
        groups=declared,
        environment=environment,
        coders={**coders, **side},
    )


def _member(
    entry: Table, coders: Mapping[str, Coder], declared: tuple[str, ...], others: list[Session]
) -> Session | None:
    """The member `entry` describes, unless it has no id or one of `others` has its id (a name
    one of them has is read as absent)."""
    session = _session(entry, coders, declared)
    if session is None:
        return None
    if any(other.id == session.id for other in others):
        entry.flaw("id", f"session id {session.id!r} is used twice")
        return None
    if session.name is not None and any(other.name == session.name for other in others):
        entry.flaw("name", f"session name {session.name!r} is used twice")
        session = replace(session, name=None)
    return session


def _side_members(
    root: Path,
    bundle_id: str,
    coders: Mapping[str, Coder],
    declared: tuple[str, ...],
    sessions: list[Session],
    reading: Reading,
) -> dict[str, Coder]:
    """Insert into `sessions`, each at its `index`, the bundle's members of the side file of its
    layer (`<root>/mcphost/members.toml`, module doc); return their coders (process coders)."""
    try:
        top = open_table((root,), MEMBERS_FILE, "mcphost members configuration", reading)
    except RelayError:
        if reading is STRICT:
            raise
        return {}  # lenient: an unreadable or invalid side file adds no member
    if top is None:
        return {}
    side = _coders(top, MCPHOST_SHAPES, coders)
    placed: list[tuple[int, Table, Session]] = []
    for entry in top.tables("sessions"):
        if entry.string("bundle", required=True) != bundle_id:
            continue  # another bundle's member (or, forgiven, one of no bundle)
        index = entry.integer("index", low=0)
        if index is None:
            entry.flaw("index", "missing required field")
        session = _member(entry, side, declared, sessions + [s for _, _, s in placed])
        if session is not None:
            placed.append((len(sessions) + len(placed) if index is None else index, entry, session))
    for index, entry, session in sorted(placed, key=lambda p: p[0]):
        if index > len(sessions):
            entry.flaw("index", f"beyond the bundle's {len(sessions)} members before it")
        sessions.insert(min(index, len(sessions)), session)
    top.done()
    return side


def require_bundle(
    roots: Sequence[Path],
    bundle_id: str,
    *,
    coders: Mapping[str, Coder] | None = None,
    reading: Reading = STRICT,
) -> Bundle:
    """`load_bundle`, with `validation_unknown_bundle` when no layer configures the bundle."""
    bundle = load_bundle(roots, bundle_id, coders=coders, reading=reading)
    if bundle is None:
        where = ", ".join(str(r / "bundles") for r in roots)
        raise RelayError(
            "validation_unknown_bundle",
            f"bundle '{bundle_id}' is not configured under {where}",
            {"bundle_name": bundle_id, "path": where},
        )
    return bundle


def bundle_ids(roots: Sequence[Path]) -> list[str]:
    """Every bundle id across the layers (union by id), sorted."""
    return layers.bundle_ids(roots)


# -- the writer ------------------------------------------------------------------------------


def layer_toml(bundles: Iterable[Bundle], header: str = "") -> dict[str, str]:
    """Every file of a configuration layer holding `bundles` (strictly read: each coder with
    its body), as {path relative to the layer: text}: `coders.toml` and `bundles/<id>.toml` in
    agentmux's format, `mcphost/members.toml` with the members agentmux cannot express."""
    bundles = list(bundles)
    coders = {c.id: c for b in bundles for c in b.coders.values()}
    files = {"coders.toml": coders_toml(coders.values(), header)}
    files.update({f"bundles/{b.id}.toml": bundle_toml(b, header) for b in bundles})
    files[MEMBERS_FILE] = members_toml(bundles, header)
    return files


def bundle_toml(bundle: Bundle, header: str = "") -> str:
    """`bundles/<id>.toml` for `bundle`'s members agentmux can express (the others go to
    `members_toml`, its coders to `coders_toml`), under `header`."""
    document: dict[str, Any] = {"format-version": FORMAT_VERSION}
    if bundle.autostart:
        document["autostart"] = True
    if bundle.groups:
        document["groups"] = list(bundle.groups)
    if bundle.environment:
        document["environment"] = _environment(bundle.environment)
    members = [s for s in bundle.sessions if s.transport not in MCPHOST_SHAPES]
    document["sessions"] = [_session_document(s) for s in members]
    return _dumps(document, header)


def coders_toml(coders: Iterable[Coder], header: str = "") -> str:
    """`coders.toml` for those of `coders` agentmux can express (a process coder goes to
    `members_toml`), under `header`."""
    entries = [_coder_document(c) for c in coders if c.transport in AGENTMUX_SHAPES]
    return _dumps({"format-version": FORMAT_VERSION, "coders": entries}, header)


def members_toml(bundles: Iterable[Bundle], header: str = "") -> str:
    """The side file (`MEMBERS_FILE`) for the members of `bundles` agentmux cannot express:
    each `[[sessions]]` with its `bundle` and its `index` among the bundle's members, and
    their coders, under `header`."""
    coders: dict[str, Coder] = {}
    sessions: list[dict[str, Any]] = []
    for bundle in bundles:
        for index, session in enumerate(bundle.sessions):
            if session.transport not in MCPHOST_SHAPES:
                continue
            coder = bundle.coder_for(session)
            if coder is not None:
                coders[coder.id] = coder
            sessions.append({"bundle": bundle.id, "index": index, **_session_document(session)})
    entries = [_coder_document(c) for c in coders.values()]
    return _dumps(
        {"format-version": FORMAT_VERSION, "coders": entries, "sessions": sessions}, header
    )


def _session_document(session: Session) -> dict[str, Any]:
    out: dict[str, Any] = {"id": session.id}
    if session.name is not None:
        out["name"] = session.name
    if session.directory is not None:
        out["directory"] = session.directory
    if session.kind in MARKERS:
        out[session.kind] = {}
    elif session.coder is not None:
        out["coder"] = session.coder
    if session.coder_session_id is not None:
        out["coder-session-id"] = session.coder_session_id
    if session.policy is not None:
        out["policy"] = session.policy
    if session.groups:
        out["groups"] = list(session.groups)
    if session.environment:
        out["environment"] = _environment(session.environment)
    return out


def _coder_document(coder: Coder) -> dict[str, Any]:
    out: dict[str, Any] = {"id": coder.id}
    if coder.environment:
        out["environment"] = _environment(coder.environment)
    body: dict[str, Any] = {}
    if coder.tmux is not None:
        body = _tmux_document(coder.tmux)
    elif coder.acp is not None:
        body = {"channel": coder.acp.channel}
        body.update(
            {k: v for k, v in (("command", coder.acp.command), ("url", coder.acp.url)) if v}
        )
    elif coder.process is not None:
        body = {"command": coder.process.command}
    out[coder.transport] = body
    return out


def _tmux_document(tmux: TmuxCoder) -> dict[str, Any]:
    keys: list[tuple[str, Any]] = [
        ("initial-command", tmux.initial_command),
        ("resume-command", tmux.resume_command),
        ("prompt-regex", tmux.prompt_regex),
        ("prompt-idle-column", tmux.prompt_idle_column),
        ("prime-timeout-ms", tmux.prime_timeout_ms),
    ]
    if tmux.prompt_inspect_lines != PROMPT_INSPECT_LINES_DEFAULT:
        keys.append(("prompt-inspect-lines", tmux.prompt_inspect_lines))
    if tmux.readiness_timeout_ms != READINESS_TIMEOUT_DEFAULT_MS:
        keys.append(("readiness-timeout-ms", tmux.readiness_timeout_ms))
    return {key: value for key, value in keys if value is not None}


def _environment(pairs: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in pairs]


def _dumps(document: dict[str, Any], header: str) -> str:
    """`document` as TOML by `tomli_w` (every string escaped as TOML wants, control characters
    included: any command round-trips), under `header`."""
    import tomli_w

    return header + tomli_w.dumps(document)
