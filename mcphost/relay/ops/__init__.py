"""The relay's operations, one module per operation (reference `agentmux-relay.md` §1.3-§1.12).

Owns: `OPERATIONS`, the operation table (name -> `base.Operation`: its request model, its
capability, its run), built from the modules: `listing` (list), `look`, `send`, `raww`,
`updown` (up, down), `choices` (choices_list, choices_pick), `credentials` (new_peer,
change_psk, drop_peer, change_scope, identity_introspect), `discovery` (list_relays,
discover_namespaces, discover_principals). Each module holds its response models and its policy
capability; the request models are `mcphost.agentmux.operations`' (the relay tools build the
same bodies with them). Every run gets the one `state.RelayState`.

Must never: import `mcphost.supervisor` or `mcphost.relaytools`, or start a process.
"""

from __future__ import annotations

from typing import Any

from mcphost.relay.ops import choices, credentials, discovery, listing, look, raww, send, updown
from mcphost.relay.ops.base import Operation

OPERATIONS: dict[str, Operation[Any]] = {
    op.name: op
    for module in (listing, look, send, raww, updown, choices, credentials, discovery)
    for op in module.OPERATIONS
}
