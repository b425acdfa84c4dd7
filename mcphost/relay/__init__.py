"""The relay: the supervisor serves agentmux's relay wire protocol and hosts bundles in tmux.

The module contracts are pinned in docs/relay-internals.md; the protocol is reference
`agentmux-relay.md` §2; the wire itself (frames, `RelayError`, principal ids, the typed request
bodies), the configuration layers' reader, the bundle file (read strictly here, leniently by the
relay tools; written by the supervisor) and the inscriptions writer are agentmux's conventions,
shared with the relay tools, in `mcphost.agentmux`. Modules:
- `server`: `RelayServer`: the Unix socket (0600), pre-hello timeout, hello handshake, identity
  claims, one response per request, write timeout, connection cap.
- `connections`: the live connections and their identity claims, one registry shared by the
  server and the behaviour (revocation, events, who is connected).
- `principals`: the principal store (PSKs: mint, rotate, constant-time lookup).
- `policy`: policies and deny-by-default authorization (pure).
- `config`: users and relay configuration for the relay (`users.toml`, `relay.toml`).
- `envelope`: the pane envelope of §3.4 (pure).
- `tmux`: one tmux server per bundle: sessions, capture, bracketed paste, a pane's exit.
- `panes`: the readiness gate and delivery into one pane (deliver, raw_write).
- `outcome`: a delivery's terminal outcome, whatever the member.
- `hosting`: `BundleHost` / `MemberHealth`, what the relay asks of the supervisor.
- `members`: the member port (`members.port`: `Member`, `MemberKind`) and the registry of kinds
  (`members.KINDS`: `tmux`), bound to the endpoints the host hands over.
- `state`: `RelayState`, the one state object every operation is handed.
- `requester`: who is asking, about whom: the membership rule, targets, the member kind check,
  the target bound as a member, the bundle's choices queue (functions of the state).
- `delivery`: per-target queues, batching, handing a batch to its member, outcomes, receipts.
- `ops`: one module per operation (list, look, send, raww, up/down, choices, credentials,
  discovery), each with its response models and capability; `ops.OPERATIONS` the table.
- `behaviour`: `RelayBehaviour`, identity (authenticate, admit) and the dispatcher over the
  table: what RelayServer calls.

Nothing here imports `mcphost.supervisor` or `mcphost.relaytools` (import-linter checks both): peer credentials come from `mcphost.peer`, which
sits below both (the supervisor imports the relay and hosts it). This package file imports
nothing.
"""
