"""The relay's ACP client pieces (reference acp.md §2-§7): one ACP member's connection and state.

Owns: `entries` (the look buffer, structured_entries_v1, and look's freshness rule), `choices`
(the bundle's queue of permission requests awaiting a decision) and `session` (`AcpSession`, one
ACP client connection over an already-spawned agent's pipes, on the `agent-client-protocol` SDK).
Nothing is imported here: `entries` and `choices` stay free of the SDK's import cost.
Must never: start or stop a process (the supervisor's `AcpRunner` spawns the agent and hands its
pipes over), import `mcphost.supervisor` or `mcphost.relaytools` (import-linter), or persist
anything (the ACP session id is the runner's to keep).
"""
