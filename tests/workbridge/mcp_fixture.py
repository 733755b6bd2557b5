"""A small MCP server for the tests, built with the official SDK's FastMCP:
`python mcp_fixture.py stdio`, or `python mcp_fixture.py http PORT` for streamable HTTP on loopback."""

import os
import sys

from mcp.server.fastmcp import FastMCP

server = FastMCP("inventory", host="127.0.0.1", port=int(sys.argv[2]) if sys.argv[1:2] == ["http"] else 8000)


@server.tool(name="stock-level", description="How many units of a SKU are in stock.")
def stock_level(sku: str, warehouse: str = "main") -> dict:
    return {"sku": sku, "warehouse": warehouse, "units": len(sku) * 7}


@server.tool(description="Greet someone by name.")
def greet(name: str) -> str:
    return f"你好, {name}!"


@server.tool(description="Who the server runs as, and whether it can read the file named by PROBE_PATH.")
def probe() -> dict:
    try:
        with open(os.environ.get("PROBE_PATH", "/nonexistent"), "rb") as handle:
            readable = bool(handle.read(1))
    except OSError:
        readable = False
    return {"uid": os.getuid(), "readable": readable, "network": _has_network()}


def _has_network() -> bool:
    """Whether any interface but loopback is up (a sandboxed server sees only its own loopback)."""
    try:
        return any(name != "lo" for name in os.listdir("/sys/class/net"))
    except OSError:
        return False


@server.tool(description="Always fails.")
def broken() -> str:
    raise RuntimeError("the warehouse system is down")


if __name__ == "__main__":
    server.run(transport="streamable-http" if sys.argv[1] == "http" else "stdio")
