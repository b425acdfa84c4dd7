"""A promise is a test: every test, file and module the docs name exists (pure, reads files).

README.md, SECURITY.md, docs/*.md and tests/README.md cite the tests that show what they say
(`path/test_x.py::test_name`, a later `::test_other` meaning the same file) and name the modules
that do it (`mcphost/supervisor/agents/homes.py`, `mcphost.supervisor.confine.fence`). A test
renamed or a module moved without its sentence fails here, naming the document and the citation.
A citation may give a path's tail (`agents/test_runner.py`, `test_supervise.py`): it stands for
every test file ending so, and the test it names must be in one of them.
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
