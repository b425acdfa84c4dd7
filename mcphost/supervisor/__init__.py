"""The supervisor: `mcphost supervise` runs a worker's fleet of agents from one process.

It spawns each agent in its own session, serves every agent's MCP surfaces over Unix sockets
to thin attach pumps (`mcphost/attach.py`), identifies each pump from the kernel (peer
credentials and ancestry, never a secret: `mcphost.peer`, below this package), and is the only
holder of the worker token. The module contracts are pinned in docs/supervisor-internals.md;
the operator's guide is docs/supervisor.md.

Modules:
- `plan`: what the supervisor runs from: `Fleet`, `AgentPlan` (every default applied), the
  center's agents, the machine checks (users, sandbox); every other module imports it.
- `fleet`: the fleet file (`[center]`, `[defaults]`, `[[agent]]`) on the settings base and its
  loader, which builds the plan (`plan` never imports it).
- `homes`: per-agent home (0700), workspace, and the attach-only MCP config via configgen.
- `state`: SQLite under `--state`: a generation per agent, strictly increasing, persisted.
- `logs`: size-rotated per-agent logs; tail and follow for `ctl logs`.
- `lifecycle`: one AgentRunner per agent: spawn, reap, restart policy, backoff, intensity, stop.
- `tmuxrunner`: an AgentRunner whose process is a pane of its bundle's tmux server.
- `kernel`: prctl wrappers (subreaper, non-dumpable, pdeathsig) and the child reaper.
- `execs`: `ctl exec`: a command run as an agent, rooted at its current generation.
- `refusals`: the one table of refusal codes and messages (attach handshake, control socket).
- `identity`: the identity roots and the one vouch rule (hub, relay socket trust, exec).
- `sessions`: SessionHub: one socket per surface, the handshake line, one SDK session per pump.
- `control`: the control socket: `protocol` (the wire), `server` (asyncio), `client` (blocking).
- `ctl`: `mcphost ctl`, on the control client only.
- `operations`: the ctl operations (status, start, stop, restart, reload, logs, exec).
- `centerlink`, `centerhealth`, `centerfleet`: the token and admin client, the center's health,
  the fleet the center assigns (`[center] fleet = "center"`).
- `relayhost`: the bundles in tmux, `runner = "tmux"` agents, the relay socket.
- `startup`: before serving: the token, the state directory's lock and modes.
- `records`: every process run or adopted, in the state file; what a crash left is ended.
- `reconcile`: the fleet in force and its slots: reconcile, reload, the agents' locks, and the
  one table of runner kinds (`RUNNERS`).
- `surfaces`: what each session is served (center tools, relay tools) and when it ends.
- `supervisor`: the orchestrator: the run loop, the shared admin client, signals, shutdown.
- `cli`: `mcphost supervise`.

This package file imports nothing: `mcphost supervise` loads only what it uses.
"""
