"""A promise is a test: every test, file and module the docs name exists (pure, reads files).

README.md, SECURITY.md, docs/*.md and tests/README.md cite the tests that show what they say
(`path/test_x.py::test_name`, a later `::test_other` meaning the same file) and name the modules
that do it (`mcphost/supervisor/agents/homes.py`, `mcphost.supervisor.confine.fence`). A test
renamed or a module moved without its sentence fails here, naming the document and the citation.
A citation may give a path's tail (`agents/test_runner.py`, `test_supervise.py`): it stands for
every test file ending so, and the test it names must be in one of them.

What the docs spell must also be what the code and the contrib files say: a section named by its
title (`docs/concepts.md, "The fence"`) or linked by its anchor is a heading of that page; a
directive given to the contrib unit (`Delegate=yes` beside `contrib/systemd/mcphost-supervisor.service`)
is set in it; a snake_case spelling in backticks is a word of the code (no invented code); and
the center's health states that are no failure's code (`admin_unreachable`) are named only as
its health, never as a call's outcome; a fleet key's default a doc spells (`"auto"` (default)) is
the fleet model's. An internals page copies no signature, class or field
list: it links to the module that has them.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "SECURITY.md",
        ROOT / "tests" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)
TEST_FILES = sorted((ROOT / "tests").rglob("test_*.py"))

# `some/path/test_x.py` with an optional `::test_name`, or a bare `::test_name` (same file).
CITATION = re.compile(r"((?:[\w.-]+/)*test_\w+\.py)(?:::(\w+))?|(?<![\w/])::(test_\w+)")
# a repository path of a source or contrib file, and a dotted module name
PATH = re.compile(
    r"(?<![\w/.])((?:mcphost|configgen|bench|contrib|tools)/[\w./-]+\.(?:py|toml|service|json))"
)
MODULE = re.compile(r"(?<![\w/.])(mcphost(?:\.\w+)+)")


def files_ending(tail: str) -> list[Path]:
    """The test files whose path ends with `tail` (a whole path component at least)."""
    return [
        p for p in TEST_FILES if str(p.relative_to(ROOT)) == tail or str(p).endswith("/" + tail)
    ]


@functools.cache
def defined(path: Path) -> frozenset[str]:
    """The functions and classes a test file defines, at any depth."""
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, kinds))


def broken_citations(text: str) -> list[str]:
    """Each citation of `text` that names no test file, or a test none of its files defines."""
    broken: list[str] = []
    files: list[Path] = []
    for match in CITATION.finditer(text):
        tail, name, continued = match.groups()
        if tail:
            files = files_ending(tail)
            if not files:
                broken.append(f"{tail}: no such test file")
                continue
        else:
            name = continued
            if not files:
                broken.append(f"::{name}: no test file before it")
                continue
        if name and not any(name in defined(f) for f in files):
            broken.append(f"{tail or files[0].name}::{name}: no such test")
    return broken


def is_module(dotted: str) -> bool:
    """A module of the tree, or an attribute of one (`mcphost.supervisor.plan.AgentPlan`)."""
    parts = dotted.split(".")
    for length in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:length])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return length >= len(parts) - 1
    return False


def broken_names(text: str) -> list[str]:
    """Each repository path or dotted module of `text` that does not exist."""
    missing = [p for p in PATH.findall(text) if not (ROOT / p).exists()]
    return missing + [m for m in MODULE.findall(text) if not is_module(m)]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_test_exists(doc: Path) -> None:
    assert broken_citations(doc.read_text()) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_file_and_module_exists(doc: Path) -> None:
    assert broken_names(doc.read_text()) == []


def test_the_checks_find_what_is_missing() -> None:
    text = (
        "`tests/core/test_doc_citations.py::test_every_cited_test_exists`, "
        "`::test_no_such_thing`; `agents/test_nowhere.py`; `mcphost/supervisor/nowhere.py`, "
        "`mcphost.supervisor.plan.AgentPlan`, `mcphost.supervisor.nowhere.thing`"
    )
    assert broken_citations(text) == [
        "test_doc_citations.py::test_no_such_thing: no such test",
        "agents/test_nowhere.py: no such test file",
    ]
    assert broken_names(text) == [
        "mcphost/supervisor/nowhere.py",
        "mcphost.supervisor.nowhere.thing",
    ]


INTERNALS = ROOT / "docs" / "supervisor-internals.md"
SUPERVISOR = ROOT / "mcphost" / "supervisor"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def section(text: str, title: str) -> str:
    """The body of the `## title` section of a markdown text, up to the next `## `."""
    body = text.split(f"\n## {title}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def mapped_modules(text: str) -> set[str]:
    """The modules the internals page's "Every module" list names, as paths under the package:
    a line `- root: ...` names root modules, a line `` - `wing/`: ... `` a wing's."""
    named: set[str] = set()
    for item in section(text, "Every module").split("\n- ")[1:]:
        head, _, files = item.partition(":")
        folder = "" if head.strip() == "root" else head.strip().strip("`")
        named.update(folder + name for name in re.findall(r"`([\w.]+\.py)`", files))
    return named


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file(doc: Path) -> None:
    targets = [t for t in LINK.findall(doc.read_text()) if "://" not in t]
    assert [t for t in targets if not (doc.parent / t).exists()] == []


def test_the_supervisors_map_names_every_module() -> None:
    actual = {str(p.relative_to(SUPERVISOR)) for p in SUPERVISOR.rglob("*.py")}
    assert mapped_modules(INTERNALS.read_text()) == actual


def test_every_refusal_code_is_on_the_internals_page() -> None:
    from mcphost.supervisor import refusals

    codes = {row.code for row in vars(refusals).values() if isinstance(row, refusals.Refusal)}
    text = INTERNALS.read_text()
    assert sorted(code for code in codes if f"`{code}`" not in text) == []


def test_every_package_head_names_its_modules() -> None:
    unnamed = [
        f"{init.parent.relative_to(ROOT)}: {module.stem}"
        for init in SUPERVISOR.rglob("__init__.py")
        for module in init.parent.glob("*.py")
        if module.name != "__init__.py" and f"`{module.stem}`" not in init.read_text()
    ]
    assert unnamed == []


def test_the_relays_map_names_every_module() -> None:
    text = (ROOT / "docs" / "relay-internals.md").read_text()
    modules = [
        p
        for package in ("relay", "agentmux")
        for p in (ROOT / "mcphost" / package).rglob("*.py")
        if p.name != "__init__.py"
    ]
    assert [str(p.relative_to(ROOT)) for p in modules if p.name not in text] == []


# -- drift: what the docs spell must be what the code and the contrib files say ------------------

HEADING = re.compile(r"(?m)^#{1,4} (.+)$")
# `docs/x.md, "Title"`, `[x.md, "Title"]`, `x.md "Title"`: a section named by its title's start
SECTION = re.compile(r'(?<![\w/.-])(?:docs/)?([\w-]+\.md)\]?,? "([^"]+)"')


def slug(title: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@functools.cache
def headings(path: Path) -> tuple[str, ...]:
    return tuple(HEADING.findall(path.read_text())) if path.is_file() else ()


def target(doc: Path, name: str) -> Path:
    """The page a reference from `doc` names: a sibling, a page of docs/, or the README."""
    for place in (doc.parent / name, ROOT / "docs" / name, ROOT / name):
        if place.is_file():
            return place
    return doc.parent / name


def broken_sections(doc: Path, text: str) -> list[str]:
    """Each `page.md, "Title"` whose page has no heading starting so, and each link
    `page.md#anchor` (or `#anchor`) whose page has no heading of that anchor."""
    broken = [
        f'{name}, "{title}": no such section'
        for name, spelled in SECTION.findall(text)
        for title in [" ".join(spelled.replace("#", " ").split()).rstrip(",.;:")]
        if not any(h.startswith(title) for h in headings(target(doc, name)))
    ]
    for page, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
        if "://" in page:
            continue
        where = doc if not page else doc.parent / page
        if anchor not in {slug(h) for h in headings(where)}:
            broken.append(f"{page}#{anchor}: no such heading")
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_section_a_doc_names_is_there(doc: Path) -> None:
    assert broken_sections(doc, doc.read_text()) == []


# The source and contrib files that point at a doc's section (`docs/concepts.md, "Limits"` in a
# docstring or a comment): a section moved or renamed fails here too.
POINTING = sorted(
    p
    for base in ("mcphost", "configgen", "bench", "contrib", "tests")
    for p in (ROOT / base).rglob("*")
    if p.suffix in (".py", ".toml", ".service") and p.is_file() and p != Path(__file__).resolve()
)


def test_every_section_the_code_points_at_is_there() -> None:
    broken = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in POINTING
        for problem in broken_sections(path, path.read_text())
        if problem.endswith("no such section")
        and any((place / problem.split(",")[0]).is_file() for place in (ROOT / "docs", ROOT))
    ]
    assert sorted(set(broken)) == []


UNIT = ROOT / "contrib" / "systemd" / "mcphost-supervisor.service"
# a paragraph or table row that speaks of the contrib unit, and the `Key=value` directives in it
SPEAKS_OF_UNIT = re.compile(r"mcphost-supervisor\.service|contrib(?:'s)? (?:systemd )?unit")
DIRECTIVE = re.compile(r"`([A-Z][A-Za-z]+)=([^`\s]*)`")


def blocks(text: str) -> list[str]:
    """Paragraphs (blank-line separated) and table rows, each one block."""
    return [
        piece
        for paragraph in re.split(r"\n\s*\n", text)
        for piece in (paragraph.splitlines() if paragraph.lstrip().startswith("|") else [paragraph])
    ]


def unit_drift(text: str, unit: str) -> list[str]:
    """Each directive a block of `text` gives the contrib unit that `unit` does not set: a
    `Key=value` the unit lacks as a line, a `Key=` (cleared, or named) whose key it never sets."""
    lines = {line.strip() for line in unit.splitlines() if not line.lstrip().startswith("#")}
    keys = {line.split("=", 1)[0] for line in lines if "=" in line}
    return [
        f"{key}={value}"
        for block in blocks(text)
        if SPEAKS_OF_UNIT.search(block)
        for key, value in DIRECTIVE.findall(block)
        if (f"{key}={value}" not in lines if value else key not in keys)
    ]


def test_the_unit_check_finds_a_directive_the_unit_lacks() -> None:
    unit = "[Service]\nUser=mcphost\n# Delegate=yes\nKillMode=mixed\n"
    text = (
        "Under `contrib/systemd/mcphost-supervisor.service` (`Delegate=yes`, `KillMode=mixed`).\n\n"
        "The contrib unit with `User=` cleared, `TasksMax=100`.\n\n"
        "Elsewhere `Delegate=yes` is systemd's own word.\n"
    )
    assert unit_drift(text, unit) == ["Delegate=yes", "TasksMax=100"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_directive_the_docs_give_the_contrib_unit_is_in_it(doc: Path) -> None:
    assert unit_drift(doc.read_text(), UNIT.read_text()) == []


# A snake_case spelling in backticks (`admin_unavailable`, `memory_max`, `state_problem`) names a
# code, key, field or function: it must be a word of the code. The exceptions, each with why:
NOT_OURS = {
    "validation_unassociated_server": "upstream agentmux's newer code, named as a difference",
}
SPELLING = re.compile(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`")


@functools.cache
def code_words() -> frozenset[str]:
    """Every identifier-like word of the source, tests and contrib files, and the families of the
    one library whose names the docs quote (prometheus_client's process collector)."""
    from prometheus_client import ProcessCollector

    process = {
        m.name + ("_total" if m.type == "counter" else "")
        for m in ProcessCollector(registry=None).collect()
    }
    files: list[Path] = []
    for base in ("mcphost", "configgen", "contrib", "tests", "bench", "tools"):
        files += [
            p
            for p in (ROOT / base).rglob("*")
            if p.suffix in (".py", ".toml", ".service", ".json", ".mjs")
            and "node_modules" not in p.parts
            and p.is_file()
        ]
    words = {w for p in files for w in re.findall(r"\w+", p.read_text(errors="ignore"))}
    return frozenset(words | process)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_snake_case_spelling_of_the_docs_is_a_word_of_the_code(doc: Path) -> None:
    spelled = set(SPELLING.findall(doc.read_text()))
    assert sorted(spelled - code_words() - NOT_OURS.keys()) == []


def health_only_states() -> set[str]:
    """The center's health states that are no failure's code (`admin_unreachable` for the
    failure `admin_unavailable`): names for `ctl status`'s center line, never an outcome."""
    from mcphost.supervisor.center import health

    table = health._TABLE
    states = {d.state for d in table.values()} | {health._UNAUTHORIZED.state}
    return states - set(table)


def misplaced_states(text: str) -> list[str]:
    """Each health-only state a block names that is not about the center's health (its
    `state`, or `ctl status`'s `center:` line)."""
    only = health_only_states()
    return [
        state
        for block in blocks(text)
        if not re.search(r"`state`|center: |\"state\"", block)
        for state in re.findall(r"`(\w+)`", block)
        if state in only
    ]


def test_a_health_state_named_as_a_call_s_outcome_is_found() -> None:
    text = (
        "| `mcphost_center_calls_total` | by outcome (`ok` or the code, e.g. `admin_unreachable`) |\n"
        "`ctl status --json` has the center's `state`: `ok`, `admin_unreachable`, ...\n"
    )
    assert "admin_unavailable" not in health_only_states()
    assert misplaced_states(text) == ["admin_unreachable"]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_center_s_health_states_are_named_only_as_its_health(doc: Path) -> None:
    assert misplaced_states(doc.read_text()) == []


# An internals page links to the code: a copied signature, class or field list falls behind it.
COPIED = re.compile(
    r"(?m)^\s*(?:(?:async )?def \w+\(|class \w+\b[^\n]*|\w+: [\w\[\]|., ]+(?: = .+)?$)"
)


def copied_code(text: str) -> list[str]:
    """The lines of `text` that copy a signature, a class head or a field declaration."""
    return [match.group(0).strip() for match in COPIED.finditer(text)]


def test_the_copy_check_finds_a_signature_a_class_and_a_field() -> None:
    text = (
        "def read_stat(pid: int) -> ProcStat | None\n"
        "class PeerCred: pid: int; uid: int\n"
        "    runner: Runner = 'process'\n"
        "- `read_stat`: one process's stat, see [`procfs.py`](../mcphost/procfs.py).\n"
    )
    assert copied_code(text) == [
        "def read_stat(",
        "class PeerCred: pid: int; uid: int",
        "runner: Runner = 'process'",
    ]


@pytest.mark.parametrize(
    "page", sorted((ROOT / "docs").glob("*internals.md")), ids=lambda p: p.name
)
def test_internals_pages_link_to_the_code_and_copy_none_of_it(page: Path) -> None:
    assert copied_code(page.read_text()) == []


# A fleet key's default as a doc spells it: `runner = "tmux"  # "auto" (default ...)` on one line,
# or a row `"auto"` (default) of a table whose head is the key (`| `runner` | ... |`).
KEY_ON_LINE = re.compile(r"`?(\w+) = \"")
DEFAULT_ON_LINE = re.compile(r"\"([\w-]+)\"`? \(default")
TABLE_HEAD = re.compile(r"^\| `(\w+)` \|")


def fleet_defaults() -> dict[str, object]:
    """Every key of `[defaults]` and `[center]` with its built-in default."""
    import dataclasses

    from mcphost.supervisor import plan

    return {
        field.name: field.default
        for kind in (plan.AgentDefaults, plan.CenterConfig)
        for field in dataclasses.fields(kind)
        if field.default is not dataclasses.MISSING
    }


def wrong_defaults(text: str) -> list[str]:
    """Each `key: "value" (default)` of `text` whose key's built-in default is another value."""
    defaults = fleet_defaults()
    wrong: list[str] = []
    head: str | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            head = None
        elif (match := TABLE_HEAD.match(line)) and head is None:
            head = match.group(1)
        for spelled in DEFAULT_ON_LINE.finditer(line):
            value = spelled.group(1)
            keys = KEY_ON_LINE.findall(line, 0, spelled.start())  # the last key before it
            key = head if head is not None else (keys[-1] if keys else None)
            if key in defaults and defaults[key] != value:
                wrong.append(f'{key}: "{value}" (default), but the default is {defaults[key]!r}')
    return wrong


def test_a_default_the_fleet_model_does_not_have_is_found() -> None:
    text = (
        'runner = "tmux"                # "process" (default) | "tmux"\n'
        "| `runner` | runs the agent |\n|---|---|\n"
        '| `"auto"` (default) | as tmux |\n| `"tmux"` (default) | wrong |\n\n'
        '- `restart = "always"`: any exit; `"on-failure"` (default): a failure\n'
    )
    assert wrong_defaults(text) == [
        "runner: \"process\" (default), but the default is 'auto'",
        "runner: \"tmux\" (default), but the default is 'auto'",
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_default_a_doc_gives_a_fleet_key_is_the_fleet_model_s(doc: Path) -> None:
    assert wrong_defaults(doc.read_text()) == []
