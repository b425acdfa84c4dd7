"""The house's shape (issue 33): a newcomer reads a package at a glance (pure, reads files).

No product file is over `MAX_LINES` lines, and no package of the supervisor holds more than
`MAX_MODULES` modules side by side (its wings, `mcphost/supervisor/__init__.py`, are where a new
one goes). The floors themselves are import-linter's (pyproject.toml; tests/core/test_import_rules.py).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (ROOT / "mcphost", ROOT / "configgen")
SUPERVISOR = ROOT / "mcphost" / "supervisor"
MAX_LINES = 800
MAX_MODULES = 12


def over_long(roots: tuple[Path, ...], limit: int) -> dict[str, int]:
    """Every `.py` file under `roots` longer than `limit` lines, with its length."""
    lengths = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for root in roots
        for path in root.rglob("*.py")
    }
    return {path: n for path, n in lengths.items() if n > limit}


def over_wide(root: Path, limit: int) -> dict[str, int]:
    """Every package under `root` (itself included) with more than `limit` modules side by side
    (its `__init__.py` not counted, its subpackages not either: they are wings of their own)."""
    widths = {
        str(init.parent.relative_to(ROOT)): sum(
            1 for module in init.parent.glob("*.py") if module.name != "__init__.py"
        )
        for init in root.rglob("__init__.py")
    }
    return {package: n for package, n in widths.items() if n > limit}


def test_no_product_file_is_over_800_lines() -> None:
    assert over_long(PRODUCT, MAX_LINES) == {}


def test_no_package_of_the_supervisor_holds_more_than_12_modules() -> None:
    assert over_wide(SUPERVISOR, MAX_MODULES) == {}


def test_the_checks_see_a_long_file_and_a_wide_package() -> None:
    assert "mcphost/supervisor/plan.py" in over_long((SUPERVISOR,), 10)
    assert "mcphost/supervisor" in over_wide(SUPERVISOR, 2)
