"""The tool catalog as data: every center tool is one `ToolDecl` in a family module.

Owns: assembling the families into `CATALOG` and checking its invariants at import (unique
names, no `agent_id` anywhere). Special tools (`search_tools`, file movers) are declared here
too but served by their own code paths in the host.
Must never: hold behaviour; handlers live in `mcphost.host`.
"""

from __future__ import annotations

from collections.abc import Mapping

from mcphost.catalog import files, issues, tasks, work
from mcphost.catalog.meta import SEARCH_TOOLS
from mcphost.catalog.model import ToolDecl

CATALOG: tuple[ToolDecl, ...] = (
    *work.TOOLS,
    *tasks.TOOLS,
    *issues.TOOLS,
    *files.TOOLS,
    SEARCH_TOOLS,
)


def index(decls: tuple[ToolDecl, ...]) -> Mapping[str, ToolDecl]:
    by_name: dict[str, ToolDecl] = {}
    for decl in decls:
        if decl.name in by_name:
            raise ValueError(f"duplicate tool name {decl.name!r}")
        if "agent_id" in decl.input.model_fields:
            raise ValueError(f"{decl.name}: input models must not declare agent_id")
        by_name[decl.name] = decl
    return by_name


BY_NAME: Mapping[str, ToolDecl] = index(CATALOG)
