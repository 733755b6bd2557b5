"""How long a python tool takes to start: every call is a fresh sandbox (bubblewrap, a new Python, the runner), so
start-up is most of a trivial call's latency.

    .venv/bin/python -m bench.sandbox [--runs 50] [--keep]

Prints p50/p95 of: a bare `python -I -c pass` (the floor no sandbox can beat), the first call after the process
starts (cold: the bubblewrap probe included), `sandbox.run_python` of a trivial `run`, and the same tool called
through `invoke_tool` (schema check and the invocation recorded). Self-contained: a private instance
(bench/helpers/private_instance.py).
"""

import argparse
import subprocess
import sys
import time

from bench.helpers.private_instance import bench_workspace, clean_up, print_header
from serving.metrics import percentile
from workbridge import sandbox, services

TARGET_P50_MS = 150.0
TRIVIAL = "def run(args):\n    return {'echo': args['text']}\n"


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def _trivial_run() -> None:
    result = sandbox.run_python(TRIVIAL, {"text": "hi"}, timeout_s=10, max_output_bytes=4096)
    assert result.output == {"echo": "hi"}, result.error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    try:
        run(args.runs)
    finally:
        clean_up(args.keep)


def run(runs: int) -> None:
    print_header("Python tool sandbox", f"{runs} runs each; sandbox mode {sandbox.mode()}")
    cold = _timed(lambda: (sandbox.availability(), _trivial_run()))
    bare = [_timed(lambda: subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)) for _ in range(runs)]
    direct = [_timed(_trivial_run) for _ in range(runs)]
    actor, workspace = bench_workspace()
    tool = services.save_tool(actor=actor, workspace=workspace, name="echo", description="Echo a text.",
                              binding="python", config={"code": TRIVIAL},
                              parameters={"type": "object", "required": ["text"],
                                          "properties": {"text": {"type": "string"}}})

    def through_invoke() -> None:
        result = services.invoke_tool(actor=actor, tool=tool, arguments={"text": "hi"}, caller="bench")
        assert result.ok, result.invocation.error

    invoked = [_timed(through_invoke) for _ in range(runs)]
    print(f"{'what':<44}{'p50 ms':>10}{'p95 ms':>10}")
    print(f"{'first call in this process (cold, with probe)':<44}{cold:>10.1f}{'':>10}")
    for name, values in (("bare python -I -c pass (no sandbox)", bare), ("run_python, trivial run()", direct),
                         ("invoke_tool, trivial python tool", invoked)):
        print(f"{name:<44}{percentile(values, 50):>10.1f}{percentile(values, 95):>10.1f}")
    p50 = percentile(invoked, 50)
    print(f"target: a trivial call p50 < {TARGET_P50_MS:g} ms: {'met' if p50 < TARGET_P50_MS else 'NOT met'} "
          f"({p50:.1f} ms)")


if __name__ == "__main__":
    main()
