"""A stdio MCP server like the reference `mcp-server-time`, built with the official SDK's FastMCP, for
bench.tool_overhead: `python bench/helpers/mcp_time_server.py`."""

from datetime import datetime
from zoneinfo import ZoneInfo

from mcp.server.fastmcp import FastMCP

server = FastMCP("time")


@server.tool(description="The current time in an IANA time zone, e.g. Asia/Shanghai.")
def get_current_time(timezone: str) -> dict:
    now = datetime.now(ZoneInfo(timezone))
    return {"timezone": timezone, "datetime": now.isoformat(timespec="seconds"), "is_dst": bool(now.dst())}


@server.tool(description="A time of day (HH:MM) in one time zone, in another.")
def convert_time(source_timezone: str, time: str, target_timezone: str) -> dict:
    hours, minutes = (int(part) for part in time.split(":"))
    source = datetime.now(ZoneInfo(source_timezone)).replace(hour=hours, minute=minutes, second=0, microsecond=0)
    target = source.astimezone(ZoneInfo(target_timezone))
    return {"source": source.isoformat(), "target": target.isoformat()}


if __name__ == "__main__":
    server.run(transport="stdio")
