"""The supervisor: `mcphost supervise` runs a worker's fleet of agents from one process.

It spawns each agent in its own session, serves every agent's MCP surfaces over Unix sockets
to thin attach pumps (`mcphost/attach.py`), identifies each pump from the kernel (peer
credentials and ancestry, never a secret), and is the only holder of the worker token. The
module contracts are pinned in docs/supervisor-internals.md; the operator's guide is
docs/supervisor.md.

Modules:
- `peer`: kernel identity: SO_PEERCRED, SO_PEERPIDFD, /proc ancestry (pure parse, thin reads).
- `fleet`: the fleet file (`[center]`, `[defaults]`, `[[agent]]`) on the settings base.
- `homes`: per-agent home (0700), workspace, and the attach-only MCP config via configgen.
- `state`: SQLite under `--state`: a generation per agent, strictly increasing, persisted.
- `logs`: size-rotated per-agent logs; tail and follow for `ctl logs`.
- `lifecycle`: one AgentRunner per agent: spawn, reap, restart policy, backoff, intensity, stop.
- `kernel`: prctl wrappers (subreaper, non-dumpable, pdeathsig) and the child reaper.
- `sessions`: SessionHub: one socket per surface, the handshake line, one SDK session per pump.
- `control`: the control socket (0600, JSON lines), server and client; `mcphost ctl`.
- `supervisor`: the orchestrator: owns the token, the shared admin client, reconcile, signals.
- `cli`: `mcphost supervise`.

This package file imports nothing: `mcphost supervise` loads only what it uses.
"""
