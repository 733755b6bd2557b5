"""Failover: two replicas weighted 1:1 under a steady stream of requests through the gateway; a quarter of the way
in, one replica's engine is killed with SIGKILL. How many requests fail, how long until the health check has the
replica back, and whether the gateway kept sending requests to it meanwhile.

    .venv/bin/python -m bench.failover [--requests 200] [--concurrency 4]
"""

import argparse
import asyncio
import os
import signal
import time
from dataclasses import dataclass
from datetime import datetime

import httpx
from django.utils import timezone

from bench.helpers.running_instance import (
    CLIENT_TIMEOUT,
    GATEWAY_URL,
    BenchDeployment,
    StreamResult,
    bench_deployment,
    chat_body,
    print_header,
    prompts,
    stream_chat,
    wait_for,
)
from serving.models import Replica, RequestRecord, ServingEvent, ServingState

WEIGHTS = [1.0, 1.0]
COOLDOWN_S = 30.0
MAX_TOKENS = 16
# Two llama.cpp replicas on two cores: one thread each, so they do not fight over the cores.
THREADS_PER_REPLICA = 1
KILL_AFTER_FRACTION = 0.25
# Beat checks replicas every 5 s and restarts a dead one after a 2 s backoff; loading the model takes a few more.
RECOVERY_TIMEOUT_S = 90


@dataclass(frozen=True)
class Kill:
    replica_id: int
    pid: int
    at: datetime
    at_perf: float


async def _run(bench: BenchDeployment, victim: Replica, *, count: int,
               concurrency: int) -> tuple[list[StreamResult], Kill]:
    """Send `count` streaming requests, `concurrency` at a time, and kill the victim's engine just before the
    request at KILL_AFTER_FRACTION is sent."""
    questions = prompts(count)
    kill_before = int(count * KILL_AFTER_FRACTION)
    results: list[StreamResult] = []
    kills: list[Kill] = []
    next_index = 0  # shared by the workers; they run on one event loop, so taking it needs no lock

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal next_index
        while next_index < count:
            index, next_index = next_index, next_index + 1
            if index == kill_before:
                os.kill(victim.pid, signal.SIGKILL)
                kills.append(Kill(replica_id=victim.pk, pid=victim.pid, at=timezone.now(),
                                  at_perf=time.perf_counter()))
            body = chat_body(model=bench.name, prompt=questions[index], max_tokens=MAX_TOKENS, stream=True)
            results.append(await stream_chat(client, base_url=GATEWAY_URL, api_key=bench.api_key, body=body))

    async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT, limits=httpx.Limits(max_connections=concurrency)) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return results, kills[0]


def _seconds_after(kill: Kill, moment: datetime | None) -> str:
    return f"+{(moment - kill.at).total_seconds():.1f}s" if moment else "never"


def _is_back(replica: Replica, kill: Kill) -> bool:
    return replica.state == ServingState.READY and replica.pid not in (None, kill.pid) and replica.restarts >= 1


def _wait_until_back(kill: Kill) -> Replica:
    """The replica as it stands once it is ready with a new engine, or after RECOVERY_TIMEOUT_S."""
    try:
        return wait_for(lambda: Replica.objects.get(pk=kill.replica_id), done=lambda r: _is_back(r, kill),
                        timeout_s=RECOVERY_TIMEOUT_S, interval_s=0.5, what="the killed replica to be back")
    except TimeoutError:
        return Replica.objects.get(pk=kill.replica_id)


def _report_requests(results: list[StreamResult], kill: Kill, concurrency: int) -> list[StreamResult]:
    """Print what the client saw; returns the failed requests that were in flight when the engine was killed."""
    failed = [r for r in results if not r.ok]
    in_flight = [r for r in results if r.timing.received_at < kill.at_perf < r.finished_at]
    failed_in_flight = [r for r in failed if r.timing.received_at < kill.at_perf]
    sent_after_kill = [r for r in results if r.timing.received_at >= kill.at_perf]
    print(f"Requests: {len(results) - len(failed)} succeeded, {len(failed)} failed; {len(in_flight)} were in flight "
          f"when the engine was killed, {len(sent_after_kill)} were sent after it.")
    for result in sorted(in_flight, key=lambda r: r.timing.received_at):
        sent = result.timing.received_at - kill.at_perf
        ended = result.finished_at - kill.at_perf
        outcome = "ok" if result.ok else f"FAILED ({result.error})"
        print(f"  in flight at the kill: sent {sent:+.2f}s, ended {ended:+.2f}s, {len(result.text)} chars: {outcome}")
    for result in (r for r in failed if r not in in_flight):
        print(f"  failed, not in flight at the kill: sent {result.timing.received_at - kill.at_perf:+.2f}s: "
              f"{result.error}")
    verdict = "met" if len(failed) <= concurrency and len(failed_in_flight) == len(failed) else "NOT met"
    print(f"Target: at most the in-flight requests fail (<= concurrency {concurrency}): {len(failed)} failed, "
          f"{len(failed_in_flight)} of them in flight -> {verdict}")
    return failed_in_flight


def _report_recovery(kill: Kill, replica: Replica) -> datetime | None:
    """Print the replica's way back from the kill; returns when it was ready again, if it was."""
    events = list(ServingEvent.objects.filter(replica_id=kill.replica_id, at__gte=kill.at).order_by("at", "id"))
    print(f"Replica {kill.replica_id} after the kill (from its serving events):")
    for event in events:
        print(f"  {_seconds_after(kill, event.at):>7} replica {kill.replica_id}: {event.from_state} -> "
              f"{event.to_state}  {event.message.splitlines()[0] if event.message else ''}")
    back_at = next((e.at for e in events if e.to_state == ServingState.READY), None)
    is_back = _is_back(replica, kill)
    print(f"Replica {kill.replica_id} back: {'yes' if is_back else 'NO'}, state {replica.state}, pid {kill.pid} -> "
          f"{replica.pid}, restarts {replica.restarts}; ready again {_seconds_after(kill, back_at)} after the kill"
          + ("" if is_back else f" (waited {RECOVERY_TIMEOUT_S}s after the run)"))
    return back_at if is_back else None


def _report_routing(bench: BenchDeployment, kill: Kill, back_at: datetime | None, requests: int,
                    failed_in_flight: list[StreamResult]) -> None:
    recorded = bench.wait_for_records(requests)
    rows = list(RequestRecord.objects.filter(deployment=bench.deployment)
                .values_list("replica_id", "status", "attempts", "created_at"))
    print(f"RequestRecord rows: {recorded} of {requests}")
    back_or_now = back_at or timezone.now()
    print(f"{'replica':>8} {'before kill':>12} {'kill..back':>11} {'after back':>11} {'non-200':>8} {'retried':>8}")
    for replica in bench.replicas():
        mine = [row for row in rows if row[0] == replica.pk]
        print(f"{replica.pk:>8} {sum(1 for r in mine if r[3] < kill.at):>12} "
              f"{sum(1 for r in mine if kill.at <= r[3] <= back_or_now):>11} "
              f"{sum(1 for r in mine if r[3] > back_or_now):>11} {sum(1 for r in mine if r[1] != 200):>8} "
              f"{sum(1 for r in mine if r[2] > 1):>8}")
    print("  (before/after by the row's time; retried = served after the gateway failed over from another replica)")
    rejoined = min((row[3] for row in rows if row[0] == kill.replica_id and row[1] == 200 and back_at
                    and row[3] > back_at), default=None)
    print(f"First request served by the restarted replica: {_seconds_after(kill, rejoined)} after the kill (a replica "
          f"that failed a request stays out of routing for the {bench.deployment.cooldown_s:g}s cooldown)")
    victim_failures = sorted(row[3] for row in rows if row[0] == kill.replica_id and row[1] != 200
                             and kill.at <= row[3] <= back_or_now)
    first_failure = victim_failures[0] if victim_failures else None
    beyond_in_flight = max(len(victim_failures) - len(failed_in_flight), 0)
    print(f"First failed request on replica {kill.replica_id}, from the kill: {_seconds_after(kill, first_failure)}; "
          f"failed rows on it from then until it was back: {len(victim_failures)}, of which in flight at the kill: "
          f"{len(failed_in_flight)}")
    print(f"Target: no request routed to the dead replica after its first failure besides the in-flight ones: "
          f"{beyond_in_flight} -> {'met' if beyond_in_flight == 0 else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    print_header("failover", f"{args.requests} streaming chat requests (max_tokens {MAX_TOKENS}, concurrency "
                             f"{args.concurrency}) through the gateway to 2 replicas weighted 1:1 (cooldown "
                             f"{COOLDOWN_S:g}s); one replica's engine is killed with SIGKILL after "
                             f"{KILL_AFTER_FRACTION:.0%} of the requests were sent. Failed requests, time to "
                             f"recovery, and requests routed to the dead replica.")
    with bench_deployment(label="failover", weights=WEIGHTS, threads=THREADS_PER_REPLICA,
                          cooldown_s=COOLDOWN_S) as bench:
        print(bench.describe())
        print(f"Both replicas run with engine setting threads={THREADS_PER_REPLICA} so that they do not fight over "
              f"the cores.")
        victim = bench.replicas()[0]
        started = time.perf_counter()
        results, kill = asyncio.run(_run(bench, victim, count=args.requests, concurrency=args.concurrency))
        killed_at = kill.at.isoformat(timespec="milliseconds")
        print(f"Ran {args.requests} requests in {time.perf_counter() - started:.1f}s; killed replica "
              f"{kill.replica_id} (pid {kill.pid}) at {killed_at}, {kill.at_perf - started:.1f}s into the run.")
        failed_in_flight = _report_requests(results, kill, args.concurrency)
        back_at = _report_recovery(kill, _wait_until_back(kill))
        _report_routing(bench, kill, back_at, args.requests, failed_in_flight)


if __name__ == "__main__":
    main()
