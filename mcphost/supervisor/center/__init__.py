"""The center's wing: the supervisor's one link to the center's admin endpoint.

- `link`: the worker token (never an agent's) and the shared admin client.
- `health`: the center's health as the supervisor sees it (reachable, failing, back).
- `preflight`: `mcphost supervise --check`'s one-shot view of the center and the state directory
  (above both `link` and `health`, which never import each other back).
- `generations`: the generations the center reserves and the fleet it assigns
  (`[center] fleet = "center"`).

Beside `confine` on one floor (neither imports the other), below the agents.
"""
