"""The import rules (import-linter's contracts in pyproject.toml, run by `make lint`) check what
they say: a forbidden package that contains one of the contract's sources is skipped by
import-linter, so such a contract names the package's modules (`pkg.**`); and the
standard-library-only modules are kept from every runtime dependency, a new one included."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _project() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def _forbidden_contracts() -> list[dict[str, Any]]:
    contracts = _project()["tool"]["importlinter"]["contracts"]
    return [c for c in contracts if c["type"] == "forbidden"]


def test_no_contract_forbids_a_package_holding_its_own_source() -> None:
    silent = [
        (contract["name"], forbidden, source)
        for contract in _forbidden_contracts()
        for forbidden in contract["forbidden_modules"]
        for source in contract["source_modules"]
        if "*" not in forbidden and source.startswith(forbidden + ".")
    ]
    assert silent == [], "import-linter skips these pairs: forbid `<package>.**` instead"


def _canonical(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def test_the_standard_library_only_modules_are_kept_from_every_dependency() -> None:
    """By the names each dependency is imported as (`acp` is agent-client-protocol's)."""
    dependencies = {
        _canonical(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0])
        for requirement in _project()["project"]["dependencies"]
    }
    installed = {
        name: {_canonical(d) for d in distributions}
        for name, distributions in packages_distributions().items()
    }
    assert dependencies <= set().union(*installed.values()), "run `make venv`"
    imported = {
        name for name, of in installed.items() if of & dependencies and not name.startswith("_")
    }
    (contract,) = [c for c in _forbidden_contracts() if "no installed package" in c["name"]]
    assert imported <= set(contract["forbidden_modules"])
    assert "mcphost.attach" in contract["source_modules"]
