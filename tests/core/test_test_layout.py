"""Tests mirror the source by module (tests/README.md, "Where the test of X is"): pure, file names.

Whoever changes `mcphost/<pkg>/<module>.py` finds its tests in `tests/<pkg>/test_<module>.py`, or
in `test_<module>_<aspect>.py` beside it. This checks both directions over the tree as it is:
every `tests/**/test_*.py` is named after a module of the package its folder mirrors (or after a
command of that package, black-box), and every source module with logic has a test file named
after it, or a line in NOT_NAMED saying where it is tested instead.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
SOURCES = ("mcphost", "configgen")

# The folders that do not mirror `mcphost/<folder>/` by their own name.
PACKAGES = {
    "core": "mcphost",  # the top-level modules, mcphost/*.py (one folder, as each subpackage has)
    "configgen": "configgen",  # the generator is a top-level package of its own
    "host/files": "mcphost/host",  # the file tools (files, transfer, workspace): own fixtures
    "bench": "bench",  # the benchmarks' pure parts and smoke runs (bench/ is no product package)
}

# The process-level tiers: tests that cross packages through real processes, named after what
# they prove (tests/README.md says what each holds). No name in them is checked.
TIERS = {"blackbox", "hardening", "kernels"}

# Black-box tests of a package's command, named after what they drive: `test_<command>.py` or
# `test_<command>_<aspect>.py` in the package's own folder, docstring starting "Black-box:".
# Each command stands for the module that implements it.
COMMANDS = {
    "supervisor": {"supervise": "mcphost/supervisor/cli.py"},  # `mcphost supervise`
    "relaytools": {"relay_tools": "mcphost/relaytools/cli.py"},  # `mcphost relay-tools`
    "devcenter": {"devcenter": "mcphost/devcenter/cli.py"},  # `mcphost devcenter`
}

# Test files of the project as a whole, not of one module.
PROJECT = {
    "core/test_import_rules.py": "the import rules of pyproject.toml",
    "core/test_test_layout.py": "this layout",
    "core/test_doc_citations.py": "the tests, files and modules the docs name",
    "core/test_house.py": "the house's shape: file lengths, package widths",
    "core/test_skips.py": "the suite's environment skips (tests/skips.py)",
    "core/test_install.py": "README's install path, the unit's ExecStart, make system's lock wait",
}

# Source modules with logic and no test file of their name: where they are tested instead. A key
# ending in "/" stands for every such module directly in that folder. Every `tests/...py` named
# must exist; an entry that no longer stands for a module without a test file of its name fails
# (delete the line).
NOT_NAMED = {
    "mcphost/cliargs.py": "every CLI's hygiene (tests/hardening/test_token_hygiene.py)",
    "mcphost/demo.py": "no test: `make demo-host` runs it (its parts: tests/blackbox/test_host.py)",
    "mcphost/surface.py": "the contract, served in tests/mcpserve/test_adapter.py",
    "mcphost/transcript.py": "the demos' output (tests/core/test_demofleet.py)",
    "mcphost/admin/client.py": "against the real center: tests/supervisor/center/test_generations.py, "
    "tests/hardening/test_burst.py",
    "mcphost/agentmux/operations.py": "both ends' models: tests/relaytools/test_validation.py, "
    "tests/relay/test_behaviour.py",
    "mcphost/agentmux/settings.py": "on the settings base: tests/core/test_settings.py",
    "mcphost/catalog/": "the tool declarations (data), checked whole: tests/catalog/test_catalog.py",
    "mcphost/devcenter/": "the reference center's parts, through its routes and its process: "
    "tests/devcenter/test_tools.py, tests/devcenter/test_devcenter_process.py",
    "mcphost/host/check.py": "`mcphost check` as a process: tests/blackbox/test_process.py",
    "mcphost/host/cli.py": "`mcphost host` as a process: tests/blackbox/test_host.py",
    "mcphost/host/requests.py": "every request to the center: tests/host/test_server.py",
    "mcphost/mcpserve/connection.py": "the shared core under tests/mcpserve/test_stdio.py and "
    "tests/mcpserve/test_stream.py",
    "mcphost/relay/connections.py": "the dispatcher's: tests/relay/test_behaviour.py",
    "mcphost/relay/delivery.py": "the dispatcher's: tests/relay/test_behaviour.py",
    "mcphost/relay/hosting.py": "the host's protocol: tests/relay/test_behaviour.py",
    "mcphost/relay/members/__init__.py": "the kinds' registry: tests/relay/members/test_port.py",
    "mcphost/relay/members/tmux.py": "the tmux kind: tests/relay/test_behaviour.py",
    "mcphost/relay/ops/": "one module per operation, each run by the dispatcher: "
    "tests/relay/test_behaviour.py",
    "mcphost/relay/outcome.py": "a delivery's outcome: tests/relay/members/test_port.py",
    "mcphost/relay/panes.py": "the pane gate and paste: tests/relay/test_tmux.py",
    "mcphost/relay/requester.py": "the dispatcher's: tests/relay/test_behaviour.py",
    "mcphost/relay/state.py": "the dispatcher's: tests/relay/test_behaviour.py",
    "mcphost/relaytools/handlers.py": "through the process: tests/relaytools/test_relay_tools.py",
    "mcphost/relaytools/settings.py": "on the settings base: tests/core/test_settings.py",
    "mcphost/supervisor/center/health.py": "tests/supervisor/test_supervise_center.py",
    "mcphost/supervisor/center/preflight.py": "`supervise --check` as a process: "
    "tests/supervisor/test_supervise_center.py",
    "mcphost/supervisor/center/link.py": "tests/supervisor/test_supervise_center.py, "
    "tests/supervisor/test_supervise_rotation.py",
    "mcphost/supervisor/control/client.py": "both ends of the socket: "
    "tests/supervisor/control/test_server.py",
    "mcphost/supervisor/control/protocol.py": "both ends of the socket: "
    "tests/supervisor/control/test_server.py",
    "mcphost/supervisor/operator/operations.py": "what `mcphost ctl` asks: tests/supervisor/test_supervise.py",
    "mcphost/supervisor/plan.py": "the fleet's plan: tests/supervisor/test_fleet.py",
    "mcphost/supervisor/startup.py": "tests/supervisor/test_supervise_state.py",
    "mcphost/standin/anthropic.py": "the Messages stand-in, served to the real Claude Code in "
    "tests/blackbox/test_claude_code.py and to the demo script in tests/standin/test_director.py",
    "mcphost/standin/responses.py": "the Responses stand-in, served to the real Codex in "
    "tests/blackbox/test_fenced_codex.py and to the demo script in tests/standin/test_director.py",
    "mcphost/testing/": "the harnesses, run by the tests that use them (tests/README.md, Helpers)",
    "configgen/__init__.py": "generate and write_config: tests/configgen/test_launch_roundtrip.py",
    "configgen/files.py": "the private, atomic write: tests/configgen/test_cli.py",
}


def has_logic(path: Path) -> bool:
    """A module other than `__init__`/`__main__` always counts; `__main__` never (it calls a
    `main` elsewhere); `__init__` with a definition or a computed assignment (a registry, a
    table), not for its imports, `__all__` or a constant (`__version__`)."""
    if path.name not in ("__init__.py", "__main__.py"):
        return True
    if path.name == "__main__.py":
        return False
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign) and not isinstance(
            node.value, ast.Constant
        ):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(not (isinstance(t, ast.Name) and t.id == "__all__") for t in targets):
                return True
    return False


@functools.cache
def source_modules() -> tuple[str, ...]:
    found = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            if has_logic(path):
                found.append(path.relative_to(ROOT).as_posix())
    return tuple(found)


def all_test_files() -> list[PurePosixPath]:
    return sorted(PurePosixPath(p.relative_to(TESTS).as_posix()) for p in TESTS.rglob("test_*.py"))


def docstring(rel: PurePosixPath) -> str:
    return ast.get_docstring(ast.parse((TESTS / rel).read_text())) or ""


def target(rel: PurePosixPath, doc: str = "") -> str | None:
    """The source module `tests/<rel>` is named after (None for a tier or a project test), or
    ValueError saying what is wrong with the name."""
    folder = rel.parent.as_posix()
    if rel.parts[0] in TIERS or rel.as_posix() in PROJECT:
        return None
    package = ROOT / PACKAGES.get(folder, f"mcphost/{folder}")
    if not (package / "__init__.py").is_file():
        raise ValueError(
            f"tests/{folder}/ mirrors no package ({package.relative_to(ROOT)}/ is not one): "
            "move the file to the folder of the package it tests"
        )
    stem = rel.stem.removeprefix("test_")
    modules = {p.stem: p for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")}
    init = package.name not in modules  # supervisor/supervisor.py keeps its name
    if init:
        modules[package.name] = package / "__init__.py"  # test_<pkg>.py (exactly): __init__'s
    named = [m for m in modules if stem == m or stem.startswith(m + "_")]
    best = max(named, key=len) if named else None
    if best is not None and not (init and best == package.name and stem != best):
        return modules[best].relative_to(ROOT).as_posix()
    commands = COMMANDS.get(folder, {})
    driven = [c for c in commands if stem == c or stem.startswith(c + "_")]
    if driven:
        if not doc.startswith("Black-box:"):
            raise ValueError(
                f"tests/{rel} is named after the command {driven[0]!r}, so its docstring must "
                "start with 'Black-box:' (or name it after the module it tests)"
            )
        return commands[max(driven, key=len)]
    where = package.relative_to(ROOT).as_posix()
    raise ValueError(
        f"tests/{rel} names no module of {where}/: call it test_<module>.py or "
        f"test_<module>_<aspect>.py after the module it tests"
        + (
            f", or test_<command>_<aspect>.py for a black-box test of {sorted(commands)}"
            if commands
            else ""
        )
    )


@pytest.mark.parametrize("rel", all_test_files(), ids=str)
def test_every_test_file_is_named_after_a_module(rel: PurePosixPath) -> None:
    target(rel, docstring(rel))


@functools.cache
def named() -> frozenset[str | None]:
    """The source modules the test files are named after."""
    found: set[str | None] = set()
    for rel in all_test_files():
        try:
            found.add(target(rel, docstring(rel)))
        except ValueError:
            pass  # test_every_test_file_is_named_after_a_module says what is wrong with it
    return frozenset(found)


@functools.cache
def not_named() -> dict[str, list[str]]:
    """NOT_NAMED's entries -> the modules with logic and no test file of their name each stands
    for."""
    bare = [m for m in source_modules() if m not in named()]
    return {
        key: [
            m for m in bare if (m.rsplit("/", 1)[0] + "/" == key if key.endswith("/") else m == key)
        ]
        for key in NOT_NAMED
    }


def test_every_module_with_logic_has_a_test_file_named_after_it() -> None:
    excused = {m for modules in not_named().values() for m in modules}
    missing = [m for m in source_modules() if m not in named() and m not in excused]
    assert not missing, (
        "no tests/<pkg>/test_<module>.py for these modules: add one, or a line in NOT_NAMED "
        f"(tests/core/test_test_layout.py) saying where each is tested: {missing}"
    )


@pytest.mark.parametrize("key", sorted(NOT_NAMED))
def test_not_named_stays_true(key: str) -> None:
    assert not_named()[key], f"NOT_NAMED[{key!r}]: no module without a test file left: delete it"
    for path in re.findall(r"tests/[\w/]+\.py", NOT_NAMED[key]):
        assert (ROOT / path).is_file(), f"NOT_NAMED[{key!r}] names {path}, which is gone"


@pytest.mark.parametrize(
    ("rel", "doc"),
    [
        ("relaytools/test_relaytools_pure.py", "Pure parts of the relay tools."),
        ("relay/test_members.py", ""),  # a subpackage's tests live in its own folder
        ("supervisor/test_relay_hosting.py", "Black-box: ..."),
        ("supervisor/test_supervise_acp.py", "An ACP member under mcphost supervise."),
        ("nowhere/test_thing.py", ""),
        ("configgen/test_configgen_attach.py", ""),  # the package's name is not a module's
    ],
)
def test_a_misnamed_file_is_refused(rel: str, doc: str) -> None:
    with pytest.raises(ValueError):
        target(PurePosixPath(rel), doc)


def test_the_rule_maps_each_kind_of_name() -> None:
    assert target(PurePosixPath("relay/members/test_tmux.py")) == "mcphost/relay/members/tmux.py"
    assert target(PurePosixPath("core/test_binding.py")) == "mcphost/binding.py"
    assert target(PurePosixPath("configgen/test_merge.py")) == "configgen/merge.py"
    assert (
        target(PurePosixPath("supervisor/confine/test_fence_levels.py"))
        == "mcphost/supervisor/confine/fence.py"
    )
    assert target(PurePosixPath("host/files/test_workspace_race.py")) == "mcphost/host/workspace.py"
    assert target(PurePosixPath("catalog/test_catalog.py")) == "mcphost/catalog/__init__.py"
    assert target(PurePosixPath("supervisor/test_supervisor_x.py")) == (
        "mcphost/supervisor/supervisor.py"
    )
    assert target(PurePosixPath("supervisor/test_supervise_x.py"), "Black-box: x") == (
        "mcphost/supervisor/cli.py"
    )
    assert target(PurePosixPath("blackbox/test_anything.py")) is None
