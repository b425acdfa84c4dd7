"""A fixed, representative generator input shared by the configgen tests."""

from __future__ import annotations

from configgen import AgentConfig, CenterBinding, RelayBinding

PIN_A = "sha256:" + ":".join(["AB"] * 32)
PIN_B = "cd" * 32


def sample_config(**overrides: object) -> AgentConfig:
    """Center over pinned TCP with a token file, plus the relay: every field exercised."""
    center = CenterBinding(
        agent_id="agent-7f3a",
        admin_url="tcp://center.example:8443",
        token_file="/srv/agents/agent-7f3a/token",
        fingerprint=f"{PIN_A}, {PIN_B}",
        agent_root="/srv/agents/agent-7f3a/tasks",
        runtime_socket="/run/mcphost/agent-7f3a.sock",
        generation=3,
    )
    relay = RelayBinding(
        bundle="party",
        session_name="alpha",
        configuration_directories=("/etc/agentmux", "/srv/agentmux/conf"),
        state_directory="/var/lib/agentmux",
        inscriptions_directory="/var/log/agentmux",
    )
    fields: dict[str, object] = {
        "center": center,
        "relay": relay,
        "mcphost": "/opt/mcphost/bin/mcphost",
    }
    fields.update(overrides)
    return AgentConfig(**fields)  # type: ignore[arg-type]
