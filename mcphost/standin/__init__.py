"""Model stand-ins: loopback servers that answer the real agent CLIs as their model APIs would.

Owns: `anthropic` (Anthropic's Messages API, as Claude Code and claude-code-acp ask it: a fixed
script of turns, and the record of every request), `responses` (OpenAI's Responses API, as
Codex and codex-acp ask it, on the same thread and lifecycle), and `director` (the demo script:
the next step decided from each request's conversation, for both APIs), which `mcphost demo
model` serves and `make demo-agents` runs the real CLIs against. The suite's black-box tests of
the real CLIs (tests/blackbox/) script them with fixed turns.

Must never: bind anything but the loopback, decide from wall-clock time, or be imported by the
host's or the supervisor's code paths (aiohttp is imported only by whoever serves a stand-in).
"""
