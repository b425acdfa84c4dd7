"""The reference center: an aiohttp + SQLite stand-in for agent-center's admin API.

Owns: enough of the center's admin surface (agent-tool routes, file transfer, runtime fork
socket) for black-box tests of the per-agent host, for trying the host by hand, and for
benchmarks and fuzzing. It is a faithful-enough *reference*, not the product center.
Must never: be imported by the per-agent host path (it pulls in aiohttp's server side and
SQLite), or relax a check the real center makes: tests built on it must fail where the real
center would refuse.

Modules: `errors` (the error envelope), `ids` (ULIDs), `store` (SQLite schema, seed, queries),
`specs` (the declarative tool table: fields, codes, response shapes), `tools` (tool logic),
`files` (transfer and download routes), `runtime` (the runtime control socket), `control`
(faults and request log), `openapi`, `tls`, `app` (wiring) and `cli`.
"""
