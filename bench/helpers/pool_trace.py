"""A seeded synthetic trace of training jobs for the pool scheduler (bench.pool_sim): heavy-tailed durations
(lognormal, capped), gangs of 1-8 devices, some elastic, mixed priority classes, steady arrivals plus bursts in
which one workspace submits a sweep at once."""

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class TraceJob:
    id: int
    workspace: int
    submitted_at: float
    priority: str
    min_devices: int
    max_devices: int
    # Device-seconds of work at full efficiency: an elastic job runs it faster on more devices.
    work: float


def make_trace(*, jobs: int = 2000, workspaces: int = 8, devices: int = 64, load: float = 1.3,
               seed: int = 7) -> list[TraceJob]:
    """`load`: offered device-seconds over the capacity of the arrival window (above 1: a backlog builds)."""
    rng = random.Random(seed)
    bursts, count = [], 0
    while count < jobs:
        workspace = rng.randrange(workspaces)
        roll = rng.random()
        if roll < 0.05:
            priority, size, median = "urgent", rng.choice((1, 2, 4)), 600
        elif roll < 0.20:
            priority, size, median = "high", rng.choice((1, 2, 4)), 1200
        elif roll < 0.70:
            priority, size, median = "normal", rng.choice((1, 1, 2, 2, 4, 8)), 1800
        else:
            priority, size, median = "low", rng.choice((2, 4, 8)), 2400
        elastic = priority in ("low", "normal") and size >= 4 and rng.random() < 0.4
        minimum = max(1, size // 4) if elastic else size
        seconds = min(median * math.exp(rng.gauss(0, 1.1)), 12 * 3600)
        # Now and then a workspace submits a sweep: many like jobs at once.
        burst = 1 if rng.random() > 0.04 or priority == "urgent" else min(rng.randint(8, 30), jobs - count)
        bursts.append([(workspace, priority, minimum, size, max(60.0, seconds) * size)] * burst)
        count += burst
    window = sum(draft[4] for burst in bursts for draft in burst) / devices / load
    trace, at = [], 0.0
    for burst in bursts:
        at += rng.expovariate(1.0) * window / jobs * len(burst)
        for workspace, priority, minimum, size, work in burst:
            trace.append(TraceJob(len(trace) + 1, workspace, round(at, 1), priority, minimum, size, work))
    return trace
