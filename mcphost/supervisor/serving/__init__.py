"""The serving wing: every agent's MCP sessions, over its attach pump.

- `sessions`: SessionHub, one Unix socket per surface: the handshake line, the kernel's word on
  who is calling (peer credentials), one SDK session per pump, and the bounds per agent.
- `streamable`: HttpHub, MCP's streamable HTTP on one loopback listener for the clients that
  speak it (no pump): the kernel's word on each connection's owner uid, the SDK's transport per
  session, the same bounds per agent.
- `surfaces`: what each session is served (the center's tools, the relay tools) and when it
  ends (a new generation, a stop, a reload).

It stands above the reconcile (it serves the slots the reconcile keeps) and below the operator.
"""
