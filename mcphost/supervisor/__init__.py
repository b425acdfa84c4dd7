"""The supervisor: `mcphost supervise` runs a worker's fleet of agents from one process.

It spawns each agent in its own session, serves every agent's MCP surfaces over Unix sockets
to thin attach pumps (`mcphost/attach.py`), identifies each pump from the kernel (peer
credentials and ancestry, never a secret: `mcphost.peer`, below this package), and is the only
holder of the worker token. The operator's guide is docs/supervisor.md; the internals,
docs/supervisor-internals.md.

The wings, top to bottom (one import-linter `layers` contract in pyproject.toml forces the
order: a wing imports only the wings and root modules below it):
- `cli` (`mcphost supervise`), then `supervisor`: the orchestrator (start-up, then the run
  loop, signals, shutdown), whose `Supervisor` is every wing wired together, whole once built.
- `operator/`: ctl, the control operations, the fleet page, metrics, the journal.
- `serving/`: the attach hubs and what each session is served.
- `reconcile`: the fleet in force and its slots: reconcile, reload, the agents' locks, and the
  one table of runner kinds (`RUNNERS`).
- `fleet` (the fleet file and its loader, which builds the plan) beside `startup` (before
  serving: the token, the state directory's lock and modes, then the ground the supervisor
  stands on), above `records` (every process run or adopted; what a crash left is ended).
- `agents/`: the runners (process, ACP, tmux), the relay host, homes, sign-in, logs, execs, reach.
- `center/` beside `confine/`: the link to the center (token, health, generations) and what holds
  an agent in (fence, cgroups, usage, kernel).
- `plan` (what the supervisor runs from: `Fleet`, `AgentPlan`), `identity` (the one vouch
  rule), `state` (SQLite under `--state`: generations, uids, records), `control/` (the control
  socket: `protocol`, `server`, `client`), then `uids` (the agents' own uids), `refusals`
  (the one table of refusal codes and messages) and `values` (the fleet file's value types:
  listen addresses and the `Host` guard of every HTTP listener, sizes, counts).

This package file imports nothing: `mcphost supervise` loads only what it uses.
"""
