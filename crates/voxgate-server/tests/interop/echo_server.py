"""A small stdio MCP server for the MCP endpoint interop test (official `mcp` SDK, FastMCP).

Run by the bridges (`mcp2xiaozhi`, `xiaozhi-mcp`), never by hand: it speaks MCP on stdin/stdout.
"""

from mcp.server.fastmcp import FastMCP

mcp = FastMCP("voxgate-interop")


@mcp.tool()
def echo(text: str) -> str:
    """Repeat the text back, prefixed with 'echo: '."""
    return f"echo: {text}"


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    mcp.run(transport="stdio")
