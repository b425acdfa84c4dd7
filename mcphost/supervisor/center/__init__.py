"""The center's wing: the supervisor's one link to the center's admin endpoint.

- `link`: the worker token (never an agent's) and the shared admin client.
- `health`: the center's health as the supervisor sees it (reachable, failing, back).
- `generations`: the generations the center reserves and the fleet it assigns
  (`[center] fleet = "center"`).

Beside `confine` on one floor (neither imports the other), below the agents.
"""
