"""The shared pool's scheduler (issue 46) on a synthetic trace, with a simulated clock, against first come first
served.

    .venv/bin/python -m bench.pool_sim [--jobs 2000] [--nodes 8] [--devices-per-node 8] [--workspaces 8]
                                       [--load 1.3] [--checkpoint-s 600] [--seed 7]

The trace (bench/helpers/pool_trace.py): heavy-tailed durations, gangs of 1-8, elastic jobs, classes low to urgent,
bursts. Every workspace's queue has an equal nominal quota (the pool divided evenly), any borrowing and lending.
The real policy (`cluster.scheduling.policy.schedule`) decides at every arrival, end and checkpointed stop, and every
scheduling interval, as the platform's pass runs on each submit, each job end and beat's tick. A simulated job:
- runs at one device-second of work a second per device (an elastic job faster on more), after a start-up
  (`--startup-s`: loading, resuming) that does no work;
- checkpoints every `--checkpoint-s` of running; told to stop, it checkpoints at its next step boundary (uniform
  within `--step-s`) and so loses nothing; one killed past the grace period loses its work since the checkpoint;
- requeued after a preemption, resumes from that checkpoint.
FCFS is today's dispatch: one line in arrival order, the head starts when its gang fits (best fit) and everything
behind it waits; no quotas, no preemption, elastic jobs ask for their maximum.

Figures (over the whole run; "backlog": waiting jobs' minimum gangs at least fill the free devices):
- utilization under backlog: devices held / devices, and "productive" without start-ups;
- wait p50/p95 by class: submit to first start; urgent's target is one scheduling interval;
- each workspace's share of the pool while every workspace has work waiting, against its quota;
- work lost to preemption: seconds of progress per preemption (target ≤ one checkpoint interval);
- the longest wait of any job.
"""

import argparse
import heapq
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field

from bench.helpers.pool_trace import TraceJob, make_trace
from cluster.scheduling import policy

KIND = "H100-80GB"


@dataclass
class SimJob:
    trace: TraceJob
    allocation: dict = field(default_factory=dict)
    rate: int = 0  # devices the job works on (an elastic job's grown devices count after its restart)
    run_started_at: float | None = None
    working_from: float = 0.0
    work_at_run_start: float = 0.0
    saved_work: float = 0.0
    last_checkpoint_at: float | None = None
    stopping: policy.Stop | policy.Grow | None = None
    stopping_since: float | None = None
    nominated: tuple = ()
    preemptions: int = 0
    quota_idle: bool = False  # on arrival its workspace's quota had room for it (idle, or lent out)
    first_started_at: float | None = None
    finished_at: float | None = None
    version: int = 0

    def work(self, now: float) -> float:
        if self.run_started_at is None:
            return self.saved_work
        return self.work_at_run_start + self.rate * max(0.0, now - self.working_from)


class Simulation:
    def __init__(self, trace: list[TraceJob], *, nodes: int, per_node: int, workspaces: int, args, fcfs: bool):
        self.jobs = {job.id: SimJob(job) for job in trace}
        self.capacity = {f"node-{n}": {KIND: per_node} for n in range(nodes)}
        self.devices = nodes * per_node
        self.quotas = {ws: {KIND: policy.Quota(nominal=self.devices // workspaces)} for ws in range(workspaces)}
        self.settings = policy.Settings(interval_s=args.interval_s, min_run_s=args.min_run_s, grace_s=args.grace_s)
        self.args, self.fcfs, self.workspaces = args, fcfs, workspaces
        self.rng = random.Random(args.seed)
        self.events: list[tuple] = []
        self.now = 0.0
        self.waiting: dict[int, SimJob] = {}
        self.running: dict[int, SimJob] = {}
        self.stats = defaultdict(float)
        self.share_time = defaultdict(float)
        self.preemptions, self.lost_s = 0, []

    def push(self, at: float, kind: str, job_id: int = 0, version: int = 0) -> None:
        heapq.heappush(self.events, (at, kind, job_id, version))

    def run(self) -> None:
        for job in self.jobs.values():
            self.push(job.trace.submitted_at, "arrive", job.trace.id)
        self.push(0.0, "tick")
        while self.events:
            at = self.events[0][0]
            self.account(at)
            self.now = at
            while self.events and self.events[0][0] == at:
                _, kind, job_id, version = heapq.heappop(self.events)
                self.handle(kind, job_id, version)
            if len(self.waiting) + len(self.running) == 0 and not any(e[1] == "arrive" for e in self.events):
                break
            self.schedule()

    def handle(self, kind: str, job_id: int, version: int) -> None:
        if kind == "tick":
            self.push(self.now + self.settings.interval_s, "tick")
            return
        job = self.jobs[job_id]
        if kind == "arrive":
            self.waiting[job_id] = job
            used = sum(sum(j.allocation.values()) for j in self.running.values()
                       if j.trace.workspace == job.trace.workspace)
            job.quota_idle = used + job.trace.min_devices <= self.devices // self.workspaces
        elif kind == "end" and version == job.version:
            job.finished_at, job.allocation, job.stopping, job.stopping_since = self.now, {}, None, None
            job.version += 1
            del self.running[job_id]
        elif kind == "boundary" and version == job.version:
            self.reached_boundary(job)

    def reached_boundary(self, job: SimJob) -> None:
        """A signalled job checkpoints here (nothing lost) and stops, shrinks or grows."""
        job.saved_work = job.work(self.now)
        decision, job.stopping, job.stopping_since = job.stopping, None, None
        keep = decision.allocation if isinstance(decision, policy.Grow) else decision.keep
        if keep:
            self.start(job, keep)
        else:
            job.allocation, job.run_started_at, job.rate = {}, None, 0
            job.version += 1
            del self.running[job.trace.id]
            self.waiting[job.trace.id] = job

    def start(self, job: SimJob, allocation: dict) -> None:
        job.allocation, job.rate = dict(allocation), sum(allocation.values())
        job.run_started_at = self.now
        job.working_from = self.now + self.args.startup_s
        job.work_at_run_start = job.saved_work
        job.last_checkpoint_at, job.nominated = None, ()
        job.version += 1
        if job.first_started_at is None:
            job.first_started_at = self.now
        self.waiting.pop(job.trace.id, None)
        self.running[job.trace.id] = job
        left = max(0.0, job.trace.work - job.saved_work) / job.rate
        self.push(job.working_from + left, "end", job.trace.id, job.version)

    def checkpoint(self, job: SimJob) -> float | None:
        """When the running job last wrote a checkpoint (every --checkpoint-s of running)."""
        if job.run_started_at is None:
            return None
        runs = int((self.now - job.run_started_at) // self.args.checkpoint_s)
        return job.run_started_at + runs * self.args.checkpoint_s if runs else None

    def workloads(self) -> list[policy.Workload]:
        result = []
        for job in [*self.running.values(), *self.waiting.values()]:
            trace = job.trace
            stop = job.stopping
            result.append(policy.Workload(
                id=trace.id, workspace=trace.workspace, kind=KIND, min_devices=trace.min_devices,
                max_devices=trace.max_devices, priority=trace.priority, submitted_at=trace.submitted_at,
                sizes=tuple(size for size in (1, 2, 4, 8) if trace.min_devices <= size <= trace.max_devices),
                allocation=dict(job.allocation), started_at=job.run_started_at,
                last_checkpoint_at=self.checkpoint(job), stopping_since=job.stopping_since,
                stopping_to=(stop.keep if isinstance(stop, policy.Stop) else {}),
                stopping_for=(stop.by if isinstance(stop, policy.Stop) else None), nominated=job.nominated,
                preemptions=job.preemptions))
        return result

    def schedule(self) -> None:
        if self.fcfs:
            return self.schedule_fcfs()
        decisions = policy.schedule(capacity=self.capacity, quotas=self.quotas, workloads=self.workloads(),
                                    now=self.now, settings=self.settings)
        for job_id, nodes in decisions.nominate.items():
            self.jobs[job_id].nominated = nodes
        for admit in decisions.admit:
            self.start(self.jobs[admit.workload], admit.allocation)
        for decision in [*decisions.stop, *decisions.grow]:
            job = self.jobs[decision.workload]
            job.stopping, job.stopping_since = decision, self.now
            if isinstance(decision, policy.Stop):
                job.preemptions += 1
                self.preemptions += 1
                self.lost_s.append(0.0)  # it checkpoints at its step boundary, within the grace period
            else:
                job.allocation = dict(decision.allocation)  # the grown devices are held from now on
            self.push(self.now + self.rng.uniform(0, self.args.step_s), "boundary", job.trace.id, job.version)
        for job_id in decisions.kill:
            job = self.jobs[job_id]
            checkpoint = self.checkpoint(job) or job.run_started_at
            self.lost_s.append((job.work(self.now) - job.work(checkpoint)) / max(job.rate, 1))
            job.saved_work = job.work(checkpoint)
            job.work_at_run_start, job.working_from = job.saved_work, self.now
            self.push(self.now, "boundary", job_id, job.version)

    def schedule_fcfs(self) -> None:
        free = {node: kinds[KIND] - sum(j.allocation.get(node, 0) for j in self.running.values())
                for node, kinds in self.capacity.items()}
        for job in sorted(self.waiting.values(), key=lambda j: (j.trace.submitted_at, j.trace.id)):
            size = job.trace.max_devices
            fitting = [node for node, count in free.items() if count >= size]
            if not fitting:
                return
            node = min(fitting, key=lambda n: (free[n], n))
            free[node] -= size
            self.start(job, {node: size})

    def account(self, until: float) -> None:
        span = until - self.now
        if span <= 0:
            return
        held = sum(sum(job.allocation.values()) for job in self.running.values())
        productive = sum(j.rate for j in self.running.values() if j.working_from <= self.now)
        free = self.devices - held
        backlog = sum(j.trace.min_devices if not self.fcfs else j.trace.max_devices
                      for j in self.waiting.values()) >= max(free, 1)
        if backlog:
            self.stats["backlog_s"] += span
            self.stats["held"] += held * span
            self.stats["productive"] += productive * span
        waiting_workspaces = {j.trace.workspace for j in self.waiting.values()}
        for ws in waiting_workspaces:
            self.stats[("backlogged_s", ws)] += span
            self.share_time[("backlogged", ws)] += span * sum(
                sum(j.allocation.values()) for j in self.running.values() if j.trace.workspace == ws)
        if len(waiting_workspaces) == self.workspaces:
            self.stats["all_backlogged_s"] += span
            for job in self.running.values():
                self.share_time[job.trace.workspace] += sum(job.allocation.values()) * span

    def report(self, started: float) -> dict:
        waits = defaultdict(list)
        for job in self.jobs.values():
            waits[job.trace.priority].append(job.first_started_at - job.trace.submitted_at)
            if job.quota_idle:
                waits[f"{job.trace.priority}, quota free or lent"].append(job.first_started_at - job.trace.submitted_at)
        backlog = self.stats["backlog_s"] or 1
        shares = {ws: self.share_time[ws] / (self.stats["all_backlogged_s"] or 1) / self.devices
                  for ws in range(self.workspaces)}
        return {
            "utilization": self.stats["held"] / backlog / self.devices,
            "productive": self.stats["productive"] / backlog / self.devices,
            "backlog_h": self.stats["backlog_s"] / 3600, "all_backlogged_h": self.stats["all_backlogged_s"] / 3600,
            "waits": {cls: (percentile(values, 50), percentile(values, 95), len(values))
                      for cls, values in waits.items()},
            "longest": max(max(values) for values in waits.values()),
            "backlogged_shares": {ws: self.share_time[("backlogged", ws)] / (self.stats[("backlogged_s", ws)] or 1)
                                  / self.devices for ws in range(self.workspaces)},
            "shares": shares, "preemptions": self.preemptions,
            "most_preempted": max(job.preemptions for job in self.jobs.values()),
            "lost": max(self.lost_s, default=0.0),
            "makespan_h": max(j.finished_at or 0 for j in self.jobs.values()) / 3600,
            "seconds": time.monotonic() - started,
        }


def percentile(values: list[float], percent: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * percent / 100
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def share(value: float, quota: float) -> str:
    return f"{value:.1%} ({(value - quota) * 100:+.1f} pp)"


def minutes(seconds: float) -> str:
    return f"{seconds / 60:7.1f} min" if seconds >= 60 else f"{seconds:7.1f} s  "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--workspaces", type=int, default=8)
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument("--interval-s", type=float, default=30.0)
    parser.add_argument("--min-run-s", type=float, default=600.0)
    parser.add_argument("--grace-s", type=float, default=120.0)
    parser.add_argument("--checkpoint-s", type=float, default=600.0)
    parser.add_argument("--step-s", type=float, default=10.0)
    parser.add_argument("--startup-s", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    trace = make_trace(jobs=args.jobs, workspaces=args.workspaces, devices=args.nodes * args.devices_per_node,
                       load=args.load, seed=args.seed)
    results = {}
    for name, fcfs in (("scheduler", False), ("FCFS", True)):
        simulation = Simulation(trace, nodes=args.nodes, per_node=args.devices_per_node,
                                workspaces=args.workspaces, args=args, fcfs=fcfs)
        started = time.monotonic()
        simulation.run()
        results[name] = simulation.report(started)
    ours, fcfs = results["scheduler"], results["FCFS"]
    quota = 1 / args.workspaces
    print(f"{args.jobs} jobs, {args.nodes}x{args.devices_per_node} devices, {args.workspaces} workspaces, "
          f"load {args.load}, interval {args.interval_s:.0f} s, checkpoint every {args.checkpoint_s:.0f} s")
    print(f"{'':38}{'scheduler':>16}{'FCFS':>16}   target")
    print(f"{'utilization under backlog (held)':38}{ours['utilization']:>16.1%}{fcfs['utilization']:>16.1%}   ≥ 90%")
    print(f"{'  productive (no start-ups)':38}{ours['productive']:>16.1%}{fcfs['productive']:>16.1%}")
    print(f"{'  hours of backlog':38}{ours['backlog_h']:>16.1f}{fcfs['backlog_h']:>16.1f}")
    for cls in ["urgent, quota free or lent", *reversed(policy.PRIORITY_CLASSES)]:
        p50, p95, count = ours["waits"][cls]
        f50, f95, _ = fcfs["waits"][cls]
        target = f"   ≤ {args.interval_s:.0f} s" if cls == "urgent, quota free or lent" else ""
        print(f"{f'wait p50 / p95, {cls} ({count})':38}{minutes(p50):>16}{minutes(f50):>16}")
        print(f"{'':38}{minutes(p95):>16}{minutes(f95):>16}{target}")
    print(f"{'longest wait':38}{minutes(ours['longest']):>16}{minutes(fcfs['longest']):>16}")
    print(f"share of the pool while all {args.workspaces} workspaces wait "
          f"({ours['all_backlogged_h']:.1f} h / {fcfs['all_backlogged_h']:.1f} h), quota {quota:.1%} each:")
    for ws in range(args.workspaces):
        print(f"{f'  workspace {ws}':38}{share(ours['shares'][ws], quota):>17}{share(fcfs['shares'][ws], quota):>17}"
              f"   within 5 pp")
    gaps = [max(abs(result["shares"][ws] - quota) for ws in range(args.workspaces)) for result in (ours, fcfs)]
    print(f"{'  largest gap (of the quota)':38}{f'{gaps[0] * 100:.1f} pp ({gaps[0] / quota:.0%})':>16}"
          f"{f'{gaps[1] * 100:.1f} pp ({gaps[1] / quota:.0%})':>16}")
    print("share of the pool while the workspace has work waiting (its guarantee), against its quota:")
    for ws in range(args.workspaces):
        print(f"{f'  workspace {ws}':38}{share(ours['backlogged_shares'][ws], quota):>17}"
              f"{share(fcfs['backlogged_shares'][ws], quota):>17}   ≥ quota - 5 pp")
    preempted = f"{ours['preemptions']} ({ours['preemptions'] / args.jobs:.1f} / {ours['most_preempted']})"
    print(f"{'preemptions (a job / most of one job)':38}{preempted:>16}{'-':>16}")
    print(f"{'work lost per preemption, most':38}{minutes(ours['lost']):>16}{'-':>16}   "
          f"≤ {args.checkpoint_s:.0f} s")
    print(f"{'all done after':38}{ours['makespan_h']:>14.1f} h{fcfs['makespan_h']:>14.1f} h")
    print(f"{'simulated in':38}{ours['seconds']:>14.1f} s{fcfs['seconds']:>14.1f} s")


if __name__ == "__main__":
    main()
