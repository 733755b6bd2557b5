"""The pool's scheduling policy: which waiting workloads start, on which devices, and which running ones make room.

Pure: no database, no clock, no I/O (its reasons are event-log templates, `cluster/log_messages.py`, filled here
and shown in the reader's language). `schedule()` takes the pool as it stands (capacity by node and device kind, each
workspace's quota, every unfinished workload) and the time, and returns decisions; the database pass
(`cluster/scheduling/pool.py`) and the simulation (`bench/pool_sim.py`) apply them, so both run this same code.

The contract, in order of precedence:
- **Quota.** A workspace's queue has, per device kind, a nominal quota (guaranteed), a borrowing limit (how many idle
  devices beyond its quota it may use; None: any) and a lending limit (how many of its idle quota devices others may
  borrow; None: all). Capacity in no queue's quota is idle for anyone to borrow. A workspace without a queue row has
  nominal 0 and may borrow anything: on a fresh install one workspace gets the whole pool, as before the scheduler.
- **Order.** Each workspace's queue is by class, a job waiting `promote_s` counting one class higher (up to `high`),
  then age. Across workspaces fair share decides, not class: next is the workspace whose head would borrow the
  least beyond its quota (its own quota first), then the higher class, then the lowest dominant share (its largest
  usage/nominal over device kinds). A job waiting `aging_s` goes before fair share, the oldest first, so nothing
  waits for ever. A job that fits nowhere is passed over (backfill), but a node is held (drained) for the longest
  waiting gang past `starving_s` and for a workspace below its quota whose gang finds no room, one of each per
  kind, so big gangs are not starved by small ones and the quota is not lost to fragments.
- **Gangs.** A workload needs `min_devices` of one kind at once, on one node unless `spread`, all or nothing; an
  elastic one (min < max) takes up to `max_devices` (only counts in `sizes`, when given), no more than its idle
  quota while others wait, and grows at a checkpoint boundary when devices stay free and no one waits for the kind.
- **Preemption.** A workload that cannot start may stop others: lower classes of its own workspace (a victim's
  class counting as promoted when it started), and workloads of workspaces using more than their nominal quota:
  any class when it reclaims its own quota, else only when it would still hold no larger share than the victim's
  workspace after the stop (fair share), of a lower class or for a workspace below its quota. A workload runs
  `min_run_s` before it can be preempted (no preemption loops), except by an urgent one.
  Victims are taken sparing those that would leave their workspace below its quota, then the least often
  preempted, then by least progress lost (time since their last checkpoint), then lowest class; an elastic victim
  shrinks as far as needed, stopping only when shrinking cannot make the room. A victim checkpoints at its next
  step boundary and is requeued (or keeps running smaller); one still running `grace_s` after the signal is killed.
  The preemptor waits for its victims rather than choosing more, and is then `nominated`: it goes before every
  class, so the room made is its own.
"""

from collections import defaultdict
from dataclasses import dataclass, field, replace

from cluster import log_messages as log

PRIORITY_CLASSES = ("low", "normal", "high", "urgent")
RANK = {name: rank for rank, name in enumerate(PRIORITY_CLASSES)}
URGENT = PRIORITY_CLASSES[-1]
INFINITE = 10**9


@dataclass(frozen=True)
class Settings:
    interval_s: float = 30.0
    min_run_s: float = 600.0
    grace_s: float = 120.0
    # A job waiting this long goes before fair share (the oldest first): the bound on any wait, far beyond the
    # waits fair share makes, as it overrides the quotas.
    aging_s: float = 48 * 3600.0
    starving_s: float = 1800.0
    # A job waiting this long is ordered as one class higher in its workspace's queue, and so on (never above the
    # class below urgent), so that a steady stream of higher classes does not hold a low job back for ever; it
    # gains no preemption rights, but keeps the class it started in against its own workspace's work.
    promote_s: float = 4 * 3600.0


@dataclass(frozen=True)
class Quota:
    nominal: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass
class Workload:
    id: int
    workspace: int | None
    kind: str
    min_devices: int
    max_devices: int
    priority: str
    submitted_at: float
    spread: bool = False
    # Nodes the workload may run on (its files are there); empty: any.
    nodes: tuple[str, ...] = ()
    # Device counts the workload can run on (an elastic job's batch divides by them); empty: any from min to max.
    sizes: tuple[int, ...] = ()
    # node -> devices held; empty while waiting.
    allocation: dict[str, int] = field(default_factory=dict)
    started_at: float | None = None
    last_checkpoint_at: float | None = None
    # Signalled to checkpoint and stop (or shrink to `stopping_to`), for workload `stopping_for`, at `stopping_since`.
    stopping_since: float | None = None
    stopping_to: dict[str, int] = field(default_factory=dict)
    stopping_for: int | None = None
    # Times it was preempted: once it has been, it runs `min_run_s` before it can be preempted again.
    preemptions: int = 0
    # Nodes where others were stopped to make room for this waiting workload: held for it, and it goes first.
    nominated: tuple[str, ...] = ()

    @property
    def devices(self) -> int:
        return sum(self.allocation.values())

    @property
    def running(self) -> bool:
        return bool(self.allocation)

    @property
    def elastic(self) -> bool:
        return self.max_devices > self.min_devices

    def fits(self, count: int) -> bool:
        return self.min_devices <= count <= self.max_devices and (not self.sizes or count in self.sizes)


@dataclass(frozen=True)
class Admit:
    workload: int
    allocation: dict[str, int]


@dataclass(frozen=True)
class Stop:
    """Checkpoint and stop (`keep` empty: requeued) or shrink to `keep`, to make room for workload `by`."""

    workload: int
    by: int
    keep: dict[str, int]


@dataclass(frozen=True)
class Grow:
    workload: int
    allocation: dict[str, int]


@dataclass
class Decisions:
    admit: list[Admit] = field(default_factory=list)
    stop: list[Stop] = field(default_factory=list)
    grow: list[Grow] = field(default_factory=list)
    # Signalled workloads still running past the grace period: stop them now.
    kill: list[int] = field(default_factory=list)
    # Waiting workloads for which room is being made -> the nodes it is made on (held for them until they start).
    nominate: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # Why each waiting workload waits, in the user's words.
    reasons: dict[int, str] = field(default_factory=dict)


class _Pool:
    """The pass's working state: what is free where and what each workspace uses, updated as decisions are made."""

    def __init__(self, capacity: dict[str, dict[str, int]], quotas: dict, workloads: list[Workload],
                 ranks: dict[int, int]):
        self.capacity = capacity
        self.quotas = quotas
        self.ranks = ranks  # waiting workload -> its class as promoted by its wait
        self.free = {node: dict(kinds) for node, kinds in capacity.items()}
        self.usage: dict[int | None, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.holders: dict[tuple, list[Workload]] = defaultdict(list)
        # kind -> node -> the workload it is held for (room made by preemption, or a gang it drains for); a higher
        # class may still use it
        self.reserved: dict[str, dict[str, Workload]] = defaultdict(dict)
        self.stopping: set[int] = set()  # told to stop in this pass
        self.version = 0  # counts the pass's decisions
        self.waiting: dict[str, int] = defaultdict(int)  # kind -> workloads still waiting for it in this pass
        for workload in workloads:
            if workload.running:
                self.take(workload, workload.allocation)
            else:
                self.waiting[workload.kind] += 1

    def rank(self, workload: Workload) -> int:
        return self.ranks.get(workload.id, RANK.get(workload.priority, 0))

    def quota(self, workspace, kind: str) -> Quota:
        return self.quotas.get(workspace, {}).get(kind, Quota())

    def take(self, workload: Workload, allocation: dict[str, int]) -> None:
        for node, count in allocation.items():
            self.free.setdefault(node, {}).setdefault(workload.kind, 0)
            self.free[node][workload.kind] -= count
        self.usage[workload.workspace][workload.kind] += sum(allocation.values())
        if workload not in self.holders[(workload.workspace, workload.kind)]:
            self.holders[(workload.workspace, workload.kind)].append(workload)

    def give_back(self, workload: Workload, allocation: dict[str, int]) -> None:
        for node, count in allocation.items():
            self.free[node][workload.kind] += count
        self.usage[workload.workspace][workload.kind] -= sum(allocation.values())

    def over_quota(self, workspace, kind: str) -> int:
        return self.usage[workspace][kind] - self.quota(workspace, kind).nominal

    def share(self, workspace, kind: str, change: int = 0) -> float:
        return (self.usage[workspace][kind] + change) / max(self.quota(workspace, kind).nominal, 1)

    def dominant_share(self, workspace) -> float:
        shares = [used / max(self.quota(workspace, kind).nominal, 1)
                  for kind, used in self.usage[workspace].items() if used > 0]
        return max(shares, default=0.0)

    def kept_by_others(self, workspace, kind: str) -> int:
        """Idle quota devices of other workspaces that they do not lend: nobody else may take them."""
        kept = 0
        for other, kinds in self.quotas.items():
            quota = kinds.get(kind)
            if other == workspace or quota is None or quota.lending_limit is None:
                continue
            idle = max(0, quota.nominal - self.usage[other][kind])
            kept += max(0, idle - quota.lending_limit)
        return kept

    def quota_room(self, workspace, kind: str) -> tuple[int, int]:
        """(devices within the workspace's idle quota, devices it may still borrow)."""
        quota, used = self.quota(workspace, kind), self.usage[workspace][kind]
        borrowed = max(0, used - quota.nominal)
        borrow_room = INFINITE if quota.borrowing_limit is None else max(0, quota.borrowing_limit - borrowed)
        return max(0, quota.nominal - used), borrow_room

    def free_on(self, node: str, kind: str) -> int:
        return max(0, self.free.get(node, {}).get(kind, 0))

    def lent_on(self, node: str, kind: str) -> int:
        """Devices on the node held by workspaces beyond their quota: a reclaim may take them back."""
        return sum(workload.allocation.get(node, 0) for (workspace, held_kind), workloads in self.holders.items()
                   if held_kind == kind and self.over_quota(workspace, kind) > 0 for workload in workloads)

    def nodes_for(self, workload: Workload, *, honour_reservations: bool = True) -> list[str]:
        nodes = [node for node in self.capacity if not workload.nodes or node in workload.nodes]
        if honour_reservations:
            held, rank = self.reserved[workload.kind], self.rank(workload)
            nodes = [node for node in nodes if node not in held or held[node] is workload
                     or self.rank(held[node]) < rank]
        return nodes

    def placement(self, workload: Workload, *, honour_reservations: bool = True,
                  extra: dict[str, int] | None = None) -> dict[str, int] | None:
        """Where the workload could start now, taking as many devices as quota and free devices allow (up to its
        max); None when not even its minimum fits. `extra` counts devices already held (a grow)."""
        kind = workload.kind
        own_idle, borrow_room = self.quota_room(workload.workspace, kind)
        pool_free = sum(self.free_on(node, kind) for node in self.capacity)
        allowed = min(own_idle + borrow_room, pool_free - self.kept_by_others(workload.workspace, kind))
        if not extra and self.waiting[kind] > 1:
            # Others wait: an elastic job takes its minimum, or its idle quota, and grows once none do.
            allowed = min(allowed, max(workload.min_devices, own_idle))
        nodes = self.nodes_for(workload, honour_reservations=honour_reservations)
        held = extra or {}
        if workload.spread:
            room = {node: self.free_on(node, kind) + held.get(node, 0) for node in nodes}
            count = self._size(workload, min(allowed + sum(held.values()), sum(room.values())))
            if count is None:
                return None
            allocation, left = {}, count
            for node in sorted(room, key=lambda n: (-room[n], n)):
                take = min(room[node], left)
                if take:
                    allocation[node], left = take, left - take
            return allocation
        best = None
        for node in nodes:
            room = self.free_on(node, kind) + held.get(node, 0)
            if held and node not in held:
                continue
            count = self._size(workload, min(allowed + sum(held.values()), room))
            if count is None:
                continue
            # Best fit for a fixed gang (less fragmentation); the roomiest node for an elastic one (room to grow).
            key = (-count, room if not workload.elastic else -room, node)
            if best is None or key < best[0]:
                best = (key, node, count)
        return {best[1]: best[2]} if best else None

    @staticmethod
    def _size(workload: Workload, available: int) -> int | None:
        for count in range(min(available, workload.max_devices), workload.min_devices - 1, -1):
            if workload.fits(count):
                return count
        return None


def schedule(*, capacity: dict[str, dict[str, int]], quotas: dict, workloads: list[Workload], now: float,
             settings: Settings = Settings()) -> Decisions:
    """One scheduling pass. `capacity`: node -> device kind -> devices (healthy nodes); `quotas`: workspace ->
    device kind -> Quota; `workloads`: every unfinished workload, running (with an allocation) or waiting."""
    waiting = sorted((w for w in workloads if not w.running), key=lambda w: (w.submitted_at, w.id))
    pool = _Pool(capacity, quotas, workloads, {w.id: _promoted(w, now, settings) for w in waiting})
    decisions = Decisions()
    for workload in workloads:
        if workload.stopping_since is not None and now - workload.stopping_since > settings.grace_s:
            decisions.kill.append(workload.id)
    lines: dict = defaultdict(list)  # workspace -> its queue: room made for it first, then by class, then oldest
    for workload in waiting:
        lines[workload.workspace].append(workload)
    for line in lines.values():
        line.sort(key=lambda w: (not w.nominated, -pool.rank(w), w.submitted_at, w.id))
    stopping_for = defaultdict(list)
    for workload in workloads:
        if workload.stopping_since is not None and workload.stopping_for is not None:
            stopping_for[workload.stopping_for].append(workload)
    blocked_kinds: set[str] = set()
    places = _places_in_queue(pool, waiting)
    # Requests that found no room, by shape, with the pool's version then: a like request after it, with nothing
    # changed since, finds none either (a backlog holds many alike).
    no_room: dict[tuple, int] = {}
    # kind -> the longest-waiting one-node gang past `starving_s`: a node drains for it.
    starving: dict[str, Workload] = {}
    for workload in waiting:
        if now - workload.submitted_at >= settings.starving_s and not workload.spread:
            starving.setdefault(workload.kind, workload)
        for node in workload.nominated:
            holder = pool.reserved[workload.kind].get(node)
            if holder is None or pool.rank(holder) < pool.rank(workload):
                pool.reserved[workload.kind][node] = workload
    owed_held: set[str] = set()  # kinds with a node drained for a workspace below its quota in this pass
    while lines:
        workspace = min(lines, key=lambda ws: _turn(pool, lines[ws][0], now, settings))
        workload = lines[workspace].pop(0)
        if not lines[workspace]:
            del lines[workspace]
        if stopping_for[workload.id]:
            victims = stopping_for[workload.id]
            decisions.reasons[workload.id] = "waiting for " + ", ".join(
                f"job {v.id} ({v.priority})" for v in victims) + " to checkpoint and make room"
            blocked_kinds.add(workload.kind)
            continue
        shape = (workload.workspace, workload.kind, RANK.get(workload.priority, 0), workload.min_devices,
                 workload.spread, workload.nodes, workload.sizes)
        if no_room.get(shape) != pool.version:
            allocation = pool.placement(workload)
            if allocation is not None:
                pool.take(workload, allocation)
                pool.waiting[workload.kind] -= 1
                pool.version += 1
                decisions.admit.append(Admit(workload.id, allocation))
                continue
            stops, nodes = _make_room(pool, workload, workloads, now, settings)
            if stops:
                decisions.stop.extend(stops)
                decisions.nominate[workload.id] = nodes
                for node in nodes:
                    pool.reserved[workload.kind][node] = workload
                pool.stopping.update(stop.workload for stop in stops)
                pool.version += 1
                decisions.reasons[workload.id] = "preempting " + ", ".join(
                    f"job {s.workload}" for s in stops) + "; starts when they checkpoint"
                blocked_kinds.add(workload.kind)
                continue
            no_room[shape] = pool.version
        blocked_kinds.add(workload.kind)
        decisions.reasons[workload.id] = _reason(pool, workload, places[workload.id])
        owed = workload.kind not in owed_held and not workload.spread and _owed(pool, workload)
        if owed:
            owed_held.add(workload.kind)
        if owed or workload is starving.get(workload.kind):
            _drain_for(pool, decisions, workload, reclaiming=owed)
        elif workload.nominated:
            # Held for it before, and neither owed nor the longest waiting now: the node is free for others.
            for node in workload.nominated:
                if pool.reserved[workload.kind].get(node) is workload:
                    del pool.reserved[workload.kind][node]
            decisions.nominate[workload.id] = ()
    for workload in workloads:
        if (workload.running and workload.elastic and workload.stopping_since is None
                and workload.kind not in blocked_kinds and workload.devices < workload.max_devices
                and _ran_for(workload, now) >= settings.min_run_s):
            grown = pool.placement(workload, extra=workload.allocation)
            if grown is not None and sum(grown.values()) > workload.devices:
                pool.take(workload, {node: count - workload.allocation.get(node, 0)
                                     for node, count in grown.items()})
                decisions.grow.append(Grow(workload.id, grown))
    return decisions


def _promoted(workload: Workload, at: float, settings: Settings) -> int:
    """The workload's class as ordered at `at`: one higher for each `promote_s` it has waited, up to `high`."""
    rank = RANK.get(workload.priority, 0)
    return min(max(rank, RANK[URGENT] - 1), rank + int((at - workload.submitted_at) // settings.promote_s))


def _turn(pool: _Pool, workload: Workload, now: float, settings: Settings) -> tuple:
    """Which workspace's head goes next: room made for it; then a job waiting `aging_s`, the oldest first; then
    fair share: the least borrowed beyond its quota with this job (its own quota first), the higher class, the
    lowest dominant share, the oldest."""
    aged = now - workload.submitted_at >= settings.aging_s
    borrowed = max(0, pool.over_quota(workload.workspace, workload.kind) + workload.min_devices)
    return (not workload.nominated, not aged, workload.submitted_at if aged else 0.0,
            borrowed / max(pool.quota(workload.workspace, workload.kind).nominal, 1), -pool.rank(workload),
            pool.dominant_share(workload.workspace), workload.submitted_at, workload.id)


def _owed(pool: _Pool, workload: Workload) -> bool:
    """Its workspace is below its quota of the kind, and the gang could fit in that quota."""
    return pool.over_quota(workload.workspace, workload.kind) < 0 and \
        workload.min_devices <= pool.quota(workload.workspace, workload.kind).nominal


def _drain_for(pool: _Pool, decisions: Decisions, workload: Workload, *, reclaiming: bool) -> None:
    """Hold a node for a gang that found no room, so that it drains for it (nominated: kept across passes): where
    it was held before, else where it fits soonest (free devices, and those lent out when it reclaims)."""
    kind = workload.kind
    nodes = [node for node in pool.nodes_for(workload)
             if pool.capacity[node].get(kind, 0) >= workload.min_devices]
    kept = [node for node in workload.nominated if node in nodes]
    if not kept and not nodes:
        return
    node = kept[0] if kept else max(nodes, key=lambda n: (
        pool.free_on(n, kind) + (pool.lent_on(n, kind) if reclaiming else 0), pool.free_on(n, kind), n))
    pool.reserved[kind][node] = workload
    if tuple(workload.nominated) != (node,):
        decisions.nominate[workload.id] = (node,)


def _ran_for(workload: Workload, now: float) -> float:
    return 0.0 if workload.started_at is None else now - workload.started_at


def _progress_lost(workload: Workload, now: float) -> float:
    """Seconds of work since the workload's last checkpoint (since it started, before its first)."""
    if workload.last_checkpoint_at is not None:
        return now - workload.last_checkpoint_at
    return _ran_for(workload, now)


def _make_room(pool: _Pool, workload: Workload, workloads: list[Workload], now: float,
               settings: Settings) -> tuple[list[Stop], tuple[str, ...]]:
    """The cheapest set of stops that lets `workload` start, or none: for a gang on one node, the node whose
    victims lose the least progress. Tried on the pool's state and undone: the devices stay taken until the
    victims have checkpointed."""
    rank = RANK.get(workload.priority, 0)
    reclaiming = pool.over_quota(workload.workspace, workload.kind) + workload.min_devices <= 0
    candidates = []
    for other in workloads:
        if (not other.running or other.stopping_since is not None or other.id in pool.stopping
                or other.kind != workload.kind
                or (_ran_for(other, now) < settings.min_run_s and workload.priority != URGENT)):
            continue
        # A job promoted by its wait keeps that class once started: its own workspace's next job of the class it
        # was promoted past does not stop it again (a preemption loop).
        lower = _promoted(other, other.started_at if other.started_at is not None else now, settings) < rank
        if other.workspace == workload.workspace:
            if lower:
                candidates.append(other)
        elif pool.over_quota(other.workspace, other.kind) > 0 and (reclaiming or (
                (lower or pool.over_quota(workload.workspace, workload.kind) < 0) and _fair(pool, workload, other))):
            candidates.append(other)
    if not candidates:
        return [], ()
    # A victim whose stop would leave its workspace below its quota last (it would reclaim in turn); then the
    # least often preempted (a long borrower is not the one taken back every time), the least progress lost, the
    # lowest class.
    candidates.sort(key=lambda other: (
        other.workspace != workload.workspace and _freed(other) > pool.over_quota(other.workspace, other.kind),
        other.preemptions, _progress_lost(other, now), RANK.get(other.priority, 0), other.id))
    targets = [workload] if workload.spread else [
        replace(workload, nodes=(node,)) for node in pool.nodes_for(workload, honour_reservations=False)]
    best = None
    for target in targets:
        near = [c for c in candidates if not target.nodes or set(c.allocation) & set(target.nodes)]
        stops = (_victims_for(pool, target, near, now, reclaiming=reclaiming)
                 or _victims_for(pool, target, near, now, reclaiming=reclaiming, shrink=False))
        if stops:
            # Least progress lost, then the lowest classes, then fewest stopped outright (a shrink keeps running).
            cost = (max(lost for lost, _, _ in stops), sum(lost for lost, _, _ in stops),
                    max(rank for _, rank, _ in stops), sum(not stop.keep for _, _, stop in stops))
            if best is None or cost < best[0]:
                nodes = target.nodes or tuple(sorted({n for c in candidates for n in c.allocation}))
                best = (cost, [stop for _, _, stop in stops], nodes)
    return (best[1], best[2]) if best else ([], ())


def _fair(pool: _Pool, workload: Workload, victim: Workload) -> bool:
    """Taking from another workspace without reclaiming quota: only while the preemptor's share with this job
    stays no larger than the victim workspace's share after the stop (so the two never take turns)."""
    return (pool.share(workload.workspace, workload.kind, workload.min_devices)
            <= pool.share(victim.workspace, victim.kind, -_freed(victim)))


def _victims_for(pool: _Pool, workload: Workload, candidates: list[Workload], now: float, *, reclaiming: bool,
                 shrink: bool = True) -> list[tuple]:
    """(progress lost, class, Stop) for victims taken in order until `workload` fits, or [] when they never make
    it fit. An elastic victim shrinks as far as needed (to its minimum, when that is not enough), or with
    `shrink` off stops outright."""
    stops, undo = [], []
    for victim in candidates:
        if victim.workspace != workload.workspace and (
                pool.over_quota(victim.workspace, victim.kind) <= 0
                or not (reclaiming or _fair(pool, workload, victim))):
            continue  # back within its quota (the rest of it is guaranteed), or no longer the larger share
        keep = _kept(pool, workload, victim) if shrink else {}
        freed = {node: count - keep.get(node, 0) for node, count in victim.allocation.items()}
        pool.give_back(victim, freed)
        undo.append((victim, freed))
        stops.append((_progress_lost(victim, now), RANK.get(victim.priority, 0), Stop(victim.id, workload.id, keep)))
        if pool.placement(workload, honour_reservations=False) is not None:
            break
    else:
        stops = []
    for victim, freed in undo:
        pool.take(victim, freed)
    return stops


def _sizes_below(victim: Workload) -> list[int]:
    """The smaller counts an elastic victim can run on, largest first."""
    return sorted((size for size in (victim.sizes or range(victim.min_devices, victim.max_devices + 1))
                   if victim.min_devices <= size < victim.devices), reverse=True)


def _freed(victim: Workload) -> int:
    """Devices a victim gives back at most: down to its smallest size, or all of them."""
    sizes = _sizes_below(victim)
    return victim.devices - (sizes[-1] if sizes else 0)


def _kept(pool: _Pool, workload: Workload, victim: Workload) -> dict[str, int]:
    """What an elastic victim keeps: the largest of its sizes that lets `workload` fit, else its smallest (and
    further victims make up the rest); {} (stop) for a fixed one."""
    sizes = _sizes_below(victim)
    for size in sizes:
        keep = _shrunk(victim, size)
        freed = {node: count - keep.get(node, 0) for node, count in victim.allocation.items()}
        pool.give_back(victim, freed)
        fits = pool.placement(workload, honour_reservations=False) is not None
        pool.take(victim, freed)
        if fits:
            return keep
    return _shrunk(victim, sizes[-1]) if sizes else {}


def _shrunk(victim: Workload, size: int) -> dict[str, int]:
    """An elastic victim's allocation cut to `size`, fewest devices taken from its largest node last."""
    keep, left = {}, size
    for node, count in sorted(victim.allocation.items(), key=lambda item: -item[1]):
        take = min(count, left)
        if take:
            keep[node], left = take, left - take
    return keep


def _places_in_queue(pool: _Pool, waiting: list[Workload]) -> dict[int, int]:
    """Each waiting workload's place in its workspace's queue for its device kind: by class (as promoted), then
    age."""
    places, lines = {}, defaultdict(list)
    for workload in waiting:
        lines[(workload.workspace, workload.kind)].append(workload)
    for line in lines.values():
        line.sort(key=lambda w: (-pool.rank(w), w.submitted_at, w.id))
        places.update({workload.id: place for place, workload in enumerate(line, start=1)})
    return places


def _reason(pool: _Pool, workload: Workload, place: int) -> str:
    kind = workload.kind
    quota = pool.quota(workload.workspace, kind)
    used = pool.usage[workload.workspace][kind]
    holders = [w.id for w in pool.holders[(workload.workspace, kind)] if w.running]
    own_idle, borrow_room = pool.quota_room(workload.workspace, kind)
    pool_free = sum(pool.free_on(node, kind) for node in pool.capacity)
    idle = max(0, pool_free - own_idle - pool.kept_by_others(workload.workspace, kind))
    shown = min(used, quota.nominal)
    in_use = (log.QUOTA_IN_USE_BY(used=shown, quota=quota.nominal, kind=kind, jobs=", ".join(map(str, holders[:5])))
              if holders and quota.nominal else log.QUOTA_IN_USE(used=shown, quota=quota.nominal, kind=kind))
    if quota.borrowing_limit is not None and borrow_room == 0:
        borrow = log.BORROWING_LIMIT_REACHED(limit=quota.borrowing_limit)
    else:
        borrow = log.IDLE_TO_BORROW(count=min(idle, borrow_room))
    roomiest = max((pool.free_on(node, kind) for node in pool.capacity), default=0)
    place = log.PLACE_IN_QUEUE(place=place)
    if not workload.spread and roomiest < workload.min_devices <= pool_free:
        return log.WAITING_NO_NODE_ROOMY(devices=workload.min_devices, kind=kind, in_use=in_use, borrow=borrow,
                                         needed=workload.min_devices, place=place)
    return log.WAITING(devices=workload.min_devices, kind=kind, in_use=in_use, borrow=borrow, place=place)
