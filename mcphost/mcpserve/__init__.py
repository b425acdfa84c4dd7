"""Serve a `mcphost.surface.Surface` through the official MCP SDK's low-level server.

Owns: the one protocol core of both tool surfaces (the center host and the relay tools).
`adapter` maps a Surface onto `mcp.server.lowlevel.Server` (tools/list, tools/call with
progress, cancellation and `list_changed`, error and result shapes) and serves it over any pair
of SDK message streams (`serve_streams`); `connection` is our framing in front of the SDK
session, whatever carries the bytes (line cap, request-id recovery, id-less error replies,
backpressure, EOF grace and stop); `stdio` gives it stdin/stdout (the fd-1 move, the process
lifecycle, the `run` entry of `mcphost host` and `mcphost relay-tools`) and `stream` a connected
socket (the supervisor's attached sessions, `serve_socket`).

JSON-RPC semantics (dispatch, the handshake, protocol eras, cancellation, progress routing)
belong to the SDK. Our code only frames bytes into messages, answers what cannot become a
message (unparseable or over-long lines, envelopes the SDK's message model refuses), and decides
when to read.

Must never: dispatch a request itself, write anything but JSON-RPC to the protocol stream, or
import the SDK at module import time (`mcphost host --help` and the pure modules stay light).
"""
