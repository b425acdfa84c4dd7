"""`mcphost supervise --check`'s real probe: each agent's uid runs its program and its pump's
interpreter inside its fence, tried once per kind of agent, as that uid.

Owns: grouping a fleet's agents into the few that need a probe each (`groups`, pure given the
fences), the probe itself (`PROBE`: the supervisor's interpreter, `-I -S -c`, stdlib only),
spawning it through the very path an agent's spawn takes (`kernel.child_setup` with the agent's
`Fence` from `reach.agent_fence` and its `Credentials`: the same bubblewrap command line, the
same user switch, outside or inside), and the one line per failing group (`probe_problems`).

Why: reach.py decides with a path rule (mode bits walked per component), which cannot see every
way the kernel refuses (an ACL, a mount option, a program that cannot be executed, a fence
that will not build for that uid). The probe asks the kernel, as the agent, in its fence. It
checks, as `os.access` and `open` inside: the program as the fenced agent finds it
(`fence.resolve`; unfenced, the agent's `PATH` is searched inside) can be executed, the pump
(`mcphost/attach.py`) can be read, and the attach sockets' directory (`reach.pump_needs`: inside
a fence `<state>/run`, outside the state directory's parent) can be passed; that the
interpreter ran at all proves it and its standard library. It prints one JSON line.

Grouping: the probe of one agent answers for every agent whose answer must be the same, the
key being (who it runs as: its uid class, where an agent's own uid is represented by the
range's first, as `reach.own_uid` does; its fence plan with the agent's home written
`<home>`; its program, likewise; the `PATH` a bare name is searched in). A fleet of N agents
from one `[defaults]` takes one probe, not N. Probes run at most `PARALLEL` at once, each
bounded by `TIMEOUT` seconds (then killed with its process group: a fenced one's whole
namespace ends with its bubblewrap).

Side effects: none in the state directory. Every path the fence would bind from beneath it (the
home, the attach sockets) is bound from an empty stand-in in a temporary directory instead
(`FencePlan.stand_ins`), made for the probe, given to the agent's uid, removed after; a fleet-
given path that does not exist yet likewise. A state directory that does not exist yet (the
supervisor creates it at start) is stood in for whole by an empty temporary one for the fenced
probes (bubblewrap cannot make a mount point on the read-only root), so what they check there
is the programs, the pump and the fence's own directories; the unfenced ones check the nearest
existing directory above it.

Must never: write anything but its own temporary directory, run anything but `PROBE` as the
agent, or wait without a bound.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

from mcphost import procs
from mcphost.supervisor.agents.homes import Home, agent_argv, agent_env, home_paths
from mcphost.supervisor.agents.reach import READ, agent_fence, attach_points, own_uid, pump_needs
from mcphost.supervisor.confine import fence as fences
from mcphost.supervisor.confine.kernel import Credentials, child_setup, resolve_user
from mcphost.supervisor.confine.probe import Support
from mcphost.supervisor.plan import AgentPlan, Fleet, apply_defaults

TIMEOUT = 10.0  # seconds one probe may take before it is killed and reported
PARALLEL = 4  # probes running at once
HOME = "<home>"  # how an agent's home is written in a group's key

# Run as `interpreter -I -S -c PROBE REQUEST`: each need {"what", "path", "mode": "x"|"r",
# "nearest": search the nearest existing directory instead, "search": a PATH to find a bare name
# in}; prints {"uid", "failed": [{"what", "path", "blocked", "why"}]}. Stdlib only, no site.
PROBE = r"""
import json, os, sys
req = json.loads(sys.argv[1])
def blocked(path, depth=0):
    current = "/"
    for part in [p for p in path.split("/") if p]:
        step = os.path.join(current, part)
        try:
            os.lstat(step)
        except PermissionError:
            return current, "search"
        except FileNotFoundError:
            return step, "missing"
        except OSError:
            return None
        if os.path.islink(step) and depth < 40:
            target = os.path.join(current, os.readlink(step))
            return blocked(os.path.normpath(target), depth + 1)
        current = step
    return None
def check(need):
    path, mode = need["path"], need["mode"]
    if need.get("nearest"):
        while not os.path.lexists(path) and path != "/":
            path = os.path.dirname(path)
    if need.get("search") is not None:
        entries = [e for e in need["search"].split(os.pathsep) if os.path.isabs(e)]
        for entry in entries:
            full = os.path.join(entry, path)
            if os.path.isfile(full) and os.access(full, os.X_OK):
                return None
        for entry in entries:
            stop = blocked(os.path.join(entry, path))
            if stop is not None and stop[1] == "search":
                return {"path": path, "blocked": stop[0], "why": "search"}
        return {"path": path, "blocked": path, "why": "not on PATH " + need["search"]}
    if mode == "r":
        try:
            with open(path, "rb") as file:
                file.read(1)
            return None
        except OSError:
            pass
    elif os.access(path, os.X_OK):
        return None
    stop = blocked(path)
    if stop is not None:
        return {"path": path, "blocked": stop[0], "why": stop[1]}
    return {"path": path, "blocked": path, "why": "read" if mode == "r" else "exec"}
failed = []
for need in req:
    found = check(need)
    if found is not None:
        found["what"] = need["what"]
        failed.append(found)
print(json.dumps({"uid": os.getuid(), "failed": failed}))
"""


@dataclass(frozen=True, slots=True)
class Member:
    """One agent as the check plans it: its index in the fleet file, its plan, credentials,
    fence (None: unfenced), home, argv and environment."""

    index: int | None  # None: an agent the center assigns (planned from [defaults] alone)
    plan: AgentPlan
    creds: Credentials | None
    fence: fences.Fence | None
    home: Home
    argv: tuple[str, ...]
    env: Mapping[str, str]

    @property
    def program(self) -> str:
        return self.argv[0] if self.argv else ""


@dataclass(frozen=True, slots=True)
class Group:
    """Agents one probe answers for: `members[0]` is probed."""

    key: tuple[object, ...]
    members: tuple[Member, ...]


def _generic(value: str, home: str) -> str:
    """`value` with the agent's home written `HOME` when it is the home or beneath it."""
    if value == home or value.startswith(home + "/"):
        return HOME + value[len(home) :]
    return value


def group_key(member: Member) -> tuple[object, ...]:
    """What decides the probe's answer (see the module docstring): the uid class, the fence
    plan and the program, each with the agent's home generic."""
    home = member.home.root
    creds = member.creds
    who = None if creds is None else (creds.uid, creds.gid, creds.groups)
    fenced: object = None
    if member.fence is not None:
        planned = member.fence.plan
        fields = {}
        for item in dataclasses.fields(planned):
            value = getattr(planned, item.name)
            if isinstance(value, str):
                value = _generic(value, home)
            elif isinstance(value, tuple) and all(isinstance(v, str) for v in value):
                value = tuple(_generic(v, home) for v in value)
            fields[item.name] = value
        fenced = (tuple(sorted(fields.items(), key=lambda kv: kv[0])), member.fence.switch_outside)
    program = _generic(member.program, home)
    search = None if "/" in member.program else member.env.get("PATH", os.defpath)
    return (who, fenced, program, search)


def groups(members: list[Member]) -> list[Group]:
    """`members` grouped by `group_key`, in the fleet's order of each group's first agent."""
    found: dict[tuple[object, ...], list[Member]] = {}
    for member in members:
        found.setdefault(group_key(member), []).append(member)
    return [Group(key, tuple(items)) for key, items in found.items()]


def plan_members(
    fleet: Fleet,
    state_dir: str,
    env: Mapping[str, str],
    support: Support | None = None,
) -> list[Member]:
    """Every agent that runs as another uid or in a fence (the others are the supervisor
    itself: nothing to prove), planned as the supervisor will spawn it; a center's fleet
    without agents yet stands for the agents it will assign by one planned from [defaults]."""
    state = os.path.abspath(state_dir)
    plans: list[tuple[int | None, AgentPlan]] = list(enumerate(fleet.agents))
    if not plans and fleet.center.fleet == "center":
        plans = [(None, apply_defaults(fleet.defaults, "any-agent"))]
    out = []
    for index, plan in plans:
        creds = resolve_user(plan.user, own_uid(fleet, plan))
        if plan.sandbox == "none" and creds is None:
            continue
        home = home_paths(state, plan.agent_id, plan.client)
        fence = agent_fence(fleet, state, plan, home, support=support, env=env)
        argv = tuple(agent_argv(plan, home))
        out.append(Member(index, plan, creds, fence, home, argv, agent_env(env, plan, home)))
    return out


def _needs(member: Member, state: str) -> list[dict[str, object]]:
    """What the probe checks for `member`: its program (as `fence.resolve` finds it in the
    fence; a bare name unfenced, searched inside in its `PATH`; one relative to its workspace is
    its own, not checked), then `reach.pump_needs`."""
    needs: list[dict[str, object]] = []
    program = member.program
    path = member.env.get("PATH", os.defpath)
    if member.fence is not None:
        try:
            program = fences.resolve(member.fence.plan, program, path)
        except FileNotFoundError:
            program = ""  # reach.program_problems names it already
    if program and (os.path.isabs(program) or "/" not in program):
        need: dict[str, object] = {"what": "its program", "path": program, "mode": "x"}
        if "/" not in program:
            need["search"] = path
        needs.append(need)
    for what, where, want in pump_needs(state, member.fence is not None):
        need = {"what": what, "path": where, "mode": "r" if want == READ else "x"}
        if where == os.path.dirname(os.path.abspath(state)):  # created at start if missing
            need["nearest"] = True
        needs.append(need)
    return needs


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one probe found: `failed` (the probe's JSON), or `broken` (it did not answer)."""

    group: Group
    failed: tuple[dict[str, str], ...] = ()
    broken: str | None = None
    seconds: float = 0.0


class _Scratch:
    """The probe's temporary directory: stand-ins for what it must not bind, given to the uid."""

    def __init__(self) -> None:
        self.root = tempfile.mkdtemp(prefix="mcphost-check-")
        os.chmod(self.root, 0o711)  # a uid's own bubblewrap opens its stand-ins through it
        self._count = 0

    def make(self, creds: Credentials | None, *, file: bool = False, inside: str = "") -> str:
        """A new empty file or directory (with `inside`, one directory beneath it), the
        agent's uid's (as its home and sockets are to it)."""
        self._count += 1
        path = os.path.join(self.root, str(self._count))
        made = [path]
        if file:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        else:
            os.mkdir(path, 0o700)
            if inside:
                made.append(os.path.join(path, inside))
                os.mkdir(made[-1], 0o700)
        if creds is not None and os.geteuid() == 0:
            for each in made:
                os.chown(each, creds.uid, creds.gid)
        return path

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _staged(member: Member, state: str, scratch: _Scratch) -> tuple[fences.Fence | None, str]:
    """`member`'s fence with stand-ins for what lies beneath the state directory or does not
    exist yet, and the directory to start in (a stand-in workspace)."""
    workspace = os.path.relpath(member.home.workspace, member.home.root)
    if member.fence is None:
        return None, os.path.join(scratch.make(member.creds, inside=workspace), workspace)
    planned = member.fence.plan
    attach = attach_points(state)
    sockets = {attach.center_socket, attach.relay_socket}
    pairs = []
    for path in (*planned.keeps, *planned.readonly, *planned.given):
        if os.path.lexists(path) and not fences.beneath(path, state):
            continue
        inside = workspace if path == member.home.root else ""
        pairs.append((path, scratch.make(member.creds, file=path in sockets, inside=inside)))
    fence = dataclasses.replace(
        member.fence, plan=dataclasses.replace(planned, stand_ins=tuple(pairs))
    )
    return fence, "/"


async def _probe(group: Group, state: str, scratch: _Scratch, gate: asyncio.Semaphore) -> Outcome:
    member = group.members[0]
    attach = attach_points(state)
    argv = [attach.interpreter, "-I", "-S", "-c", PROBE, json.dumps(_needs(member, state))]
    env = dict(member.env)
    async with gate:
        started = time.monotonic()
        try:
            fence, cwd = _staged(member, state, scratch)
            setup = child_setup(argv, cwd=cwd, env=env, creds=member.creds, fence=fence)
            child = procs.spawn(
                setup.argv,
                cwd=setup.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                new_session=True,
                preexec=setup.preexec,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            reason = procs.spawn_failure_reason(argv[0], exc)
            return Outcome(group, broken=reason, seconds=time.monotonic() - started)
        try:
            await asyncio.wait_for(asyncio.shield(child.exit), TIMEOUT)
        except TimeoutError:
            _kill_group(child.pid)
            await child.exit
            _close(child.proc)
            return Outcome(group, broken=f"the probe did not answer within {TIMEOUT:g} s")
        seconds = time.monotonic() - started
        out, err = _drain(child.proc)
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        found = json.loads(lines[-1])
        failed = tuple(found["failed"])
        uid = found["uid"]
    except (IndexError, ValueError, KeyError, TypeError):
        said = err.decode(errors="replace").strip().splitlines()
        why = said[-1] if said else f"it exited {child.proc.returncode} and printed nothing"
        return Outcome(group, broken=f"the probe did not run: {why}", seconds=seconds)
    expected = member.creds.uid if member.creds is not None else os.geteuid()
    if uid != expected:
        return Outcome(group, broken=f"the probe ran as uid {uid}, not {expected}")
    return Outcome(group, failed=failed, seconds=seconds)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _drain(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """What the exited probe wrote (non-blocking: nothing it left behind can hold us)."""
    out = []
    for pipe in (proc.stdout, proc.stderr):
        data = b""
        if pipe is not None:
            os.set_blocking(pipe.fileno(), False)
            try:
                data = pipe.read(1 << 16) or b""
            except OSError:
                data = b""
        out.append(data)
    _close(proc)
    return out[0], out[1]


def _close(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


async def run_probes(
    fleet: Fleet,
    state_dir: str,
    env: Mapping[str, str],
    support: Support | None = None,
) -> list[Outcome]:
    """Probe one agent of each group (see the module docstring)."""
    state = os.path.abspath(state_dir)
    scratch = _Scratch()
    try:
        planned = state
        if not os.path.isdir(state):  # stood in for whole (see the module docstring)
            planned = os.path.join(scratch.root, "state")
            os.mkdir(planned, 0o711)
        members = plan_members(fleet, planned, env, support)
        if planned != state:  # the unfenced ones look at the real state's parent
            unfenced = [m for m in plan_members(fleet, state, env, support) if m.fence is None]
            members = [m for m in members if m.fence is not None] + unfenced
        found = groups(members)
        gate = asyncio.Semaphore(PARALLEL)
        return list(
            await asyncio.gather(
                *(
                    _probe(g, planned if g.members[0].fence is not None else state, scratch, gate)
                    for g in found
                )
            )
        )
    finally:
        scratch.close()


def _failure(item: Mapping[str, str], uid: int) -> str:
    """What failed (the program by its path), the path that stopped it and how."""
    what = item.get("what", "")
    if what == "its program":
        what += f" {item.get('path')}"
    return f"{what}: {_why(item, uid)}"


def _why(item: Mapping[str, str], uid: int) -> str:
    """The path that failed and how, with its mode and owner where it stops a lookup."""
    blocked, why = item.get("blocked", item.get("path", "")), item.get("why", "")
    if why == "missing":
        return f"{blocked} does not exist"
    if why.startswith("not on PATH"):
        return f"{item.get('path')} is {why} for uid {uid}"
    verb = {"search": "searchable", "read": "readable", "exec": "executable"}.get(why, why)
    try:
        info = os.stat(blocked)
        shown = f" (mode {info.st_mode & 0o7777:04o}, owner uid {info.st_uid})"
    except OSError:
        shown = ""
    return f"{blocked}{shown} is not {verb} by uid {uid}"


def problem_line(outcome: Outcome, fleet: Fleet) -> str:
    """One line for a group whose probe failed: the key, the agents, the uid, the path that
    failed and the fix."""
    member = outcome.group.members[0]
    names = ", ".join(m.plan.agent_id for m in outcome.group.members)
    if member.index is None:
        names = "every agent the center assigns"
    creds = member.creds
    uid = creds.uid if creds is not None else os.geteuid()
    if creds is None:
        who = f"uid {uid}, the supervisor's"
    elif creds.user is None:
        who = f"uid {uid}, as each runs as a uid of its own from {fleet.uids}"
    else:
        who = f"uid {uid}, user {creds.user!r}"
    fenced = "in its fence" if member.fence is not None else "unfenced"
    program_failed = any(item.get("what") == "its program" for item in outcome.failed)
    key = _key(fleet, member, program_failed)
    if outcome.broken is not None:
        found = outcome.broken
    else:
        found = "; ".join(_failure(item, uid) for item in outcome.failed)
    fix = (
        "install it under a path every uid can reach (e.g. a virtualenv under /opt, not in a "
        "private directory such as /root)"
    )
    if creds is not None and creds.user is not None:
        fix += ", or give that user access"
    if member.fence is None and creds is not None:
        fix += ', or fence the agent (sandbox = "auto": the fence brings the supervisor\'s own '
        fix += "programs back)"
    if creds is not None:
        fix += ', or run it as root (user = "root")'
    said = f"{key} (agents: {names}; {who}; probed {fenced} as that uid)"
    return f"{said}: cannot start: {found}: {fix}"


def _key(fleet: Fleet, member: Member, program: bool) -> str:
    """The fleet key that decides what failed: the command for its program, else the user."""
    index, plan = member.index, member.plan
    if program:
        own = plan.command is not None and plan.command != fleet.defaults.command
        return f"agent[{index}].command" if own and index is not None else "defaults.command"
    if plan.user is not None:
        own = plan.user != fleet.defaults.user
        return f"agent[{index}].user" if own and index is not None else "defaults.user"
    if member.creds is not None:
        return "identity.uids"
    return f"agent[{index}].sandbox" if index is not None else "defaults.sandbox"


def probe_problems(
    fleet: Fleet,
    state_dir: str,
    env: Mapping[str, str],
    support: Support | None = None,
) -> tuple[str, list[str]]:
    """`--check`'s informative line (how many probes for how many agents, how long) and one
    line per group whose probe failed (none: every group's passed)."""
    started = time.monotonic()
    outcomes = asyncio.run(run_probes(fleet, state_dir, env, support))
    agents = sum(len(o.group.members) for o in outcomes)
    slowest = max((o.seconds for o in outcomes), default=0.0)
    said = (
        f"{len(outcomes)} for {agents} agent(s) of another uid or fenced, run as each agent's "
        f"uid in its fence, in {time.monotonic() - started:.2f} s (slowest {slowest:.2f} s)"
    )
    return said, [problem_line(o, fleet) for o in outcomes if o.broken is not None or o.failed]
