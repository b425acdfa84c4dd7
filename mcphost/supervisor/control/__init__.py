"""The control socket, in three modules so that `mcphost ctl` loads only its side.

- `protocol`: the wire (request grammar, reply encoding, bounds, `ControlError`); pure.
- `server`: `ControlServer` (asyncio), its lock and peer check; the supervisor's side.
- `client`: the blocking client (`request`, `stream_logs`, `ExecClient`); `mcphost ctl`'s side.

`client` and `server` both import `protocol`, never each other; this file imports nothing.
"""
