"""The SDK floor: a minimal hello-world `MCPServer` over stdio."""

from mcp.server import MCPServer

server = MCPServer("hello", version="1")


@server.tool()
def hello(name: str = "world") -> str:
    """Say hello."""
    return f"hello {name}"


if __name__ == "__main__":
    server.run()
