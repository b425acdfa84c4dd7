"""The agents' wing: one agent's life, from its home to its process and its relay members.

- `runner`: AgentRunner, the process runner (spawn, reap, restart policy, backoff, intensity,
  stop), the agent's states and the `Collaborators` every runner is built from.
- `acp`, `tmux`: the two other kinds of runner (an ACP agent spoken to over stdio, a pane of its
  bundle's tmux server); all three stand on this one floor.
- `relayhost`: the bundles the supervisor hosts as a relay (tmux panes and ACP agents).
- `homes`, `signin`: the agent's home, workspace and attach-only MCP config; the sign-in copied in.
- `logs`, `execs`: per-agent rotated logs; `ctl exec`, a command run as the agent.
- `reach`, `reachprobe`: what an agent's uid can reach, checked at load and probed by `--check`.

It stands above the center and the confinement; nothing here imports the reconcile or above.
"""
