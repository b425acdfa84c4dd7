"""The agents' wing: one agent's life, from its home to its process and its relay members.

- `states`: the agent's states (`AgentState`, `AgentStatus`) and the rules read from them.
- `runner`: AgentRunner, the process runner (spawn, reap, restart policy, backoff, intensity,
  stop), and the `Collaborators` every runner is built from (its one constructor takes them).
- `acp`, `tmux`: the two other kinds of runner (an ACP agent spoken to over stdio, a pane of its
  bundle's tmux server), on one floor: neither imports the other nor the relay host.
- `relayhost`: the bundles the supervisor hosts as a relay (tmux panes and ACP agents); it asks
  a member's runner for its endpoint and readiness, never for its kind (import-linter).
- `homes`, `signin`: the agent's home, workspace and attach-only MCP config; the sign-in copied in.
- `logs`, `execs`: per-agent rotated logs; `ctl exec`, a command run as the agent.
- `reach`, `reachprobe`: what an agent's uid can reach, checked at load and probed by `--check`.

It stands above the center and the confinement; nothing here imports the reconcile or above.
"""
