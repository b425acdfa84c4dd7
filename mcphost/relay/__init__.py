"""The relay: the supervisor serves agentmux's relay wire protocol and hosts bundles in tmux.

The module contracts are pinned in docs/relay-internals.md; the protocol is reference
`agentmux-relay.md` §2; the wire itself (frames, `RelayError`, principal ids, the typed request
bodies), the configuration layers' reader and the inscriptions writer are agentmux's
conventions, shared with the relay tools, in `mcphost.agentmux`. Modules:
- `server`: `RelayServer`: the Unix socket (0600), pre-hello timeout, hello handshake, identity
  claims, one response per request, write timeout, connection cap, revocation.
- `principals`: the principal store (PSKs: mint, rotate, constant-time lookup).
- `policy`: policies and deny-by-default authorization (pure).
- `bundles`: bundle, coder, users and relay configuration for the relay.
- `envelope`: the pane envelope of §3.4 (pure).
- `tmux`: one tmux server per bundle: sessions, capture, bracketed paste, readiness.
- `hosting`: `BundleHost` / `MemberHealth`, what the relay asks of the supervisor.
- `requester`: who is asking, about whom: the membership rule, targets, the transport check.
- `delivery`: per-target queues, readiness gate, batching, paste-and-submit, outcomes, receipts.
- `credentials`: new_peer, change_psk, drop_peer (the principal store's changes).
- `behaviour`: `RelayBehaviour`, the operation table (list, look, send, raww, up, down, ...),
  composed of the three above.

Nothing here imports `mcphost.supervisor` or `mcphost.relaytools` (import-linter checks both): peer credentials come from `mcphost.peer`, which
sits below both (the supervisor imports the relay and hosts it). This package file imports
nothing.
"""
