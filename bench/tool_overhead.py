"""What Work Bridge adds to an HTTP tool call: the same GET to a local endpoint sent straight with httpx and as a
tool through `workbridge.services.invoke_tool` (schema check, secret lookup, egress check and pinning, the
invocation recorded), alternated call by call, and the difference of the medians. Then an MCP tool of a local stdio
server like `mcp-server-time` (bench/helpers/mcp_time_server.py, a catalogue entry, sandboxed as in production) through
invoke_tool: a session started for each call (the pool off, as before pooling) beside calls on the warm pooled
session.

    .venv/bin/python -m bench.tool_overhead [--calls 500] [--mcp-calls 200] [--mcp-start-calls 10] [--keep]

Self-contained: a private instance (bench/helpers/private_instance.py: a temporary data dir and SQLite database).
"""

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from django.test import override_settings

from bench.helpers.private_instance import DATA_DIR, bench_workspace, clean_up, print_header
from serving.metrics import percentile
from workbridge import mcp_client, sandbox, services

TARGET_ADDED_P50_MS = 2.0
TARGET_WARM_MCP_P50_MS = 50.0
WARMUP = 20
TIME_SERVER = Path(__file__).resolve().parent / "helpers" / "mcp_time_server.py"


class Endpoint(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real API would offer
    # Headers and body go out in two writes; with Nagle's algorithm the second waits for the client's delayed ACK
    # (40 ms) on a kept-alive connection, which no real server makes its clients wait.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        body = json.dumps({"sku": self.path.rsplit("/", 1)[-1], "units": 7}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--mcp-calls", type=int, default=200, help="calls on the warm pooled MCP session")
    parser.add_argument("--mcp-start-calls", type=int, default=10, help="MCP calls that each start the server")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        with override_settings(EGRESS_ALLOW=["127.0.0.1/32"]):
            actor, workspace = bench_workspace()
            run(base, args.calls, actor, workspace)
            run_mcp(args.mcp_calls, args.mcp_start_calls, actor, workspace)
    finally:
        server.shutdown()
        clean_up(args.keep)


def run(base: str, calls: int, actor, workspace) -> None:
    print_header("Work Bridge tool overhead", f"{calls} GETs to a loopback endpoint each way, alternated: "
                                              f"httpx straight, and an http tool through invoke_tool")
    services.set_secret(actor=actor, workspace=workspace, name="STOCK_TOKEN", value="bench-token")
    tool = services.save_tool(
        actor=actor, workspace=workspace, name="stock_level", description="Units of a SKU in stock.",
        parameters={"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}}},
        config={"method": "GET", "url": f"{base}/stock/{{sku}}", "auth": {"type": "bearer", "secret": "STOCK_TOKEN"}})
    direct_ms, tool_ms = [], []
    with httpx.Client(trust_env=False) as client:
        for index in range(WARMUP + calls):
            sku = f"SKU-{index}"
            started = time.perf_counter()
            answer = client.get(f"{base}/stock/{sku}", headers={"Authorization": "Bearer bench-token"})
            direct = (time.perf_counter() - started) * 1000
            assert answer.json()["sku"] == sku
            started = time.perf_counter()
            result = services.invoke_tool(actor=actor, tool=tool, arguments={"sku": sku}, caller="bench")
            through = (time.perf_counter() - started) * 1000
            assert result.ok and result.output["sku"] == sku, result.invocation.error
            if index >= WARMUP:
                direct_ms.append(direct)
                tool_ms.append(through)
    print(f"{'path':<10}{'p50 ms':>10}{'p95 ms':>10}")
    for name, values in (("direct", direct_ms), ("tool", tool_ms)):
        print(f"{name:<10}{percentile(values, 50):>10.2f}{percentile(values, 95):>10.2f}")
    added = [through - direct for direct, through in zip(direct_ms, tool_ms)]
    added_p50 = percentile(tool_ms, 50) - percentile(direct_ms, 50)
    print(f"added: p50 {added_p50:.2f} ms (difference of medians), p95 of per-pair differences "
          f"{percentile(added, 95):.2f} ms")
    print(f"target: p50 added <= {TARGET_ADDED_P50_MS:g} ms: "
          f"{'met' if added_p50 <= TARGET_ADDED_P50_MS else 'NOT met'}")


def run_mcp(calls: int, start_calls: int, actor, workspace) -> None:
    print(f"\n== MCP tool calls: get_current_time on a stdio server like mcp-server-time, through invoke_tool, "
          f"sandbox {sandbox.mode()}")
    catalogue = DATA_DIR / "mcp-commands.toml"
    catalogue.write_text(f"[time]\ncommand = [{json.dumps(sys.executable)}, {json.dumps(str(TIME_SERVER))}]\n"
                         f"read_only_paths = [{json.dumps(str(TIME_SERVER.parent))}]\n")
    with override_settings(MCP_COMMANDS_FILE=catalogue):
        server = services.save_mcp_server(actor=actor, workspace=workspace, name="time", transport="stdio",
                                          catalog_entry="time")
        [tool] = services.import_mcp_tools(actor=actor, server=server, names=["get_current_time"])
        mcp_client.close_all()

        def call_ms() -> float:
            started = time.perf_counter()
            result = services.invoke_tool(actor=actor, tool=tool, arguments={"timezone": "Asia/Shanghai"},
                                          caller="bench")
            elapsed = (time.perf_counter() - started) * 1000
            assert result.ok and "Asia/Shanghai" in json.dumps(result.output), result.invocation.error
            return elapsed

        with override_settings(MCP_POOL_SIZE=0):
            per_call_start = [call_ms() for _ in range(start_calls)]
        first = call_ms()
        warm = [call_ms() for _ in range(calls)]
        mcp_client.close_all()
    print(f"{'session':<24}{'calls':>7}{'p50 ms':>10}{'p95 ms':>10}")
    for name, values in (("started per call", per_call_start), ("pooled, first (start)", [first]),
                         ("pooled, warm", warm)):
        print(f"{name:<24}{len(values):>7}{percentile(values, 50):>10.2f}{percentile(values, 95):>10.2f}")
    warm_p50 = percentile(warm, 50)
    print(f"target: warm pooled p50 <= {TARGET_WARM_MCP_P50_MS:g} ms: "
          f"{'met' if warm_p50 <= TARGET_WARM_MCP_P50_MS else 'NOT met'}")


if __name__ == "__main__":
    main()
